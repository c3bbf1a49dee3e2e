"""How the blockwise pooling visits blocks: which key blocks each query block
reads and in which order (causal and hard-window skipping, decided statically),
the Gaussian bound that skips more of them at run time, and the slicing and
padding of :class:`~.pool.Centres` / :class:`~.pool.Context` into blocks.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, NamedTuple, Optional, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.layers.context_pool.geometry import grid_coordinates
from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolRule
from contextpool_jax.base.numerics import MIN_TWO_VARIANCE

Array = jax.Array
Positions = TypeVar('Positions', Centres, Context)


class BlockSpec(NamedTuple):
  """Static description of a blockwise pooling (a ``custom_vjp`` nondiff arg).

  ``k_order[q]``: the key blocks query block q reads, in the order it reads
  them (:func:`key_block_order`; causal: none above the diagonal; fixed
  window: none out of reach).
  ``skip_nats``: None, or the Gaussian skipping margin (see
  :func:`skip_block`).
  """

  rule: PoolRule
  block_q: int
  block_k: int
  k_order: tuple[tuple[int, ...], ...]
  skip_nats: Optional[float] = None


# -- static: the key blocks each query block reads ----------------------------


def support_reach(rule: PoolRule) -> Optional[int]:
  """The largest flat-index distance of an input a centre can read (None:
  unbounded): a hard support of Euclidean radius R reaches
  ``|d flat index| <= R * sum of the axis strides``."""
  radius = {'fixed_window': rule.window, 'random_sparse': rule.support_span}.get(rule.locality)
  if radius is None:
    return None
  return radius * sum(math.prod(rule.spatial[a + 1 :]) for a in range(len(rule.spatial)))


def key_block_ranges(
    q_index: np.ndarray,
    block_q: int,
    block_k: int,
    num_k_blocks: int,
    causal: bool,
    reach: Optional[int],
) -> tuple[tuple[int, int], ...]:
  """Static key block range per query block (see :class:`BlockSpec`).

  ``reach``: the largest flat-index distance of a key a query can read (None:
  unbounded).
  """
  ranges = []
  for start in range(0, len(q_index), block_q):
    idx = q_index[start : start + block_q]
    lo, hi = 0, num_k_blocks
    if causal:
      hi = min(hi, int(idx.max()) // block_k + 1)
    if reach is not None:
      lo = max(lo, (int(idx.min()) - reach) // block_k)
      hi = min(hi, (int(idx.max()) + reach) // block_k + 1)
    ranges.append((lo, hi))
  return tuple(ranges)


def key_block_order(
    q_index: np.ndarray,
    block_q: int,
    block_k: int,
    ranges: Sequence[tuple[int, int]],
    near_first: bool,
) -> tuple[tuple[int, ...], ...]:
  """The key blocks each query block visits, in order (see :class:`BlockSpec`):
  its range (:func:`key_block_ranges`) in ascending order, or, ``near_first``
  (Gaussian skipping), by distance from the block holding the query block's
  median centre (causal: the diagonal block; ties: the earlier block first),
  so that the running maxima are good early and far blocks can be skipped."""
  order = []
  for qb, (lo, hi) in enumerate(ranges):
    blocks = range(lo, hi)
    if near_first:
      idx = q_index[qb * block_q : (qb + 1) * block_q]
      home = int(np.median(idx)) // block_k
      blocks = sorted(blocks, key=lambda kb: (abs(kb - home), kb))
    order.append(tuple(blocks))
  return tuple(order)


def visit_table(spec: BlockSpec) -> tuple[Array, Any]:
  """``(order [q_blocks, L] int32, counts)``: query block q visits key blocks
  ``order[q, :counts[q]]``, in that order (:func:`key_block_order`); ``counts``
  is a Python int when every query block visits as many."""
  counts = np.array([len(o) for o in spec.k_order], np.int32)
  order = np.zeros((len(spec.k_order), max(1, counts.max())), np.int32)
  for qb, blocks in enumerate(spec.k_order):
    order[qb, : len(blocks)] = blocks
  if (counts == counts[0]).all():
    return jnp.asarray(order), int(counts[0])
  return jnp.asarray(order), jnp.asarray(counts)


# -- run time: the Gaussian block skipping ------------------------------------


class SkipTables(NamedTuple):
  """What :func:`skip_block` bounds a key block's logits with.

  Attributes:
    max_log_w: ``[batch, k_blocks]`` float32 (:func:`block_max_log_w`).
    boxes: ``[k_blocks, ndim, 2]`` float32 (:func:`key_block_boxes`).
  """

  max_log_w: Array
  boxes: Array


def block_max_log_w(context: Context, block_k: int) -> Array:
  """``max_j a_j`` over the real inputs of each key block, ``[batch, n_pad / block_k]``
  float32: ``a_j = 0`` for uniform weights; ``-inf`` for a block without a real input."""
  batch, n_pad = context.valid.shape
  a = jnp.zeros((batch, n_pad), jnp.float32) if context.log_w is None else context.log_w
  a = jnp.where(context.valid, a.astype(jnp.float32), -jnp.inf)
  return jnp.max(a.reshape(batch, n_pad // block_k, block_k), axis=-1)


def key_block_boxes(spatial: Sequence[int], block_k: int, num_k_blocks: int) -> np.ndarray:
  """Bounding box of each key block's real positions on the grid: ``[num_k_blocks,
  ndim, 2]`` float32 (lowest, highest coordinate per axis)."""
  n = math.prod(spatial)
  boxes = np.zeros((num_k_blocks, len(spatial), 2), np.float32)
  for kb in range(num_k_blocks):
    index = np.arange(kb * block_k, min((kb + 1) * block_k, n))
    coords = np.stack(grid_coordinates(index, spatial))  # [ndim, positions]
    boxes[kb, :, 0], boxes[kb, :, 1] = coords.min(axis=1), coords.max(axis=1)
  return boxes


def skip_tables(spec: BlockSpec, context: Context) -> Optional[SkipTables]:
  """The :class:`SkipTables` of a padded context, or None when the Gaussian
  skipping is off (``spec.skip_nats`` is None)."""
  if spec.skip_nats is None:
    return None
  bk = spec.block_k
  max_log_w = block_max_log_w(context, bk)
  boxes = jnp.asarray(key_block_boxes(spec.rule.spatial, bk, context.valid.shape[1] // bk))
  return SkipTables(max_log_w, boxes)


def skip_block(
    spec: BlockSpec,
    q: Centres,
    kb: Array,
    row_max: Array,
    max_log_w: Array,
    boxes: Array,
) -> Array:
  """Gaussian block skipping: whether key block ``kb`` is left out for the query
  block ``q`` (a scalar bool, for the whole batch).

  Every logit of the block (``locality='gaussian'``, query-independent
  weights) is at most ``u_i = max_j a_j - dmin_i^2 / (2 sigma_i^2)``, ``dmin_i``
  the distance from centre i to the block's bounding box (``boxes [k_blocks,
  ndim, 2]``, ``max_log_w [batch, k_blocks]`` from :func:`block_max_log_w`).
  The block is skipped when ``u_i < row_max_i - skip_nats`` for every real
  centre of every example (``row_max [batch, Bq]``: the running maximum in the
  forward pass, the final one in the backward pass, which is larger, so the
  backward skips at least the blocks the forward skipped). Each skipped term
  is then below ``exp(-skip_nats)`` times the row's largest term, which is
  never skipped, so the skipped share of a row's softmax mass is at most
  ``n exp(-skip_nats)`` (n inputs) and each output moves by at most
  ``2 max_j |x_j| n exp(-skip_nats)``. Causal: a key block reaching past the
  query block's first centre is never skipped, so that the decision never
  reads a later input.
  """
  assert q.sigma is not None and spec.skip_nats is not None  # set where blocks are skipped
  coords = grid_coordinates(jnp.asarray(q.index), spec.rule.spatial)
  box = boxes[kb]  # [ndim, 2]
  gaps = [
      jnp.maximum(
          jnp.maximum(box[a, 0] - c.astype(jnp.float32), c.astype(jnp.float32) - box[a, 1]), 0.0
      )
      for a, c in enumerate(coords)
  ]
  d2 = functools.reduce(operator.add, [jnp.square(g) for g in gaps])  # [Bq]
  bound = max_log_w[:, kb][:, None] - d2[None, :] / (2.0 * jnp.square(q.sigma) + MIN_TWO_VARIANCE)
  skip = jnp.all(~q.valid | (bound < row_max - spec.skip_nats))
  if spec.rule.causal:
    skip = skip & ((kb + 1) * spec.block_k - 1 <= jnp.min(jnp.asarray(q.index)))
  return skip


def unless_skipped(spec, tables, q, kb, row_max, compute, skipped, operand):
  """``compute(operand)`` for key block ``kb`` of query block ``q``, or
  ``skipped(operand)`` where the Gaussian skipping (:func:`skip_block` with
  ``tables``, None: off) leaves the block out; ``row_max [batch, Bq]``."""
  if tables is None:
    return compute(operand)
  skip = skip_block(spec, q, kb, row_max, tables.max_log_w, tables.boxes)
  return jax.lax.cond(skip, skipped, compute, operand)


# -- blocks of positions ------------------------------------------------------


def take_slice(a: Array, start: Array, size: int, axis: int = 1) -> Array:
  """``a[start : start + size]`` along ``axis`` (a traced start)."""
  return jax.lax.dynamic_slice_in_dim(a, start, size, axis)


def positions(t: Positions, start: Array, size: int) -> Positions:
  """Positions ``start .. start + size - 1`` of a :class:`Centres` or
  :class:`Context`: ``index`` along its axis 0, every other array along axis 1."""
  return type(t)._make(
      None if a is None else take_slice(a, start, size, 0 if name == 'index' else 1)
      for name, a in zip(t._fields, t)
  )


def pad_positions(t: Positions, size: int, fill: dict[str, float]) -> Positions:
  """A :class:`Centres` or :class:`Context` padded to ``size`` positions:
  ``index`` repeats its last entry, every other array gets ``fill.get(name, 0)``
  (False for ``valid``, so the padding is never pooled)."""

  def pad(name, a):
    if a is None:
      return None
    if name == 'index':
      a = jnp.asarray(a, jnp.int32)
      return jnp.pad(a, (0, size - a.shape[0]), mode='edge')
    widths = [(0, 0), (0, size - a.shape[1])] + [(0, 0)] * (a.ndim - 2)
    return jnp.pad(a, widths, constant_values=fill.get(name, 0))

  return type(t)._make(pad(name, a) for name, a in zip(t._fields, t))
