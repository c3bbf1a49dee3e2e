"""What the loop runs besides training (``training/evaluators.py``): the pool-size log hook asks
the built model whether it sows pooling sizes. (The split metrics and BLEU over whole splits:
the trainer's runs, tests/training/test_trainer.py and tests/repo/test_configs.py.)"""

import jax
import ml_collections
import optax
import pytest

from helpers import load_config
from contextpool_jax.training import evaluators, spec, steps, tasks

NO_DEVICES = evaluators.Devices(
    state_shardings=None, data_sharding=None, eval_step_fn=None, eval_step=None
)


@pytest.mark.parametrize('name,has_pool', [('cp_resnet20', True), ('resnet20', False)])
def test_pool_size_hook_is_decided_by_the_model(name, has_pool):
  """The hook asks the built model (a preset name; the config names no
  ``context_pool``) whether it sows pooling sizes; without them it writes nothing."""
  config = load_config('cifar10_resnet', 'cp_resnet20')
  with config.unlocked():
    config.model = ml_collections.ConfigDict(dict(name=name, num_classes=10))  # no context_pool
  specs = spec.read(config)
  task = tasks.make_task(specs.task, specs.model, specs.data, '')
  [hook] = task.hooks(NO_DEVICES, log_pool_sizes=True)
  batch = task.data.init_batch()
  init = steps.make_init_fn(task.model, task.objective, batch, optax.identity())
  state = jax.eval_shape(init, jax.random.key(0))  # abstract: nothing computed
  assert hook.sows(state, batch) is has_pool
  if not has_pool:  # abstract values: running the probe would raise
    hook(1, state, batch, writer=None)
    assert hook.sown is False
  assert task.hooks(NO_DEVICES, log_pool_sizes=False) == []
