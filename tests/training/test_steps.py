"""The train step (contextpool_jax.training.steps): a non-finite step changes nothing but the step
counter and ``bad_step``."""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest


class _TinyClassifier(nn.Module):

  @nn.compact
  def __call__(self, image, train=False):
    x = nn.BatchNorm(use_running_average=not train)(image.reshape(image.shape[0], -1))
    return nn.Dense(3)(x)


@pytest.mark.parametrize('finite', [True, False])
def test_a_non_finite_step_changes_nothing_but_the_step_and_bad_step(finite):
  from contextpool_jax.training import objectives, steps

  model = _TinyClassifier()
  objective = objectives.Classification(num_classes=3)
  tx = optax.adam(0.1)
  image = np.linspace(-1, 1, 4 * 2 * 2 * 3, dtype=np.float32).reshape(4, 2, 2, 3)
  batch = {'image': image, 'label': np.array([0, 1, 2, 0], np.int32)}
  state = steps.make_init_fn(model, objective, batch, tx)(jax.random.key(0))
  if not finite:
    batch = dict(batch, image=image.copy())
    batch['image'][0, 0, 0, 0] = np.nan
  step = jax.jit(steps.make_train_step(model, objective, tx, lambda s: 0.1, jax.random.key(1)))
  new, metrics = step(state, batch)
  assert int(new.step) == 1 and np.isfinite(float(metrics['loss'])) == finite
  assert int(new.bad_step) == (-1 if finite else 0)
  rest = lambda s: (s.params, s.opt_state, s.model_state)
  same = [
      np.array_equal(a, b) for a, b in zip(jax.tree.leaves(rest(new)), jax.tree.leaves(rest(state)))
  ]
  if finite:  # parameters, Adam moments and BatchNorm statistics all moved
    assert not any(a for a, l in zip(same, jax.tree.leaves(rest(state))) if l.size > 1)
  else:
    assert all(same)
