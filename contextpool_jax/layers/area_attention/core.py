"""The core both entry points run (:func:`area_attention`), and the
parameter-free function :func:`dot_product_area_attention`."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.area_attention.areas import AreaFeatures
from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import area_sums
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
from contextpool_jax.layers.tpu_attention import flash_attention_over_groups
from contextpool_jax.layers.tpu_attention import segment_ids

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
  ``settings.implementation='pallas_tpu'`` takes :func:`flash_over_areas` (any key
  mode: the area keys and values, then jax's flash kernel over them), except with
  dropout, which the kernel does not have.
  """
  key_mode, value_mode = settings.key_mode, settings.value_mode
  dropout_rate = settings.dropout_rate
  layout = settings.layout(key.shape[1])
  if settings.implementation == 'pallas_tpu' and dropout_rng is None:
    area_keys, area_values = area_keys_values(key, value, layout, settings, sample_rng, learned_key)
    return flash_over_areas(query, area_keys, area_values, mask, layout, settings.causal, scale)
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
  area_keys, area_values = area_keys_values(key, value, layout, settings, sample_rng, learned_key)
  return attend(
      query,
      area_keys,
      area_values,
      allowed,
      scale=scale,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
  )


def area_keys_values(
    key: Array,
    value: Array,
    layout: AreaLayout,
    settings: AreaSettings,
    sample_rng: Array | None,
    learned_key: Callable[[Array, AreaFeatures], Array] | None,
) -> tuple[Array, Array]:
  """Every area's key (the base feature of ``settings.key_mode``, mapped by
  ``learned_key`` for the learned modes, Eq. 9) and value (``value_mode`` of the
  items, Eq. 4), ``[batch, num_areas, heads, depth(_v)]`` in ``layout``'s order."""
  key_feats = compute_area_features(
      key, layout, features=key_features(settings.key_mode), std_epsilon=settings.std_epsilon
  )
  value_feats = compute_area_features(
      value, layout, features=(settings.value_mode,), std_epsilon=settings.std_epsilon
  )
  area_keys = base_area_key(key_feats, settings.key_mode, sample_rng)
  if learned_key is not None:
    area_keys = learned_key(area_keys, key_feats)
  return area_keys, getattr(value_feats, settings.value_mode)  # 'sum', 'mean' or 'max'


def flash_over_areas(
    query: Array,
    area_keys: Array,
    area_values: Array,
    mask: Array | None,
    layout: AreaLayout,
    causal: bool,
    scale: float | None,
) -> Array:
  """Attention over the areas by jax's Pallas TPU flash kernel
  (``implementation='pallas_tpu'``): no ``[q_len, num_areas]`` logits are stored.

  The kernel masks by segment ids (and causality), so ``mask`` must be padding: an
  outer product of the queries' and the items' validity (what the Transformers pass);
  an area is valid when every item in it is. Causal (1D self-attention): the areas
  are laid out by their last item, ``max_area_width`` slots per position (areas that
  would start before the memory are invalid slots), so "every item ``<= i``" is the
  kernel's causal mask over groups (:func:`~contextpool_jax.layers.tpu_attention.
  flash_attention_over_groups`). As with the Transformers' kernel path, padding
  queries' outputs (and a query with no valid area, which the dense path zeroes)
  are not the dense path's; real queries' are."""
  batch, q_len = query.shape[:2]
  q_valid, kv_valid = (ids.astype(bool) for ids in segment_ids(mask, batch, q_len, layout.size))
  invalid = jnp.logical_not(kv_valid).astype(jnp.int32)
  grid = invalid.reshape(batch, layout.grid_height, layout.grid_width)
  area_valid = area_sums(grid, layout, axis=1) == 0  # [batch, num_areas]
  if not causal:
    return flash_attention_over_groups(
        query,
        area_keys,
        area_values,
        q_valid=q_valid,
        kv_valid=area_valid,
        causal=False,
        scale=scale,
    )
  if layout.grid_height != 1 or q_len != layout.size:
    raise ConfigError(
        "area attention with implementation='pallas_tpu' and causal=True needs a 1D "
        f'self-attention (memory_height 1, q_len == kv_len); got a memory of '
        f'{layout.grid_height} x {layout.grid_width} items and q_len {q_len}. Use '
        'implementation=None there.'
    )
  by_end = lambda a: _areas_by_last_item(a, layout)
  return flash_attention_over_groups(
      query,
      by_end(area_keys),
      by_end(area_values),
      q_valid=q_valid,
      kv_valid=by_end(area_valid),
      causal=True,
      keys_per_position=len(layout.shapes),
      scale=scale,
  )


def _areas_by_last_item(a: Array, layout: AreaLayout) -> Array:
  """A per-area array of a 1D layout (``[batch, num_areas, ...]``, width-major, by
  first item) as ``[batch, length * widths, ...]``: position ``e``'s slots hold the
  areas ending at ``e``, width 1 first; an area of width ``w`` ending before
  ``w - 1`` does not exist and its slot is zero (False)."""
  n, blocks, start = layout.size, [], 0
  for _, w in layout.shapes:
    block = jax.lax.slice_in_dim(a, start, start + n - w + 1, axis=1)
    pad = [(0, 0)] * a.ndim
    pad[1] = (w - 1, 0)
    blocks.append(jnp.pad(block, pad))
    start += n - w + 1
  stacked = jnp.stack(blocks, axis=2)  # [batch, n, widths, ...]
  return stacked.reshape((a.shape[0], n * len(layout.shapes)) + a.shape[2:])


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
    implementation: str | None = None,
) -> Array:
  """Parameter-free area attention (basic form: Eq. 3-4; Eq. 1-2 over areas).

  Every area of the memory (:func:`area_layout`) gets a key and a value from its items
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
    implementation: None (dense) or ``'pallas_tpu'`` (:func:`flash_over_areas`).

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
      implementation=implementation,
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
