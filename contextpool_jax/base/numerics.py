"""The package's numerical conventions, each defined once: the finite minus infinity
of masked logits, the variance floor of Gaussian exponents, and the masked softmax
the layers share (float32, max-subtracted, memory-lean)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

# A finite "minus infinity" for masked logits and impossible scores: exp() of it is
# exactly 0 in float32 and, unlike -inf, it never gives inf - inf = NaN in a forward
# or backward pass.
NEG_INF = -1e30
# Added to 2 sigma^2 so that sigma -> 0 gives a finite (huge) Gaussian exponent.
MIN_TWO_VARIANCE = 1e-12


def masked_softmax(logits: Array, allowed: Array | None) -> Array:
  """Softmax over the last axis restricted to ``allowed``; 0 elsewhere.

  Computed in float32 with max-subtraction whatever the dtype of ``logits``;
  ``allowed`` (bool, or None = everything) broadcasts against ``logits``. A
  row with no allowed entry is all zeros, with zero (finite) gradients: no
  division by a sum that can reach 0. The derivative is written in terms of
  the output, ``dp = p * (dl - sum(p * dl))`` (as ``jax.nn.softmax``), so
  reverse-mode autodiff keeps only ``p`` for the backward pass, not the
  logits, exponentials and quotient.
  """
  logits = logits.astype(jnp.float32)
  if allowed is None:
    return jax.nn.softmax(logits, axis=-1)
  shape = jnp.broadcast_shapes(logits.shape, allowed.shape)
  return _masked_softmax(jnp.broadcast_to(logits, shape), jnp.broadcast_to(allowed, shape))


@jax.custom_jvp
def _masked_softmax(logits: Array, allowed: Array) -> Array:
  row_max = jnp.max(jnp.where(allowed, logits, NEG_INF), axis=-1, keepdims=True)
  e = jnp.exp(jnp.where(allowed, logits - row_max, NEG_INF))
  denom = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(denom > 0, denom, 1.0)


@_masked_softmax.defjvp
def _masked_softmax_jvp(primals, tangents):
  # ``allowed`` is boolean: its tangent is float0 and ignored.
  p = _masked_softmax(*primals)
  dl = tangents[0]
  return p, p * (dl - jnp.sum(p * dl, axis=-1, keepdims=True))
