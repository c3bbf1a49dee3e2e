"""The four layers as ``flax.nnx`` modules, for NNX models.

Each class here is its Linen layer behind ``flax.nnx.bridge.ToNNX``: built from
the shape of a sample input (``input_shape``, batch included: a decoding cache
is sized by it) and ``rngs``, then called like the Linen layer. Its parameters
are ``nnx.Param``; the state a call may change -- BatchNorm statistics
(``nnx.BatchStat``, :class:`LambdaLayer` with ``train=True``) and the decoding
cache (``nnx.Cache``, ``decode=True``) -- is updated in place, as NNX modules do.

Bridged, not written again: one implementation of each layer (the Linen one,
tested against the papers' references) serves both APIs, so an NNX layer
computes exactly what the Linen layer computes with the same parameters
(``tests/layers/test_nnx.py``), and every field of the Linen layer is a keyword
argument here. Usage: docs/nnx.md.
"""

from __future__ import annotations

from typing import Any, Sequence

from flax import nnx
from flax.nnx import bridge
import flax.linen as nn
import jax.numpy as jnp

from contextpool_jax import layers

# The collections a call may change in place (others, e.g. the sown
# 'intermediates', are not kept: they would grow with every call).
UPDATED = ('batch_stats', 'cache')


class _Bridged(bridge.ToNNX):
  """A Linen layer as an NNX module, initialised from a sample input's shape."""

  def __init__(
      self,
      module: nn.Module,
      input_shape: Sequence[int],
      rngs: nnx.Rngs,
      dtype: Any = jnp.float32,
      **call_kwargs: Any,
  ):
    super().__init__(module, rngs=rngs)
    self.lazy_init(jnp.zeros(tuple(input_shape), dtype), **call_kwargs)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    kwargs.setdefault('mutable', list(UPDATED))
    return super().__call__(*args, **kwargs)


class ContextPool(_Bridged):
  """:class:`contextpool_jax.ContextPool` for NNX: ``ContextPool(input_shape,
  rngs=nnx.Rngs(0), **fields)``; call ``(x, mask=None, deterministic=True)``."""

  def __init__(self, input_shape: Sequence[int], *, rngs: nnx.Rngs, dtype=jnp.float32, **fields):
    super().__init__(layers.ContextPool(**fields), input_shape, rngs, dtype)


class AreaAttention(_Bridged):
  """:class:`contextpool_jax.AreaAttention` for NNX (self-attention shapes from
  ``input_shape``; a memory of another shape is read at call time); call
  ``(inputs_q, inputs_kv=None, mask=None, deterministic=True)``."""

  def __init__(self, input_shape: Sequence[int], *, rngs: nnx.Rngs, dtype=jnp.float32, **fields):
    super().__init__(layers.AreaAttention(**fields), input_shape, rngs, dtype)


class LambdaLayer(_Bridged):
  """:class:`contextpool_jax.LambdaLayer` for NNX; call ``(x, train=False)``:
  ``train=True`` normalises with the batch and updates the running statistics."""

  def __init__(self, input_shape: Sequence[int], *, rngs: nnx.Rngs, dtype=jnp.float32, **fields):
    super().__init__(layers.LambdaLayer(**fields), input_shape, rngs, dtype)


class AugmentedConv2D(_Bridged):
  """:class:`contextpool_jax.AugmentedConv2D` for NNX; call ``(inputs)``."""

  def __init__(self, input_shape: Sequence[int], *, rngs: nnx.Rngs, dtype=jnp.float32, **fields):
    super().__init__(layers.AugmentedConv2D(**fields), input_shape, rngs, dtype)


def linen_variables(module: nnx.Module) -> dict[str, Any]:
  """A bridged layer's variables as its Linen layer's ``apply`` takes them
  (``{'params': ..., 'batch_stats': ..., 'cache': ...}``, the collections it has)."""
  kinds = {'params': nnx.Param, 'batch_stats': nnx.BatchStat, 'cache': nnx.Cache}
  out = {}
  for name, kind in kinds.items():
    state = nnx.to_pure_dict(nnx.state(module, kind))
    if state:
      out[name] = state
  return out
