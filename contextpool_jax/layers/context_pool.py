"""ContextPool: adaptive context pooling (Huang et al., ICML 2022).

For every token i, ContextPool pools the features of its neighbours with learned
per-token weights ``w`` and a learned, per-token Gaussian pooling size:

    y_i = sum_j x_j w_j g^i_j / sum_j w_j g^i_j                       (Eq. 4, Eq. 6)
    g^i_j = exp(-d(i, j)^2 / (2 sigma_i^2))
    sequences: sigma_i = r * n * s_i,            r = 0.1              (Sec. 3.2)
    grids:     sigma_k = r * S_k * (h + w) / 2,  r = 0.05             (Appendix A)
    {w, s} = m(X): two convolutions with two output channels.

With softmax-normalised weights, ``w_j = exp(a_j) / Z`` and the constant ``Z``
cancels between numerator and denominator, so Eq. 4 *is* a softmax over j of

    l_ij = a_j - d(i, j)^2 / (2 sigma_i^2)

applied to X. This module computes exactly that, in log space with a
max-subtracted softmax in float32 (whatever the compute dtype), so no
denominator can reach 0. Every ablation of the paper's Tables 1-3 is a choice of
how ``l_ij`` is built:

* ``weights`` (Table 1/2 middle cell): ``'learned'`` a_j = raw weight (softmax
  weights); ``'unnormalized'`` w_j = softplus(raw weight), a positive weight with
  no normalisation (exp would be identical to softmax, since Z cancels);
  ``'uniform'`` a_j = 0 (average pooling); ``'nonlocal'`` a_ij =
  theta(x_i)^T phi(x_j) / sqrt(k) with linear maps ``theta(x) = W^theta x``,
  ``phi(x) = W^phi x`` and no bias (Eq. 3; a bias on phi would add a j-only
  term; query dependent, O(n^2) cost).
* ``locality`` (bottom cell): ``'gaussian'`` the adaptive Gaussian above;
  ``'none'`` no locality prior; ``'fixed_window'`` a hard window of radius
  ``window``; ``'adaptive_window'`` a hard window of learned radius
  rho_i = sigma_i; ``'random_sparse'`` a fixed, seeded random support
  ("random sparse locations"; our reading: each token keeps itself and each
  position within radius ``random_span`` with probability K / M, K and M the
  numbers of lattice offsets within ``window`` and ``random_span``, so it
  pools over as many positions as the fixed window in expectation, and the
  support depends on neither the padding nor, if causal, on later tokens).
* ``mapping`` (Table 3): ``'cnn'`` two convolutions; ``'mlp'`` two per-token
  dense layers; ``'attention'`` single-head self-attention followed by a dense
  layer.

Choices the paper leaves open (papers README, A1-A5) are fields, documented on
:class:`ContextPool` and in the README table.

One function, :func:`pool_block`, builds ``l_ij`` and its support for a block
of centres (:class:`Centres`: positions, validity, sigma, theta) x a block of
inputs (:class:`Context`: positions, validity, features, a_j, phi); a new
weights or locality variant is one edit there. Two implementations call it
and compute the same ``y`` (field ``implementation``); the per-call arrays
travel as one :class:`PoolInputs`:

* ``'dense'`` calls it once on every centre and input: the ``[batch, m, n]``
  pooling matrix (m outputs, n inputs), differentiated by autodiff: O(m n)
  memory.
* ``'blockwise'`` never materialises it. Since every variant's ``l_ij`` is a
  query term plus a key term plus a function of the two positions (the
  non-local ``theta_i . phi_j`` included), Eq. 4 is an attention with one head,
  and it is computed flash-attention style: queries and keys in blocks of
  ``block_size``, an online (running max / running sum) float32 softmax in the
  forward pass, and a ``jax.custom_vjp`` whose backward pass recomputes each
  block's probabilities from the saved per-row (max, sum) and differentiates
  the block's logits (:func:`pool_block` again) with ``jax.vjp``. Memory per
  example is
  O((m + n) d + block_size^2).
  Causal pooling skips the key blocks above the diagonal, a fixed window the
  key blocks out of its reach, and the Gaussian locality (with weights that do
  not depend on the query) at run time the key blocks whose every logit is
  more than ``gaussian_skip_nats`` (18) below the running maximum of every
  centre of the query block, visiting the nearest key blocks first (a
  bounded approximation: each row loses at most ``n exp(-18)`` of its mass). Every weights x locality x mapping variant is
  supported and gives the dense result up to float32 rounding; the hard
  adaptive window is exact too (its straight-through gradient only needs the
  final row max, which the backward pass has).
* ``'auto'`` (default) is ``'blockwise'`` when the number of input positions n
  exceeds :data:`AUTO_BLOCKWISE_THRESHOLD` (1024), else ``'dense'``.

Randomness is counter-based in both implementations, so they agree exactly:
the ``'random_sparse'`` support and the dropout mask on the pooling weights
are a 32-bit integer hash (murmur3's finaliser) of (seed, centre, input),
evaluated elementwise wherever needed: for the support, of the two positions'
grid coordinates (so it does not change with the input's size or padding);
for dropout, of their flat indices.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.errors import ConfigError
from contextpool_jax import checks as v
from contextpool_jax.layers._softmax import masked_softmax

Array = jax.Array
Dtype = Any

WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
MAPPINGS = ('cnn', 'mlp', 'attention')
SIZE_NORMS = ('softmax', 'sigmoid')
IMPLEMENTATIONS = ('auto', 'dense', 'blockwise')
# implementation='auto' uses 'blockwise' when the number of input positions n
# is larger than this. Measured on CPU (benchmarks/contextpool_memory.py: batch
# 1, 512 features, causal, cnn mapping, block_size 512, compiled forward +
# backward temp memory, dense / blockwise): n = 512: 7.1 / 9.1 MiB, 768:
# 15.2 / 13.2, 1024: 24.3 / 11.3, 2048: 80.5 / 17.6, 8192: 1090 / 66 (16.4x).
# Forward + backward time: n = 1024 (not causal) dense 30.8 ms, blockwise 34.2;
# n = 2048 blockwise 2.1x (causal) and 1.4x (not) faster. So: 32 x 32 grids
# and shorter stay dense, the enwik8/text8 stages (2048-8192) are blockwise.
AUTO_BLOCKWISE_THRESHOLD = 1024
# Default ContextPool.gaussian_skip_nats: exp(-18) = 1.5e-8 is below float32's
# half-ulp (6e-8), so a skipped term is below the rounding of its row's largest.
GAUSSIAN_SKIP_NATS = 18.0
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    'relu': nn.relu,
    'gelu': nn.gelu,
    'silu': nn.silu,
    'tanh': jnp.tanh,
}
DEFAULT_RATIO = {1: 0.1, 2: 0.05}  # r for sequences (Sec. 3.2) and grids (App. A).

# A finite "minus infinity" for masked logits: exp() of it is exactly 0 in float32
# and, unlike -inf, it never produces inf - inf = NaN in a forward or backward pass.
_NEG = -1e30
# Added to 2 sigma^2 so that sigma -> 0 gives a finite (huge) Gaussian exponent.
_MIN_TWO_VARIANCE = 1e-12

_OWNER = 'ContextPool'
_ZEROS = nn.initializers.zeros_init()


# ----------------------------------------------------------------------------
# Geometry: token coordinates, pooling centres, squared distances.
# ----------------------------------------------------------------------------


def pool_centres(
    spatial: Sequence[int], strides: Sequence[int], window_shape: Sequence[int]
) -> list[np.ndarray]:
  """Integer input coordinates of the pooling centres, per spatial axis.

  The output has ``ceil(size / stride)`` positions per axis, as
  ``nn.avg_pool(..., window_shape, strides, padding='SAME')``. Output position
  ``o`` pools around the centre of that op's window:
  ``o * stride - pad_lo + (window - 1) // 2`` where
  ``pad_lo = max((out - 1) * stride + window - size, 0) // 2``; for an even
  window the centre is rounded down to a grid position.

  Returns:
    One int array per axis, of length ``ceil(size / stride)``.
  """
  centres = []
  for size, stride, window in zip(spatial, strides, window_shape):
    out = -(-size // stride)
    pad_lo = max((out - 1) * stride + window - size, 0) // 2
    c = np.arange(out) * stride - pad_lo + (window - 1) // 2
    centres.append(np.clip(c, 0, size - 1))
  return centres


def _query_indices(spatial: Sequence[int], centres: Sequence[np.ndarray]) -> np.ndarray:
  """Flat (row-major) input indices of the pooling centres, ``[m]``."""
  mesh = np.meshgrid(*centres, indexing='ij')
  return np.ravel_multi_index([c.reshape(-1) for c in mesh], tuple(spatial))


def _grid_coordinates(index: Any, spatial: Sequence[int]) -> list[Any]:
  """Row-major integer coordinates of flat indices (numpy or jax), one per axis."""
  coords = []
  for size in reversed(spatial[1:]):
    coords.append(index % size)
    index = index // size
  coords.append(index)
  return coords[::-1]


def squared_distances(q_coords: Sequence[Array], k_coords: Sequence[Array]) -> Array:
  """Squared Euclidean grid distances ``[Bq, Bk]`` (float32, exact integers)
  between centres and inputs given by their integer grid coordinates (one
  ``[Bq]`` / ``[Bk]`` array per axis, :func:`_grid_coordinates`)."""
  return functools.reduce(
      operator.add,
      [
          jnp.square(q.astype(jnp.float32)[:, None] - k.astype(jnp.float32)[None, :])
          for q, k in zip(q_coords, k_coords)
      ],
  )


# ----------------------------------------------------------------------------
# Pooling sizes (A1) and weights.
# ----------------------------------------------------------------------------


def normalised_size(raw_size: Array, valid: Array, *, size_norm: str, causal: bool) -> Array:
  """The normalised pooling sizes ``s`` in [0, 1], ``[batch, n]`` float32 (A1),
  from the mapping's raw size channel ``[batch, n]``:

  * ``'softmax'``: the paper's literal reading, a softmax of the raw sizes over
    the valid positions (for ``causal``: over the valid positions ``<= i``, a
    prefix softmax, so that s_i never depends on later tokens);
  * ``'sigmoid'``: a per-token squashing, ``s_i = sigmoid(raw_i)``.

  0 at padded positions.
  """
  z = jnp.where(valid, raw_size.astype(jnp.float32), _NEG)
  if size_norm == 'sigmoid':
    s = jax.nn.sigmoid(z)
  elif causal:
    s = jnp.exp(z - jax.lax.cumlogsumexp(z, axis=1))
  else:
    s = jax.nn.softmax(z, axis=1)
  return jnp.where(valid, s, 0.0)


def pooling_sigma(
    s: Array,
    valid: Array,
    *,
    causal: bool,
    ratio: float,
    grid_extent: Optional[float],
    length: Optional[float] = None,
) -> Array:
  """Gaussian standard deviations in token units, ``[batch, n]`` (float32), from
  the normalised sizes ``s`` (:func:`normalised_size`).

  Sequences: ``sigma_i = r * n_i * s_i`` where ``n_i`` is the number of tokens
  token i pools over: the number of valid tokens (not the padded length, so the
  amount of padding never changes a real token's output) or, for ``causal``,
  the number of valid tokens ``<= i`` (so the output at i is the same whatever
  the length of the future); or, when ``length`` is given
  (``ContextPool.sigma_length``), that static n for every token, so a token's
  size does not depend on where it sits in the window. Grids: ``sigma = r * S
  * (h + w) / 2`` with the static grid size (``grid_extent``).
  """
  if grid_extent is not None:
    extent = grid_extent
  elif length is not None:
    extent = length
  elif causal:
    extent = jnp.cumsum(valid, axis=1, dtype=jnp.float32)
  else:
    extent = jnp.sum(valid, axis=1, keepdims=True, dtype=jnp.float32)
  return ratio * extent * s


def _log_softplus(z: Array) -> Array:
  """log(softplus(z)) without underflow: equals z (to float32 precision) for z < -30."""
  safe = jnp.maximum(z, -30.0)
  return jnp.where(z < -30.0, z, jnp.log(jax.nn.softplus(safe)))


# ----------------------------------------------------------------------------
# Counter-based randomness: the random sparse support and the dropout mask.
# ----------------------------------------------------------------------------

_SALT_SUPPORT = 0x2C1B3C6D
_SALT_DROPOUT = 0x297A2D39


def _fmix32(h: Array) -> Array:
  """murmur3's 32-bit finaliser: a bijective avalanche mix of uint32 values."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _row_hash(seed: Any, salt: int, row: Sequence[Array]) -> Array:
  """The per-row half of :func:`_pair_hash`: a uint32 mix of (seed, salt, *row),
  ``row`` a sequence of integer arrays (a flat index, or one coordinate per axis)."""
  seed = jnp.asarray(seed, jnp.uint32)
  h = _fmix32(seed ^ np.uint32(salt))
  for r in row:
    h = _fmix32(h ^ jnp.asarray(r).astype(jnp.uint32))
  return h


def _pair_hash(row_hash: Array, col: Sequence[Array]) -> Array:
  """uint32 hash of (row hash, *col), ``col`` as ``row`` in :func:`_row_hash`; broadcasts."""
  h = row_hash
  for c in col:
    h = _fmix32(h + jnp.asarray(c).astype(jnp.uint32) * np.uint32(0x9E3779B9))
  return h


def _threshold(prob: float) -> int:
  """uint32 threshold t with P(hash < t) = prob (for prob < 1)."""
  return min(int(round(prob * 2.0**32)), 2**32 - 1)


def _lattice_points(ndim: int, radius_sq: int) -> int:
  """Number of integer points of squared Euclidean length <= radius_sq in ndim dimensions."""
  r = math.isqrt(radius_sq)
  if ndim == 1:
    return 2 * r + 1
  return sum(_lattice_points(ndim - 1, radius_sq - o * o) for o in range(-r, r + 1))


def _ball_size(ndim: int, radius: int) -> int:
  """Number of non-zero integer offsets of Euclidean length <= radius in ndim dimensions."""
  return _lattice_points(ndim, radius * radius) - 1


def _support_probability(ndim: int, window: int, span: int) -> float:
  """Keep probability of a ``'random_sparse'`` off-centre position within the span.

  ``K / M``: K (M) is the number of non-zero integer offsets within radius
  ``window`` (``span``) on the unbounded lattice, so that wherever the span
  fits in the input the expected support is exactly the fixed window's (and,
  for causal pooling, half of both, as for the fixed window). It depends on
  neither the input's size nor its padding.
  """
  return min(1.0, _ball_size(ndim, window) / _ball_size(ndim, span))


def _random_support(
    seed: int,
    prob: float,
    span: int,
    q_coords: Sequence[Array],
    k_coords: Sequence[Array],
    d2: Array,
) -> Array:
  """``'random_sparse'`` support ``[Bq, Bk]`` (bool) for centres and inputs given by
  their grid coordinates (``[Bq]`` and ``[Bk]`` per axis) and squared distances
  ``d2 [Bq, Bk]``: the centre itself, and every input within Euclidean distance
  ``span`` whose ``hash(seed, centre coordinates, input coordinates) < prob * 2^32``.

  Hashing coordinates (not flat indices, which depend on the padded width of
  a grid) makes the support of a pair of positions independent of the input's
  size and padding, and of the block it is evaluated in.
  """
  support = d2 <= float(span) ** 2
  if prob < 1.0:
    rows = _row_hash(np.uint32(seed & 0xFFFFFFFF), _SALT_SUPPORT, q_coords)
    keep = _pair_hash(rows[:, None], [c[None, :] for c in k_coords])
    support = support & (keep < np.uint32(_threshold(prob)))
  return support | (d2 == 0)


def _dropout_keep(seeds: Array, rate: float, q_index: Array, k_index: Array) -> Array:
  """Dropout keep bits ``[batch, len(q_index), len(k_index)]`` from per-example
  uint32 ``seeds [batch]``: ``hash(seed_b, i, j) >= rate * 2^32``."""
  rows = _row_hash(seeds[:, None], _SALT_DROPOUT, [q_index[None, :]])
  return _pair_hash(rows[:, :, None], [k_index[None, None, :]]) >= np.uint32(_threshold(rate))


# ----------------------------------------------------------------------------
# Eq. 4 on a block of centres x inputs: the one place that builds l_ij and its
# support (the dense path is one block of everything, the blockwise path
# visits blocks, the sown weights are a block without locality).
# ----------------------------------------------------------------------------


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
      (:func:`_support_probability`); 1.0 for the other localities.
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
    keep: dropout keep bits (:func:`_dropout_keep`); None without dropout.
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
  (``'random_sparse'``, :func:`_random_support`), and for
  ``'adaptive_window'`` the hard window ``d <= sigma_i`` with its soft edge.
  Dropout keep bits hash (seed, i, j) (:func:`_dropout_keep`). Every value
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
    q_coords = _grid_coordinates(q_index, rule.spatial)
    k_coords = _grid_coordinates(k_index, rule.spatial)
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
    terms.append(-d2[None] / (2.0 * jnp.square(sigma) + _MIN_TWO_VARIANCE))
  logits = functools.reduce(operator.add, terms) if terms else jnp.zeros((), jnp.float32)

  allowed = centres.valid[:, :, None] & context.valid[:, None, :]
  if rule.causal:
    allowed = allowed & (k_index[None, :] <= q_index[:, None])[None]
  if rule.locality == 'fixed_window':
    allowed = allowed & (d2 <= float(rule.window) ** 2)[None]
  elif rule.locality == 'random_sparse':
    allowed = (
        allowed
        & _random_support(
            rule.support_seed, rule.support_prob, rule.support_span, q_coords, k_coords, d2
        )[None]
    )
  in_window = soft_window = None
  if rule.locality == 'adaptive_window':
    in_window = d2[None] <= jnp.square(sigma)
    soft_window = jax.nn.sigmoid((sigma - jnp.sqrt(d2)[None]) / rule.window_softness)
  keep = None
  if rule.dropout_rate > 0.0:
    keep = _dropout_keep(dropout_seeds, rule.dropout_rate, q_index, k_index)
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
# The pooling itself.
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
  row_max = jnp.max(jnp.where(support, logits, _NEG), axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(row_max)
  shifted = logits - row_max
  if in_window is not None:
    # Outside the window the forward value is multiplied by 0; clamping the
    # exponent at 0 keeps exp() finite there (the max was taken inside).
    shifted = jnp.where(in_window, shifted, jnp.minimum(shifted, 0.0))
  e = jnp.exp(jnp.where(allowed, shifted, _NEG))
  if window_ste is not None:
    e = e * window_ste
  denom = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(denom > 0, denom, 1.0)


@jax.checkpoint
def _mask_features(keep: Array, x: Array, fill: Any) -> Array:
  """``where(keep, x, fill)`` whose backward pass recomputes the select.

  ``keep`` is a small ``[..., 1]`` mask; autodiff of a plain ``jnp.where``
  would keep its broadcast to x's full ``[batch, n, features]`` shape (and
  the filled copy) alive until the backward pass, three activation-sized
  buffers per ContextPool; checkpointed, only the inputs are kept.
  """
  return jnp.where(keep, x, fill)


def _apply_pool(p: Array, x: Array) -> Array:
  """``[b, m, n] x [b, n, d] -> [b, m, d]`` in x's dtype, accumulated in float32."""
  y = jnp.einsum('bmn,bnd->bmd', p.astype(x.dtype), x, preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


def _drop(p: Array, keep: Optional[Array], rate: float) -> Array:
  """Inverted dropout of pooling weights with a block's keep bits (None: no dropout)."""
  return p if keep is None else jnp.where(keep, p / (1.0 - rate), 0.0)


def _pool_dense(rule: PoolRule, inputs: PoolInputs) -> Array:
  """``implementation='dense'``: Eq. 4 as one :func:`pool_block` of every centre
  and every input, the ``[batch, m, n]`` pooling matrix, differentiated by
  autodiff. Returns ``[batch, m, features]`` in x's dtype."""
  block = pool_block(rule, inputs.centres, inputs.context, inputs.dropout_seeds)
  window_ste = None
  if block.soft_window is not None:
    # The adaptive window: exactly the hard window forward, the gradient of
    # its sigmoid edge backward (straight-through), so the radius trains.
    soft = block.soft_window
    window_ste = block.in_window.astype(jnp.float32) + soft - jax.lax.stop_gradient(soft)
  p = masked_pool(block.logits, block.allowed, in_window=block.in_window, window_ste=window_ste)
  return _apply_pool(_drop(p, block.keep, rule.dropout_rate), inputs.context.x)


# ----------------------------------------------------------------------------
# Blockwise pooling: an online softmax over key blocks and a recomputing VJP.
# ----------------------------------------------------------------------------


class _BlockSpec(NamedTuple):
  """Static description of a blockwise pooling (a ``custom_vjp`` nondiff arg).

  ``k_order[q]``: the key blocks query block q reads, in the order it reads
  them (:func:`_key_block_order`; causal: none above the diagonal; fixed
  window: none out of reach).
  ``skip_nats``: None, or the Gaussian skipping margin (see
  :func:`_skip_block`).
  """

  rule: PoolRule
  block_q: int
  block_k: int
  k_order: tuple[tuple[int, ...], ...]
  skip_nats: Optional[float] = None


# The fields pool_block differentiates (the features x are differentiated by hand).
_CENTRE_GRADS = ('sigma', 'theta')
_CONTEXT_GRADS = ('log_w', 'phi')


def _fields(t: NamedTuple, names: Sequence[str]) -> tuple[Any, ...]:
  return tuple(getattr(t, name) for name in names)


def _slice(a: Array, start: Array, size: int, axis: int = 1) -> Array:
  return jax.lax.dynamic_slice_in_dim(a, start, size, axis)


def _positions(t: NamedTuple, start: Array, size: int) -> NamedTuple:
  """Positions ``start .. start + size - 1`` of a :class:`Centres` or
  :class:`Context`: ``index`` along its axis 0, every other array along axis 1."""
  return type(t)(
      *(
          None if a is None else _slice(a, start, size, 0 if name == 'index' else 1)
          for name, a in zip(t._fields, t)
      )
  )


def _pad_positions(t: NamedTuple, size: int, fill: dict[str, float]) -> NamedTuple:
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

  return type(t)(*(pad(name, a) for name, a in zip(t._fields, t)))


def _differentiable_block(
    rule: PoolRule, centres: Centres, context: Context, dropout_seeds: Optional[Array]
):
  """``jax.vjp`` of :func:`pool_block` in the fields it differentiates:
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


def _visit_table(spec: _BlockSpec) -> tuple[Array, Any]:
  """``(order [q_blocks, L] int32, counts)``: query block q visits key blocks
  ``order[q, :counts[q]]``, in that order (:func:`_key_block_order`); ``counts``
  is a Python int when every query block visits as many."""
  counts = np.array([len(o) for o in spec.k_order], np.int32)
  order = np.zeros((len(spec.k_order), max(1, counts.max())), np.int32)
  for qb, blocks in enumerate(spec.k_order):
    order[qb, : len(blocks)] = blocks
  if (counts == counts[0]).all():
    return jnp.asarray(order), int(counts[0])
  return jnp.asarray(order), jnp.asarray(counts)


def _skips(spec: _BlockSpec) -> bool:
  """Whether the Gaussian block skipping is on (:func:`_skip_block`)."""
  return spec.skip_nats is not None


def _block_max_log_w(context: Context, block_k: int) -> Array:
  """``max_j a_j`` over the real inputs of each key block, ``[batch, n_pad / block_k]``
  float32: ``a_j = 0`` for uniform weights; ``-inf`` for a block without a real input."""
  batch, n_pad = context.valid.shape
  a = jnp.zeros((batch, n_pad), jnp.float32) if context.log_w is None else context.log_w
  a = jnp.where(context.valid, a.astype(jnp.float32), -jnp.inf)
  return jnp.max(a.reshape(batch, n_pad // block_k, block_k), axis=-1)


def _key_block_boxes(spatial: Sequence[int], block_k: int, num_k_blocks: int) -> np.ndarray:
  """Bounding box of each key block's real positions on the grid: ``[num_k_blocks,
  ndim, 2]`` float32 (lowest, highest coordinate per axis)."""
  n = math.prod(spatial)
  boxes = np.zeros((num_k_blocks, len(spatial), 2), np.float32)
  for kb in range(num_k_blocks):
    index = np.arange(kb * block_k, min((kb + 1) * block_k, n))
    coords = np.stack(_grid_coordinates(index, spatial))  # [ndim, positions]
    boxes[kb, :, 0], boxes[kb, :, 1] = coords.min(axis=1), coords.max(axis=1)
  return boxes


def _skip_block(
    spec: _BlockSpec,
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
  ndim, 2]``, ``max_log_w [batch, k_blocks]`` from :func:`_block_max_log_w`).
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
  coords = _grid_coordinates(jnp.asarray(q.index), spec.rule.spatial)
  box = boxes[kb]  # [ndim, 2]
  gaps = [
      jnp.maximum(
          jnp.maximum(box[a, 0] - c.astype(jnp.float32), c.astype(jnp.float32) - box[a, 1]), 0.0
      )
      for a, c in enumerate(coords)
  ]
  d2 = functools.reduce(operator.add, [jnp.square(g) for g in gaps])  # [Bq]
  bound = max_log_w[:, kb][:, None] - d2[None, :] / (2.0 * jnp.square(q.sigma) + _MIN_TWO_VARIANCE)
  skip = jnp.all(~q.valid | (bound < row_max - spec.skip_nats))
  if spec.rule.causal:
    skip = skip & ((kb + 1) * spec.block_k - 1 <= jnp.min(jnp.asarray(q.index)))
  return skip


def _pool_blockwise(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float] = None
) -> Array:
  """``implementation='blockwise'``: :func:`_blockwise_pool` on the inputs padded
  to whole blocks. Returns ``[batch, m, features]`` in x's dtype.

  The context is the whole input in order (``context.index = arange(n)``) and
  ``centres.index`` is static (numpy): the key blocks each query block reads
  are computed from them at trace time. ``skip_nats``: the Gaussian block
  skipping margin (:func:`_skip_block`), used with ``locality='gaussian'``
  and query-independent weights only; None: no skipping.
  """
  spec, padded = _blockwise_setup(rule, block_size, inputs, skip_nats)
  m = len(inputs.centres.index)
  return _blockwise_pool(spec, padded)[:, :m].astype(inputs.context.x.dtype)


def _blockwise_setup(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float]
) -> tuple[_BlockSpec, PoolInputs]:
  """The :class:`_BlockSpec` of a blockwise pooling and its inputs padded to whole blocks."""
  centres, context = inputs.centres, inputs.context
  m, n = len(centres.index), len(context.index)
  block_q, block_k = min(block_size, m), min(block_size, n)
  m_pad, n_pad = -(-m // block_q) * block_q, -(-n // block_k) * block_k
  if rule.locality != 'gaussian' or centres.theta is not None:
    skip_nats = None  # only the Gaussian bound with query-independent weights
  q_index = np.asarray(centres.index)
  ranges = _key_block_ranges(q_index, block_q, block_k, n_pad // block_k, rule.causal, _reach(rule))
  spec = _BlockSpec(
      rule=rule,
      block_q=block_q,
      block_k=block_k,
      k_order=_key_block_order(q_index, block_q, block_k, ranges, skip_nats is not None),
      skip_nats=None if skip_nats is None else float(skip_nats),
  )
  padded = PoolInputs(
      _pad_positions(centres, m_pad, {'sigma': 1.0}),
      _pad_positions(context, n_pad, {}),
      inputs.dropout_seeds,
  )
  return spec, padded


def blockwise_visits(
    rule: PoolRule, block_size: int, inputs: PoolInputs, skip_nats: Optional[float] = None
) -> tuple[Array, int]:
  """``(visited, planned)``: the number of (query block, key block) pairs the
  blockwise forward pass computes, and the number it would without the
  Gaussian skipping (after the static causal / window skipping). For
  benchmarks and tests; the arguments are :func:`_pool_blockwise`'s."""
  spec, padded = _blockwise_setup(rule, block_size, inputs, skip_nats)
  return _forward_pass(spec, padded)[3], sum(len(o) for o in spec.k_order)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise_pool(spec: _BlockSpec, inputs: PoolInputs) -> Array:
  """``y [batch, m_pad, features]`` float32 = Eq. 4, block by block.

  ``inputs`` is padded to whole blocks: ``m_pad`` centres and ``n_pad`` inputs
  (the padding invalid). Each (query block, key block) is a :func:`pool_block`.
  """
  return _blockwise_forward(spec, inputs)[0]


def _blockwise_forward(spec, inputs):
  y, row_max, row_sum, _ = _forward_pass(spec, inputs)
  return y, (inputs, y, row_max, row_sum)


def _forward_pass(spec, inputs):
  """The online softmax: ``(y, row_max, row_sum, visited)``, ``visited`` the
  number of key blocks computed (int32)."""
  centres, context, dropout_seeds = inputs
  batch, m_pad = centres.valid.shape
  features = context.x.shape[-1]
  bq, bk = spec.block_q, spec.block_k
  order, counts = _visit_table(spec)
  if _skips(spec):
    max_log_w = _block_max_log_w(context, bk)
    boxes = jnp.asarray(_key_block_boxes(spec.rule.spatial, bk, context.valid.shape[1] // bk))

  def query_block(qb, carry):
    y_all, max_all, sum_all, visited = carry
    q0 = qb * bq
    q = _positions(centres, q0, bq)

    def visit(kb, state):
      row_max, row_sum, acc, visited = state
      k = _positions(context, kb * bk, bk)
      block = pool_block(spec.rule, q, k, dropout_seeds)
      # Forward values: the hard window is exactly in_window (the STE only
      # changes gradients), so the support is allowed & in_window.
      support = block.allowed if block.in_window is None else block.allowed & block.in_window
      new_max = jnp.maximum(row_max, jnp.max(jnp.where(support, block.logits, _NEG), axis=-1))
      # min(., 0): XLA may evaluate the logits twice, with different rounding,
      # for the max and for the exponent; a huge transient max (a tiny sigma,
      # before the block holding the centre) must not overflow exp.
      e = jnp.exp(jnp.where(support, jnp.minimum(block.logits - new_max[..., None], 0.0), _NEG))
      rescale = jnp.exp(row_max - new_max)
      row_sum = row_sum * rescale + jnp.sum(e, axis=-1)
      e = _drop(e, block.keep, spec.rule.dropout_rate)
      acc = acc * rescale[..., None] + jnp.einsum(
          'bmn,bnd->bmd', e.astype(k.x.dtype), k.x, preferred_element_type=jnp.float32
      )
      return new_max, row_sum, acc, visited + 1

    def key_block(t, state):
      kb = order[qb, t]
      if not _skips(spec):
        return visit(kb, state)
      skip = _skip_block(spec, q, kb, state[0], max_log_w, boxes)
      return jax.lax.cond(skip, lambda s: s, functools.partial(visit, kb), state)

    init = (
        jnp.full((batch, bq), _NEG, jnp.float32),
        jnp.zeros((batch, bq), jnp.float32),
        jnp.zeros((batch, bq, features), jnp.float32),
        visited,
    )
    count = counts if isinstance(counts, int) else counts[qb]
    row_max, row_sum, acc, visited = jax.lax.fori_loop(0, count, key_block, init)
    y = acc / jnp.where(row_sum > 0, row_sum, 1.0)[..., None]
    put = lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, u, q0, 1)
    return put(y_all, y), put(max_all, row_max), put(sum_all, row_sum), visited

  init = (
      jnp.zeros((batch, m_pad, features), jnp.float32),
      jnp.zeros((batch, m_pad), jnp.float32),
      jnp.zeros((batch, m_pad), jnp.float32),
      jnp.zeros((), jnp.int32),
  )
  return jax.lax.fori_loop(0, m_pad // bq, query_block, init)


def _blockwise_backward(spec, residuals, dy):
  inputs, y, row_max, row_sum = residuals
  centres, context, dropout_seeds = inputs
  x = context.x
  bq, bk, rate = spec.block_q, spec.block_k, spec.rule.dropout_rate
  order, counts = _visit_table(spec)
  if _skips(spec):
    max_log_w = _block_max_log_w(context, bk)
    boxes = jnp.asarray(_key_block_boxes(spec.rule.spatial, bk, x.shape[1] // bk))
  dy = dy.astype(jnp.float32)
  # sum_j p_ij dp_ij = dy_i . y_i (dropout included: y is the dropped-out output).
  delta = jnp.sum(dy * y, axis=-1)
  denom = jnp.where(row_sum > 0, row_sum, 1.0)
  zeros = lambda tree: jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), tree)

  def query_block(qb, carry):
    dq_all, dk_all, dx_all = carry
    q0 = qb * bq
    q = _positions(centres, q0, bq)
    dy_q = _slice(dy, q0, bq)
    dy_x = dy_q.astype(x.dtype)
    delta_q, max_q, denom_q = (_slice(a, q0, bq) for a in (delta, row_max, denom))

    def block_grads(kb):
      """Gradients of one (query block, key block): (d centres, d context, dx block)."""
      k = _positions(context, kb * bk, bk)
      (logits, soft), logits_vjp, (allowed, in_window, keep) = _differentiable_block(
          spec.rule, q, k, dropout_seeds
      )
      # masked_pool's probabilities, from the final row max and sum. Inside
      # the support logits <= max, so min(., 0) only changes rounding there;
      # outside the hard window it is masked_pool's clamp.
      shifted = jnp.minimum(logits - max_q[..., None], 0.0)
      ex = jnp.exp(jnp.where(allowed, shifted, _NEG))
      e = ex if in_window is None else jnp.where(in_window, ex, 0.0)
      p = _drop(e / denom_q[..., None], keep, rate)
      dp = _drop(
          jnp.einsum('bmd,bnd->bmn', dy_x, k.x, preferred_element_type=jnp.float32), keep, rate
      )
      dx = jnp.einsum('bmn,bmd->bnd', p, dy_q)
      # p = e / sum(e): d/de_ij = (dp_ij - delta_i) / sum_i.
      de = (dp - delta_q[..., None]) / denom_q[..., None]
      d_logits = de * e  # e = exp(logits - max) where it is not 0
      d_soft = None if soft is None else de * ex  # the STE: e = ex * window
      dq_blk, dk_blk = logits_vjp((d_logits, d_soft))
      f32 = lambda tree: jax.tree.map(lambda u: u.astype(jnp.float32), tree)
      return f32(dq_blk), f32(dk_blk), dx

    def key_block(t, state):
      dq, dk_all, dx_all = state
      kb = order[qb, t]
      if _skips(spec):
        # The blocks the forward pass skipped (and possibly more: the final
        # row max is at least the running one) add nothing here either.
        skip = _skip_block(spec, q, kb, max_q, max_log_w, boxes)
        grads = jax.lax.cond(
            skip, lambda kb: zeros(jax.eval_shape(block_grads, kb)), block_grads, kb
        )
      else:
        grads = block_grads(kb)
      dq_blk, dk_blk, dx = grads
      k0 = kb * bk
      dq = jax.tree.map(jnp.add, dq, dq_blk)
      add = lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, _slice(a, k0, bk) + u, k0, 1)
      return dq, jax.tree.map(add, dk_all, dk_blk), add(dx_all, dx)

    count = counts if isinstance(counts, int) else counts[qb]
    dq, dk_all, dx_all = jax.lax.fori_loop(
        0, count, key_block, (zeros(_fields(q, _CENTRE_GRADS)), dk_all, dx_all)
    )
    dq_all = jax.tree.map(lambda a, u: jax.lax.dynamic_update_slice_in_dim(a, u, q0, 1), dq_all, dq)
    return dq_all, dk_all, dx_all

  centre_grads, context_grads = _fields(centres, _CENTRE_GRADS), _fields(context, _CONTEXT_GRADS)
  init = (zeros(centre_grads), zeros(context_grads), jnp.zeros(x.shape, jnp.float32))
  dq, dk, dx = jax.lax.fori_loop(0, centres.valid.shape[1] // bq, query_block, init)
  cast = lambda grads, like: jax.tree.map(lambda g, a: g.astype(a.dtype), grads, like)
  # Integer and boolean inputs (positions, validity, dropout seeds) get None.
  d_centres = Centres(None, None)._replace(**dict(zip(_CENTRE_GRADS, cast(dq, centre_grads))))
  d_context = Context(None, None, dx.astype(x.dtype))._replace(
      **dict(zip(_CONTEXT_GRADS, cast(dk, context_grads)))
  )
  return (PoolInputs(d_centres, d_context, None),)


_blockwise_pool.defvjp(_blockwise_forward, _blockwise_backward)


def _reach(rule: PoolRule) -> Optional[int]:
  """The largest flat-index distance of an input a centre can read (None:
  unbounded): a hard support of Euclidean radius R reaches
  ``|d flat index| <= R * sum of the axis strides``."""
  radius = {'fixed_window': rule.window, 'random_sparse': rule.support_span}.get(rule.locality)
  if radius is None:
    return None
  return radius * sum(math.prod(rule.spatial[a + 1 :]) for a in range(len(rule.spatial)))


def _key_block_ranges(
    q_index: np.ndarray,
    block_q: int,
    block_k: int,
    num_k_blocks: int,
    causal: bool,
    reach: Optional[int],
) -> tuple[tuple[int, int], ...]:
  """Static key block range per query block (see :class:`_BlockSpec`).

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


def _key_block_order(
    q_index: np.ndarray,
    block_q: int,
    block_k: int,
    ranges: Sequence[tuple[int, int]],
    near_first: bool,
) -> tuple[tuple[int, ...], ...]:
  """The key blocks each query block visits, in order (see :class:`_BlockSpec`):
  its range (:func:`_key_block_ranges`) in ascending order, or, ``near_first``
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


# ----------------------------------------------------------------------------
# The module.
# ----------------------------------------------------------------------------


class ContextPool(nn.Module):
  """Adaptive context pooling (Huang et al., ICML 2022), Eq. 4 and Eq. 6.

  ``__call__(x, mask=None, deterministic=True)``:

  * ``x``: ``[batch, length, features]`` (a sequence) or
    ``[batch, height, width, features]`` (a grid); ``batch`` may be 0 (an
    empty output, as at the end of a sharded evaluation).
  * ``mask``: optional bool, ``x.shape[:-1]``; True marks a real token. Padded
    positions get zero pooling weight, are zeroed before the mapping reads them,
    and are passed through unchanged in the output, so their values can never
    change a real position's output (A5). For sequences the sizes also use the
    number of real tokens, so the amount of padding does not matter either.
  * ``deterministic``: False enables dropout on the pooling weights (rng
    ``'dropout'``).

  Returns ``x``'s shape, or for ``strides > 1`` the grid sampled at the pooling
  centres (see :func:`pool_centres`).

  Sows into ``'intermediates'`` (``apply(..., mutable=['intermediates'])``):
  ``'pool_weights'``: the normalised weights w, ``[batch, *spatial]`` (for
  ``weights='nonlocal'`` the pairwise weights ``[batch, *out_spatial, *spatial]``);
  ``'pool_size'``: the normalised size s in [0, 1] (:func:`normalised_size`)
  and ``'pool_sigma'``: sigma in token units, both ``[batch, *spatial]`` (for
  ``'adaptive_window'`` the window radius; not sown for localities without a
  learned size). Output position o uses the sigma of its centre.

  Attributes:
    weights: ``'learned' | 'unnormalized' | 'uniform' | 'nonlocal'``.
    locality: ``'gaussian' | 'none' | 'fixed_window' | 'adaptive_window' |
      'random_sparse'``.
    mapping: ``'cnn' | 'mlp' | 'attention'`` -- m(X) predicting the raw weight
      and raw size channels (only the channels the variant uses are predicted).
    size_norm: A1. ``'sigmoid'`` (default: per token, sigma in (0, r n)) or
      ``'softmax'`` (the literal reading: over positions, so sizes sum to 1
      and the average sigma is r tokens). See :func:`normalised_size`. Default
      chosen by ``benchmarks/ablation_default.py`` (README "Results"): on the
      offline LM, sigmoid gave lower validation BPC than softmax in every
      placement (e.g. 2.34 vs 2.45 at seed 0); on a grid the softmax reading
      makes every sigma a small fraction of a cell (r (h + w) / 2 / (h w)),
      i.e. an identity layer.
    ratio: r; None means 0.1 for sequences, 0.05 for grids.
    sigma_length: sequences only: a static n in ``sigma_i = r n s_i`` (e.g. the
      model's context length), so that a token's pooling size does not depend
      on its position in the window (an extension: the paper's n is "the
      sequence length"). None (default): n counts the real tokens (causal: the
      real tokens ``<= i``). Causality and padding invariance hold either way.
    size_bias_init: initial bias of the raw size channel (the mapping's last
      layer), i.e. where ``s = sigmoid(raw)`` starts (``'sigmoid'``: about
      ``sigmoid(size_bias_init)``); 0.0 (default) is flax's zero bias. A
      negative value starts narrow: ``-3.2`` gives ``s ~ 0.04``, sigma ~ 1
      token at ``r n = 25.6`` (an extension; the paper gives no init).
    residual: A3. False: the pooled features replace the input (the paper's
      "pool them ... for use in the next attention block"); True: ``x + pool(x)``.
    gate: an extension of A3 (not in the paper): a learned per-feature gate
      ``g [features]``, ``y = x + g * (pool(x) - x)``, so every channel can
      learn how much of its pooled value replaces its own (g = 1: the paper's
      replacement, g = 0: the identity). Not combined with ``residual``.
    gate_init: the gate's initial value (every feature), 1.0: the paper's
      replacement at initialisation.
    causal: A4. Sequences only. No output depends on a later input: the
      support is ``j <= i``; the cnn mapping is left-padded; the mlp mapping is
      per token; the attention mapping and non-local weights are causally
      masked; the softmax size normalisation is a prefix softmax; n in
      ``sigma = r n s`` counts tokens ``<= i``.
    strides: output stride per spatial axis (the ConvNet pooling replacement);
      not allowed with ``causal``.
    window_shape: window of the pooling op being replaced, used only to place
      the centres ('SAME' semantics as ``nn.avg_pool``); None means ``strides``.
    kernel_size: A2. kernel size of both mapping convolutions (per axis).
    hidden_features: A2. width of the mapping's hidden layer.
    activation: A2. ``'relu' | 'gelu' | 'silu' | 'tanh'``.
    window: radius (Euclidean, in tokens) of the ``'fixed_window'`` support,
      and the window whose size a ``'random_sparse'`` support matches in
      expectation.
    window_softness: adaptive window only: width (tokens) of the sigmoid edge
      whose gradient trains the hard window's radius (straight-through).
    random_seed: seed of the ``'random_sparse'`` support (fixed, not an rng).
    random_span: ``'random_sparse'`` only (the paper gives no details): the
      support of a centre is itself plus each other position within Euclidean
      radius ``random_span`` kept with probability ``K / M``, where K (M) is
      the number of non-zero integer offsets within radius ``window``
      (``random_span``) on the unbounded grid. So wherever the span fits in
      the input, a token pools over as many positions as the fixed window in
      expectation (causal: half of both, as the fixed window), scattered over
      a region 4x wider by default; near the edges both supports shrink.
      K / M involves neither the input's length nor its padding, and the keep
      bits hash the positions' coordinates, so padding never changes a real
      token's support and a causal prefix gives the whole sequence's outputs.
      None means ``4 * window``; must be ``>= window``.
    nonlocal_features: width of theta/phi for ``weights='nonlocal'``; None
      means the input width (the paper's d x d projections, no bias).
    dropout_rate: dropout on the normalised pooling weights. The keep mask is
      a counter-based hash of (a per-example seed drawn from the ``'dropout'``
      rng, centre index, input index), the same in both implementations (and
      for any ``block_size``), so they give identical outputs for one rng.
    implementation: ``'auto' | 'dense' | 'blockwise'`` (see the module
      docstring). ``'dense'`` materialises the ``[batch, m, n]`` pooling
      matrix; ``'blockwise'`` never does (flash-attention style online softmax
      and a recomputing ``custom_vjp``), for every variant, with the same
      result up to float32 rounding. ``'auto'``: ``'blockwise'`` when the
      number of input positions n > :data:`AUTO_BLOCKWISE_THRESHOLD` (1024),
      else ``'dense'`` (measured: where blockwise starts to need less compiled
      forward + backward memory, and is no slower on CPU). Blockwise
      limitations: reverse-mode autodiff only (``jax.grad``/``vjp``/``jacrev``;
      ``jax.jvp``/``jacfwd`` raise a TypeError, the price of the custom VJP:
      use ``'dense'`` for forward mode); ``mapping='attention'`` is itself a
      flax self-attention over all positions and stays O(n^2) whatever the
      implementation; with ``weights='nonlocal'`` and a mutable
      ``'intermediates'`` collection the sown pairwise weights are
      ``[batch, m, n]`` (only built when sown, in both implementations).
    block_size: query and key block length of ``'blockwise'`` (clipped to the
      number of outputs / inputs; other lengths are padded internally and the
      padding masked). Temporaries are O(batch * block_size^2).
    gaussian_skip_nats: ``'blockwise'`` with ``locality='gaussian'`` and
      query-independent weights only: a key block whose largest possible
      logit (``max_j a_j - min_i d^2 / (2 sigma_i^2)`` over the query block's
      centres) lies more than this many nats below every centre's running
      maximum is skipped at run time, in the forward and backward passes (key
      blocks are visited nearest first). Each skipped term is below
      ``exp(-gaussian_skip_nats)`` times its row's largest, so a row loses at
      most ``n exp(-gaussian_skip_nats)`` of its softmax mass (the default 18:
      1.5e-8 per term, below float32 rounding). None: never skip.
    decode: streaming (incremental decoding; needs ``causal``): the first call,
      on the full ``[batch, max_len, features]``, creates the ``'cache'``
      collection and returns the ordinary output; every later call takes one
      position ``[batch, 1, features]`` (mask ``[batch, 1]``) and returns its
      pooled feature from the cached x_{<=t}, a_{<=t} (phi_{<=t} for non-local
      weights), the running size statistics and the last k - 1 inputs of each
      mapping convolution (:meth:`_decode_step`): nothing is recomputed.
    dtype: compute dtype (None: the input's); the pooling softmax is always
      computed in float32.
    param_dtype: parameter dtype.
  """

  weights: str = 'learned'
  locality: str = 'gaussian'
  mapping: str = 'cnn'
  size_norm: str = 'sigmoid'
  ratio: Optional[float] = None
  sigma_length: Optional[int] = None
  size_bias_init: float = 0.0
  residual: bool = False
  gate: bool = False
  gate_init: float = 1.0
  causal: bool = False
  strides: Union[int, Sequence[int]] = 1
  window_shape: Optional[Union[int, Sequence[int]]] = None
  kernel_size: int = 3
  hidden_features: int = 32
  activation: str = 'relu'
  window: int = 8
  window_softness: float = 1.0
  random_seed: int = 0
  random_span: Optional[int] = None
  nonlocal_features: Optional[int] = None
  dropout_rate: float = 0.0
  implementation: str = 'auto'
  block_size: int = 512
  gaussian_skip_nats: Optional[float] = GAUSSIAN_SKIP_NATS
  decode: bool = False
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  # -- configuration ---------------------------------------------------------

  def check_config(self) -> None:
    """Raises ValueError for any invalid field (called by ``__call__``)."""
    v.check_choice(_OWNER, 'weights', self.weights, WEIGHTS)
    v.check_choice(_OWNER, 'locality', self.locality, LOCALITIES)
    v.check_choice(_OWNER, 'mapping', self.mapping, MAPPINGS)
    v.check_choice(_OWNER, 'size_norm', self.size_norm, SIZE_NORMS)
    v.check_choice(_OWNER, 'activation', self.activation, tuple(ACTIVATIONS))
    v.check_choice(_OWNER, 'implementation', self.implementation, IMPLEMENTATIONS)
    v.check_positive(_OWNER, 'block_size', self.block_size, integer=True)
    v.check_positive(_OWNER, 'gaussian_skip_nats', self.gaussian_skip_nats, allow_none=True)
    v.check_positive(_OWNER, 'ratio', self.ratio, allow_none=True)
    v.check_positive(_OWNER, 'kernel_size', self.kernel_size, integer=True)
    v.check_positive(_OWNER, 'hidden_features', self.hidden_features, integer=True)
    v.check_positive(_OWNER, 'window', self.window, integer=True)
    v.check_positive(_OWNER, 'window_softness', self.window_softness)
    if self.random_span is not None and not (
        isinstance(self.random_span, int)
        and not isinstance(self.random_span, bool)
        and self.random_span >= self.window
    ):
      raise ConfigError(
          f'{_OWNER}.random_span={self.random_span!r} is invalid; expected '
          f'an int >= window ({self.window!r}), or None (4 * window).'
      )
    v.check_positive(
        _OWNER, 'nonlocal_features', self.nonlocal_features, allow_none=True, integer=True
    )
    v.check_probability(_OWNER, 'dropout_rate', self.dropout_rate)
    if not isinstance(self.random_seed, int) or isinstance(self.random_seed, bool):
      raise ConfigError(
          f'{_OWNER}.random_seed={self.random_seed!r} is invalid; ' 'expected an int.'
      )
    v.check_positive(_OWNER, 'sigma_length', self.sigma_length, allow_none=True, integer=True)
    v.check_finite(_OWNER, 'size_bias_init', self.size_bias_init)
    v.check_finite(_OWNER, 'gate_init', self.gate_init)
    for name in ('residual', 'gate', 'causal', 'decode'):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(
            f'{_OWNER}.{name}={getattr(self, name)!r} is invalid; ' 'expected True or False.'
        )
    if self.decode and not self.causal:
      raise ConfigError(
          f'{_OWNER}.decode=True needs causal=True (streaming reads x_<=t only); '
          f'got causal={self.causal!r}.'
      )
    if self.gate and self.residual:
      raise ConfigError(
          f'{_OWNER}.gate=True with residual=True: choose one way to combine x and '
          'pool(x) (gate: x + g * (pool(x) - x); residual: x + pool(x)).'
      )

  def _check_inputs(self, x: Array, mask: Optional[Array]) -> tuple[int, ...]:
    self.check_config()
    v.check_rank(
        _OWNER, 'x', x, (3, 4), '[batch, length, features] or [batch, height, width, features]'
    )
    ndim = x.ndim - 2
    strides = v.as_tuple(_OWNER, 'strides', self.strides, ndim)
    if self.window_shape is not None:
      v.as_tuple(_OWNER, 'window_shape', self.window_shape, ndim)
    if self.causal and ndim != 1:
      raise ConfigError(
          f'{_OWNER}.causal=True needs a sequence [batch, length, '
          f'features]; got a grid of shape {x.shape}. Causal pooling '
          'is only defined for 1D sequences.'
      )
    if self.sigma_length is not None and ndim != 1:
      raise ConfigError(
          f'{_OWNER}.sigma_length={self.sigma_length!r} is for sequences; got a grid of '
          f'shape {x.shape} (grids use sigma = r S (h + w) / 2). Allowed: None.'
      )
    if self.causal and any(s != 1 for s in strides):
      raise ConfigError(
          f'{_OWNER}.strides={self.strides!r} is not allowed with ' 'causal=True; allowed: 1.'
      )
    if mask is not None and tuple(mask.shape) != tuple(x.shape[:-1]):
      raise ValueError(
          f'{_OWNER}: mask has shape {tuple(mask.shape)}; expected '
          f'x.shape[:-1] = {tuple(x.shape[:-1])} (True = real token).'
      )
    return strides

  # -- m(X) ------------------------------------------------------------------

  def _out_bias_init(self, channels: int) -> Callable[..., Array]:
    """Bias init of the mapping's last layer: zeros, and ``size_bias_init`` on
    the raw size channel (the last one) when the variant has one."""
    uses_size = self.locality in ('gaussian', 'adaptive_window')

    def init(key, shape, dtype=jnp.float32):
      del key
      bias = jnp.zeros(shape, dtype)
      return bias.at[..., -1].set(self.size_bias_init) if uses_size else bias

    return init

  def _mapping(self, x: Array, valid: Array, channels: int, dtype: Dtype) -> Array:
    """m(X): ``[batch, *spatial, features] -> [batch, n, channels]`` raw outputs."""
    batch, spatial = x.shape[0], x.shape[1:-1]
    act = ACTIVATIONS[self.activation]
    valid_sp = valid.reshape(valid.shape[0], *spatial, 1)
    x = _mask_features(valid_sp, x, 0.0)
    dense = lambda f, name, bias_init=_ZEROS: nn.Dense(
        f, dtype=dtype, param_dtype=self.param_dtype, bias_init=bias_init, name=name
    )
    if self.mapping == 'cnn':
      k = self.kernel_size
      padding = [(k - 1, 0)] if self.causal else 'SAME'
      conv = lambda f, name, bias_init=_ZEROS: nn.Conv(
          f,
          (k,) * len(spatial),
          padding=padding,
          dtype=dtype,
          param_dtype=self.param_dtype,
          bias_init=bias_init,
          name=name,
      )
      h = act(conv(self.hidden_features, 'mapping_conv_0')(x))
      # Zero the hidden map at padded positions too, so that padding behaves
      # exactly like the convolution's own zero padding.
      h = _mask_features(valid_sp, h, 0.0)
      out = conv(channels, 'mapping_conv_1', self._out_bias_init(channels))(h)
    elif self.mapping == 'mlp':
      h = act(dense(self.hidden_features, 'mapping_dense_0')(x))
      out = dense(channels, 'mapping_dense_1', self._out_bias_init(channels))(h)
    else:  # 'attention'
      tokens = x.reshape(batch, math.prod(spatial), x.shape[-1])
      attn_mask = valid[:, None, :, None] & valid[:, None, None, :]
      if self.causal:
        attn_mask = attn_mask & jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
      # decode: its own key/value cache (see _decode_step).
      h = self._mapping_attention(dtype, self.decode)(tokens, tokens, mask=attn_mask)
      out = dense(channels, 'mapping_dense', self._out_bias_init(channels))(h)
    return out.reshape(batch, math.prod(spatial), channels).astype(jnp.float32)

  def _mapping_attention(self, dtype: Dtype, decode: bool) -> nn.Module:
    """The self-attention mapping's one-head attention (Table 3), for both the
    whole-sequence call and the cached decoding step."""
    return nn.MultiHeadDotProductAttention(
        num_heads=1,
        qkv_features=self.hidden_features,
        out_features=self.hidden_features,
        dtype=dtype,
        param_dtype=self.param_dtype,
        decode=decode,
        name='mapping_attention',
    )

  # -- forward ---------------------------------------------------------------

  def resolved_random_span(self) -> int:
    """Radius the ``'random_sparse'`` support is drawn from: ``random_span``, or
    4 * ``window`` when it is None."""
    return 4 * self.window if self.random_span is None else self.random_span

  def resolved_implementation(self, num_inputs: int) -> str:
    """``'dense'`` or ``'blockwise'``: what ``implementation`` means for n inputs."""
    if self.implementation != 'auto':
      return self.implementation
    return 'blockwise' if num_inputs > AUTO_BLOCKWISE_THRESHOLD else 'dense'

  def pool_rule(self, spatial: Sequence[int], dropout: bool) -> PoolRule:
    """The fields as :func:`pool_block` reads them, for inputs on the grid
    ``spatial``; ``dropout``: whether this call drops pooling weights."""
    span = self.resolved_random_span()
    return PoolRule(
        spatial=tuple(spatial),
        causal=self.causal,
        locality=self.locality,
        window=self.window,
        window_softness=float(self.window_softness),
        support_seed=self.random_seed & 0xFFFFFFFF,
        support_prob=(
            _support_probability(len(spatial), self.window, span)
            if self.locality == 'random_sparse'
            else 1.0
        ),
        support_span=span,
        dropout_rate=float(self.dropout_rate) if dropout else 0.0,
    )

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array] = None, deterministic: bool = True) -> Array:
    strides = self._check_inputs(x, mask)
    if self.decode:  # streaming: a step, or the call that creates the cache
      if self.has_variable('cache', 'cache_index'):
        return self._decode_step(x, mask, deterministic)
      self._stream_cache(x.shape[0], x.shape[1], x.shape[-1], self.dtype or x.dtype)
    dtype = self.dtype if self.dtype is not None else jnp.result_type(x)
    x = x.astype(dtype)
    batch, spatial, features = x.shape[0], tuple(x.shape[1:-1]), x.shape[-1]
    ndim, n = len(spatial), math.prod(spatial)
    ratio = self.ratio if self.ratio is not None else DEFAULT_RATIO[ndim]
    window_shape = (
        strides
        if self.window_shape is None
        else v.as_tuple(_OWNER, 'window_shape', self.window_shape, ndim)
    )
    implementation = self.resolved_implementation(n)

    valid = (
        jnp.ones((batch, n), bool)
        if mask is None
        else jnp.asarray(mask).reshape(batch, n).astype(bool)
    )
    tokens = x.reshape(batch, n, features)

    centre_axes = pool_centres(spatial, strides, window_shape)
    out_spatial = tuple(len(c) for c in centre_axes)
    q_index = _query_indices(spatial, centre_axes)  # [m] (static)

    # m(X): raw weight and/or raw size channels, only those the variant uses.
    uses_weight = self.weights in ('learned', 'unnormalized')
    uses_size = self.locality in ('gaussian', 'adaptive_window')
    channels = int(uses_weight) + int(uses_size)
    raw = self._mapping(x, valid, channels, dtype) if channels else None

    # Log pooling weights: a query-independent a [b, n] (None: uniform, a = 0)
    # or, for non-local weights, theta [b, m, k] and phi [b, n, k].
    log_w = theta = phi = None
    if self.weights == 'learned':
      log_w = raw[..., 0]
    elif self.weights == 'unnormalized':
      log_w = _log_softplus(raw[..., 0])
    elif self.weights == 'nonlocal':  # Eq. 3
      k = self.nonlocal_features or features
      # Eq. 3: linear maps W^theta x, W^phi x, without bias.
      proj = lambda name: nn.DenseGeneral(
          k, use_bias=False, dtype=dtype, param_dtype=self.param_dtype, name=name
      )
      theta = proj('nonlocal_theta')(tokens[:, q_index])
      phi = proj('nonlocal_phi')(tokens)

    sigma_q = None
    if uses_size:
      size = normalised_size(raw[..., -1], valid, size_norm=self.size_norm, causal=self.causal)
      sigma = pooling_sigma(
          size,
          valid,
          causal=self.causal,
          ratio=ratio,
          grid_extent=(sum(spatial) / 2 if ndim == 2 else None),
          length=self.sigma_length,
      )
      self.sow('intermediates', 'pool_size', size.reshape(batch, *spatial))
      self.sow('intermediates', 'pool_sigma', sigma.reshape(batch, *spatial))
      sigma_q = sigma[:, q_index]  # [b, m]

    dropout_seeds = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_seeds = jax.random.bits(self.make_rng('dropout'), (batch,), jnp.uint32)

    centres = Centres(
        index=q_index.astype(np.int32), valid=valid[:, q_index], sigma=sigma_q, theta=theta
    )
    context = Context(
        index=jnp.arange(n, dtype=jnp.int32), valid=valid, x=tokens, log_w=log_w, phi=phi
    )
    rule = self.pool_rule(spatial, dropout=dropout_seeds is not None)
    if self.is_mutable_collection('intermediates'):  # only built when they are sown
      pairwise = out_spatial if self.weights == 'nonlocal' else ()
      w = pool_weights(rule, centres, context, self.weights)
      self.sow('intermediates', 'pool_weights', w.reshape((batch,) + pairwise + spatial))

    inputs = PoolInputs(centres, context, dropout_seeds)
    if implementation == 'dense':
      y = _pool_dense(rule, inputs)
    else:
      y = _pool_blockwise(rule, self.block_size, inputs, self.gaussian_skip_nats)

    x_centres = tokens[:, q_index]
    y = self._combine(x_centres, y)
    # Padded positions are passed through unchanged.
    y = _mask_features(centres.valid[..., None], y, x_centres)
    return y.reshape(batch, *out_spatial, features)

  def _combine(self, x: Array, pooled: Array) -> Array:
    """What the layer returns at the centres from their inputs ``x`` and the
    pooled features (both ``[batch, m, features]``): the pooled features (the
    paper), ``x + pooled`` (``residual``) or ``x + g * (pooled - x)``
    (``gate``), for the whole-sequence call and the decoding step alike."""
    if self.residual:
      return x + pooled
    if self.gate:
      g = self.param(
          'gate', nn.initializers.constant(self.gate_init), (x.shape[-1],), self.param_dtype
      )
      return x + g.astype(x.dtype) * (pooled - x)
    return pooled

  # -- streaming (decode=True) -----------------------------------------------

  def _stream_cache(
      self, batch: int, length: Optional[int], features: int, dtype: Dtype
  ) -> dict[str, Any]:
    """The ``'cache'`` variables of ``decode=True``, created on the first call
    (``length`` = max_len; later calls pass None). Per example:

    * ``x [max_len, features]``, ``valid [max_len]``: the inputs x_j, j <= t;
    * ``log_w [max_len]`` float32: a_j (learned / unnormalised weights);
    * ``phi [max_len, k]``: the non-local keys (``weights='nonlocal'``);
    * ``count``, ``size_lse`` float32: the number of real tokens <= t (n in
      sigma = r n s) and, for the softmax size norm, the running logsumexp of
      the raw sizes (the prefix softmax's denominator);
    * ``conv_inputs [k - 1, features]``, ``conv_hidden [k - 1,
      hidden_features]``: the last k - 1 (masked) inputs of each mapping
      convolution (``mapping='cnn'``);

    and ``cache_index``, the next position t. The attention mapping keeps its
    own (flax) key/value cache.
    """
    uses_weight = self.weights in ('learned', 'unnormalized')
    uses_size = self.locality in ('gaussian', 'adaptive_window')
    zeros = lambda shape, dt: (lambda: jnp.zeros((batch,) + shape, dt))
    names = {
        'cache_index': lambda: jnp.array(0, jnp.int32),
        'x': zeros((length, features), dtype),
        'valid': zeros((length,), bool),
    }
    if uses_weight:
      names['log_w'] = zeros((length,), jnp.float32)
    if self.weights == 'nonlocal':
      names['phi'] = zeros((length, self.nonlocal_features or features), dtype)
    if uses_size:
      names['count'] = zeros((), jnp.float32)
      if self.size_norm == 'softmax':
        names['size_lse'] = lambda: jnp.full((batch,), _NEG, jnp.float32)
    if self.mapping == 'cnn':
      names['conv_inputs'] = zeros((self.kernel_size - 1, features), dtype)
      names['conv_hidden'] = zeros((self.kernel_size - 1, self.hidden_features), dtype)
    return {name: self.variable('cache', name, init) for name, init in names.items()}

  def _mapping_step(
      self, x: Array, valid: Array, channels: int, dtype: Dtype, cache: dict[str, Any]
  ) -> Array:
    """m(X) at the new position: ``x [batch, 1, features]`` -> ``[batch, channels]``
    float32, equal to :meth:`_mapping`'s output there. The causal convolutions
    read the cached last k - 1 inputs (``'VALID'`` over a window of k, the same
    parameters), the mlp reads the token, the attention mapping attends over its
    cache with the cached validity."""
    act = ACTIVATIONS[self.activation]
    keep = valid[..., None]  # [b, 1, 1]
    x = _mask_features(keep, x, 0.0)
    dense = lambda f, name, bias_init=_ZEROS: nn.Dense(
        f, dtype=dtype, param_dtype=self.param_dtype, bias_init=bias_init, name=name
    )
    if self.mapping == 'cnn':
      conv = lambda f, name, bias_init=_ZEROS: nn.Conv(
          f,
          (self.kernel_size,),
          padding='VALID',
          dtype=dtype,
          param_dtype=self.param_dtype,
          bias_init=bias_init,
          name=name,
      )
      window = jnp.concatenate([cache['conv_inputs'].value, x.astype(dtype)], axis=1)
      h = _mask_features(keep, act(conv(self.hidden_features, 'mapping_conv_0')(window)), 0.0)
      hidden = jnp.concatenate([cache['conv_hidden'].value, h.astype(dtype)], axis=1)
      out = conv(channels, 'mapping_conv_1', self._out_bias_init(channels))(hidden)
      cache['conv_inputs'].value = window[:, 1:]
      cache['conv_hidden'].value = hidden[:, 1:]
    elif self.mapping == 'mlp':
      out = dense(channels, 'mapping_dense_1', self._out_bias_init(channels))(
          act(dense(self.hidden_features, 'mapping_dense_0')(x))
      )
    else:  # 'attention': flax's cache masks j > t; the cached validity masks padding.
      attn_mask = valid[:, None, :, None] & cache['valid'].value[:, None, None, :]
      h = self._mapping_attention(dtype, True)(x, x, mask=attn_mask)
      out = dense(channels, 'mapping_dense', self._out_bias_init(channels))(h)
    return out.reshape(x.shape[0], channels).astype(jnp.float32)

  def _decode_step(self, x: Array, mask: Optional[Array], deterministic: bool) -> Array:
    """One streaming step: the pooled feature ``[batch, 1, features]`` of position
    t = ``cache_index`` from ``x [batch, 1, features]`` (mask ``[batch, 1]``).

    Eq. 4 for the one centre t over the cached inputs j <= t, by the same
    :func:`pool_block` and dense pooling as the full forward: a_t (and phi_t,
    theta_t) from the new token's mapping output, and sigma_t = r n_t s_t
    (:func:`pooling_sigma`) from the running count n_t of real tokens and, for
    the softmax size norm, the running logsumexp of the raw sizes. O(t) work.
    """
    if x.shape[1] != 1:
      raise ValueError(
          f'{_OWNER}: a decode=True step takes one position [batch, 1, features]; '
          f'got x of shape {x.shape}.'
      )
    if not deterministic and self.dropout_rate > 0.0:
      raise ValueError(
          f'{_OWNER}: decode=True steps are inference; got deterministic=False with '
          f'dropout_rate={self.dropout_rate!r}.'
      )
    dtype = self.dtype if self.dtype is not None else jnp.result_type(x)
    x = x.astype(dtype)
    batch, features = x.shape[0], x.shape[-1]
    valid = (
        jnp.ones((batch, 1), bool)
        if mask is None
        else jnp.asarray(mask).reshape(batch, 1).astype(bool)
    )
    cache = self._stream_cache(batch, None, features, dtype)
    t = cache['cache_index'].value
    length = cache['x'].value.shape[1]
    put = lambda name, new: jax.lax.dynamic_update_slice_in_dim(
        cache[name].value, new.astype(cache[name].value.dtype), t, axis=1
    )
    cache['x'].value = put('x', x)
    cache['valid'].value = put('valid', valid)

    uses_weight = self.weights in ('learned', 'unnormalized')
    uses_size = self.locality in ('gaussian', 'adaptive_window')
    channels = int(uses_weight) + int(uses_size)
    raw = self._mapping_step(x, valid, channels, dtype, cache) if channels else None

    theta = None
    if uses_weight:
      a = raw[:, :1] if self.weights == 'learned' else _log_softplus(raw[:, :1])
      cache['log_w'].value = put('log_w', a)
    elif self.weights == 'nonlocal':  # Eq. 3, as in __call__
      k = self.nonlocal_features or features
      proj = lambda name: nn.DenseGeneral(
          k, use_bias=False, dtype=dtype, param_dtype=self.param_dtype, name=name
      )
      theta = proj('nonlocal_theta')(x)
      cache['phi'].value = put('phi', proj('nonlocal_phi')(x))

    sigma = None
    if uses_size:  # pooling_sigma's causal prefix statistics, one step on
      z = jnp.where(valid, raw[:, -1:], _NEG)
      count = cache['count'].value + valid[:, 0].astype(jnp.float32)
      cache['count'].value = count
      if self.size_norm == 'sigmoid':
        s = jax.nn.sigmoid(z)
      else:
        lse = jnp.logaddexp(cache['size_lse'].value, z[:, 0])
        cache['size_lse'].value = lse
        s = jnp.exp(z - lse[:, None])
      ratio = self.ratio if self.ratio is not None else DEFAULT_RATIO[1]
      extent = count[:, None] if self.sigma_length is None else self.sigma_length
      sigma = ratio * extent * jnp.where(valid, s, 0.0)

    centres = Centres(index=t[None].astype(jnp.int32), valid=valid, sigma=sigma, theta=theta)
    context = Context(
        index=jnp.arange(length, dtype=jnp.int32),
        valid=cache['valid'].value,
        x=cache['x'].value,
        log_w=cache['log_w'].value if uses_weight else None,
        phi=cache['phi'].value if self.weights == 'nonlocal' else None,
    )
    y = _pool_dense(self.pool_rule((length,), dropout=False), PoolInputs(centres, context))
    cache['cache_index'].value = t + 1
    return _mask_features(valid[..., None], self._combine(x, y), x)
