"""Area attention (Li et al., "Area Attention", ICML 2019): masks, the attention
core, the parameter-free function and the Linen modules.

Attention in which the unit a query attends to is an *area*: a contiguous
range of 1..``max_area_width`` items of a 1D memory, or a rectangle of up to
``max_area_height`` x ``max_area_width`` items of a 2D memory (a grid that is
stored flattened row-major, ``memory_height`` rows of ``kv_len //
memory_height`` items). Every area gets a key and a value computed from its
items, and ordinary dot-product attention runs over the areas.

* Basic form (parameter-free): area key = mean of the item keys (Eq. 3), area
  value = sum of the item values (Eq. 4).
* Rich form (Eq. 5-9): area key = ReLU(f W1 + sigma W2 + [e_h; e_w] W3) Wd from
  the area mean (or max, or a sample), the standard deviation of the item keys
  (Eq. 5) and learned embeddings of the area's height and width (Eq. 6-8).
  Key modes named as in tensor2tensor's ``area_attention.py`` compute what
  they compute there (some without sigma); see :class:`AreaAttention`.

Which areas exist, in which order, and their features (sums and means from
summed area tables, Eq. 10-11; stds by pairwise merges instead of Eq. 12;
maxima) are :mod:`contextpool_jax.layers.areas`, whose public names
are importable from here too. In this file:

* :func:`area_attention_mask`: item-level mask and causality -> area-level mask.
* :func:`attend_to_areas`: softmax attention of queries over area keys/values.
* :func:`dot_product_area_attention`: the parameter-free pure function.
* :class:`AreaKeyEncoder`: the learned area key of Eq. 9 (Linen).
* :class:`AreaAttention`: multi-head area attention (Linen).

The function and the module check their settings and memory with the same two
functions (:func:`_check_config`, :func:`_check_memory`) and run the same core
(:func:`_area_attention`).

Choices the paper leaves open (each documented where it is made; the area
order, the std and the tables' precision in :mod:`.areas`):

* Masking: an area may be attended by a query only if every one of its items
  may be. ``causal=True`` adds the item mask ``j <= i`` (top-left aligned when
  ``q_len != kv_len``, as ``jax.nn.dot_product_attention``); on a 2D memory
  positions are raster (row-major) indices, so an area is visible to query
  ``i`` iff its bottom-right item has flattened index ``<= i``.
* A query with no attendable area outputs exactly zero, with zero (finite)
  gradients.
* Numerics: the softmax runs in float32 with max-subtraction, whatever the
  compute dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from contextpool_jax.errors import ConfigError
from contextpool_jax import checks as v
from contextpool_jax.layers._softmax import masked_softmax
from contextpool_jax.layers.areas import FEATURE_NAMES
from contextpool_jax.layers.areas import AreaFeatures
from contextpool_jax.layers.areas import AreaLayout
from contextpool_jax.layers.areas import area_features
from contextpool_jax.layers.areas import area_layout
from contextpool_jax.layers.areas import area_sums
from contextpool_jax.layers.areas import check_area_options
from contextpool_jax.layers.areas import check_memory_length
from contextpool_jax.layers.areas import compute_area_features
from contextpool_jax.layers.areas import num_areas
from contextpool_jax.layers.areas import pad_areas
from contextpool_jax.layers.areas import padded_area_sums
from contextpool_jax.layers.areas import padded_area_sums_transpose
from contextpool_jax.layers.areas import padded_area_valid

__all__ = [
    'KEY_MODES',
    'LEARNED_KEY_MODES',
    'PARAMETER_FREE_KEY_MODES',
    'VALUE_MODES',
    'AreaAttention',
    'AreaKeyEncoder',
    'area_attention_mask',
    'attend_to_areas',
    'dot_product_area_attention',
    # From areas, importable here as before the split.
    'FEATURE_NAMES',
    'AreaFeatures',
    'AreaLayout',
    'area_features',
    'area_layout',
    'num_areas',
]

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]

PARAMETER_FREE_KEY_MODES = ('mean', 'max', 'sample')


class _LearnedKey(NamedTuple):
  """A learned key mode: base feature f, whether sigma enters, how features combine."""

  base: str  # 'mean' | 'max' | 'sample'
  std: bool
  combine: str  # 'concat' | 'sum' (AreaKeyEncoder.mode)


# The learned key modes. The first five are tensor2tensor's names and compute
# what its compute_area_key computes for them; the last three are Eq. 9 with
# the std term for the other base features (names of our own).
_LEARNED_KEYS = {
    'concat': _LearnedKey('mean', True, 'concat'),
    'max_concat': _LearnedKey('max', False, 'concat'),
    'sample_concat': _LearnedKey('sample', False, 'concat'),
    'sum': _LearnedKey('mean', True, 'sum'),
    'sample_sum': _LearnedKey('sample', False, 'sum'),
    'max_std_concat': _LearnedKey('max', True, 'concat'),
    'sample_std_concat': _LearnedKey('sample', True, 'concat'),
    'sample_std_sum': _LearnedKey('sample', True, 'sum'),
}
LEARNED_KEY_MODES = tuple(_LEARNED_KEYS)
KEY_MODES = PARAMETER_FREE_KEY_MODES + LEARNED_KEY_MODES
VALUE_MODES = ('sum', 'mean', 'max')


def _key_base(key_mode: str) -> str:
  """The base feature f of a key mode: 'mean', 'max' or 'sample'."""
  return _LEARNED_KEYS[key_mode].base if key_mode in _LEARNED_KEYS else key_mode


def _key_features(key_mode: str) -> tuple[str, ...]:
  """Which per-area statistics of the item keys a key mode reads."""
  base, learned = _key_base(key_mode), _LEARNED_KEYS.get(key_mode)
  needs_std = base == 'sample' or (learned is not None and learned.std)
  return (('max',) if base == 'max' else ('mean',)) + (('std',) if needs_std else ())


# ----------------------------------------------------------------------------
# The checks of both entry points (dot_product_area_attention, AreaAttention).
# ----------------------------------------------------------------------------


def _check_config(
    owner: str,
    *,
    key_mode: Any,
    value_mode: Any,
    max_area_width: Any,
    max_area_height: Any,
    memory_height: Any,
    dropout_rate: Any,
    causal: Any,
    std_epsilon: Any,
) -> None:
  """Raises ConfigError for an invalid area attention setting."""
  v.check_choice(owner, 'key_mode', key_mode, KEY_MODES)
  v.check_choice(owner, 'value_mode', value_mode, VALUE_MODES)
  check_area_options(owner, max_area_width, max_area_height, memory_height)
  v.check_probability(owner, 'dropout_rate', dropout_rate)
  v.check_choice(owner, 'causal', causal, (False, True))
  v.check_positive(owner, 'std_epsilon', std_epsilon, allow_zero=True)


def _check_memory(
    owner: str,
    *,
    kv_len: int,
    memory_height: int,
    what: str,
    mask: Any,
    attention_shape: tuple[int, ...],
) -> None:
  """Raises ConfigError unless ``memory_height`` divides the memory's ``kv_len``
  items (``what`` names the memory), and ValueError unless ``mask`` is None or
  broadcastable to ``attention_shape = (batch, heads, q_len, kv_len)``."""
  check_memory_length(owner, kv_len, memory_height, what)
  if mask is not None:
    _check_mask(owner, mask, attention_shape)


def _check_mask(owner: str, mask: Any, target: tuple[int, ...]) -> None:
  shape = getattr(mask, 'shape', None)
  ok = shape is not None and len(shape) <= 4
  if ok:
    try:
      ok = tuple(np.broadcast_shapes(tuple(shape), target)) == tuple(target)
    except ValueError:
      ok = False
  if not ok:
    raise ValueError(
        f'{owner}: mask has shape {shape}; expected an item-level mask '
        f'broadcastable to [batch, heads, q_len, kv_len] = {list(target)}.'
    )


# ----------------------------------------------------------------------------
# Masks and the attention core.
# ----------------------------------------------------------------------------


def area_attention_mask(
    mask: Array | None,
    *,
    q_len: int,
    kv_len: int,
    max_area_width: int = 1,
    max_area_height: int = 1,
    memory_height: int = 1,
    causal: bool = False,
) -> Array | None:
  """Turns an item-level mask into an area-level mask.

  An area may be attended by a query iff every item in it may be (the paper
  only says padding must not enter areas; this is the general rule). The
  number of forbidden items in every area comes from a summed area table over
  the negated mask (Eq. 10-11, exact in int32); the area is allowed iff that
  count is zero. ``causal=True`` adds the item mask ``j <= i``: an area is
  visible to query ``i`` iff the flattened index of its bottom-right item (its
  largest index, :attr:`AreaLayout.last_index`) is ``<= i``; on a 2D memory
  this is raster order.

  Args:
    mask: ``None`` or a boolean item mask (True = may attend) broadcastable to
      ``[batch, heads, q_len, kv_len]`` (lower ranks are broadcast numpy-style).
    q_len: number of queries.
    kv_len: number of memory items.
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of the memory grid.
    causal: add the causal item mask.

  Returns:
    ``None`` (every area allowed) or a boolean ``[b, h, q, num_areas]`` mask
    whose leading dims are those of ``mask`` (size 1 where it broadcasts).
  """
  owner = 'area_attention_mask'
  check_area_options(owner, max_area_width, max_area_height, memory_height)
  mask = None if mask is None else jnp.asarray(mask)
  lead = ((1,) * 4 + mask.shape)[-4:-2] if mask is not None and mask.ndim <= 4 else (1, 1)
  _check_memory(
      owner,
      kv_len=kv_len,
      memory_height=memory_height,
      what='key/value',
      mask=mask,
      attention_shape=lead + (q_len, kv_len),
  )
  layout = area_layout(
      kv_len,
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
  )
  return _area_mask(mask, layout, q_len, causal)


def _area_mask(mask: Array | None, layout: AreaLayout, q_len: int, causal: bool) -> Array | None:
  """:func:`area_attention_mask` of a checked mask over the memory's layout."""
  out = None
  if mask is not None:
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape).astype(bool)
    mask = jnp.broadcast_to(mask, mask.shape[:-1] + (layout.grid_height * layout.grid_width,))
    forbidden = jnp.logical_not(mask).astype(jnp.int32)
    forbidden = forbidden.reshape(mask.shape[:3] + (layout.grid_height, layout.grid_width))
    out = area_sums(forbidden, layout, axis=3) == 0
  if causal:
    visible = (
        jnp.arange(q_len, dtype=jnp.int32)[:, None]
        >= jnp.asarray(layout.last_index, jnp.int32)[None, :]
    )
    out = visible[None, None] if out is None else jnp.logical_and(out, visible)
  return out


def attend_to_areas(
    query: Array,
    area_keys: Array,
    area_values: Array,
    area_mask: Array | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
) -> Array:
  """Dot-product attention of queries over areas (Eq. 1-2 with area keys/values).

  ``p = softmax(scale * q . k_area)`` over the allowed areas, computed in
  float32 with max-subtraction; ``out = sum_area p * v_area``. A query with no
  allowed area outputs exactly zero. Dropout (inverted, element-wise, no
  broadcasting) is applied to the probabilities when ``not deterministic``.

  Args:
    query: ``[batch, q_len, heads, depth]``.
    area_keys: ``[batch, num_areas, heads, depth]``.
    area_values: ``[batch, num_areas, heads, depth_v]``.
    area_mask: ``None`` or boolean, broadcastable to
      ``[batch, heads, q_len, num_areas]`` (see :func:`area_attention_mask`).
    scale: logit scale; ``None`` means ``1 / sqrt(depth)``.
    dropout_rate: dropout rate on the attention probabilities.
    dropout_rng: PRNG key, required if ``dropout_rate > 0`` and not
      ``deterministic``.
    deterministic: disables dropout.

  Returns:
    ``[batch, q_len, heads, depth_v]`` in the dtype of ``area_values``.
  """
  owner = 'attend_to_areas'
  v.check_rank(owner, 'query', query, (4,), '[batch, q_len, heads, depth]')
  v.check_rank(owner, 'area_keys', area_keys, (4,), '[batch, num_areas, heads, depth]')
  v.check_rank(owner, 'area_values', area_values, (4,), '[batch, num_areas, heads, depth_v]')
  v.check_probability(owner, 'dropout_rate', dropout_rate)
  if not deterministic and dropout_rate > 0.0 and dropout_rng is None:
    raise ValueError(
        f'{owner}: dropout_rng=None but dropout_rate={dropout_rate!r} and '
        'deterministic=False; pass dropout_rng= or deterministic=True.'
    )
  return _attend(
      query,
      area_keys,
      area_values,
      area_mask,
      scale=scale,
      dropout_rate=dropout_rate,
      dropout_rng=None if deterministic else dropout_rng,
  )


def _attend(
    query: Array,
    area_keys: Array,
    area_values: Array,
    area_mask: Array | None,
    *,
    scale: float | None,
    dropout_rate: float,
    dropout_rng: Array | None,
    heads_major: bool = False,
) -> Array:
  """:func:`attend_to_areas` on checked inputs; dropout iff ``dropout_rng`` is given.

  ``heads_major``: the areas are ``[batch, heads, num_areas, depth]`` (the
  decoding cache's layout, :meth:`AreaAttention._area_cache`) instead of
  ``[batch, num_areas, heads, depth]``."""
  a = 'bhad' if heads_major else 'bahd'
  scale = _logit_scale(query, scale)
  logits = jnp.einsum(f'bqhd,{a}->bhqa', query, area_keys, preferred_element_type=jnp.float32)
  logits = logits * jnp.float32(scale)
  probs = _area_probs(logits, area_mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  return jnp.einsum(f'bhqa,{a}->bqhd', probs.astype(area_values.dtype), area_values)


def _logit_scale(query: Array, scale: float | None) -> float:
  """The logit scale: ``scale``, or ``1 / sqrt(depth)`` when it is ``None``."""
  return 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale


def _area_probs(
    logits: Array, area_mask: Array | None, *, dropout_rate: float, dropout_rng: Array | None
) -> Array:
  """``[batch, heads, q_len, num_areas]`` attention probabilities over the areas:
  the float32 masked softmax of ``logits`` (0 on masked areas), then inverted
  element-wise dropout iff ``dropout_rng`` is given and ``dropout_rate > 0``."""
  return _dropout(
      masked_softmax(logits, area_mask),
      _dropout_keep(dropout_rng, dropout_rate, logits.shape),
      dropout_rate,
  )


def _dropout_keep(rng: Array | None, rate: float, shape: tuple[int, ...]) -> Array | None:
  """The dropout draw of the probabilities ``[batch, heads, q_len, num_areas]``
  (True = kept), or ``None`` without dropout (no ``rng`` or ``rate == 0``)."""
  if rng is None or rate <= 0.0:
    return None
  return jax.random.bernoulli(rng, 1.0 - rate, shape)


def _dropout(probs: Array, keep: Array | None, rate: float) -> Array:
  """Inverted dropout of ``probs`` by the draw ``keep`` (``None``: none)."""
  return probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)


def _is_linear_in_items(key_mode: str, value_mode: str, sample_rng: Array | None) -> bool:
  """Whether the area keys are item-key means and the area values item-value
  sums or means (the basic form, Eq. 3-4), so that :func:`_attend_through_items`
  computes the same attention as :func:`_attend` on the area features."""
  mean_key = key_mode == 'mean' or (key_mode == 'sample' and sample_rng is None)
  return mean_key and value_mode in ('sum', 'mean')


# Queries per block of :func:`_attend_through_items`: its per-block arrays
# ``[batch, heads, block, num_shapes * kv_len]`` stay cache-sized (batch 4, 8
# heads, kv_len 256, width 5: 5 MiB) instead of being written to and read back
# from memory; 16 and 64 were slower on the CPU (benchmarks/area_speed.py).
_QUERY_BLOCK = 32


def _attend_through_items(
    query: Array,
    key: Array,
    value: Array,
    area_mask: Array | None,
    *,
    layout: AreaLayout,
    value_mode: str,
    scale: float | None,
    dropout_rate: float,
    dropout_rng: Array | None,
    heads_major: bool = False,
) -> Array:
  """Area attention with mean area keys and sum/mean area values (Eq. 1-4),
  without forming area keys or values.

  Both are linear in the items, so the products with them are item products
  summed over areas: ``q . mean_{j in a} k_j = mean_{j in a} (q . k_j)``
  (Eq. 3), and ``sum_a p_a sum_{j in a} v_j = sum_j (sum_{a ni j} p_a) v_j``
  (Eq. 4; ``1 / |a|`` inside for mean values). The item logits ``q . k_j``
  ``[batch, heads, q_len, kv_len]`` are summed into area logits in the padded
  area layout (:func:`padded_area_sums`: ``[batch, heads, q_len, num_shapes *
  kv_len]``, padding masked), the masked float32 softmax over the areas and
  the dropout are those of :func:`_attend` (the same draws, :func:`pad_areas`
  of ``[..., num_areas]``), the probabilities are summed back onto the items
  they cover by the transpose, and one ``[q_len, kv_len]`` product with the
  item values gives the output. The matrix products are ordinary
  attention's (``kv_len`` columns, not ``num_areas``); only the softmax runs
  over the areas, and the backward pass maps gradients between items and areas
  with the same window sums (no gathers, no scatters).

  Queries are processed in blocks of ``_QUERY_BLOCK`` (``lax.map``) and each
  block is rematerialised in the backward pass (``jax.checkpoint``): the
  per-area arrays of a block stay in cache and none of ``[q_len, areas]``
  size is ever stored, so memory is that of ordinary attention plus a block.
  Equal to :func:`_attend` on the area features up to float32 rounding (the
  area logits are means of float32 item logits rather than products with
  rounded means).

  Args:
    query: ``[batch, q_len, heads, depth]``.
    key: ``[batch, kv_len, heads, depth]`` item keys.
    value: ``[batch, kv_len, heads, depth_v]`` item values.
    area_mask: ``None`` or boolean, broadcastable to ``[batch, heads, q_len,
      num_areas]``.
    layout: the memory's :func:`area_layout`.
    value_mode: ``'sum'`` or ``'mean'``.
    scale: logit scale; ``None`` -> ``1 / sqrt(depth)``.
    dropout_rate: dropout rate on the probabilities over the areas.
    dropout_rng: dropout iff given.
    heads_major: ``key`` / ``value`` are ``[batch, heads, kv_len, depth]``
      (the decoding cache's layout) instead.

  Returns:
    ``[batch, q_len, heads, depth_v]`` in the dtype of ``value``.
  """
  kv = 'bhkd' if heads_major else 'bkhd'
  scale = _logit_scale(query, scale)
  sizes = [h * w for h, w in layout.shapes]
  key_weights = [scale / s for s in sizes]
  value_weights = [1.0 / s for s in sizes] if value_mode == 'mean' else None
  batch, q_len, heads = query.shape[:3]
  valid = jnp.asarray(padded_area_valid(layout))
  # Per-query inputs: [batch, heads, q_len, padded areas], or q_len 1 (broadcast).
  per_query = []
  if area_mask is not None:
    per_query.append(
        pad_areas(
            area_mask.reshape((1,) * (4 - area_mask.ndim) + area_mask.shape), layout, 3, False
        )
    )
  keep = _dropout_keep(dropout_rng, dropout_rate, (batch, heads, q_len, layout.num_areas))
  if keep is not None:
    per_query.append(pad_areas(keep, layout, 3, False))

  def block(q: Array, mask: Array | None, keep: Array | None) -> Array:
    item_logits = jnp.einsum(f'bqhd,{kv}->bhqk', q, key, preferred_element_type=jnp.float32)
    grid = item_logits.reshape(item_logits.shape[:3] + (layout.grid_height, layout.grid_width))
    logits = padded_area_sums(grid, layout, 3, key_weights)
    allowed = valid if mask is None else jnp.logical_and(valid, mask)
    probs = _dropout(masked_softmax(logits, allowed), keep, dropout_rate)
    item_probs = padded_area_sums_transpose(probs, layout, 3, value_weights)
    item_probs = item_probs.reshape(item_logits.shape)
    return jnp.einsum(f'bhqk,{kv}->bqhd', item_probs.astype(value.dtype), value)

  mask_index = 0 if area_mask is not None else None
  keep_index = len(per_query) - 1 if keep is not None else None
  pick = lambda xs, i: None if i is None else xs[i]
  num_blocks = -(-q_len // _QUERY_BLOCK)
  if num_blocks <= 1:
    return block(query, pick(per_query, mask_index), pick(per_query, keep_index))
  # Pad the queries to whole blocks and put the block index first; a per-query
  # input broadcast over the queries (q_len 1) is shared by every block.
  rows = num_blocks * _QUERY_BLOCK

  def blocks(x: Array, axis: int) -> Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, rows - q_len)
    x = jnp.pad(x, pad)
    x = x.reshape(x.shape[:axis] + (num_blocks, _QUERY_BLOCK) + x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)

  blocked = [blocks(x, 2) if x.shape[2] == q_len else None for x in per_query]
  shared = [None if b is not None else x for b, x in zip(blocked, per_query)]

  @jax.checkpoint
  def step(xs: tuple[Array, tuple[Array | None, ...]]) -> Array:
    q, inputs = xs
    inputs = [s if b is None else b for b, s in zip(inputs, shared)]
    return block(q, pick(inputs, mask_index), pick(inputs, keep_index))

  out = jax.lax.map(step, (blocks(query, 1), tuple(blocked)))  # [blocks, batch, block, heads, dv]
  out = jnp.moveaxis(out, 0, 1).reshape((batch, rows) + out.shape[3:])
  return out[:, :q_len]


def _base_area_key(feats: AreaFeatures, key_mode: str, sample_rng: Array | None) -> Array:
  """The key feature ``f``: mean (Eq. 3), max, or a sample ``mean + std * eps``.

  Sample modes draw ``eps ~ N(0, I)`` (``jax.random.normal(sample_rng,
  mean.shape)``, reparameterised so gradients flow to mean and std) only when
  ``sample_rng`` is given (training); otherwise ``f = mean``, the mean of the
  distribution.
  """
  base = _key_base(key_mode)
  if base == 'max':
    return feats.max
  if base == 'sample' and sample_rng is not None:
    eps = jax.random.normal(sample_rng, feats.mean.shape, jnp.float32)
    return (feats.mean + feats.std * eps.astype(feats.std.dtype)).astype(feats.mean.dtype)
  return feats.mean


def _area_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None,
    *,
    layout: AreaLayout,
    causal: bool,
    key_mode: str,
    value_mode: str,
    std_epsilon: float,
    sample_rng: Array | None,
    dropout_rate: float,
    dropout_rng: Array | None,
    scale: float | None = None,
    learned_key: Callable[[Array, AreaFeatures], Array] | None = None,
) -> Array:
  """The core both entry points run, on checked inputs (Eq. 1-4, and Eq. 5-9
  through ``learned_key``); returns ``[batch, q_len, heads, depth_v]``.

  Area keys: the base feature of ``key_mode`` of the item keys
  (:func:`_base_area_key`), mapped by ``learned_key(base, key_features)`` for
  the learned modes (Eq. 9); area values: ``value_mode`` of the item values;
  the item mask and causality as an area mask (:func:`_area_mask`); then
  attention over the areas (:func:`_attend`; dropout iff ``dropout_rng`` is
  given). ``layout`` is the memory's :func:`area_layout`; ``query`` is
  ``[batch, q_len, heads, depth]``, ``key`` / ``value`` ``[batch, kv_len,
  heads, depth(_v)]``.

  The basic form (mean keys, sum or mean values; :func:`_is_linear_in_items`)
  takes :func:`_attend_through_items` instead, the same attention computed
  from item logits: ordinary attention's matrix products, ~5x fewer FLOPs at
  width 5, and the fast backward pass (the other modes need the features).
  """
  area_mask = _area_mask(mask, layout, query.shape[1], causal)
  if learned_key is None and _is_linear_in_items(key_mode, value_mode, sample_rng):
    return _attend_through_items(
        query,
        key,
        value,
        area_mask,
        layout=layout,
        value_mode=value_mode,
        scale=scale,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
    )
  key_feats = compute_area_features(
      key, layout, features=_key_features(key_mode), std_epsilon=std_epsilon
  )
  value_feats = compute_area_features(
      value, layout, features=(value_mode,), std_epsilon=std_epsilon
  )
  area_keys = _base_area_key(key_feats, key_mode, sample_rng)
  if learned_key is not None:
    area_keys = learned_key(area_keys, key_feats)
  area_values = getattr(value_feats, value_mode)  # 'sum', 'mean' or 'max'
  return _attend(
      query,
      area_keys,
      area_values,
      area_mask,
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

  Value modes: ``'sum'`` (Eq. 4; the paper's), ``'mean'``, ``'max'``.

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
    value_mode: ``'sum'``, ``'mean'`` or ``'max'``.
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
  _check_config(
      owner,
      key_mode=key_mode,
      value_mode=value_mode,
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
      dropout_rate=dropout_rate,
      causal=causal,
      std_epsilon=std_epsilon,
  )
  if key_mode in LEARNED_KEY_MODES:
    raise ConfigError(
        f'{owner}.key_mode={key_mode!r} has learned parameters (Eq. 9); use '
        'contextpool_jax.AreaAttention, or compute keys with AreaKeyEncoder on '
        f'area_features(...) and call attend_to_areas. Parameter-free key modes: '
        f'{", ".join(repr(m) for m in PARAMETER_FREE_KEY_MODES)}.'
    )
  if scale is not None:
    v.check_positive(owner, 'scale', scale)
  v.check_rank(owner, 'query', query, (4,), '[batch, q_len, heads, depth]')
  v.check_rank(owner, 'key', key, (4,), '[batch, kv_len, heads, depth]')
  v.check_rank(owner, 'value', value, (4,), '[batch, kv_len, heads, depth_v]')
  b, q_len, heads, depth = query.shape
  if (key.shape[0], key.shape[2], key.shape[3]) != (b, heads, depth):
    raise ValueError(
        f'{owner}: key shape {key.shape} does not match query shape '
        f'{query.shape}; expected [batch={b}, kv_len, heads={heads}, '
        f'depth={depth}].'
    )
  if value.shape[:3] != key.shape[:3]:
    raise ValueError(
        f'{owner}: value shape {value.shape} does not match key shape '
        f'{key.shape} in [batch, kv_len, heads].'
    )
  kv_len = key.shape[1]
  _check_memory(
      owner,
      kv_len=kv_len,
      memory_height=memory_height,
      what='key/value',
      mask=mask,
      attention_shape=(b, heads, q_len, kv_len),
  )
  needs_rng = not deterministic and (dropout_rate > 0.0 or key_mode == 'sample')
  if needs_rng and rng is None:
    raise ValueError(
        f'{owner}: rng=None but deterministic=False with '
        f'dropout_rate={dropout_rate!r}, key_mode={key_mode!r} needs '
        'randomness; pass rng= or deterministic=True.'
    )
  sample_rng = dropout_rng = None
  if needs_rng:
    sample_rng, dropout_rng = jax.random.split(rng)
    if key_mode != 'sample':
      sample_rng = None
  layout = area_layout(
      kv_len,
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
  )
  return _area_attention(
      query,
      key,
      value,
      mask,
      layout=layout,
      causal=causal,
      key_mode=key_mode,
      value_mode=value_mode,
      std_epsilon=std_epsilon,
      sample_rng=sample_rng,
      dropout_rate=dropout_rate,
      dropout_rng=dropout_rng,
      scale=scale,
  )


# ----------------------------------------------------------------------------
# Linen modules.
# ----------------------------------------------------------------------------


def _check_embedding_dim(
    owner: str,
    field: str,
    embedding_dim: int | None,
    mode_field: str,
    mode: str,
    combine: str,
    depth: int,
) -> None:
  """A ``'sum'`` key adds ``[e_h; e_w]`` (each ``embedding_dim``, default
  ``depth // 2``) to depth-``depth`` features: both must fit."""
  if combine != 'sum':
    return
  if depth % 2:
    raise ConfigError(
        f'{owner}.{mode_field}={mode!r} needs an even head depth: its height and width '
        f'embeddings (depth // 2 each, as in tensor2tensor) are concatenated and added '
        f"to the key features; got depth {depth}. Use an even depth or a 'concat' mode."
    )
  if embedding_dim not in (None, depth // 2):
    raise ConfigError(
        f'{owner}.{field}={embedding_dim!r} is invalid for {mode_field}={mode!r}, whose '
        f'[e_h; e_w] is added to the depth-{depth} key features; use None or {depth // 2}.'
    )


class AreaKeyEncoder(nn.Module):
  """Learned area key of the rich form (Eq. 5-9), as tensor2tensor computes it.

  ``mode='concat'`` is Eq. 9 literally (a matmul of a concatenation equals the
  sum of per-block matmuls):
  ``k = ReLU([f; sigma; e_h; e_w] W + b1) Wd + bd`` with
  ``W = [W1; W2; W3]`` of shape ``[2 D + 2 S, hidden]``, where ``f`` is the
  base area feature (mean, max or sample, chosen by the caller), ``sigma`` the
  std of the item keys (Eq. 5), ``e_h = E_h[h - 1]``, ``e_w = E_w[w - 1]`` the
  height/width embeddings (Eq. 6-8; the one-hot products of Eq. 6-7 are table
  lookups), each ``S = D // 2`` wide by default (tensor2tensor's
  ``depth // 2``; the paper does not give S). Without ``std`` (tensor2tensor's
  ``max_concat`` and ``sample_concat``): ``k = ReLU([f; e_h; e_w] W + b1) Wd +
  bd``, ``W: [D + 2 S, hidden]``.

  ``mode='sum'`` is tensor2tensor's tied variant: the features are added
  element-wise before one projection, ``k = ReLU((f + sigma + [e_h; e_w]) W +
  b1) Wd + bd`` (``sigma`` only if ``std`` is given), ``W: [D, hidden]``, so
  ``2 S`` must equal ``D`` (an even ``D``; tensor2tensor fails otherwise).

  The paper does not say whether the MLP is shared by the heads; by default it
  is (as in tensor2tensor, which applies it to every head's ``D``-dim
  features), ``per_head=True`` gives every head its own ``W, b1, Wd, bd`` (a
  leading ``[heads]`` axis). Embeddings are shared by the heads in both cases.

  Parameters: ``height_embedding [max_area_height, S]``,
  ``width_embedding [max_area_width, S]``, ``hidden_kernel [(heads,) in,
  hidden]``, ``hidden_bias [(heads,) hidden]``, ``output_kernel [(heads,)
  hidden, D]``, ``output_bias [(heads,) D]`` (biases iff ``use_bias``); ``in =
  2 D + 2 S`` (concat with std), ``D + 2 S`` (concat without) or ``D`` (sum).

  Attributes:
    max_area_width: rows of the width embedding table.
    max_area_height: rows of the height embedding table.
    mode: ``'concat'`` (Eq. 9) or ``'sum'`` (tied variant).
    hidden_dim: width of the ReLU layer; ``None`` -> ``D`` (the paper's
      ``W1 in R^{D x D}`` reading, tensor2tensor's ``units=depth``).
    embedding_dim: ``S``, depth of each shape embedding; ``None`` -> ``D //
      2``; for ``'sum'`` only ``None`` or ``D / 2``.
    per_head: separate MLP parameters per head.
    use_bias: biases in both layers.
    dtype: compute dtype (``None``: inferred from inputs and params).
    param_dtype: parameter dtype.
    kernel_init: kernel initializer (fan-in of the whole ``in`` dimension).
    bias_init: bias initializer.
    embedding_init: shape-embedding initializer.
  """

  max_area_width: int
  max_area_height: int = 1
  mode: str = 'concat'
  hidden_dim: int | None = None
  embedding_dim: int | None = None
  per_head: bool = False
  use_bias: bool = True
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  @nn.compact
  def __call__(self, base: Array, std: Array | None, height: Array, width: Array) -> Array:
    """Computes area keys.

    Args:
      base: ``[batch, num_areas, heads, D]`` base feature ``f``.
      std: ``[batch, num_areas, heads, D]`` standard deviation ``sigma``, or
        ``None`` for a key without the std term.
      height: ``[num_areas]`` int area heights in ``1..max_area_height``.
      width: ``[num_areas]`` int area widths in ``1..max_area_width``.

    Returns:
      ``[batch, num_areas, heads, D]`` area keys.
    """
    owner = 'AreaKeyEncoder'
    v.check_choice(owner, 'mode', self.mode, ('concat', 'sum'))
    check_area_options(owner, self.max_area_width, self.max_area_height, 1)
    v.check_positive(owner, 'hidden_dim', self.hidden_dim, allow_none=True, integer=True)
    v.check_positive(owner, 'embedding_dim', self.embedding_dim, allow_none=True, integer=True)
    v.check_rank(owner, 'base', base, (4,), '[batch, num_areas, heads, depth]')
    if std is not None:
      v.check_rank(owner, 'std', std, (4,), '[batch, num_areas, heads, depth]')
      if std.shape != base.shape:
        raise ValueError(f'{owner}: std shape {std.shape} != base shape {base.shape}.')
    heads, depth = base.shape[2], base.shape[3]
    _check_embedding_dim(
        owner, 'embedding_dim', self.embedding_dim, 'mode', self.mode, self.mode, depth
    )
    emb_dim = self.embedding_dim or depth // 2
    hidden = self.hidden_dim or depth
    num_features = 2 if std is not None else 1
    in_dim = depth if self.mode == 'sum' else num_features * depth + 2 * emb_dim
    lead = (heads,) if self.per_head else ()

    e_h_table = self.param(
        'height_embedding', self.embedding_init, (self.max_area_height, emb_dim), self.param_dtype
    )
    e_w_table = self.param(
        'width_embedding', self.embedding_init, (self.max_area_width, emb_dim), self.param_dtype
    )
    w_in = self.param('hidden_kernel', self.kernel_init, lead + (in_dim, hidden), self.param_dtype)
    w_out = self.param('output_kernel', self.kernel_init, lead + (hidden, depth), self.param_dtype)
    b_in = b_out = None
    if self.use_bias:
      b_in = self.param('hidden_bias', self.bias_init, lead + (hidden,), self.param_dtype)
      b_out = self.param('output_bias', self.bias_init, lead + (depth,), self.param_dtype)
    base, std, e_h_table, e_w_table, w_in, w_out, b_in, b_out = nn.dtypes.promote_dtype(
        base, std, e_h_table, e_w_table, w_in, w_out, b_in, b_out, dtype=self.dtype
    )
    e_h = jnp.take(e_h_table, jnp.asarray(height) - 1, axis=0)  # [num_areas, S]
    e_w = jnp.take(e_w_table, jnp.asarray(width) - 1, axis=0)
    shape_emb = jnp.concatenate([e_h, e_w], -1)  # [num_areas, 2 S]

    if self.per_head:
      mm = lambda x, w: jnp.einsum('...hi,hio->...ho', x, w)
      mm_shape = lambda e, w: jnp.einsum('ai,hio->aho', e, w)  # [num_areas, heads, out]
    else:
      mm = lambda x, w: jnp.einsum('...i,io->...o', x, w)
      mm_shape = lambda e, w: jnp.einsum('ai,io->ao', e, w)[:, None, :]
    if self.mode == 'concat':  # [f; sigma; e] W as f W1 + sigma W2 + e W3
      pre = mm(base, w_in[..., :depth, :]) + mm_shape(
          shape_emb, w_in[..., in_dim - 2 * emb_dim :, :]
      )
      if std is not None:
        pre = pre + mm(std, w_in[..., depth : 2 * depth, :])
    else:  # (f + sigma + e) W as (f + sigma) W + e W: e is not broadcast to the batch
      pre = mm(base if std is None else base + std, w_in) + mm_shape(shape_emb, w_in)
    if b_in is not None:
      pre = pre + b_in
    out = mm(nn.relu(pre), w_out)
    if b_out is not None:
      out = out + b_out
    return out


class AreaAttention(nn.Module):
  """Multi-head area attention (Li et al., 2019), self- or cross-attention, 1D or 2D.

  Queries, keys and values are projected per head (``DenseGeneral`` named
  ``query``, ``key``, ``value``), every area of the memory gets a key (by
  ``key_mode``) and a value (by ``value_mode``) from the projected items,
  each query attends over the areas it may see, and the heads are projected
  back to ``out_features`` (``out``). ``max_area_width = max_area_height = 1``
  is ordinary multi-head attention.

  Key modes (``f`` is the base feature of the mode, ``sigma`` the std of the
  item keys, Eq. 5):

  ===================  =========================================  ==============
  key_mode             area key (``e = [e_h; e_w]``)              parameters
  ===================  =========================================  ==============
  'mean'               mean of item keys (Eq. 3, basic form)      none
  'max'                element-wise max of item keys              none
  'sample'             mean + sigma * eps (eps only in training)  none
  'concat'             ReLU([mean; sigma; e] W) Wd (Eq. 9)        AreaKeyEncoder
  'max_concat'         ReLU([max; e] W) Wd                        AreaKeyEncoder
  'sample_concat'      ReLU([sample; e] W) Wd                     AreaKeyEncoder
  'sum'                ReLU((mean + sigma + e) W) Wd              AreaKeyEncoder
  'sample_sum'         ReLU((sample + e) W) Wd                    AreaKeyEncoder
  'max_std_concat'     ReLU([max; sigma; e] W) Wd (Eq. 9, f=max)  AreaKeyEncoder
  'sample_std_concat'  ReLU([sample; sigma; e] W) Wd              AreaKeyEncoder
  'sample_std_sum'     ReLU((sample + sigma + e) W) Wd            AreaKeyEncoder
  ===================  =========================================  ==============

  (Biases ``b1``, ``bd`` omitted.) Every mode tensor2tensor's
  ``compute_area_key`` has (the first eight rows) computes what it computes
  there: no std in ``max_concat``, ``sample_concat``, ``sample_sum``; height
  and width embeddings ``head_dim // 2`` wide each, concatenated (so ``'sum'``
  modes need an even head dim); the MLP's hidden width is the head dim and it
  is shared by the heads. The ``*_std_*`` modes are Eq. 9 (which has sigma)
  with the other base features, names of our own.

  Sample noise ``eps ~ N(0, I)`` is reparameterised and drawn from the
  ``'dropout'`` rng stream only when ``deterministic=False``; at evaluation
  the sample is the mean. Value modes: ``'sum'`` (Eq. 4), ``'mean'``,
  ``'max'`` of the projected item values.

  Memories: ``inputs_kv`` ``[batch, kv_len, features]`` is a grid of
  ``memory_height`` rows stored row-major (``kv_len`` must be a multiple), or
  ``[batch, height, width, features]``, whose grid is taken from its shape
  (then ``memory_height`` must be 1 or ``height``). ``inputs_q`` may likewise
  be ``[batch, q_len, features]`` or ``[batch, height, width, features]``;
  the output has its layout with ``out_features`` channels. Positions in
  masks and causality are flattened row-major indices.

  Attributes:
    num_heads: number of heads.
    qkv_features: total query/key/value width (``None``: query features);
      must be divisible by ``num_heads``.
    out_features: output width (``None``: query features).
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of a flattened 2D memory (1: a sequence).
    key_mode: see the table.
    value_mode: ``'sum'``, ``'mean'`` or ``'max'``.
    causal: query ``i`` sees only areas whose items all have index ``<= i``
      (raster order in 2D; top-left aligned for cross-attention).
    dropout_rate: dropout on attention probabilities (rng ``'dropout'``).
    std_epsilon: variance floor inside the area std.
    area_key_hidden_dim: hidden width of the Eq. 9 MLP (``None``: head dim).
    area_embedding_dim: ``S``, width of each shape embedding (``None``: head
      dim // 2, as tensor2tensor; ``'sum'`` modes allow only that).
    per_head_area_key_params: one Eq. 9 MLP per head instead of a shared one.
    dtype: compute dtype (``None``: inferred); the softmax runs in float32.
    param_dtype: parameter dtype.
    kernel_init: projection kernel initializer.
    bias_init: projection bias initializer.
    use_bias: biases in the projections and the Eq. 9 MLP.
    decode: incremental decoding of causal 1D self-attention: the first call,
      on the full ``[batch, max_len, features]``, creates the ``'cache'``
      collection and returns the ordinary output; every later call takes one
      query ``[batch, 1, features]`` (``mask=None``, ``deterministic=True``)
      and attends over the areas ending at or before it (:meth:`_decode_step`).
      Non-causal (cross-attention over a fixed memory, e.g. the encoder
      output): the first call stores the memory's projected item keys and
      values (``cached_memory_key`` / ``cached_memory_value`` ``[batch,
      kv_len, heads, depth]``) and later calls read them instead of
      projecting the memory again; the areas and the mask are those of the
      ordinary call.
  """

  num_heads: int
  qkv_features: int | None = None
  out_features: int | None = None
  max_area_width: int = 1
  max_area_height: int = 1
  memory_height: int = 1
  key_mode: str = 'mean'
  value_mode: str = 'sum'
  causal: bool = False
  dropout_rate: float = 0.0
  std_epsilon: float = 1e-6
  area_key_hidden_dim: int | None = None
  area_embedding_dim: int | None = None
  per_head_area_key_params: bool = False
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  use_bias: bool = True
  decode: bool = False

  @nn.compact
  def __call__(
      self,
      inputs_q: Array,
      inputs_kv: Array | None = None,
      mask: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    """Applies area attention.

    Args:
      inputs_q: ``[batch, q_len, features]`` or ``[batch, h, w, features]``;
        ``batch`` may be 0 (an empty output).
      inputs_kv: memory, same layouts; ``None`` -> self-attention on
        ``inputs_q``.
      mask: item-level boolean mask broadcastable to
        ``[batch, num_heads, q_len, kv_len]`` (flattened positions), True = may
        attend.
      deterministic: no dropout and no sampling noise. Positional so that
        ``nn.remat(AreaAttention, static_argnums=(4,))`` can make it static.

    Returns:
      ``[batch, q_len, out_features]`` or ``[batch, h, w, out_features]`` (the
      layout of ``inputs_q``).
    """
    owner = 'AreaAttention'
    _check_config(
        owner,
        key_mode=self.key_mode,
        value_mode=self.value_mode,
        max_area_width=self.max_area_width,
        max_area_height=self.max_area_height,
        memory_height=self.memory_height,
        dropout_rate=self.dropout_rate,
        causal=self.causal,
        std_epsilon=self.std_epsilon,
    )
    v.check_positive(owner, 'num_heads', self.num_heads, integer=True)
    v.check_positive(owner, 'qkv_features', self.qkv_features, allow_none=True, integer=True)
    v.check_positive(owner, 'out_features', self.out_features, allow_none=True, integer=True)
    v.check_positive(
        owner, 'area_key_hidden_dim', self.area_key_hidden_dim, allow_none=True, integer=True
    )
    v.check_positive(
        owner, 'area_embedding_dim', self.area_embedding_dim, allow_none=True, integer=True
    )
    layouts = '[batch, length, features] or [batch, height, width, features]'
    v.check_rank(owner, 'inputs_q', inputs_q, (3, 4), layouts)
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    v.check_rank(owner, 'inputs_kv', inputs_kv, (3, 4), layouts)
    if inputs_kv.shape[0] != inputs_q.shape[0]:
      raise ValueError(
          f'{owner}: inputs_q batch {inputs_q.shape[0]} != inputs_kv batch '
          f'{inputs_kv.shape[0]}.'
      )

    q_shape = inputs_q.shape
    x_q = inputs_q.reshape((q_shape[0], math.prod(q_shape[1:-1]), q_shape[-1]))
    memory_height = self.memory_height
    if inputs_kv.ndim == 4:
      if memory_height not in (1, inputs_kv.shape[1]):
        raise ConfigError(
            f'{owner}.memory_height={memory_height!r} conflicts with the 2D memory '
            f'inputs_kv of shape {inputs_kv.shape} (height {inputs_kv.shape[1]}); use '
            f'memory_height=1 or {inputs_kv.shape[1]}.'
        )
      memory_height = inputs_kv.shape[1]
    x_kv = inputs_kv.reshape(
        (inputs_kv.shape[0], math.prod(inputs_kv.shape[1:-1]), inputs_kv.shape[-1])
    )
    batch, q_len, kv_len = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    _check_memory(
        owner,
        kv_len=kv_len,
        memory_height=memory_height,
        what='inputs_kv',
        mask=mask,
        attention_shape=(batch, self.num_heads, q_len, kv_len),
    )

    features = self.qkv_features or q_shape[-1]
    if features % self.num_heads:
      raise ConfigError(
          f'{owner}.qkv_features={features!r} is not divisible by ' f'num_heads={self.num_heads!r}.'
      )
    head_dim = features // self.num_heads
    out_features = self.out_features or q_shape[-1]
    learned = _LEARNED_KEYS.get(self.key_mode)
    if learned is not None:
      _check_embedding_dim(
          owner,
          'area_embedding_dim',
          self.area_embedding_dim,
          'key_mode',
          self.key_mode,
          learned.combine,
          head_dim,
      )

    dense = functools.partial(
        nn.DenseGeneral,
        features=(self.num_heads, head_dim),
        axis=-1,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        use_bias=self.use_bias,
    )
    query = dense(name='query')(x_q)
    if self.decode and not self.causal:  # a fixed memory: projected once, cached
      key, value = self._memory_keys_values(dense, x_kv)
    else:
      key, value = dense(name='key')(x_kv), dense(name='value')(x_kv)

    learned_key = None
    if learned is not None:
      encoder = AreaKeyEncoder(
          max_area_width=self.max_area_width,
          max_area_height=self.max_area_height,
          mode=learned.combine,
          hidden_dim=self.area_key_hidden_dim,
          embedding_dim=self.area_embedding_dim,
          per_head=self.per_head_area_key_params,
          use_bias=self.use_bias,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          kernel_init=self.kernel_init,
          bias_init=self.bias_init,
          name='area_key',
      )
      learned_key = lambda base, feats: encoder(
          base, feats.std if learned.std else None, feats.height, feats.width
      )
    sample_rng = dropout_rng = None  # drawn in this order, from the 'dropout' stream
    if _key_base(self.key_mode) == 'sample' and not deterministic:
      sample_rng = self.make_rng('dropout')
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng('dropout')
    cache = None
    if self.decode and self.causal:  # a cached step, or the call that creates the cache
      self._check_decode(x_q, x_kv, memory_height, mask, deterministic)
      cache = self._area_cache(key, value, self._steps_through_items(learned_key))
    if cache is not None:
      out = self._decode_step(cache, query, key, value, learned_key)
    else:
      out = _area_attention(
          query,
          key,
          value,
          mask,
          layout=area_layout(
              kv_len,
              max_area_width=self.max_area_width,
              max_area_height=self.max_area_height,
              memory_height=memory_height,
          ),
          causal=self.causal,
          key_mode=self.key_mode,
          value_mode=self.value_mode,
          std_epsilon=self.std_epsilon,
          sample_rng=sample_rng,
          dropout_rate=self.dropout_rate,
          dropout_rng=dropout_rng,
          learned_key=learned_key,
      )
    out = nn.DenseGeneral(
        features=out_features,
        axis=(-2, -1),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
        use_bias=self.use_bias,
        name='out',
    )(out)
    return out.reshape(q_shape[:-1] + (out_features,))

  # -- incremental decoding (decode=True) ------------------------------------

  def _memory_keys_values(self, dense, x_kv: Array) -> tuple[Array, Array]:
    """The fixed memory's item keys and values (``decode=True``, not causal):
    projected and stored by the first call, read by later ones."""
    if self.has_variable('cache', 'cached_memory_key'):
      return (
          self.get_variable('cache', 'cached_memory_key'),
          self.get_variable('cache', 'cached_memory_value'),
      )
    key, value = dense(name='key')(x_kv), dense(name='value')(x_kv)
    self.variable('cache', 'cached_memory_key', lambda: key)
    self.variable('cache', 'cached_memory_value', lambda: value)
    return key, value

  def _check_decode(self, x_q, x_kv, memory_height, mask, deterministic) -> None:
    """Raises unless this is causal 1D self-attention at inference."""
    owner = 'AreaAttention'
    if memory_height != 1 or self.max_area_height != 1:
      raise ConfigError(
          f'{owner}.decode=True with causal=True needs a 1D memory (memory_height=1, '
          f'max_area_height=1); got memory_height={memory_height!r}, '
          f'max_area_height={self.max_area_height!r}.'
      )
    if mask is not None or not deterministic or x_q.shape[1] != x_kv.shape[1]:
      raise ValueError(
          f'{owner}: decode=True is self-attention at inference: mask=None, '
          f'deterministic=True and as many queries as keys; got mask '
          f'{None if mask is None else jnp.shape(mask)}, deterministic={deterministic!r}, '
          f'{x_q.shape[1]} queries and {x_kv.shape[1]} keys.'
      )

  def _steps_through_items(self, learned_key) -> bool:
    """Whether a decoding step attends through the items (the basic form: mean
    keys, sum / mean values, :func:`_attend_through_items`) rather than over
    cached area features."""
    return learned_key is None and _is_linear_in_items(self.key_mode, self.value_mode, None)

  def _area_cache(self, key: Array, value: Array, through_items: bool) -> dict[str, Any] | None:
    """The ``'cache'`` of ``decode=True`` (W = ``max_area_width``, L = max_len),
    created by the first call (returns None then), else returned:

    * ``cached_key`` / ``cached_value`` ``[batch, heads, W - 1 + L, depth]``:
      the item keys / values, position t at ``W - 1 + t`` (W - 1 leading
      zeros, so the last W items are always a slice);
    * unless the step goes ``through_items`` (the basic form, which needs the
      items only): ``cached_area_key`` / ``cached_area_value`` ``[batch,
      heads, L * W, depth]``, the key and value of the area of width w ending
      at t in ``[:, :, t * W + w - 1]``;
    * ``cache_index``: the next position t.

    Heads-major, as :class:`~contextpool_jax.models.transformer.MultiHeadAttention`'s
    cache and for the same measured reason (the step's contractions read it
    in place, where ``[batch, L, heads, depth]`` made XLA transpose the whole
    cache at every step); the area cache is flat because a reshape of the
    updated cache made XLA:CPU duplicate the update and copy the cache every
    step.
    """
    width = self.max_area_width
    initialized = self.has_variable('cache', 'cache_index')
    b, length, heads, depth = key.shape
    zeros = lambda n, a: (lambda: jnp.zeros((b, heads, n, a.shape[3]), a.dtype))
    cache = {
        'cached_key': self.variable('cache', 'cached_key', zeros(width - 1 + length, key)),
        'cached_value': self.variable('cache', 'cached_value', zeros(width - 1 + length, value)),
        'cache_index': self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32)),
    }
    if not through_items:
      for name, a in (('cached_area_key', key), ('cached_area_value', value)):
        cache[name] = self.variable('cache', name, zeros(length * width, a))
    return cache if initialized else None

  def _decode_step(self, cache, query, key, value, learned_key) -> Array:
    """Area attention of the query at t = ``cache_index`` (``[batch, 1, heads,
    depth]``), its key and value appended to the cache; O(t W) work per step.

    The query attends over every area ending at or before t that starts at or
    after 0 (the causal area mask, :func:`_area_mask`). The basic form
    (:meth:`_steps_through_items`) does it through the cached items exactly as
    the full forward does (:func:`_attend_through_items` over the W - 1 + L
    cached items, areas over the leading zeros masked): the step reads t
    items, not t W areas. Otherwise the W areas that end at t (widths 1..W)
    get their features from the last W cached items, by the same
    :func:`compute_area_features` on a memory of W items (the areas of that
    memory whose last item is t), and their keys by the same key mode (Eq. 3 /
    Eq. 9); they are stored, and the query attends over the cached areas.
    """
    width = self.max_area_width
    t = cache['cache_index'].value
    # [b, n, heads, depth] -> [b, heads, n, depth], written at ``at``.
    put = lambda name, new, at: jax.lax.dynamic_update_slice_in_dim(
        cache[name].value, jnp.swapaxes(new, 1, 2).astype(cache[name].value.dtype), at, 2
    )
    cache['cached_key'].value = put('cached_key', key, width - 1 + t)
    cache['cached_value'].value = put('cached_value', value, width - 1 + t)
    cache['cache_index'].value = t + 1
    if self._steps_through_items(learned_key):
      items = area_layout(cache['cached_key'].value.shape[2], max_area_width=width)
      allowed = (items.col >= width - 1) & (items.last_index <= width - 1 + t)
      return _attend_through_items(
          query,
          cache['cached_key'].value,
          cache['cached_value'].value,
          allowed[None, None, None, :],
          layout=items,
          value_mode=self.value_mode,
          scale=None,
          dropout_rate=0.0,
          dropout_rng=None,
          heads_major=True,
      )

    last = lambda name: jnp.swapaxes(
        jax.lax.dynamic_slice_in_dim(cache[name].value, t, width, axis=2), 1, 2
    )
    layout = area_layout(width, max_area_width=width)
    ending = np.flatnonzero(layout.last_index == width - 1)  # widths 1..W, in order
    pick = lambda a: None if a is None else a[:, ending]

    def features(items, names):
      feats = compute_area_features(items, layout, features=names, std_epsilon=self.std_epsilon)
      return AreaFeatures(*(pick(a) for a in feats[:4]), feats.height[ending], feats.width[ending])

    key_feats = features(last('cached_key'), _key_features(self.key_mode))
    area_keys = _base_area_key(key_feats, self.key_mode, None)
    if learned_key is not None:
      area_keys = learned_key(area_keys, key_feats)
    area_values = getattr(features(last('cached_value'), (self.value_mode,)), self.value_mode)
    cache['cached_area_key'].value = put('cached_area_key', area_keys, t * width)
    cache['cached_area_value'].value = put('cached_area_value', area_values, t * width)

    length = cache['cached_area_key'].value.shape[2] // width
    start = jnp.arange(length)[:, None] - jnp.arange(width)[None, :]  # [L, W]
    allowed = (jnp.arange(length)[:, None] <= t) & (start >= 0)
    return _attend(
        query,
        cache['cached_area_key'].value,
        cache['cached_area_value'].value,
        allowed.reshape(1, 1, 1, length * width),
        scale=None,
        dropout_rate=0.0,
        dropout_rng=None,
        heads_major=True,
    )
