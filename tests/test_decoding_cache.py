"""Incremental decoding: every cache gives the full forward's outputs, step by step.

ContextPool streaming (every variant allowed to be causal), the Transformer
decoder and the LM (standard, local, area attention, ContextPool), greedy and
beam search with and without the cache, cache shapes and dtypes under jit,
bfloat16.
"""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers.context_pool import ContextPool

B, N, D = 2, 11, 6
CP_WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
CP_LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
CP_MAPPINGS = ('cnn', 'mlp', 'attention')


def _x(shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _stream(module, params, x, mask):
  """Outputs ``[batch, n, features]`` of ``module`` (``decode=True``) fed one
  position at a time after the cache-creating call on the whole ``x``."""
  _, state = module.apply(params, x, mask, mutable=['cache'])

  def step(cache, xm):
    xt, mt = xm
    y, state = module.apply({**params, 'cache': cache}, xt[:, None], mt[:, None], mutable=['cache'])
    return state['cache'], y[:, 0]

  _, ys = jax.lax.scan(step, state['cache'], (jnp.swapaxes(x, 0, 1), mask.T))
  return jnp.swapaxes(ys, 0, 1)


CP_CASES = list(itertools.product(CP_WEIGHTS, CP_LOCALITIES, CP_MAPPINGS))


@pytest.mark.parametrize('weights,locality,mapping', CP_CASES)
def test_context_pool_stream_equals_full_forward(weights, locality, mapping):
  x = _x((B, N, D))
  # Padding inside and at the end: padded positions pass through, and never
  # change a real position's output (the cache keeps their validity).
  mask = jnp.ones((B, N), bool).at[0, 3].set(False).at[1, 8:].set(False)
  fields = dict(weights=weights, locality=locality, mapping=mapping, causal=True, window=2)
  fields.update(random_span=4, ratio=0.3, nonlocal_features=4, hidden_features=5)
  full = ContextPool(**fields)
  params = full.init(jax.random.key(1), x, mask)
  params = jax.tree.map(lambda p: 3.0 * p, params)  # varied weights and sizes
  want = full.apply(params, x, mask)
  got = jax.jit(functools.partial(_stream, ContextPool(decode=True, **fields)))(params, x, mask)
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    'fields',
    [
        dict(size_norm='softmax'),
        dict(size_norm='softmax', locality='adaptive_window'),
        dict(residual=True, kernel_size=1),
        dict(kernel_size=5, activation='gelu'),
    ],
)
def test_context_pool_stream_other_fields(fields):
  x = _x((B, N, D), seed=3)
  mask = jnp.ones((B, N), bool).at[1, 0].set(False)
  full = ContextPool(causal=True, **fields)
  params = jax.tree.map(lambda p: 3.0 * p, full.init(jax.random.key(2), x, mask))
  want = full.apply(params, x, mask)
  got = jax.jit(functools.partial(_stream, ContextPool(decode=True, causal=True, **fields)))(
      params, x, mask
  )
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)


def test_context_pool_decode_needs_causal():
  with pytest.raises(ConfigError, match='decode=True needs causal=True'):
    ContextPool(decode=True).init(jax.random.key(0), _x((1, 4, 3)))
