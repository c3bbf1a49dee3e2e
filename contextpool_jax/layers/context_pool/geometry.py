"""Where ContextPool pools: token coordinates, pooling centres, squared distances.

Positions are row-major flat indices of the input grid ``spatial`` (``(length,)``
or ``(height, width)``); d(i, j) of Eq. 4 / Eq. 6 is the Euclidean distance of
two positions' integer grid coordinates.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


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


def query_indices(spatial: Sequence[int], centres: Sequence[np.ndarray]) -> np.ndarray:
  """Flat (row-major) input indices of the pooling centres, ``[m]``."""
  mesh = np.meshgrid(*centres, indexing='ij')
  return np.ravel_multi_index([c.reshape(-1) for c in mesh], tuple(spatial))


def grid_coordinates(index: Any, spatial: Sequence[int]) -> list[Any]:
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
  ``[Bq]`` / ``[Bk]`` array per axis, :func:`grid_coordinates`)."""
  return functools.reduce(
      operator.add,
      [
          jnp.square(q.astype(jnp.float32)[:, None] - k.astype(jnp.float32)[None, :])
          for q, k in zip(q_coords, k_coords)
      ],
  )
