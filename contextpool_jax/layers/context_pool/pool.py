"""Eq. 4 on a block of centres x inputs, and the dense pooling.

:func:`pool_block` is the one place that builds the logits ``l_ij`` and their
support for every weights x locality variant: the dense path is one block of
everything (:func:`pool_dense`), the blockwise path (:mod:`.blockwise`) visits
blocks, the sown weights are a block without locality (:func:`pool_weights`)
and a decoding step is a block of one centre. The per-call arrays travel as
one :class:`PoolInputs` (its :class:`Centres` and :class:`Context`); what the
module's fields say about a pair is a static :class:`PoolRule`.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.layers.context_pool.geometry import grid_coordinates
from contextpool_jax.layers.context_pool.geometry import squared_distances
from contextpool_jax.layers.context_pool.randomness import dropout_keep
from contextpool_jax.layers.context_pool.randomness import random_support
from contextpool_jax.base.numerics import MIN_TWO_VARIANCE
from contextpool_jax.base.numerics import NEG_INF
from contextpool_jax.base.numerics import masked_softmax

Array = jax.Array


class PoolRule(NamedTuple):
  """What the module's fields say about a pair (centre i, input j); static and
  hashable (part of the blockwise custom VJP's non-differentiable argument).

  Attributes:
    spatial: the input grid, ``(length,)`` or ``(height, width)``; positions
      are its row-major flat indices.
    causal: only inputs ``j <= i`` are pooled.
    locality: ``'gaussian' | 'none' | 'fixed_window' | 'adaptive_window' |
      'random_sparse'``.
    window: radius (tokens) of the ``'fixed_window'`` support.
    window_softness: width (tokens) of the adaptive window's sigmoid edge.
    support_seed: uint32 seed of the ``'random_sparse'`` support.
    support_prob: keep probability K / M of the ``'random_sparse'`` support
      (:func:`support_probability`); 1.0 for the other localities.
    support_span: radius of the ``'random_sparse'`` support.
    dropout_rate: dropout on the pooling weights; 0.0 when it is off.
  """

  spatial: tuple[int, ...]
  causal: bool
  locality: str
  window: int
  window_softness: float
  support_seed: int
  support_prob: float
  support_span: int
  dropout_rate: float


class Centres(NamedTuple):
  """The centres i of a block: all m of them, a block of them, or one.

  Attributes:
    index: ``[Bq]`` int, the flat input position of each centre (shared by the
      batch). The module passes a numpy array: the blockwise path reads it at
      trace time to skip key blocks.
    valid: ``[batch, Bq]`` bool; False: a padded centre, pooling nothing.
    sigma: ``[batch, Bq]`` float32 Gaussian std or adaptive window radius in
      tokens; None for localities without a learned size.
    theta: ``[batch, Bq, k]`` non-local queries ``W^theta x_i`` (Eq. 3); None
      unless ``weights='nonlocal'``.
  """

  index: Any
  valid: Array
  sigma: Optional[Array] = None
  theta: Optional[Array] = None


class Context(NamedTuple):
  """The inputs j a block pools over, by position and features.

  Attributes:
    index: ``[Bk]`` int flat input positions.
    valid: ``[batch, Bk]`` bool; False: padding, never pooled.
    x: ``[batch, Bk, features]``, the features pooled.
    log_w: ``[batch, Bk]`` float32 log pooling weights a_j; None for uniform
      weights (a_j = 0) and non-local ones.
    phi: ``[batch, Bk, k]`` non-local keys ``W^phi x_j`` (Eq. 3); None unless
      ``weights='nonlocal'``.
  """

  index: Any
  valid: Array
  x: Array
  log_w: Optional[Array] = None
  phi: Optional[Array] = None


class PoolInputs(NamedTuple):
  """Every per-call array of one pooling (a pytree): its centres, its inputs and
  ``dropout_seeds [batch]`` uint32 (None: no dropout)."""

  centres: Centres
  context: Context
  dropout_seeds: Optional[Array] = None


class PoolBlock(NamedTuple):
  """Eq. 4 before its softmax, on a block: ``[batch, Bq, Bk]`` arrays.

  Attributes:
    logits: float32 ``l_ij``, differentiable in sigma, theta, a and phi.
    soft_window: ``'adaptive_window'`` only: ``sigmoid((sigma_i - d_ij) /
      window_softness)``, whose gradient the hard window takes
      (straight-through); else None.
    allowed: bool; a real centre and input, ``j <= i`` if causal, inside the
      fixed window or the random sparse support.
    in_window: ``'adaptive_window'`` only: the hard window ``d_ij <= sigma_i``
      (bool); else None.
    keep: dropout keep bits (:func:`dropout_keep`); None without dropout.
  """

  logits: Array
  soft_window: Optional[Array]
  allowed: Array
  in_window: Optional[Array]
  keep: Optional[Array]


def pool_block(
    rule: PoolRule, centres: Centres, context: Context, dropout_seeds: Optional[Array] = None
) -> PoolBlock:
  """The logits and support of Eq. 4 / Eq. 6 for a block of centres x inputs.

  ``l_ij = a_j + theta_i . phi_j / sqrt(k) - d(i, j)^2 / (2 sigma_i^2)``, each
  term only where the variant has it: ``a_j`` (``context.log_w``; learned or
  unnormalised weights), the non-local ``theta_i . phi_j / sqrt(k)`` (Eq. 3)
  and the log of the Gaussian g^i_j (``'gaussian'``), with ``d`` the
  Euclidean grid distance of the two positions and ``2 sigma^2`` floored at
  1e-12. The support: a real centre and a real input, ``j <= i`` if causal,
  ``d <= window`` (``'fixed_window'``), the seeded random support
  (``'random_sparse'``, :func:`random_support`), and for
  ``'adaptive_window'`` the hard window ``d <= sigma_i`` with its soft edge.
  Dropout keep bits hash (seed, i, j) (:func:`dropout_keep`). Every value
  depends on the two positions only, never on the block's size or offset.

  The dense path calls this once with every centre and input, the blockwise
  path once per (query block, key block), :func:`pool_weights` without the
  locality; a decoding step can call it with one centre.

  Returns:
    A :class:`PoolBlock` of ``[batch, Bq, Bk]`` arrays (``Bq`` centres,
    ``Bk`` inputs).
  """
  q_index, k_index = jnp.asarray(centres.index), jnp.asarray(context.index)
  shape = (centres.valid.shape[0], q_index.shape[0], k_index.shape[0])
  q_coords = k_coords = d2 = None  # not needed without locality
  if rule.locality != 'none':
    q_coords = grid_coordinates(q_index, rule.spatial)
    k_coords = grid_coordinates(k_index, rule.spatial)
    d2 = squared_distances(q_coords, k_coords)  # [Bq, Bk]
  sigma = None if centres.sigma is None else centres.sigma[:, :, None]  # [b, Bq, 1]

  terms = []
  if context.log_w is not None:
    terms.append(context.log_w[:, None, :])
  if centres.theta is not None:  # Eq. 3
    terms.append(
        jnp.einsum('bmk,bnk->bmn', centres.theta, context.phi, preferred_element_type=jnp.float32)
        / math.sqrt(centres.theta.shape[-1])
    )
  if rule.locality == 'gaussian':
    assert d2 is not None and sigma is not None  # a locality's distances, a learned size
    terms.append(-d2[None] / (2.0 * jnp.square(sigma) + MIN_TWO_VARIANCE))
  logits = functools.reduce(operator.add, terms) if terms else jnp.zeros((), jnp.float32)

  allowed = centres.valid[:, :, None] & context.valid[:, None, :]
  if rule.causal:
    allowed = allowed & (k_index[None, :] <= q_index[:, None])[None]
  if rule.locality == 'fixed_window':
    assert d2 is not None
    allowed = allowed & (d2 <= float(rule.window) ** 2)[None]
  elif rule.locality == 'random_sparse':
    assert q_coords is not None and k_coords is not None and d2 is not None
    allowed = (
        allowed
        & random_support(
            rule.support_seed, rule.support_prob, rule.support_span, q_coords, k_coords, d2
        )[None]
    )
  in_window = soft_window = None
  if rule.locality == 'adaptive_window':
    assert d2 is not None and sigma is not None
    in_window = d2[None] <= jnp.square(sigma)
    soft_window = jax.nn.sigmoid((sigma - jnp.sqrt(d2)[None]) / rule.window_softness)
  keep = None
  if rule.dropout_rate > 0.0:
    assert dropout_seeds is not None  # the rule drops only where the inputs carry seeds
    keep = dropout_keep(dropout_seeds, rule.dropout_rate, q_index, k_index)
  return PoolBlock(jnp.broadcast_to(logits, shape), soft_window, allowed, in_window, keep)


def pool_weights(rule: PoolRule, centres: Centres, context: Context, weights: str) -> Array:
  """The pooling weights w of Eq. 4 without the locality prior (the sown
  ``'pool_weights'``), from :func:`pool_block` with ``locality='none'``.

  ``weights='nonlocal'`` (Eq. 3, query dependent): ``[batch, m, n]``, each
  centre's softmax over the inputs it may read (real, and ``j <= i`` if
  causal). Otherwise w does not depend on the centre: ``[batch, n]``, the row
  of a centre that reads every real input: ``softmax_j(a_j)`` (learned; 1 / n
  for uniform), or ``exp(a_j) = softplus(raw_j)`` for ``'unnormalized'``
  (not normalised; 0 at padding).
  """
  rule = rule._replace(locality='none', dropout_rate=0.0)
  if weights != 'nonlocal':
    rule = rule._replace(causal=False)
    centres = Centres(
        index=np.zeros((1,), np.int32), valid=jnp.ones((centres.valid.shape[0], 1), bool)
    )
  block = pool_block(rule, centres, context)
  if weights == 'unnormalized':
    w = jnp.where(block.allowed, jnp.exp(block.logits), 0.0)
  else:
    w = masked_softmax(block.logits, block.allowed)
  return w if weights == 'nonlocal' else w[:, 0]


# ----------------------------------------------------------------------------
# The dense pooling: the whole [batch, m, n] pooling matrix.
# ----------------------------------------------------------------------------


def masked_pool(
    logits: Array,
    allowed: Array,
    *,
    in_window: Optional[Array] = None,
    window_ste: Optional[Array] = None,
) -> Array:
  """Pooling weights ``p = softmax_n(logits)`` over the allowed positions.

  Args:
    logits: ``[batch or 1, m, n]`` float32 log pooling weights ``l_mn``.
    allowed: bool, broadcastable to logits; positions outside get p = 0.
    in_window: optional bool ``[batch, m, n]`` hard window (adaptive window only).
      The max is taken over ``allowed & in_window`` and positions outside the
      window are multiplied by ``window_ste``.
    window_ste: optional float32 ``[batch, m, n]`` straight-through window mask:
      exactly ``in_window`` in value, with the gradient of a soft window.

  Returns:
    ``p [batch, m, n]`` float32. A row with no allowed position gets ``p = 0``
    (never a division by 0).
  """
  if in_window is None and window_ste is None:
    return masked_softmax(logits, allowed)
  support = allowed if in_window is None else allowed & in_window
  row_max = jnp.max(jnp.where(support, logits, NEG_INF), axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(row_max)
  shifted = logits - row_max
  if in_window is not None:
    # Outside the window the forward value is multiplied by 0; clamping the
    # exponent at 0 keeps exp() finite there (the max was taken inside).
    shifted = jnp.where(in_window, shifted, jnp.minimum(shifted, 0.0))
  e = jnp.exp(jnp.where(allowed, shifted, NEG_INF))
  if window_ste is not None:
    e = e * window_ste
  denom = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(denom > 0, denom, 1.0)


def valid_positions(mask: Optional[Array], batch: int, n: int) -> Array:
  """``[batch, n]`` bool, True at real tokens: the ``mask`` flattened, or all
  True without one."""
  if mask is None:
    return jnp.ones((batch, n), bool)
  return jnp.asarray(mask).reshape(batch, n).astype(bool)


@jax.checkpoint
def mask_features(keep: Array, x: Array, fill: Any) -> Array:
  """``where(keep, x, fill)`` whose backward pass recomputes the select.

  ``keep`` is a small ``[..., 1]`` mask; autodiff of a plain ``jnp.where``
  would keep its broadcast to x's full ``[batch, n, features]`` shape (and
  the filled copy) alive until the backward pass, three activation-sized
  buffers per ContextPool; checkpointed, only the inputs are kept.
  """
  return jnp.where(keep, x, fill)


def apply_pool(p: Array, x: Array) -> Array:
  """``[b, m, n] x [b, n, d] -> [b, m, d]`` in x's dtype, accumulated in float32."""
  y = jnp.einsum('bmn,bnd->bmd', p.astype(x.dtype), x, preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


def drop(p: Array, keep: Optional[Array], rate: float) -> Array:
  """Inverted dropout of pooling weights with a block's keep bits (None: no dropout)."""
  return p if keep is None else jnp.where(keep, p / (1.0 - rate), 0.0)


def pool_dense(rule: PoolRule, inputs: PoolInputs) -> Array:
  """``implementation='dense'``: Eq. 4 as one :func:`pool_block` of every centre
  and every input, the ``[batch, m, n]`` pooling matrix, differentiated by
  autodiff. Returns ``[batch, m, features]`` in x's dtype."""
  block = pool_block(rule, inputs.centres, inputs.context, inputs.dropout_seeds)
  window_ste = None
  if block.soft_window is not None:
    # The adaptive window: exactly the hard window forward, the gradient of
    # its sigmoid edge backward (straight-through), so the radius trains.
    soft = block.soft_window
    assert block.in_window is not None  # set with soft_window
    window_ste = block.in_window.astype(jnp.float32) + soft - jax.lax.stop_gradient(soft)
  p = masked_pool(block.logits, block.allowed, in_window=block.in_window, window_ste=window_ste)
  return apply_pool(drop(p, block.keep, rule.dropout_rate), inputs.context.x)
