"""ResNet family (contextpool_jax.models.resnet): shapes, parameter counts, BN modes,
overfitting one batch per family, bf16, remat and configuration errors.

Compiling Flax initialisers is slow on the shared CPU, so most tests take the
variable shapes from ``jax.eval_shape(model.init, ...)`` and fill them with
NumPy; ``test_real_init`` covers ``model.init`` itself.
"""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from contextpool_jax.models import resnet
from contextpool_jax.models.common import count_params

KEY = jax.random.key(0)
CIFAR_NAMES = sorted(n for n in resnet.MODELS if resnet.MODELS[n].keywords['stem'] == 'cifar')

# Tiny members of each family (real forward + backward in the overfit tests).
TINY = {
    'cifar_cp': ('cp_resnet20', dict(stage_sizes=(1, 1, 1), width=8), 16),
    'bottleneck_cp': ('cp_resnet50', dict(stage_sizes=(1, 1), width=8, num_classes=10), 32),
    'lambda': (
        'lambda_resnet50',
        dict(stage_sizes=(1, 1), width=8, num_classes=10, stage_pattern='C,L'),
        32,
    ),
    # One AA block (compiling AA layers is the slowest part of this file).
    'aa': (
        'aa_resnet50',
        dict(
            stage_sizes=(1,),
            width=8,
            num_classes=10,
            stage_pattern='A',
            aa_heads=2,
            aa_min_key_depth_per_head=2,
        ),
        16,
    ),
}


def _images(batch, size, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, size, size, 3)), jnp.float32)


def _shapes(model, x):
  return jax.eval_shape(model.init, KEY, x)


def _fill(shapes, seed=0):
  """Variables of the declared shapes: He-scaled kernels, BN identity, small tables."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if "'scale'" in name or "'var'" in name:
      value = np.ones(leaf.shape)
    elif "'bias'" in name or "'mean'" in name:
      value = np.zeros(leaf.shape)
    elif len(leaf.shape) >= 2:
      value = rng.normal(0.0, math.sqrt(2.0 / math.prod(leaf.shape[:-1])), leaf.shape)
    else:
      value = rng.normal(0.0, 0.1, leaf.shape)
    return jnp.asarray(value, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.lru_cache(maxsize=None)
def _preset_shapes(name, size):
  """Variable shapes of a registry preset at its defaults (shared by the tests)."""
  return _shapes(resnet.MODELS[name](), jnp.zeros((1, size, size, 3)))


def _input_size(name):
  return 32 if name in CIFAR_NAMES else 64


def _tiny(family, **overrides):
  name, kwargs, size = TINY[family]
  return resnet.MODELS[name](**{**kwargs, **overrides}), size


# ----------------------------------------------------------------------------
# Shapes and parameter counts (abstract evaluation only).
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('name', sorted(resnet.MODELS))
@pytest.mark.sweep
def test_forward_shapes(name):
  """Every preset at full depth and width, 32x32 (CIFAR) or 64x64 (ImageNet) inputs.

  Abstract evaluation only; the real train/eval forward passes run in the
  overfitting tests (one member of each family).
  """
  model = resnet.MODELS[name]()
  size = _input_size(name)
  variables = _preset_shapes(name, size)
  assert set(variables) == {'params', 'batch_stats'}
  logits = jax.eval_shape(model.apply, variables, jnp.zeros((2, size, size, 3)))
  chex.assert_shape(logits, (2, 10 if name in CIFAR_NAMES else 1000))
  assert logits.dtype == jnp.float32


# name, paper count (millions), source. Counts do not depend on the input size
# except for AA (relative tables), counted at 224x224.
PAPER_COUNTS = [
    ('resnet20', 0.27, 'He et al. 2016, Table 6'),
    ('resnet32', 0.46, 'He et al. 2016, Table 6'),
    ('resnet44', 0.66, 'He et al. 2016, Table 6; ContextPool Table S1'),
    ('resnet56', 0.85, 'He et al. 2016, Table 6'),
    ('cp_resnet44', 0.68, 'ContextPool Table S1'),
    ('cp_resnet46', 0.70, 'ContextPool Table S1'),
    ('resnet50', 25.6, 'He et al. 2016; LambdaNetworks; AA'),
    ('resnet101', 44.5, 'He et al. 2016; AA Table 3'),
    ('lambda_resnet50', 15.0, 'LambdaNetworks, L->L->L->L'),
    ('aa_resnet50', 25.8, 'AA, Table 3'),
    ('aa_resnet34', 20.7, 'AA, Table 3'),
]


def _count(name):
  size = 224 if name.startswith('aa_') else _input_size(name)
  return count_params(_preset_shapes(name, size)['params']) / 1e6


def test_parameter_counts():
  counts = {}
  lines = [f'{"model":16s} {"ours (M)":>9s} {"paper (M)":>9s} {"diff":>7s}  source']
  for name, paper, source in PAPER_COUNTS:
    counts[name] = n = _count(name)
    lines.append(f'{name:16s} {n:9.4f} {paper:9.2f} {100 * (n / paper - 1):+6.1f}%  {source}')
  for name in ('cp_resnet50', 'cp_resnet101'):
    counts[name] = _count(name)
    base = counts[name[3:]]
    lines.append(
        f'{name:16s} {counts[name]:9.4f}   (+{counts[name] - base:.3f}M over '
        f'{name[3:]}; paper Table S2: +0.2M / +0.3M)'
    )
  print('\n' + '\n'.join(lines))
  for name, paper, _ in PAPER_COUNTS:
    assert abs(counts[name] / paper - 1) < 0.05, (name, counts[name], paper)
  # Table S2 (26.6 -> 26.8M, 45.5 -> 45.8M): ContextPool adds 0.15-0.35M.
  for name in ('cp_resnet50', 'cp_resnet101'):
    assert 0.15 < counts[name] - counts[name[3:]] < 0.35


def test_stage_pattern_forms_agree():
  x = jnp.zeros((1, 64, 64, 3))
  counts = [
      count_params(_shapes(resnet.MODELS['resnet50'](stage_pattern=p, width=8), x))
      for p in ('C,C,L,L', 'CCLL', ('C', 'C', 'L', 'L'))
  ]
  assert len(set(counts)) == 1


# ----------------------------------------------------------------------------
# Real computation.
# ----------------------------------------------------------------------------


def test_real_init():
  """model.init: He-normal convolutions, zero-initialised last BN of each block."""
  model = resnet.MODELS['resnet20'](stage_sizes=(1,), width=16, zero_init_residual=True)
  variables = jax.jit(model.init)(KEY, jnp.zeros((1, 8, 8, 3)))
  params = variables['params']['stage_0_block_0']
  np.testing.assert_array_equal(params['norm_1']['scale'], 0.0)
  np.testing.assert_array_equal(params['norm_0']['scale'], 1.0)
  kernel = np.asarray(params['spatial_0']['kernel'])  # fan_out = 3 * 3 * 16
  assert abs(kernel.std() / math.sqrt(2.0 / 144) - 1) < 0.1


def test_batch_stats_modes():
  model, size = _tiny('cifar_cp', context_pool=None)
  x = _images(4, size)
  variables = _fill(_shapes(model, x))
  logits, updates = jax.jit(functools.partial(model.apply, train=True, mutable=['batch_stats']))(
      variables, x
  )
  chex.assert_shape(logits, (4, 10))
  old = jax.tree_util.tree_leaves(variables['batch_stats'])
  new = jax.tree_util.tree_leaves(updates['batch_stats'])
  assert len(old) == len(new) and all(not np.allclose(a, b) for a, b in zip(old, new))
  # Eval mode: running averages, no mutable collection needed, deterministic.
  apply = jax.jit(model.apply)
  out = apply(variables, x)
  chex.assert_trees_all_close(out, apply(variables, x))
  chex.assert_tree_all_finite(out)


def _train(model, x, y, variables, steps, lr):
  optimizer = optax.adam(lr)

  @jax.jit
  def step(params, batch_stats, opt_state):
    def loss_fn(p):
      logits, new = model.apply(
          {'params': p, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
      )
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
      return loss, new['batch_stats']

    (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), batch_stats, opt_state, loss

  params, batch_stats = variables['params'], variables['batch_stats']
  opt_state = optimizer.init(params)
  losses = []
  for _ in range(steps):
    params, batch_stats, opt_state, loss = step(params, batch_stats, opt_state)
    losses.append(float(loss))
  return losses


@pytest.mark.parametrize('family', sorted(TINY))
@pytest.mark.sweep
def test_overfits_one_batch(family):
  model, size = _tiny(family)
  x = _images(8, size, seed=1)
  y = jnp.arange(8) % 10
  losses = _train(model, x, y, _fill(_shapes(model, x)), steps=25, lr=1e-2)
  print(f'{family}: loss {losses[0]:.3f} -> {losses[-1]:.4f}')
  assert np.all(np.isfinite(losses))
  assert losses[-1] < 0.2 * losses[0]


def test_bfloat16_compute():
  model, size = _tiny('cifar_cp', dtype=jnp.bfloat16, cp_placement='downsample,global_pool')
  x = _images(2, size)
  shapes = _shapes(model, x)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(shapes))
  logits, state = jax.jit(
      functools.partial(
          model.apply,
          train=True,
          mutable=['batch_stats', 'intermediates'],
          capture_intermediates=True,
      )
  )(_fill(shapes), x)
  assert logits.dtype == jnp.float32
  chex.assert_tree_all_finite(logits)
  conv_out = state['intermediates']['stage_0_block_0']['spatial_0']['__call__'][0]
  assert conv_out.dtype == jnp.bfloat16


def test_remat_same_parameters_and_traces_gradients():
  model, size = _tiny('lambda')
  remat_model, _ = _tiny('lambda', remat=True)
  x = jnp.zeros((2, size, size, 3))
  shapes = _shapes(model, x)
  chex.assert_trees_all_equal_shapes_and_dtypes(shapes, _shapes(remat_model, x))

  def loss(params, batch_stats):
    logits, _ = remat_model.apply(
        {'params': params, 'batch_stats': batch_stats}, x, train=True, mutable=['batch_stats']
    )
    return logits.sum()

  grads = jax.eval_shape(jax.grad(loss), shapes['params'], shapes['batch_stats'])
  chex.assert_trees_all_equal_shapes_and_dtypes(grads, shapes['params'])


# ----------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------


def test_context_pool_placements():
  """Where ContextPool modules appear for each placement, and None disables them."""

  def pools(name, **kw):
    params = _shapes(resnet.MODELS[name](**kw), jnp.zeros((1, 64, 64, 3)))['params']
    found = [k for k in params if 'context_pool' in k]
    found += [f'{k}/context_pool' for k, sub in params.items() if 'context_pool' in sub]
    return sorted(found)

  assert pools('resnet50', stage_sizes=(1, 1, 1), width=8) == []
  assert pools('cp_resnet50', stage_sizes=(1, 1, 1), width=8) == [
      'stage_1_block_0/context_pool',
      'stage_2_block_0/context_pool',
      'stem_context_pool',
  ]
  assert pools('cp_resnet20') == ['head_context_pool']
  assert pools('cp_resnet20', cp_placement='downsample') == [
      'stage_1_block_0/context_pool',
      'stage_2_block_0/context_pool',
  ]
  assert pools('cp_resnet20', context_pool=None) == []


def test_augmented_depths():
  assert resnet.augmented_depths(128, 0.2, 0.1, 8, 20) == (160, 16)
  assert resnet.augmented_depths(512, 0.2, 0.1, 8, 0) == (104, 48)


@pytest.mark.parametrize(
    'overrides, field',
    [
        (dict(block='wide'), 'block'),
        (dict(stem='tiny'), 'stem'),
        (dict(shortcut='C'), 'shortcut'),
        (dict(stage_pattern='C,X,C'), 'stage_pattern'),
        (dict(stage_pattern='C,C'), 'stage_pattern'),
        (dict(cp_placement='everywhere'), 'cp_placement'),
        (dict(cp_placement=''), 'cp_placement'),
        (dict(cp_placement='stem_pool'), 'cp_placement'),  # CIFAR stem has no pool
        (dict(width=0), 'width'),
        (dict(stage_sizes=(3, 0, 3)), 'stage_sizes'),
        (dict(lambda_position='local', stage_pattern='C,L,L'), 'lambda_position'),
        (dict(lambda_scope_size=4), 'lambda_scope_size'),
        (dict(aa_position='absolute'), 'aa_position'),
        (dict(aa_value_ratio=1.0, stage_pattern='C,C,A'), 'aa_value_ratio'),
        (dict(conv_init_mode='uniform'), 'conv_init_mode'),
        (dict(bn_momentum=1.5), 'bn_momentum'),
        (dict(context_pool={'no_such_field': 1}), 'context_pool'),
        (dict(context_pool={'strides': 3}), 'context_pool'),
    ],
)
def test_bad_options_raise(overrides, field):
  model = resnet.MODELS['cp_resnet20'](**overrides)
  with pytest.raises(ValueError, match=field):
    _shapes(model, jnp.zeros((1, 32, 32, 3)))


def test_bad_input_rank_raises():
  with pytest.raises(ValueError, match='images'):
    _shapes(resnet.MODELS['resnet20'](), jnp.zeros((1, 32, 32)))
