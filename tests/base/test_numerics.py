"""The shared numerics (contextpool_jax.base.numerics): the masked softmax against a float64
reference over the allowed entries only, a row with nothing allowed all zeros with zero
gradients, float32 whatever the input dtype, and its gradient against the softmax Jacobian."""

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.base import numerics


def _reference(logits, allowed):
  """Softmax over each row's allowed entries, in float64; 0 elsewhere and in empty rows."""
  logits, out = np.asarray(logits, np.float64), np.zeros(np.shape(logits))
  for row in np.ndindex(logits.shape[:-1]):
    keep = allowed[row]
    if keep.any():
      e = np.exp(logits[row][keep] - logits[row][keep].max())
      out[row][keep] = e / e.sum()
  return out


def test_the_masked_softmax_is_the_softmax_of_the_allowed_entries():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5)) * 4
  allowed = np.array([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
  got = numerics.masked_softmax(jnp.asarray(logits, jnp.float32), jnp.asarray(allowed))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, _reference(logits, allowed), rtol=1e-6, atol=1e-7)
  assert np.all(np.asarray(got)[1] == 0) and np.all(np.asarray(got)[~allowed] == 0)
  # A mask that broadcasts (one row for every row), and None (everything allowed).
  row = allowed[0]
  np.testing.assert_allclose(
      numerics.masked_softmax(jnp.asarray(logits, jnp.float32), jnp.asarray(row)),
      _reference(logits, np.broadcast_to(row, logits.shape)),
      rtol=1e-6,
      atol=1e-7,
  )
  np.testing.assert_allclose(
      numerics.masked_softmax(jnp.asarray(logits, jnp.float32), None),
      _reference(logits, np.ones_like(allowed)),
      rtol=1e-6,
  )


def test_large_logits_and_half_precision_inputs_give_a_float32_distribution():
  logits = jnp.asarray([[1000.0, 999.0, -1000.0]], jnp.float16)  # 1000 is exact in float16
  got = numerics.masked_softmax(logits, jnp.asarray([[True, True, False]]))
  assert got.dtype == jnp.float32 and np.all(np.isfinite(got))
  e = 1 / (1 + np.exp(-1.0))  # the first two differ by 1: p = sigmoid(1), 1 - sigmoid(1)
  np.testing.assert_allclose(got, [[e, 1 - e, 0.0]], rtol=1e-6)


def test_the_gradient_is_the_softmax_jacobian_and_zero_where_nothing_is_allowed():
  rng = np.random.default_rng(1)
  logits, weights = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
  allowed = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], bool)
  loss = lambda l: jnp.sum(
      jnp.asarray(weights, jnp.float32) * numerics.masked_softmax(l, jnp.asarray(allowed))
  )
  grad = np.asarray(jax.grad(loss)(jnp.asarray(logits, jnp.float32)))
  # d/dl_i sum_j w_j p_j = p_i (w_i - sum_j p_j w_j) for a softmax p over the allowed entries.
  p = _reference(logits, allowed)
  want = p * (weights - np.sum(p * weights, axis=-1, keepdims=True))
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
  assert np.all(grad[1] == 0) and np.all(np.isfinite(grad))
