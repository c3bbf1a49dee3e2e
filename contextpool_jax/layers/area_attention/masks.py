"""Item-level masks and causality as area-level masks.

An area may be attended by a query iff every one of its items may be (the
paper only says padding must not enter areas; this is the general rule).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import area_layout
from contextpool_jax.layers.area_attention.areas import area_sums
from contextpool_jax.layers.area_attention.areas import check_area_options
from contextpool_jax.layers.area_attention.validate import check_memory

Array = jax.Array


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
  check_memory(
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
  return area_mask(mask, layout, q_len, causal)


def area_mask(mask: Array | None, layout: AreaLayout, q_len: int, causal: bool) -> Array | None:
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
