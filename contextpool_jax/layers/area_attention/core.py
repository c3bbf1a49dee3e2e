"""The core both entry points run (:func:`area_attention`), and the
parameter-free function :func:`dot_product_area_attention`."""

from __future__ import annotations

from typing import Callable

import jax

from contextpool_jax.layers.area_attention.areas import AreaFeatures
from contextpool_jax.layers.area_attention.areas import compute_area_features
from contextpool_jax.layers.area_attention.attend import attend
from contextpool_jax.layers.area_attention.keys import base_area_key
from contextpool_jax.layers.area_attention.keys import is_linear_in_items
from contextpool_jax.layers.area_attention.keys import key_features
from contextpool_jax.layers.area_attention.masks import area_mask
from contextpool_jax.layers.area_attention.through_items import attend_through_items
from contextpool_jax.layers.area_attention.validate import AreaSettings
from contextpool_jax.layers.area_attention.validate import check_function_call
from contextpool_jax.layers.area_attention.validate import needs_rng

Array = jax.Array


def area_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    settings: AreaSettings,
    *,
    sample_rng: Array | None,
    dropout_rng: Array | None,
    scale: float | None = None,
    learned_key: Callable[[Array, AreaFeatures], Array] | None = None,
) -> Array:
  """The core both entry points run, on checked inputs (Eq. 1-4, and Eq. 5-9
  through ``learned_key``); returns ``[batch, q_len, heads, depth_v]``.

  Area keys: the base feature of ``settings.key_mode`` of the item keys
  (:func:`~.keys.base_area_key`), mapped by ``learned_key(base, key_features)`` for
  the learned modes (Eq. 9); area values: ``value_mode`` of the item values;
  the item mask and causality as an area mask (:func:`~.masks.area_mask`); then
  attention over the areas (:func:`~.attend.attend`; dropout iff ``dropout_rng`` is
  given), over the areas of ``settings.layout``; ``query`` is
  ``[batch, q_len, heads, depth]``, ``key`` / ``value`` ``[batch, kv_len,
  heads, depth(_v)]``.

  The basic form (mean keys, sum or mean values; :func:`~.keys.is_linear_in_items`)
  takes :func:`~.through_items.attend_through_items` instead, the same attention computed
  from item logits: ordinary attention's matrix products, ~5x fewer FLOPs at
  width 5, and the fast backward pass (the other modes need the features).
  """
  key_mode, value_mode, std_epsilon = settings.key_mode, settings.value_mode, settings.std_epsilon
  dropout_rate = settings.dropout_rate
  layout = settings.layout(key.shape[1])
  allowed = area_mask(mask, layout, query.shape[1], settings.causal)
  if learned_key is None and is_linear_in_items(key_mode, value_mode, sample_rng):
    return attend_through_items(
        query,
        key,
        value,
        allowed,
        layout=layout,
        value_mode=value_mode,
        scale=scale,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
    )
  key_feats = compute_area_features(
      key, layout, features=key_features(key_mode), std_epsilon=std_epsilon
  )
  value_feats = compute_area_features(
      value, layout, features=(value_mode,), std_epsilon=std_epsilon
  )
  area_keys = base_area_key(key_feats, key_mode, sample_rng)
  if learned_key is not None:
    area_keys = learned_key(area_keys, key_feats)
  area_values = getattr(value_feats, value_mode)  # 'sum', 'mean' or 'max'
  return attend(
      query,
      area_keys,
      area_values,
      allowed,
      scale=scale,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
  )


def dot_product_area_attention(
    query: Array,
    key: Array,
    value: Array,
    *,
    max_area_width: int = 1,
    max_area_height: int = 1,
    memory_height: int = 1,
    mask: Array | None = None,
    causal: bool = False,
    key_mode: str = 'mean',
    value_mode: str = 'sum',
    scale: float | None = None,
    dropout_rate: float = 0.0,
    rng: Array | None = None,
    deterministic: bool = True,
    std_epsilon: float = 1e-6,
) -> Array:
  """Parameter-free area attention (basic form: Eq. 3-4; Eq. 1-2 over areas).

  Every area of the key/value memory (see :func:`area_layout`) gets a key and
  a value computed from its items with summed area tables / sliding maxima
  (:func:`area_features`), then each query attends over all areas it may see.

  Key modes available here (the learned ones need :class:`AreaAttention`):

  * ``'mean'``: mean of the item keys (Eq. 3; the paper's basic form).
  * ``'max'``: element-wise max of the item keys.
  * ``'sample'``: ``mean + std * eps``, ``eps ~ N(0, I)``, drawn only when
    ``deterministic=False`` (then ``rng`` is required); deterministic ->
    ``mean``. With ``rng`` given, ``sample_rng, dropout_rng =
    jax.random.split(rng)``.

  Args:
    query: ``[batch, q_len, heads, depth]``.
    key: ``[batch, kv_len, heads, depth]``; a 2D memory is ``memory_height``
      rows of ``kv_len // memory_height`` items flattened row-major.
    value: ``[batch, kv_len, heads, depth_v]``.
    max_area_width: largest area width (1: no horizontal grouping).
    max_area_height: largest area height (1D memories: only 1 is possible).
    memory_height: rows of the memory grid; must divide ``kv_len``.
    mask: item-level boolean mask broadcastable to
      ``[batch, heads, q_len, kv_len]``, True = may attend; an area may be
      attended only if all of its items may be.
    causal: also mask items ``j > i`` (raster order in 2D, top-left aligned).
    key_mode: ``'mean'``, ``'max'`` or ``'sample'``.
    value_mode: ``'sum'`` (Eq. 4; the paper's), ``'mean'`` or ``'max'``.
    scale: multiplies the logits; ``None`` -> ``1 / sqrt(depth)`` (as
      ``jax.nn.dot_product_attention``); ``1.0`` -> no scaling.
    dropout_rate: dropout on the attention probabilities.
    rng: PRNG key for dropout and for ``'sample'`` noise.
    deterministic: no dropout, no sampling noise.
    std_epsilon: variance floor inside the std (``'sample'`` only).

  Returns:
    ``[batch, q_len, heads, depth_v]``. Queries with no attendable area get 0.

  Raises:
    ValueError: bad rank, shapes, option, mask shape, or a learned key mode.
  """
  owner = 'dot_product_area_attention'
  settings = AreaSettings(
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
      key_mode=key_mode,
      value_mode=value_mode,
      causal=causal,
      dropout_rate=dropout_rate,
      std_epsilon=std_epsilon,
  )
  check_function_call(owner, settings, query, key, value, mask, scale, rng, deterministic)
  sample_rng, dropout_rng = _split_rng(
      rng, key_mode, needs_rng(deterministic, dropout_rate, key_mode)
  )
  return area_attention(
      query, key, value, mask, settings, sample_rng=sample_rng, dropout_rng=dropout_rng, scale=scale
  )


def _split_rng(rng: Array | None, key_mode: str, needed: bool) -> tuple[Array | None, Array | None]:
  """``(sample_rng, dropout_rng) = jax.random.split(rng)`` where randomness is
  ``needed`` (the sample only for ``'sample'`` keys), else None."""
  if not needed:
    return None, None
  assert rng is not None  # check_function_call requires one where it is needed
  sample_rng, dropout_rng = jax.random.split(rng)
  return (sample_rng if key_mode == 'sample' else None), dropout_rng
