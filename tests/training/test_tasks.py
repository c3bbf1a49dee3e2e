"""The task registry (``training/tasks.py``): what each kind of experiment builds from its specs:
its objective, its data pipeline's batches and its evaluators."""

import numpy as np
import pytest

from configs import default as default_config
from helpers import load_config
from contextpool_jax.training import evaluators, spec, tasks

NO_DEVICES = evaluators.Devices(
    state_shardings=None, data_sharding=None, eval_step_fn=None, eval_step=None
)


def _task(config):
  specs = spec.read(config)
  return tasks.make_task(specs.task, specs.model, specs.data, '')


@pytest.mark.parametrize('bleu', [True, False])
def test_a_translation_run_evaluates_bleu_after_each_splits_metrics_unless_off(bleu):
  config = load_config('wmt14', 'en-de,tiny,cp')
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
  config = load_config('cifar10_resnet', 'cp_resnet20')
  config.label_smoothing = 0.1
  objective = _task(config).objective
  assert isinstance(objective, tasks.objectives.Classification)
  assert (objective.num_classes, objective.label_smoothing) == (10, 0.1)


def test_the_abstract_batches_are_the_pipelines_batches(tmp_path):
  text = tmp_path / 'text'
  text.mkdir()
  rng = np.random.default_rng(0)
  for i in range(3):
    (text / f'f{i}.txt').write_bytes(rng.integers(32, 127, 40_000, np.uint8).tobytes())
  config = default_config.get_config()
  with config.unlocked():
    config.dataset.files = (str(text),)
    config.dataset.data_dir = str(tmp_path / 'tfds')
    config.dataset.seq_len, config.dataset.eval_context, config.dataset.eval_step = 32, 64, 32
    config.dataset.eval_batch_size = 4
    config.batch_size = 8
  specs = spec.read(config)
  task = tasks.make_task(specs.task, specs.model, specs.data, str(tmp_path))
  task.data.prepare()
  train, evaluation = task.data.batch_shapes(config.batch_size)
  real_train = next(iter(task.data.train_dataset(0, 1)))
  real_eval = next(iter(task.data.eval_batches('validation', 0, 1)))
  for shapes, real in ((train, real_train), (evaluation, real_eval)):
    assert {k: (np.shape(v), np.asarray(v).dtype) for k, v in real.items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype) in shapes.items()
    }
