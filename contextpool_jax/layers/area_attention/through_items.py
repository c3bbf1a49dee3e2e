"""The basic form's fast path: area attention computed from item logits.

With mean area keys and sum / mean area values (Eq. 3-4) both are linear in
the items, so the attention needs no area keys or values: the matrix products
are ordinary attention's and only the softmax runs over the areas.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import pad_areas
from contextpool_jax.layers.area_attention.areas import padded_area_sums
from contextpool_jax.layers.area_attention.areas import padded_area_sums_transpose
from contextpool_jax.layers.area_attention.areas import padded_area_valid
from contextpool_jax.layers.area_attention.attend import dropout
from contextpool_jax.layers.area_attention.attend import dropout_keep
from contextpool_jax.layers.area_attention.attend import logit_scale
from contextpool_jax.base.numerics import masked_softmax

Array = jax.Array

# Queries per block of :func:`attend_through_items`: its per-block arrays
# ``[batch, heads, block, num_shapes * kv_len]`` stay cache-sized (batch 4, 8
# heads, kv_len 256, width 5: 5 MiB) instead of being written to and read back
# from memory; 16 and 64 were slower on the CPU (benchmarks/area_speed.py).
QUERY_BLOCK = 32


def attend_through_items(
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
  the dropout are those of :func:`~.attend.attend` (the same draws, :func:`pad_areas`
  of ``[..., num_areas]``), the probabilities are summed back onto the items
  they cover by the transpose, and one ``[q_len, kv_len]`` product with the
  item values gives the output. The matrix products are ordinary
  attention's (``kv_len`` columns, not ``num_areas``); only the softmax runs
  over the areas, and the backward pass maps gradients between items and areas
  with the same window sums (no gathers, no scatters).

  Queries are processed in blocks of ``QUERY_BLOCK`` (``lax.map``) and each
  block is rematerialised in the backward pass (``jax.checkpoint``): the
  per-area arrays of a block stay in cache and none of ``[q_len, areas]``
  size is ever stored, so memory is that of ordinary attention plus a block.
  Equal to :func:`~.attend.attend` on the area features up to float32 rounding (the
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
  scale = logit_scale(query, scale)
  sizes = [h * w for h, w in layout.shapes]
  block = functools.partial(
      _items_block,
      key=key,
      value=value,
      layout=layout,
      key_weights=[scale / s for s in sizes],
      value_weights=[1.0 / s for s in sizes] if value_mode == 'mean' else None,
      valid=jnp.asarray(padded_area_valid(layout)),
      dropout_rate=dropout_rate,
      kv=kv,
  )
  lead = query.shape[0], query.shape[1], query.shape[2]
  per_query = _per_query_inputs(area_mask, layout, dropout_rng, dropout_rate, lead)
  return _map_query_blocks(block, query, per_query)


def _per_query_inputs(
    area_mask: Optional[Array],
    layout: AreaLayout,
    dropout_rng: Optional[Array],
    dropout_rate: float,
    lead: tuple[int, int, int],
) -> tuple[Optional[Array], Optional[Array]]:
  """``(mask, keep)``: the area mask and the dropout draw of the probabilities
  (the same draw as :func:`~.attend.attend`'s), each in the padded area layout
  ``[batch, heads, q_len or 1, padded areas]`` (:func:`pad_areas`), or None.
  ``lead``: the query's ``(batch, q_len, heads)``."""
  mask = keep = None
  if area_mask is not None:
    area_mask = area_mask.reshape((1,) * (4 - area_mask.ndim) + area_mask.shape)
    mask = pad_areas(area_mask, layout, 3, False)
  batch, q_len, heads = lead
  drawn = dropout_keep(dropout_rng, dropout_rate, (batch, heads, q_len, layout.num_areas))
  if drawn is not None:
    keep = pad_areas(drawn, layout, 3, False)
  return mask, keep


def _items_block(
    q: Array,
    mask: Optional[Array],
    keep: Optional[Array],
    *,
    key: Array,
    value: Array,
    layout: AreaLayout,
    key_weights: list[float],
    value_weights: Optional[list[float]],
    valid: Array,
    dropout_rate: float,
    kv: str,
) -> Array:
  """The attention of a block of queries ``q [batch, Bq, heads, depth]``: item
  logits summed into area logits, the masked softmax and dropout over the
  areas, the probabilities summed back onto the items, one product with the
  item values."""
  item_logits = jnp.einsum(f'bqhd,{kv}->bhqk', q, key, preferred_element_type=jnp.float32)
  grid = item_logits.reshape(item_logits.shape[:3] + (layout.grid_height, layout.grid_width))
  logits = padded_area_sums(grid, layout, 3, key_weights)
  allowed = valid if mask is None else jnp.logical_and(valid, mask)
  probs = dropout(masked_softmax(logits, allowed), keep, dropout_rate)
  item_probs = padded_area_sums_transpose(probs, layout, 3, value_weights)
  item_probs = item_probs.reshape(item_logits.shape)
  return jnp.einsum(f'bhqk,{kv}->bqhd', item_probs.astype(value.dtype), value)


def _map_query_blocks(
    block: Callable[..., Array], query: Array, per_query: tuple[Optional[Array], ...]
) -> Array:
  """``block(query, *per_query)`` over blocks of ``QUERY_BLOCK`` queries
  (``lax.map``, each block rematerialised in the backward pass), the queries
  padded to whole blocks. A per-query input broadcast over the queries (q_len
  1) is shared by every block."""
  batch, q_len = query.shape[:2]
  num_blocks = -(-q_len // QUERY_BLOCK)
  if num_blocks <= 1:
    return block(query, *per_query)
  rows = num_blocks * QUERY_BLOCK

  def blocks(x: Array, axis: int) -> Array:
    """``x`` padded to ``rows`` along ``axis``, split into blocks, the block index first."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, rows - q_len)
    x = jnp.pad(x, pad)
    x = x.reshape(x.shape[:axis] + (num_blocks, QUERY_BLOCK) + x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)

  blocked = tuple(None if x is None or x.shape[2] != q_len else blocks(x, 2) for x in per_query)
  shared = tuple(x if b is None else None for b, x in zip(blocked, per_query))

  @jax.checkpoint
  def step(xs: tuple[Array, tuple[Optional[Array], ...]]) -> Array:
    q, inputs = xs
    return block(q, *(s if b is None else b for b, s in zip(inputs, shared)))

  out = jax.lax.map(step, (blocks(query, 1), blocked))  # [blocks, batch, block, heads, dv]
  out = jnp.moveaxis(out, 0, 1).reshape((batch, rows) + out.shape[3:])
  return out[:, :q_len]
