"""The task registry (``training/tasks.py``): what each kind of experiment builds from its specs,
its evaluators and its log hooks."""

import jax
import ml_collections
import optax
import pytest

from conftest import REPO
from contextpool_jax.training import command_line, evaluators, spec, steps, tasks

NO_DEVICES = evaluators.Devices(
    state_shardings=None, data_sharding=None, eval_step_fn=None, eval_step=None
)


def _load(name, arg):
  """The config ``train.py`` starts from for ``--config=configs/<name>.py[:arg]``."""
  return command_line.load_config_file(
      str(REPO / 'configs' / f'{name}.py') + (f':{arg}' if arg else '')
  )


def _task(config):
  specs = spec.read(config)
  return tasks.make_task(specs.task, specs.model, specs.data, '')


@pytest.mark.parametrize('name,has_pool', [('cp_resnet20', True), ('resnet20', False)])
def test_pool_size_hook_is_decided_by_the_model(name, has_pool):
  """The hook asks the built model (a preset name; the config names no
  ``context_pool``) whether it sows pooling sizes; without them it writes nothing."""
  config = _load('cifar10_resnet', 'cp_resnet20')
  with config.unlocked():
    config.model = ml_collections.ConfigDict(dict(name=name, num_classes=10))  # no context_pool
  task = _task(config)
  [hook] = task.hooks(NO_DEVICES, log_pool_sizes=True)
  batch = task.data.init_batch()
  init = steps.make_init_fn(task.model, task.objective, batch, optax.identity())
  state = jax.eval_shape(init, jax.random.key(0))  # abstract: nothing computed
  assert hook.sows(state, batch) is has_pool
  if not has_pool:  # abstract values: running the probe would raise
    hook(1, state, batch, writer=None)
    assert hook.sown is False
  assert task.hooks(NO_DEVICES, log_pool_sizes=False) == []


@pytest.mark.parametrize('bleu', [True, False])
def test_a_translation_run_evaluates_bleu_after_each_splits_metrics_unless_off(bleu):
  config = _load('wmt14', 'en-de,tiny,cp')
  config.eval_bleu, config.beam_size, config.eval_bleu_batches = bleu, 3, 2
  evals = _task(config).evaluators(NO_DEVICES, ('validation', 'test'))
  kinds = [(type(e).__name__, e.split) for e in evals]
  if bleu:
    assert kinds == [
        ('SplitMetrics', 'validation'),
        ('Bleu', 'validation'),
        ('SplitMetrics', 'test'),
        ('Bleu', 'test'),
    ]
    assert {(e.beam_size, e.max_batches) for e in evals[1::2]} == {(3, 2)}
  else:
    assert kinds == [('SplitMetrics', 'validation'), ('SplitMetrics', 'test')]


def test_a_classification_objective_takes_the_models_classes_and_the_runs_smoothing():
  config = _load('cifar10_resnet', 'cp_resnet20')
  config.label_smoothing = 0.1
  objective = _task(config).objective
  assert isinstance(objective, tasks.objectives.Classification)
  assert (objective.num_classes, objective.label_smoothing) == (10, 0.1)
