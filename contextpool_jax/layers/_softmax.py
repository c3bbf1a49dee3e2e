"""The masked softmax shared by the layers: float32, max-subtracted, memory-lean."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

_NEG = -1e30  # stands in for -inf: exp() of it is exactly 0, never NaN


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
  row_max = jnp.max(jnp.where(allowed, logits, _NEG), axis=-1, keepdims=True)
  e = jnp.exp(jnp.where(allowed, logits - row_max, _NEG))
  denom = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(denom > 0, denom, 1.0)


@_masked_softmax.defjvp
def _masked_softmax_jvp(primals, tangents):
  # ``allowed`` is boolean: its tangent is float0 and ignored.
  p = _masked_softmax(*primals)
  dl = tangents[0]
  return p, p * (dl - jnp.sum(p * dl, axis=-1, keepdims=True))
