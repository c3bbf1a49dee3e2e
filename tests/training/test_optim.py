"""Optimizers and schedules built from ``config.optimizer``, read into an OptimizerSpec."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from contextpool_jax.training import optim


def _cfg(**kw):
  """``config.optimizer`` with ``kw``, read (:func:`optim.resolve_spec`)."""
  cfg = common.base_config().optimizer  # every optimizer field, at its default
  cfg.update(
      dict(
          name='adam',
          learning_rate=1e-3,
          schedule='constant',
          warmup_steps=10,
          end_learning_rate=0.0,
          weight_decay=0.0,
          grad_clip_norm=0.0,
      )
  )
  cfg.update(kw)
  return optim.resolve_spec(cfg)


def test_inverse_sqrt_is_vaswanis_schedule():
  schedule = optim.make_schedule(_cfg(schedule='inverse_sqrt', warmup_steps=4000), 100000)
  d_model = 512
  for step in (1, 100, 3999, 4000, 4001, 50000):
    # Vaswani et al. Eq. 3 rescaled so that the peak (step = warmup) is the learning rate.
    vaswani = d_model**-0.5 * min(step**-0.5, step * 4000**-1.5)
    peak = d_model**-0.5 * 4000**-0.5
    np.testing.assert_allclose(float(schedule(step)), 1e-3 * vaswani / peak, rtol=1e-5)


@pytest.mark.parametrize('kind', ['cosine', 'linear', 'warmup_constant'])
def test_warmup_then_decay(kind):
  schedule = optim.make_schedule(_cfg(schedule=kind, warmup_steps=10), 110)
  lrs = np.array([float(schedule(s)) for s in range(111)])
  np.testing.assert_allclose(lrs[0], 0.0, atol=1e-12)
  np.testing.assert_allclose(lrs[10], 1e-3, rtol=1e-5)
  assert np.all(np.diff(lrs[:11]) > 0)
  if kind == 'warmup_constant':
    np.testing.assert_allclose(lrs[10:], 1e-3, rtol=1e-6)
  else:
    assert np.all(np.diff(lrs[10:]) <= 1e-12) and lrs[-1] < 1e-6


def test_weight_decay_only_on_matrices():
  params = {'kernel': jnp.ones((3, 3)), 'bias': jnp.ones((3,)), 'scale': jnp.ones((3,))}
  tx, _ = optim.make_optimizer(_cfg(name='adamw', weight_decay=0.1), 10)
  state = tx.init(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, state, params)
  assert float(jnp.abs(updates['kernel']).sum()) > 0
  assert float(jnp.abs(updates['bias']).sum()) == 0 and float(jnp.abs(updates['scale']).sum()) == 0


def test_clipping_bounds_the_update():
  params = {'w': jnp.zeros((4,))}
  tx, _ = optim.make_optimizer(
      _cfg(name='sgd', momentum=0.0, grad_clip_norm=1.0, learning_rate=1.0), 10
  )
  updates, _ = tx.update({'w': jnp.full((4,), 100.0)}, tx.init(params), params)
  np.testing.assert_allclose(float(jnp.linalg.norm(updates['w'])), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    'field,value',
    [('name', 'adafactorz'), ('schedule', 'step'), ('learning_rate', -1.0), ('warmup_steps', -5)],
)
def test_bad_values_raise_naming_the_field(field, value):
  with pytest.raises(ValueError, match=f'config.optimizer.{field}'):
    _cfg(**{field: value})


def test_piecewise_is_he_et_als_step_schedule():
  cfg = _cfg(
      schedule='piecewise',
      warmup_steps=0,
      learning_rate=0.1,
      boundaries=(32000, 48000),
      decay_factor=0.1,
  )
  schedule = optim.make_schedule(cfg, 64000)
  for step, want in [(0, 0.1), (31999, 0.1), (32001, 0.01), (47999, 0.01), (48001, 0.001)]:
    np.testing.assert_allclose(float(schedule(step)), want, rtol=1e-6)
