"""The layers as flax.nnx modules (contextpool_jax/layers/nnx.py): the Linen layers' outputs,
gradients and state (BatchNorm statistics, the decoding cache) for the same parameters,
and an NNX model trained with nnx.Optimizer."""

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import optax
import pytest

import contextpool_jax as cp
from contextpool_jax.layers import nnx as cp_nnx

# (NNX class, Linen class, fields, input shape, call keyword arguments)
CASES = {
    'context_pool': (cp_nnx.ContextPool, cp.ContextPool, dict(causal=True), (2, 12, 8), {}),
    'context_pool_grid': (cp_nnx.ContextPool, cp.ContextPool, dict(strides=2), (2, 6, 6, 4), {}),
    'area_attention': (
        cp_nnx.AreaAttention,
        cp.AreaAttention,
        dict(num_heads=2, max_area_width=3),
        (2, 7, 8),
        {},
    ),
    'lambda_global': (
        cp_nnx.LambdaLayer,
        cp.LambdaLayer,
        dict(key_depth=4, heads=2, position='global', context_size=(4, 4)),
        (2, 4, 4, 8),
        {},
    ),
    'augmented_conv': (
        cp_nnx.AugmentedConv2D,
        cp.AugmentedConv2D,
        dict(features=20, key_ratio=0.2, value_ratio=0.4, num_heads=2),
        (2, 5, 5, 6),
        {},
    ),
}


def _x(shape, seed=1):
  return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.sweep  # the NNX bridge is one code path; each layer is tested in its own file
@pytest.mark.parametrize('name', sorted(CASES))
def test_same_outputs_and_gradients_as_the_linen_layer(name):
  nnx_cls, linen_cls, fields, shape, kwargs = CASES[name]
  layer = nnx_cls(shape, rngs=nnx.Rngs(0), **fields)
  variables = cp_nnx.linen_variables(layer)
  linen = linen_cls(**fields)
  x = _x(shape)
  chex.assert_trees_all_close(layer(x, **kwargs), linen.apply(variables, x, **kwargs), atol=1e-6)
  # The same parameters Linen's init draws from the same key.
  chex.assert_trees_all_equal_shapes(
      variables['params'], linen.init(jax.random.key(0), x, **kwargs)['params']
  )

  def nnx_loss(module):
    return jnp.sum(jnp.sin(module(x, **kwargs)))

  def linen_loss(params):
    return jnp.sum(jnp.sin(linen.apply({**variables, 'params': params}, x, **kwargs)))

  got = nnx.to_pure_dict(nnx.grad(nnx_loss)(layer))
  want = jax.grad(linen_loss)(variables['params'])
  chex.assert_trees_all_close(got, want, atol=1e-5)
  chex.assert_tree_all_finite(got)


def test_batch_statistics_update_in_place_as_linen_updates_them():
  fields = dict(key_depth=4, heads=2, position='conv', scope_size=3)
  layer = cp_nnx.LambdaLayer((2, 5, 5, 8), rngs=nnx.Rngs(0), **fields)
  before = cp_nnx.linen_variables(layer)
  x = _x((2, 5, 5, 8)) * 3.0 + 1.0
  y = layer(x, train=True)
  want_y, updates = cp.LambdaLayer(**fields).apply(before, x, train=True, mutable=['batch_stats'])
  chex.assert_trees_all_close(y, want_y, atol=1e-6)
  chex.assert_trees_all_close(
      cp_nnx.linen_variables(layer)['batch_stats'], updates['batch_stats'], atol=1e-6
  )
  assert not jnp.allclose(
      jax.tree.leaves(before['batch_stats'])[0], jax.tree.leaves(updates['batch_stats'])[0]
  )
  # Evaluation reads the running statistics and changes nothing.
  frozen = cp_nnx.linen_variables(layer)
  layer(x, train=False)
  chex.assert_trees_all_equal(cp_nnx.linen_variables(layer), frozen)


def test_decoding_cache_steps_match_the_whole_sequence():
  """ContextPool with decode=True: one position per call, the cache kept by the
  NNX module, gives the causal layer's outputs on the whole sequence."""
  batch, n, d = 2, 6, 4
  layer = cp_nnx.ContextPool((batch, n, d), rngs=nnx.Rngs(0), causal=True, decode=True)
  whole = cp.ContextPool(causal=True)
  x = _x((batch, n, d))
  want = whole.apply({'params': cp_nnx.linen_variables(layer)['params']}, x)
  steps = jnp.concatenate([layer(x[:, t : t + 1]) for t in range(n)], axis=1)
  chex.assert_trees_all_close(steps, want, atol=1e-5)
  assert int(cp_nnx.linen_variables(layer)['cache']['cache_index']) == n


class _PooledRegressor(nnx.Module):
  """ContextPool then a linear read-out: an NNX model using a bridged layer."""

  def __init__(self, shape, rngs):
    self.pool = cp_nnx.ContextPool(shape, rngs=rngs, causal=True)
    self.out = nnx.Linear(shape[-1], 1, rngs=rngs)

  def __call__(self, x):
    return self.out(self.pool(x))[..., 0]


def test_an_nnx_model_trains_with_nnx_optimizer():
  shape = (4, 16, 8)
  model = _PooledRegressor(shape, nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  x = _x(shape)
  target = jnp.cumsum(x[..., 0], axis=1) / jnp.arange(1, 17)  # a causal running mean

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - target) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(30)]
  assert losses[-1] < 0.5 * losses[0], losses
  chex.assert_tree_all_finite(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
