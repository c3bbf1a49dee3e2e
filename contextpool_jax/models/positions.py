"""Position encodings of the Transformer family: sinusoidal and rotary.

* :func:`sinusoidal_positions` -- absolute encodings added to the token
  embeddings (Vaswani et al., 2017, Sec. 3.5): the papers' Transformers.
* :func:`apply_rotary` -- rotary position embedding (RoPE; Su et al., 2021,
  "RoFormer", Sec. 3.4): each self-attention's queries and keys are rotated by
  an angle proportional to their position, so the logit ``q_m . k_n`` depends
  on the positions only through ``m - n`` (Eq. 16). What current LMs use, and
  a prior of its own: with the default base, the logits of far-apart pairs
  decay on average (RoFormer Sec. 3.4.3). Not in the four papers; the LM study
  uses it as the baseline a locality gain must beat (issue 68).

``TransformerConfig.positions`` picks one of :data:`POSITIONS` (the models
apply them; this module is the formulas).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

POSITIONS = ('sinusoidal', 'rotary')
# RoFormer's base (Eq. 15: theta_i = 10000^(-2(i-1)/d)), also Vaswani et al.'s.
ROTARY_BASE = 10000.0


def sinusoidal_positions(length: int, dim: int) -> np.ndarray:
  """Sinusoidal position encodings ``[length, dim]`` (Vaswani et al., Sec. 3.5).

  PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)),
  interleaved. A static numpy constant: any length works (no maximum length).
  """
  position = np.arange(length, dtype=np.float64)[:, None]
  div = np.exp(np.arange(0, dim, 2, dtype=np.float64) * (-math.log(10000.0) / dim))
  pe = np.zeros((length, dim), np.float32)
  pe[:, 0::2] = np.sin(position * div)
  pe[:, 1::2] = np.cos(position * div)[:, : dim // 2]
  return pe


def rotary_frequencies(dim: int, base: float = ROTARY_BASE) -> Array:
  """``theta_i = base^(-2(i-1)/dim)``, ``i = 1 .. dim/2`` (RoFormer Eq. 15), ``[dim // 2]`` float32."""
  return jnp.asarray(base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim), jnp.float32)


def apply_rotary(x: Array, positions: Array, base: float = ROTARY_BASE) -> Array:
  """Rotary position embedding of queries or keys (RoFormer Eq. 34).

  Each pair of features ``(x_{2i}, x_{2i+1})`` of a head is rotated by the
  angle ``m theta_i`` of its position ``m``:
  ``(x_{2i} cos m theta_i - x_{2i+1} sin m theta_i,
  x_{2i} sin m theta_i + x_{2i+1} cos m theta_i)``, the paper's block-diagonal
  ``R^d_{Theta,m}`` (Eq. 13-15), computed as its Eq. 34 (elementwise, no
  matrix). The pairs are the paper's adjacent ones; pairing ``i`` with
  ``i + d/2`` (GPT-NeoX's layout) is the same up to a fixed permutation of the
  projection's outputs, which are learned.

  Args:
    x: ``[batch, length, heads, head_dim]``, ``head_dim`` even.
    positions: integer positions ``[length]`` (shared by the batch) or
      ``[batch, length]``.
    base: the frequencies' base (Eq. 15).

  Returns:
    ``x`` rotated, same shape and dtype; the angles, sines and cosines and the
    rotation are computed in float32 (a position of 32k times theta_1 = 1 is
    a 32k-radian angle: float16 could not hold it).
  """
  if x.ndim != 4:
    raise ValueError(
        f'apply_rotary: x has shape {x.shape}; expected [batch, length, heads, head_dim].'
    )
  dim = x.shape[-1]
  if dim % 2:
    raise ValueError(f'apply_rotary: head_dim={dim} is odd; rotary pairs need an even head_dim.')
  if positions.shape not in ((x.shape[1],), (x.shape[0], x.shape[1])):
    raise ValueError(
        f'apply_rotary: positions have shape {positions.shape}; expected [length] = '
        f'({x.shape[1]},) or [batch, length] = {x.shape[:2]}.'
    )
  angles = positions.astype(jnp.float32)[..., None] * rotary_frequencies(dim, base)
  if positions.ndim == 1:
    angles = angles[None]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]  # [b, len, 1, d/2]
  pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], dim // 2, 2)
  even, odd = pairs[..., 0], pairs[..., 1]
  rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
  return rotated.reshape(x.shape).astype(x.dtype)
