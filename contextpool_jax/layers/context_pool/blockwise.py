"""``implementation='blockwise'``: Eq. 4 without the ``[batch, m, n]`` pooling
matrix, flash-attention style.

Every variant's ``l_ij`` is a query term plus a key term plus a function of the
two positions, so Eq. 4 is an attention with one head. Queries and keys go in
blocks (:mod:`.blocks` says which key blocks each query block visits); the
forward pass keeps an online (running max / running sum) float32 softmax, and a
``jax.custom_vjp`` backward pass recomputes each block's probabilities from the
saved per-row (max, sum) and differentiates the block's logits
(:func:`~.pool.pool_block` again) with ``jax.vjp``. Memory per example is
O((m + n) d + block_size^2).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.layers.context_pool.blocks import BlockSpec
from contextpool_jax.layers.context_pool.blocks import Positions
from contextpool_jax.layers.context_pool.blocks import SkipTables
from contextpool_jax.layers.context_pool.blocks import key_block_order
from contextpool_jax.layers.context_pool.blocks import key_block_ranges
from contextpool_jax.layers.context_pool.blocks import pad_positions
from contextpool_jax.layers.context_pool.blocks import positions
from contextpool_jax.layers.context_pool.blocks import skip_tables
from contextpool_jax.layers.context_pool.blocks import support_reach
from contextpool_jax.layers.context_pool.blocks import take_slice
from contextpool_jax.layers.context_pool.blocks import unless_skipped
from contextpool_jax.layers.context_pool.blocks import visit_table
from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolInputs
from contextpool_jax.layers.context_pool.pool import PoolRule
from contextpool_jax.layers.context_pool.pool import drop
from contextpool_jax.layers.context_pool.pool import pool_block
from contextpool_jax.base.numerics import NEG_INF

Array = jax.Array

# Default ContextPool.gaussian_skip_nats: exp(-18) = 1.5e-8 is below float32's
# half-ulp (6e-8), so a skipped term is below the rounding of its row's largest.
GAUSSIAN_SKIP_NATS = 18.0

# The fields pool_block differentiates (the features x are differentiated by hand).
_CENTRE_GRADS = ('sigma', 'theta')
_CONTEXT_GRADS = ('log_w', 'phi')


def pool_blockwise(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float] = None
) -> Array:
  """``implementation='blockwise'``: :func:`_blockwise_pool` on the inputs padded
  to whole blocks. Returns ``[batch, m, features]`` in x's dtype.

  The context is the whole input in order (``context.index = arange(n)``) and
  ``centres.index`` is static (numpy): the key blocks each query block reads
  are computed from them at trace time. ``skip_nats``: the Gaussian block
  skipping margin (:func:`~.blocks.skip_block`), used with
  ``locality='gaussian'`` and query-independent weights only; None: no
  skipping.
  """
  spec, padded = _blockwise_setup(rule, block_size, inputs, skip_nats)
  m = len(inputs.centres.index)
  return _blockwise_pool(spec, padded)[:, :m].astype(inputs.context.x.dtype)


def blockwise_visits(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float] = None
) -> tuple[Array, int]:
  """``(visited, planned)``: the number of (query block, key block) pairs the
  blockwise forward pass computes, and the number it would without the
  Gaussian skipping (after the static causal / window skipping). For
  benchmarks and tests; the arguments are :func:`pool_blockwise`'s."""
  spec, padded = _blockwise_setup(rule, block_size, inputs, skip_nats)
  return _forward_pass(spec, padded)[3], sum(len(o) for o in spec.k_order)


def _blockwise_setup(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float]
) -> tuple[BlockSpec, PoolInputs]:
  """The :class:`~.blocks.BlockSpec` of a blockwise pooling and its inputs
  padded to whole blocks."""
  centres, context = inputs.centres, inputs.context
  m, n = len(centres.index), len(context.index)
  block_q, block_k = min(block_size, m), min(block_size, n)
  m_pad, n_pad = -(-m // block_q) * block_q, -(-n // block_k) * block_k
  if rule.locality != 'gaussian' or centres.theta is not None:
    skip_nats = None  # only the Gaussian bound with query-independent weights
  q_index = np.asarray(centres.index)
  ranges = key_block_ranges(
      q_index, block_q, block_k, n_pad // block_k, rule.causal, support_reach(rule)
  )
  spec = BlockSpec(
      rule=rule,
      block_q=block_q,
      block_k=block_k,
      k_order=key_block_order(q_index, block_q, block_k, ranges, skip_nats is not None),
      skip_nats=None if skip_nats is None else float(skip_nats),
  )
  padded = PoolInputs(
      pad_positions(centres, m_pad, {'sigma': 1.0}),
      pad_positions(context, n_pad, {}),
      inputs.dropout_seeds,
  )
  return spec, padded


class _Visits(NamedTuple):
  """Which key blocks each query block visits (``order [q_blocks, L]``, the
  first ``counts`` of a row: :func:`~.blocks.visit_table`), and the tables of
  the Gaussian skipping (None: off)."""

  order: Array
  counts: Any
  skip: Optional[SkipTables]


def _plan_visits(spec: BlockSpec, context: Context) -> _Visits:
  order, counts = visit_table(spec)
  return _Visits(order, counts, skip_tables(spec, context))


def _num_visits(visits: _Visits, qb: Array) -> Any:
  """How many key blocks query block ``qb`` visits."""
  return visits.counts if isinstance(visits.counts, int) else visits.counts[qb]


# -- the custom VJP -----------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise_pool(spec: BlockSpec, inputs: PoolInputs) -> Array:
  """``y [batch, m_pad, features]`` float32 = Eq. 4, block by block.

  ``inputs`` is padded to whole blocks: ``m_pad`` centres and ``n_pad`` inputs
  (the padding invalid). Each (query block, key block) is a :func:`~.pool.pool_block`.
  """
  return _blockwise_forward(spec, inputs)[0]


def _blockwise_forward(spec, inputs):
  y, row_max, row_sum, _ = _forward_pass(spec, inputs)
  return y, (inputs, y, row_max, row_sum)


# -- forward: the online softmax ----------------------------------------------


def _forward_pass(spec: BlockSpec, inputs: PoolInputs):
  """The online softmax: ``(y, row_max, row_sum, visited)``, ``y [batch, m_pad,
  features]``, the row statistics ``[batch, m_pad]`` float32 and ``visited``
  the number of key blocks computed (int32)."""
  centres, context, _ = inputs
  batch, m_pad = centres.valid.shape
  visits = _plan_visits(spec, context)
  init = (
      jnp.zeros((batch, m_pad, context.x.shape[-1]), jnp.float32),
      jnp.zeros((batch, m_pad), jnp.float32),
      jnp.zeros((batch, m_pad), jnp.float32),
      jnp.zeros((), jnp.int32),
  )
  query_block = functools.partial(_forward_query_block, spec, inputs, visits)
  return jax.lax.fori_loop(0, m_pad // spec.block_q, query_block, init)


def _forward_query_block(spec: BlockSpec, inputs: PoolInputs, visits: _Visits, qb, carry):
  """Query block ``qb``: its key blocks folded into the online softmax, its
  outputs and final row statistics written into ``carry``."""
  centres, context, dropout_seeds = inputs
  y_all, max_all, sum_all, visited = carry
  bq = spec.block_q
  q0 = qb * bq
  q = positions(centres, q0, bq)
  visit = functools.partial(_visit_key_block, spec, q, context, dropout_seeds)

  def key_block(t, state):
    kb = visits.order[qb, t]
    return unless_skipped(
        spec, visits.skip, q, kb, state[0], functools.partial(visit, kb), lambda s: s, state
    )

  batch, features = centres.valid.shape[0], context.x.shape[-1]
  init = (
      jnp.full((batch, bq), NEG_INF, jnp.float32),
      jnp.zeros((batch, bq), jnp.float32),
      jnp.zeros((batch, bq, features), jnp.float32),
      visited,
  )
  row_max, row_sum, acc, visited = jax.lax.fori_loop(0, _num_visits(visits, qb), key_block, init)
  y = acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]
  put = lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, u, q0, 1)
  return put(y_all, y), put(max_all, row_max), put(sum_all, row_sum), visited


def _visit_key_block(spec: BlockSpec, q: Centres, context: Context, dropout_seeds, kb, state):
  """One key block ``kb`` of the online softmax: ``state = (row_max [batch, Bq],
  row_sum [batch, Bq], acc [batch, Bq, features], visited)`` one block on."""
  row_max, row_sum, acc, visited = state
  bk = spec.block_k
  k = positions(context, kb * bk, bk)
  block = pool_block(spec.rule, q, k, dropout_seeds)
  # Forward values: the hard window is exactly in_window (the STE only
  # changes gradients), so the support is allowed & in_window.
  support = block.allowed if block.in_window is None else block.allowed & block.in_window
  new_max = jnp.maximum(row_max, jnp.max(jnp.where(support, block.logits, NEG_INF), axis=-1))
  # min(., 0): XLA may evaluate the logits twice, with different rounding,
  # for the max and for the exponent; a huge transient max (a tiny sigma,
  # before the block holding the centre) must not overflow exp.
  e = jnp.exp(jnp.where(support, jnp.minimum(block.logits - new_max[..., None], 0.0), NEG_INF))
  rescale = jnp.exp(row_max - new_max)
  row_sum = row_sum * rescale + jnp.sum(e, axis=-1)
  e = drop(e, block.keep, spec.rule.dropout_rate)
  acc = acc * rescale[..., None] + jnp.einsum(
      'bmn,bnd->bmd', e.astype(k.x.dtype), k.x, preferred_element_type=jnp.float32
  )
  return new_max, row_sum, acc, visited + 1


# -- backward: recomputed blocks ----------------------------------------------


class _Rows(NamedTuple):
  """A query block's rows in the backward pass, ``[batch, Bq(, features)]``:
  the output gradient (float32 and in x's dtype), ``delta_i = dy_i . y_i``, the
  final row max and the softmax denominator."""

  dy: Array
  dy_x: Array
  delta: Array
  row_max: Array
  denom: Array


def _fields(t: NamedTuple, names: Sequence[str]) -> tuple[Any, ...]:
  return tuple(getattr(t, name) for name in names)


def _zeros(tree):
  return jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), tree)


def _blockwise_backward(spec: BlockSpec, residuals, dy):
  inputs, y, row_max, row_sum = residuals
  centres, context, _ = inputs
  x = context.x
  visits = _plan_visits(spec, context)
  dy = dy.astype(jnp.float32)
  # sum_j p_ij dp_ij = dy_i . y_i (dropout included: y is the dropped-out output).
  delta = jnp.sum(dy * y, axis=-1)
  denom = jnp.where(row_sum > 0, row_sum, 1.0)
  query_block = functools.partial(
      _backward_query_block, spec, inputs, visits, (dy, delta, row_max, denom)
  )
  centre_grads, context_grads = _fields(centres, _CENTRE_GRADS), _fields(context, _CONTEXT_GRADS)
  init = (_zeros(centre_grads), _zeros(context_grads), jnp.zeros(x.shape, jnp.float32))
  dq, dk, dx = jax.lax.fori_loop(0, centres.valid.shape[1] // spec.block_q, query_block, init)
  cast = lambda grads, like: jax.tree.map(lambda g, a: g.astype(a.dtype), grads, like)
  # Integer and boolean inputs (positions, validity, dropout seeds) get None.
  d_centres = _cotangent(Centres, dict(zip(_CENTRE_GRADS, cast(dq, centre_grads))))
  d_context = _cotangent(
      Context, {'x': dx.astype(x.dtype), **dict(zip(_CONTEXT_GRADS, cast(dk, context_grads)))}
  )
  return (PoolInputs(d_centres, d_context, None),)


def _cotangent(cls: type[Positions], grads: dict[str, Any]) -> Positions:
  """A :class:`Centres` or :class:`Context` of ``grads``, None in its other fields."""
  return cls._make(grads.get(name) for name in cls._fields)


_blockwise_pool.defvjp(_blockwise_forward, _blockwise_backward)


def _backward_query_block(spec: BlockSpec, inputs: PoolInputs, visits: _Visits, rows, qb, carry):
  """Query block ``qb``: the gradients of its centres, and its key blocks'
  contributions to the context's gradients, added into ``carry = (d centres,
  d context, dx)``. ``rows``: ``(dy, delta, row_max, denom)`` of every row."""
  centres, context, dropout_seeds = inputs
  dq_all, dk_all, dx_all = carry
  bq, bk = spec.block_q, spec.block_k
  q0 = qb * bq
  q = positions(centres, q0, bq)
  dy, delta, row_max, denom = (take_slice(a, q0, bq) for a in rows)
  rows_q = _Rows(dy, dy.astype(context.x.dtype), delta, row_max, denom)

  def block_grads(kb):
    return _block_grads(spec, q, positions(context, kb * bk, bk), rows_q, dropout_seeds)

  def key_block(t, state):
    dq, dk_all, dx_all = state
    kb = visits.order[qb, t]
    # The blocks the forward pass skipped (and possibly more: the final row
    # max is at least the running one) add nothing here either.
    skipped = lambda kb: _zeros(jax.eval_shape(block_grads, kb))
    dq_blk, dk_blk, dx = unless_skipped(
        spec, visits.skip, q, kb, rows_q.row_max, block_grads, skipped, kb
    )
    k0 = kb * bk
    add = lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, take_slice(a, k0, bk) + u, k0, 1)
    return jax.tree.map(jnp.add, dq, dq_blk), jax.tree.map(add, dk_all, dk_blk), add(dx_all, dx)

  init = (_zeros(_fields(q, _CENTRE_GRADS)), dk_all, dx_all)
  dq, dk_all, dx_all = jax.lax.fori_loop(0, _num_visits(visits, qb), key_block, init)
  dq_all = jax.tree.map(lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, u, q0, 1), dq_all, dq)
  return dq_all, dk_all, dx_all


def _differentiable_block(
    rule: PoolRule, centres: Centres, context: Context, dropout_seeds: Optional[Array]
):
  """``jax.vjp`` of :func:`~.pool.pool_block` in the fields it differentiates:
  ``((logits, soft_window), vjp, (allowed, in_window, keep))``."""

  def block(centre_grads, context_grads):
    out = pool_block(
        rule,
        centres._replace(**dict(zip(_CENTRE_GRADS, centre_grads))),
        context._replace(**dict(zip(_CONTEXT_GRADS, context_grads))),
        dropout_seeds,
    )
    return (out.logits, out.soft_window), (out.allowed, out.in_window, out.keep)

  return jax.vjp(
      block, _fields(centres, _CENTRE_GRADS), _fields(context, _CONTEXT_GRADS), has_aux=True
  )


def _block_grads(spec: BlockSpec, q: Centres, k: Context, rows: _Rows, dropout_seeds):
  """Gradients of one (query block, key block): ``(d centres, d context, dx
  block)``, the centres' and context's differentiated fields in float32."""
  rate = spec.rule.dropout_rate
  (logits, soft), logits_vjp, (allowed, in_window, keep) = _differentiable_block(
      spec.rule, q, k, dropout_seeds
  )
  # masked_pool's probabilities, from the final row max and sum. Inside
  # the support logits <= max, so min(., 0) only changes rounding there;
  # outside the hard window it is masked_pool's clamp.
  shifted = jnp.minimum(logits - rows.row_max[..., None], 0.0)
  ex = jnp.exp(jnp.where(allowed, shifted, NEG_INF))
  e = ex if in_window is None else jnp.where(in_window, ex, 0.0)
  p = drop(e / rows.denom[..., None], keep, rate)
  dp = drop(
      jnp.einsum('bmd,bnd->bmn', rows.dy_x, k.x, preferred_element_type=jnp.float32), keep, rate
  )
  dx = jnp.einsum('bmn,bmd->bnd', p, rows.dy)
  # p = e / sum(e): d/de_ij = (dp_ij - delta_i) / sum_i.
  de = (dp - rows.delta[..., None]) / rows.denom[..., None]
  d_logits = de * e  # e = exp(logits - max) where it is not 0
  d_soft = None if soft is None else de * ex  # the STE: e = ex * window
  dq_blk, dk_blk = logits_vjp((d_logits, d_soft))
  f32 = lambda tree: jax.tree.map(lambda u: u.astype(jnp.float32), tree)
  return f32(dq_blk), f32(dk_blk), dx
