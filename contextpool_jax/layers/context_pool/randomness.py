"""Counter-based randomness of ContextPool: the ``'random_sparse'`` support and
the dropout mask on the pooling weights.

Both are a 32-bit integer hash (murmur3's finaliser) of (seed, centre, input),
evaluated elementwise wherever needed, so the dense and blockwise
implementations (and any block size) agree exactly: for the support, of the two
positions' grid coordinates (so it does not change with the input's size or
padding); for dropout, of their flat indices.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

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


def support_probability(ndim: int, window: int, span: int) -> float:
  """Keep probability of a ``'random_sparse'`` off-centre position within the span.

  ``K / M``: K (M) is the number of non-zero integer offsets within radius
  ``window`` (``span``) on the unbounded lattice, so that wherever the span
  fits in the input the expected support is exactly the fixed window's (and,
  for causal pooling, half of both, as for the fixed window). It depends on
  neither the input's size nor its padding.
  """
  return min(1.0, _ball_size(ndim, window) / _ball_size(ndim, span))


def random_support(
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


def dropout_keep(seeds: Array, rate: float, q_index: Array, k_index: Array) -> Array:
  """Dropout keep bits ``[batch, len(q_index), len(k_index)]`` from per-example
  uint32 ``seeds [batch]``: ``hash(seed_b, i, j) >= rate * 2^32``."""
  rows = _row_hash(seeds[:, None], _SALT_DROPOUT, [q_index[None, :]])
  return _pair_hash(rows[:, :, None], [k_index[None, None, :]]) >= np.uint32(_threshold(rate))
