"""The modules in a user's own loop: ``jax.jit`` over sharded arrays (the example of
docs/distributed.md), ``jax.pmap`` and ``shard_map`` (4 fake CPU devices).

Run by ``tests/training/test_multi_device.py`` in a subprocess with
``--xla_force_host_platform_device_count=4`` (the device count is fixed when JAX
starts, and the rest of the suite runs on one device).
"""

import functools
import pathlib
import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from contextpool_jax import (AreaAttention, AugmentedConv2D, ContextPool, LambdaLayer, models)
from init_keys import init_variables

N_DEV = 4
AXIS = 'batch'


def setup_module():
  assert jax.local_device_count() == N_DEV, (
      f'run through tests/training/test_multi_device.py ({N_DEV} fake devices), '
      f'got {jax.local_device_count()}'
  )


def _x(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _split(x):
  """[b, ...] -> [devices, b / devices, ...] (the pmap layout)."""
  return x.reshape(N_DEV, x.shape[0] // N_DEV, *x.shape[1:])


def _merge(x):
  return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


# ----------------------------------------------------------------------------
# The docs' own loop: jit over arrays sharded on a jax.make_mesh mesh.
# ----------------------------------------------------------------------------

DOCS = pathlib.Path(__file__).resolve().parents[3] / 'docs' / 'distributed.md'


def _own_loop_block() -> str:
  """The first Python block of docs/distributed.md's "The modules in your own loop"."""
  text = DOCS.read_text()
  section = text[text.index('## The modules in your own loop') :]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_docs_jit_loop_on_four_devices_equals_one_device():
  """The block as written runs on 4 devices (batch split, parameters replicated); its step
  gives the loss and the gradient of the same step on one device (everything on device 0).

  The one-device step is the block's own ``train_step`` with its optimizer (the global
  ``tx`` it reads) swapped for SGD with rate 1, whose update is the gradient; its loss (taken
  before the update, so the optimizer does not change it) is compared with the block's.
  Not Adam for the gradients: its first step divides each gradient by its magnitude, which
  turns the rounding of a near-zero gradient (sums over devices reassociate) into a
  difference of the whole rate.
  """
  ns = {}
  exec(compile(_own_loop_block(), str(DOCS), 'exec'), ns)  # pylint: disable=exec-used
  assert ns['n'] == N_DEV and len(ns['batch']['inputs'].sharding.device_set) == N_DEV
  tokens = np.asarray(ns['tokens'])
  params = init_variables(ns['model'], jax.random.key(0), jnp.asarray(tokens[:1, :-1], jnp.int32))[
      'params'
  ]
  one = lambda tree: jax.device_put(tree, jax.devices()[0])
  batch = one({'inputs': tokens[:, :-1], 'targets': tokens[:, 1:]})
  ns['tx'] = optax.sgd(1.0)
  step = lambda p, b: ns['train_step'](p, ns['tx'].init(p), b)
  sharded = jax.device_put(params, NamedSharding(ns['mesh'], P()))
  minus = lambda p: jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), params, p)
  (updated, _, _), (updated_one, _, loss_one) = step(sharded, ns['batch']), step(one(params), batch)
  assert len(loss_one.sharding.device_set) == 1
  np.testing.assert_allclose(ns['loss'], loss_one, rtol=1e-5)  # the block's own step's loss
  grads, grads_one = minus(updated), minus(updated_one)
  chex.assert_trees_all_close(grads, grads_one, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------
# BatchNorm statistics over the mapped axis.
# ----------------------------------------------------------------------------


def _bn_cases():
  lam = functools.partial(LambdaLayer, key_depth=4, heads=2, position='conv', scope_size=3)
  resnet = functools.partial(
      models.create,
      'resnet20',
      stage_sizes=(1, 1, 1),
      width=8,
      stage_pattern='C,L,A',
      aa_heads=2,
      aa_min_key_depth_per_head=0,
      lambda_key_depth=4,
      lambda_heads=2,
      lambda_scope_size=3,
  )
  return {
      'lambda_layer': (lambda axis: lam(bn_axis_name=axis), (8, 6, 6, 8)),
      'resnet_conv_lambda_aa': (lambda axis: resnet(bn_axis_name=axis), (8, 8, 8, 3)),
  }


@pytest.mark.parametrize('case', sorted(_bn_cases()))
def test_pmap_batch_norm_with_axis_name_equals_one_device(case):
  make, shape = _bn_cases()[case]
  x = _x(shape, seed=1)
  single = make(None)
  variables = init_variables(single, jax.random.key(0), x)
  y_one, state_one = jax.jit(functools.partial(single.apply, train=True, mutable=['batch_stats']))(
      variables, x
  )

  def step(module, v, xs):
    return module.apply(v, xs, train=True, mutable=['batch_stats'])

  mapped = make(AXIS)
  y_map, state_map = jax.pmap(functools.partial(step, mapped), axis_name=AXIS, in_axes=(None, 0))(
      variables, _split(x)
  )
  for i in range(N_DEV):  # every replica holds the global batch statistics
    chex.assert_trees_all_close(
        jax.tree.map(lambda s: s[i], state_map), state_one, rtol=1e-5, atol=1e-6
    )
  chex.assert_trees_all_close(_merge(y_map), y_one, rtol=1e-5, atol=1e-5)

  # Without the axis name each replica normalises with its own statistics:
  # the replicas' running averages differ (what the field is for).
  _, state_local = jax.pmap(functools.partial(step, single), axis_name=AXIS, in_axes=(None, 0))(
      variables, _split(x)
  )
  spread = max(float(jnp.max(jnp.abs(s[0] - s[1]))) for s in jax.tree.leaves(state_local))
  assert spread > 1e-3


# ----------------------------------------------------------------------------
# Each of the four layers under shard_map: forward and gradient. Not again under pmap: on the
# stack this suite runs on (the newest, jax 0.12), ``jax.pmap`` is ``jit`` of a ``shard_map``
# (jax/_src/pmap.py), the program these compile; pmap itself runs above, through BatchNorm.
# ----------------------------------------------------------------------------


def _layer_cases():
  """name -> (module, input shape, apply kwargs); no BatchNorm in train mode here."""
  return {
      'context_pool': (ContextPool(causal=True), (8, 16, 8), {}),
      'context_pool_grid': (ContextPool(strides=2), (8, 6, 6, 4), {}),
      'area_attention': (AreaAttention(num_heads=2, max_area_width=3), (8, 10, 8), {}),
      'lambda_layer': (
          LambdaLayer(key_depth=4, heads=2, position='conv', scope_size=3),
          (8, 6, 6, 8),
          {},
      ),
      'augmented_conv': (
          AugmentedConv2D(features=8, key_ratio=0.5, value_ratio=0.5, num_heads=2),
          (8, 6, 6, 4),
          {},
      ),
  }


def _loss(module, variables, x):
  y = module.apply(variables, x)
  return jnp.sum(jnp.sin(y)), y


@pytest.mark.parametrize('case', sorted(_layer_cases()))
def test_layer_runs_and_differentiates_like_one_device(case):
  module, shape, _ = _layer_cases()[case]
  x = _x(shape, seed=2)
  variables = module.init(jax.random.key(0), x)
  params, rest = variables['params'], {k: v for k, v in variables.items() if k != 'params'}

  def local(p, xs):  # shard_map sums the gradient of the replicated parameters itself
    (loss, y), grads = jax.value_and_grad(
        lambda q: _loss(module, {'params': q, **rest}, xs), has_aux=True
    )(p)
    return y, jax.lax.psum(loss, AXIS), grads

  (loss_one, y_one), grads_one = jax.jit(
      jax.value_and_grad(lambda q: _loss(module, {'params': q, **rest}, x), has_aux=True)
  )(params)

  mesh = Mesh(np.asarray(jax.devices()), (AXIS,))
  fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(AXIS), P(), P()))
  y, loss, grads = jax.jit(fn)(params, x)
  chex.assert_tree_all_finite(grads)
  chex.assert_trees_all_close(y, y_one, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, loss_one, rtol=1e-5, atol=1e-5)
  # Per leaf, an absolute tolerance of float32 rounding at the leaf's scale
  # (sums over devices and over the algorithms' blocks reassociate).
  for g, g_one in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_one)):
    atol = max(1e-5, 1e-6 * float(np.max(np.abs(g_one))))
    np.testing.assert_allclose(g, g_one, rtol=1e-4, atol=atol)
