"""Position encodings: sinusoidal (Vaswani et al., Sec. 3.5) and rotary (Su et al., RoFormer,
Sec. 3.4), each against a direct reference written from its paper."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.models import positions as P


def _ref_sinusoidal(length, dim):
  """Vaswani et al. Sec. 3.5 by loops: PE(pos, 2i) = sin(pos / 10000^(2i/d)),
  PE(pos, 2i + 1) = cos(pos / 10000^(2i/d))."""
  pe = np.zeros((length, dim))
  for pos in range(length):
    for i in range(0, dim, 2):
      pe[pos, i] = math.sin(pos / 10000 ** (i / dim))
      if i + 1 < dim:
        pe[pos, i + 1] = math.cos(pos / 10000 ** (i / dim))
  return pe


@pytest.mark.parametrize('length,dim', [(7, 8), (5, 9)])
def test_sinusoidal_positions_follow_the_formula(length, dim):
  np.testing.assert_allclose(
      P.sinusoidal_positions(length, dim), _ref_sinusoidal(length, dim), atol=1e-6
  )


def _ref_rotation_matrix(m, dim, base=10000.0):
  """RoFormer Eq. 15: the block-diagonal R^d_{Theta,m}, block i the 2x2 rotation
  by m theta_i, theta_i = base^(-2(i-1)/d) for i = 1 .. d/2."""
  r = np.zeros((dim, dim))
  for i in range(1, dim // 2 + 1):
    theta = base ** (-2 * (i - 1) / dim)
    c, s = math.cos(m * theta), math.sin(m * theta)
    a = 2 * (i - 1)
    r[a : a + 2, a : a + 2] = [[c, -s], [s, c]]
  return r


def _ref_rotary(x, positions):
  """``x [batch, length, heads, dim]`` with each vector multiplied by its position's matrix."""
  out = np.zeros(x.shape)
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      m = positions[b, t] if positions.ndim == 2 else positions[t]
      for h in range(x.shape[2]):
        out[b, t, h] = _ref_rotation_matrix(int(m), x.shape[3]) @ x[b, t, h]
  return out


def test_rotary_equals_the_papers_rotation_matrices():
  x = np.asarray(jax.random.normal(jax.random.key(0), (2, 6, 3, 8)), np.float64)
  pos = np.array([0, 1, 2, 5, 40, 1000])
  np.testing.assert_allclose(
      P.apply_rotary(jnp.asarray(x, jnp.float32), jnp.asarray(pos)), _ref_rotary(x, pos), atol=2e-5
  )
  per_row = np.array([[3, 4, 5, 6, 7, 8], [0, 0, 9, 9, 100, 2]])
  np.testing.assert_allclose(
      P.apply_rotary(jnp.asarray(x, jnp.float32), jnp.asarray(per_row)),
      _ref_rotary(x, per_row),
      atol=2e-5,
  )


def test_rotary_logits_depend_only_on_the_relative_position():
  """Eq. 16: (R_m q) . (R_n k) = q . R_{n-m} k, the same for every shift of both positions,
  and rotation keeps each vector's norm."""
  q, k = jax.random.normal(jax.random.key(1), (2, 1, 5, 2, 16))
  logits = lambda pq, pk: jnp.einsum(
      'bthd,bshd->bhts', P.apply_rotary(q, jnp.asarray(pq)), P.apply_rotary(k, jnp.asarray(pk))
  )
  pq, pk = np.array([0, 3, 4, 9, 20]), np.array([2, 2, 7, 8, 30])
  base = logits(pq, pk)
  for shift in (1, 17, 500):
    chex.assert_trees_all_close(logits(pq + shift, pk + shift), base, atol=1e-4)
  assert not np.allclose(logits(pq + 1, pk), base, atol=1e-2)  # not invariant to a relative shift
  chex.assert_trees_all_close(
      jnp.linalg.norm(P.apply_rotary(q, jnp.asarray(pq)), axis=-1),
      jnp.linalg.norm(q, axis=-1),
      atol=1e-5,
  )


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
def test_rotary_in_half_precision_at_32k_positions(dtype):
  """The angles are float32 whatever the input: at position 32,767 the half-precision result
  is the float32 result rounded (a float16 angle would be off by up to 16 radians)."""
  x = jax.random.normal(jax.random.key(2), (1, 4, 2, 8))
  pos = jnp.array([0, 1, 16_000, 32_767])
  low = P.apply_rotary(x.astype(dtype), pos)
  assert low.dtype == dtype
  full = P.apply_rotary(x.astype(dtype).astype(jnp.float32), pos)
  np.testing.assert_allclose(np.asarray(low, np.float32), np.asarray(full), atol=3e-2, rtol=1e-2)
  np.testing.assert_allclose(
      np.asarray(full),
      _ref_rotary(np.asarray(x.astype(dtype), np.float64), np.asarray(pos)),
      atol=2e-3,
  )


@pytest.mark.parametrize(
    'shape,positions,message',
    [
        ((1, 4, 2, 7), (4,), 'head_dim=7 is odd'),
        ((4, 2, 8), (4,), r'expected \[batch, length, heads, head_dim\]'),
        ((1, 4, 2, 8), (5,), r'positions have shape \(5,\)'),
    ],
)
def test_rotary_bad_shapes_raise(shape, positions, message):
  with pytest.raises(ValueError, match=message):
    P.apply_rotary(jnp.zeros(shape), jnp.zeros(positions, jnp.int32))
