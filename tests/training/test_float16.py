"""float16 compute with dynamic loss scaling (``config.dtype='float16'``).

The loss scale is flax's DynamicScale in a :class:`steps.ScaledTrainState`
(float16 runs only). Checked here: the config field; the training of the
default LM (shrunk) against float32, and against float16 without a scale; a
step whose gradient overflows is skipped and halves the scale; the scale is
saved and resumed; every layer's forward and gradient in float16.
"""

import json
import pathlib
import shutil

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from configs import default as default_config
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers import AreaAttention, AugmentedConv2D, ContextPool, LambdaLayer
from contextpool_jax.layers import area_features
from contextpool_jax.training import checkpoints, objectives, steps, tasks, trainer
from contextpool_jax.training import spec as spec_lib
from helpers import tiny_config
from init_keys import init_key, init_variables

F16_EPS = 2.0**-10


# ----------------------------------------------------------------------------
# The config field.
# ----------------------------------------------------------------------------


def test_dtype_float16_is_accepted_and_an_unknown_dtype_names_the_allowed_ones():
  config = default_config.get_config()
  config.dtype = 'float16'
  assert spec_lib.read_run(config).dtype == jnp.float16
  config.dtype = 'float8'
  with pytest.raises(ConfigError) as err:
    spec_lib.read_run(config)
  assert str(err.value) == (
      "config.dtype='float8' is not supported; allowed values: 'float32', 'bfloat16', 'float16'."
  )


def test_only_float16_runs_have_a_loss_scale_in_their_state():
  """Every other run's state (and so its checkpoints) is the TrainState of before."""
  assert steps.uses_loss_scaling(jnp.float16)
  assert not any(steps.uses_loss_scaling(d) for d in (jnp.float32, jnp.bfloat16))
  model, objective, tx, batch = _tiny_classifier()
  plain = steps.make_init_fn(model, objective, batch, tx)(jax.random.key(0))
  scaled = steps.make_init_fn(model, objective, batch, tx, True)(jax.random.key(0))
  assert type(plain) is steps.TrainState
  assert [f.name for f in steps.TrainState.__dataclass_fields__.values()] == [
      'step',
      'params',
      'opt_state',
      'model_state',
      'bad_step',
  ]
  assert isinstance(scaled, steps.ScaledTrainState)
  assert float(scaled.dynamic_scale.scale) == steps.LOSS_SCALE_INIT == 2.0**16
  assert scaled.dynamic_scale.scale.dtype == jnp.float32
  # float32 master parameters and optimizer state.
  for leaf in jax.tree.leaves((scaled.params, scaled.opt_state)):
    assert leaf.dtype in (jnp.float32, jnp.int32)


# ----------------------------------------------------------------------------
# The train step (a tiny float16 classifier, no data pipeline).
# ----------------------------------------------------------------------------


class _Classifier(nn.Module):

  @nn.compact
  def __call__(self, image, train=False):
    x = nn.BatchNorm(use_running_average=not train, dtype=jnp.float16)(
        image.reshape(image.shape[0], -1)
    )
    return nn.Dense(3, dtype=jnp.float16)(x)


class _Overflowing:
  """``inner`` (an Objective) with its trained loss times ``OVERFLOW`` where
  ``batch['overflow']`` is set: finite in float32 (the loss is ~1e4), but its
  scaled gradient overflows float16 (2^16 * 1e4 / batch > 65504). Test-only."""

  OVERFLOW = 1e4

  def __init__(self, inner, factor=1.0):
    self.inner, self.factor = inner, factor

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def loss(self, logits, batch):
    loss, sums = self.inner.loss(logits, batch)
    if 'overflow' in batch:
      loss = loss * jnp.where(jnp.any(batch['overflow']), self.OVERFLOW, 1.0)
    return loss * self.factor, sums


def _tiny_classifier():
  model = _Classifier()
  objective = _Overflowing(objectives.Classification(num_classes=3))
  image = np.linspace(-1, 1, 4 * 2 * 2 * 3, dtype=np.float32).reshape(4, 2, 2, 3)
  batch = {'image': image, 'label': np.array([0, 1, 2, 0], np.int32)}
  return model, objective, optax.adam(0.1), batch


def _same(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize('accum', [1, 2])
def test_an_overflowing_gradient_skips_the_step_and_halves_the_scale(accum):
  """With gradient accumulation, one overflowing micro-batch skips the whole step."""
  model, objective, tx, batch = _tiny_classifier()
  state = steps.make_init_fn(model, objective, batch, tx, True)(jax.random.key(0))
  step = jax.jit(
      steps.make_train_step(model, objective, tx, lambda s: 0.1, jax.random.key(1), accum)
  )
  rows = lambda *flags: np.repeat(np.array(flags, bool), 4 // len(flags))
  good = dict(batch, overflow=rows(False))
  bad = dict(batch, overflow=rows(False, True))  # the second micro-batch (accum=2)
  rest = lambda s: (s.params, s.opt_state, s.model_state)

  s1, m1 = step(state, good)
  assert not _same(rest(s1), rest(state))  # a normal step: everything moved
  assert float(m1['skipped_steps']) == 0 and float(m1['loss_scale']) == 2.0**16
  assert float(s1.dynamic_scale.scale) == 2.0**16 and int(s1.dynamic_scale.fin_steps) == 1

  s2, m2 = step(s1, bad)
  assert _same(rest(s2), rest(s1))  # skipped: parameters, Adam moments, BatchNorm stats
  assert int(s2.step) == 2 and int(s2.bad_step) == -1  # not a bad step: the run goes on
  assert float(m2['skipped_steps']) == 1 and float(m2['grad_norm']) == 0.0
  assert np.isfinite(float(m2['loss']))
  assert float(s2.dynamic_scale.scale) == 2.0**15 and int(s2.dynamic_scale.fin_steps) == 0

  s3, m3 = step(s2, good)
  assert not _same(rest(s3), rest(s2))
  assert float(m3['loss_scale']) == 2.0**15 and float(m3['skipped_steps']) == 0


def test_an_overflow_at_the_minimum_scale_or_a_non_finite_loss_is_a_bad_step():
  model, objective, tx, batch = _tiny_classifier()
  objective.OVERFLOW = 1e6  # overflows float16 at scale 1 too (1e6 / 4 rows > 65504)
  state = steps.make_init_fn(model, objective, batch, tx, True)(jax.random.key(0))
  step = jax.jit(steps.make_train_step(model, objective, tx, lambda s: 0.1, jax.random.key(1)))
  at_min = state.replace(
      dynamic_scale=state.dynamic_scale.replace(scale=jnp.float32(steps.LOSS_SCALE_MIN))
  )
  new, metrics = step(at_min, dict(batch, overflow=np.ones(4, bool)))
  assert int(new.bad_step) == 0 and float(metrics['skipped_steps']) == 0
  nan_image = batch['image'].copy()
  nan_image[0, 0, 0, 0] = np.nan
  new, metrics = step(state, dict(batch, image=nan_image, overflow=np.zeros(4, bool)))
  assert int(new.bad_step) == 0 and float(metrics['skipped_steps']) == 0
  assert not np.isfinite(float(metrics['loss']))


# ----------------------------------------------------------------------------
# The trainer: the default LM config, shrunk (tests/training/test_trainer.py).
# ----------------------------------------------------------------------------


def _train(monkeypatch, config, workdir, *, factor=1.0, overflow_at=None):
  """trainer.train_and_evaluate with the objective's trained loss times
  ``factor`` and, at step ``overflow_at``, an overflowing gradient (_Overflowing)."""
  make_task, make_train_step = tasks.make_task, steps.make_train_step

  def task_with_factor(*args, **kwargs):
    task = make_task(*args, **kwargs)
    task.objective = _Overflowing(task.objective, factor)
    return task

  def train_step_with_overflow(*args, **kwargs):
    inner = make_train_step(*args, **kwargs)

    def train_step(state, batch):
      rows = batch['tokens'].shape[0]
      return inner(state, {**batch, 'overflow': jnp.full((rows,), state.step == overflow_at)})

    return train_step

  with monkeypatch.context() as m:
    m.setattr(tasks, 'make_task', task_with_factor)
    if overflow_at is not None:
      m.setattr(steps, 'make_train_step', train_step_with_overflow)
    return trainer.train_and_evaluate(config, str(workdir))


def _history(result, key):
  return np.array([h[key] for h in result['train_history']])


@pytest.mark.slow
def test_float16_follows_the_float32_loss_curve_and_unscaled_float16_does_not(
    corpus, tmp_path, monkeypatch
):
  """12 steps of the default LM (shrunk), float32 / float16 / float16 without a scale.

  The trained loss is multiplied by 1e-5 (Adam's update does not see a
  constant factor, up to its eps): the tiny model's own gradients do not
  underflow float16 (measured without the factor, 20 steps: float16 unscaled
  within 2.3e-4 of the float32 loss, like float16 scaled, 3.0e-4), these do,
  like those of a large batch or a late, small loss. Measured with it, max
  over the 12 steps: scaled float16 |loss - float32 loss| 9.8e-5 and
  grad_norm 2.7e-4 relative; unscaled float16 0.30 and 42% (its gradients
  flushed to zero). The tolerances, 2e-3 and 5e-3, are ~20x the scaled run's.
  """
  kw = dict(
      num_train_steps=12,
      log_every_steps=1,
      eval_every_steps=1000,
      checkpoint_every_steps=1000,
      log_pool_sizes=False,
  )
  runs = {}
  for name, dtype in (('float32', 'float32'), ('float16', 'float16'), ('unscaled', 'float16')):
    config = tiny_config(corpus, tmp_path / 'data', dtype=dtype, **kw)
    with monkeypatch.context() as m:
      if name == 'unscaled':
        m.setattr(steps, 'uses_loss_scaling', lambda dtype: False)
      runs[name] = _train(m, config, tmp_path / name, factor=1e-5)
  loss32, norm32 = _history(runs['float32'], 'loss'), _history(runs['float32'], 'grad_norm')
  loss16, norm16 = _history(runs['float16'], 'loss'), _history(runs['float16'], 'grad_norm')
  np.testing.assert_allclose(loss16, loss32, atol=2e-3, rtol=0)
  np.testing.assert_allclose(norm16, norm32, rtol=5e-3)
  assert np.all(_history(runs['float16'], 'skipped_steps') == 0)
  assert np.all(_history(runs['float16'], 'loss_scale') == 2.0**16)
  # The same tolerances fail without the scale:
  assert np.max(np.abs(_history(runs['unscaled'], 'loss') - loss32)) > 0.05
  assert np.max(np.abs(_history(runs['unscaled'], 'grad_norm') / norm32 - 1)) > 0.1
  assert 'loss_scale' not in runs['float32']['train_history'][0]


def _state(workdir, step):
  with ocp.CheckpointManager(pathlib.Path(workdir) / 'checkpoints') as mgr:
    restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return jax.tree.map(np.asarray, restored['state'])


@pytest.mark.slow
def test_overflow_is_skipped_logged_checkpointed_and_resumed(corpus, tmp_path, monkeypatch):
  kw = dict(
      dtype='float16',
      log_every_steps=2,
      eval_every_steps=1000,
      checkpoint_every_steps=1,
      keep_checkpoints=10,
      log_pool_sizes=False,
  )
  data = tmp_path / 'data'
  # Uninterrupted: 6 steps, the gradient of step 2 (the third) overflows.
  full = _train(
      monkeypatch,
      tiny_config(corpus, data, num_train_steps=6, **kw),
      tmp_path / 'full',
      overflow_at=2,
  )
  states = {s: _state(tmp_path / 'full', s) for s in (2, 3, 4)}
  for name in ('params', 'opt_state'):  # (the LM has no model state)
    assert _same(states[2][name], states[3][name])  # step 2 changed nothing ...
    assert not _same(states[3][name], states[4][name])  # ... step 3 did
  scales = [float(states[s]['dynamic_scale']['scale']) for s in (2, 3, 4)]
  assert scales == [2.0**16, 2.0**15, 2.0**15]
  assert int(states[3]['bad_step']) == -1
  lines = [json.loads(l) for l in (tmp_path / 'full' / 'metrics.jsonl').read_text().splitlines()]
  train = [l for l in lines if l['split'] == 'train']
  assert [(l['step'], l['skipped_steps'], l['loss_scale']) for l in train] == [
      (2, 0.0, 2.0**16),
      (4, 1.0, (2.0**16 + 2.0**15) / 2),  # the mean of the steps' scales
      (6, 0.0, 2.0**15),
  ]
  assert all(np.isfinite(l['grad_norm']) for l in train)

  # Stopped after step 4's checkpoint, resumed: the saved scale, not a fresh one. The stopped
  # run is the full run's workdir without checkpoints 5 and 6: it checkpoints every step, and
  # its schedule (warmup_constant) does not depend on num_train_steps, so its checkpoint 4 is a
  # 4-step run's (metrics lines past step 4 as a killed run leaves them; the resume cuts them).
  resumed_dir = tmp_path / 'resumed'
  shutil.copytree(tmp_path / 'full', resumed_dir)
  for step in ('5', '6'):
    shutil.rmtree(resumed_dir / 'checkpoints' / step)
  resumed = _train(
      monkeypatch, tiny_config(corpus, data, num_train_steps=6, **kw), resumed_dir, overflow_at=2
  )
  assert resumed['train_history'][0]['loss_scale'] == 2.0**15  # its steps 4 and 5
  final, final_resumed = _state(tmp_path / 'full', 6), _state(resumed_dir, 6)
  assert float(final_resumed['dynamic_scale']['scale']) == 2.0**15
  jax.tree.map(np.testing.assert_array_equal, final_resumed, final)
  assert full['step'] == resumed['step'] == 6

  # Resuming it as float32 would need another state: one clear error, checkpoints kept.
  with pytest.raises(checkpoints.CheckpointError, match="dtype: saved 'float16', now 'float32'"):
    trainer.train_and_evaluate(
        tiny_config(corpus, data, **{**kw, 'dtype': 'float32'}, num_train_steps=8),
        str(resumed_dir),
    )
  assert (resumed_dir / 'checkpoints' / '6').exists()


# ----------------------------------------------------------------------------
# The layers in float16: forward and gradient finite and close to float32.
# ----------------------------------------------------------------------------


def _x(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


LAYERS = {
    'context_pool': (ContextPool, {}, (2, 16, 8)),
    'context_pool_attention_mapping': (ContextPool, dict(mapping='attention'), (2, 16, 8)),
    'area_attention_2d': (
        AreaAttention,
        dict(
            num_heads=2,
            max_area_width=3,
            max_area_height=2,
            memory_height=3,
            key_mode='concat',
            causal=True,
        ),
        (2, 12, 8),
    ),
    'area_attention_max_sum': (
        AreaAttention,
        dict(num_heads=2, max_area_width=4, key_mode='max', value_mode='sum'),
        (2, 12, 8),
    ),
    # train=True: BatchNorm with batch statistics, running averages updated.
    'lambda_layer': (
        LambdaLayer,
        dict(key_depth=4, heads=2, intra_depth=2, position='conv', scope_size=3),
        (2, 5, 4, 8),
    ),
    'augmented_conv': (
        AugmentedConv2D,
        dict(features=20, key_ratio=0.2, value_ratio=0.4, num_heads=2),
        (2, 6, 5, 3),
    ),
}


@pytest.mark.parametrize('name', list(LAYERS))
@pytest.mark.sweep
def test_layer_forward_and_gradient_in_float16(name):
  cls, fields, shape = LAYERS[name]
  x = _x(shape, 1)
  m32, m16 = cls(**fields), cls(**fields, dtype=jnp.float16)
  variables = init_variables(m32, init_key(), x)
  params = variables.pop('params')

  def forward(module):
    def f(p, z):
      if cls is LambdaLayer:
        y, _ = module.apply({'params': p, **variables}, z, train=True, mutable=['batch_stats'])
        return y
      return module.apply({'params': p, **variables}, z)

    return f

  def run(module):
    y = jax.jit(forward(module))(params, x)
    w = _x(y.shape, 2)
    loss = lambda p, z: jnp.sum(w * forward(module)(p, z).astype(jnp.float32))
    return y, jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)

  (y32, g32), (y16, g16) = run(m32), run(m16)
  assert y16.dtype == jnp.float16
  chex.assert_tree_all_finite((y16, g16))
  # Measured: 0.34 (augmented conv) to 1.32 (area attention, max keys) float16
  # epsilons (2^-10) of max |y|.
  scale = float(jnp.max(jnp.abs(y32)))
  np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=3 * F16_EPS * scale, rtol=0)
  # Measured: at most 3.2 epsilons of max(1, max |gradient|) per leaf (the
  # attention mapping's query bias), parameters and input.
  for g, want in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
    atol = 6 * F16_EPS * max(1.0, float(jnp.max(jnp.abs(want))))
    np.testing.assert_allclose(np.asarray(g, np.float32), want, atol=atol, rtol=0)


@pytest.mark.slow
def test_area_tables_are_accumulated_in_float32_for_float16_inputs():
  """Summed area tables of 512 items with an offset: a float16 prefix sum would
  reach ~5e4, where float16's spacing is 32, i.e. ~10% of an area's sum; they
  are accumulated in float32, so each feature is its float32 value rounded once
  to float16 (measured: at most 0.5 epsilons)."""
  x16 = (100.0 + _x((2, 512, 4), 3)).astype(jnp.float16)
  fields = dict(max_area_width=3, features=('sum', 'mean', 'std'))
  got = area_features(x16, **fields)
  want = area_features(x16.astype(jnp.float32), **fields)
  for name in ('sum', 'mean', 'std'):
    g, w = getattr(got, name), getattr(want, name)
    assert g.dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(g, np.float32), w, rtol=F16_EPS, atol=0)


@pytest.mark.slow
def test_init_from_works_across_float16_and_float32(corpus, tmp_path):
  """``init_from`` reads only the other run's params (and model state): a float16
  run starts from a float32 one and the reverse. One step at learning rate 0
  (the warm-up's first) keeps them, so each run's checkpoint holds the other's."""
  kw = dict(num_train_steps=1, eval_every_steps=1000, checkpoint_every_steps=1)
  kw.update(log_pool_sizes=False)
  data = tmp_path / 'data'
  runs = [('a', 'float32', ''), ('b', 'float16', 'a'), ('c', 'float32', 'b')]
  for name, dtype, init_from in runs:
    source = str(tmp_path / init_from) if init_from else ''
    seed = 1 if name == 'a' else 0  # b and c's own initial params differ from a's
    config = tiny_config(corpus, data, dtype=dtype, init_from=source, seed=seed, **kw)
    trainer.train_and_evaluate(config, str(tmp_path / name))
  a, b, c = (_state(tmp_path / name, 1) for name, _, _ in runs)
  assert 'dynamic_scale' in b and 'dynamic_scale' not in a and 'dynamic_scale' not in c
  jax.tree.map(np.testing.assert_array_equal, b['params'], a['params'])
  jax.tree.map(np.testing.assert_array_equal, c['params'], a['params'])
