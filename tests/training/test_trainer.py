"""The training system end to end on small local data: resume, NaN stop, devices, errors."""

import collections
import json
import pathlib

import jax
import numpy as np
import pytest

from contextpool_jax.training import steps
from contextpool_jax.training import trainer
from conftest import REPO
from helpers import tiny_config


def _params(workdir):
  """The latest checkpoint's params as numpy arrays."""
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(pathlib.Path(workdir) / 'checkpoints') as mgr:
    step = mgr.latest_step()
    restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return step, jax.tree.map(np.asarray, restored['state']['params'])


def _traced(run) -> collections.Counter:
  """How many times ``run()`` traced each function (JAX's trace events, by name)."""
  names = collections.Counter()

  def on_duration(event, seconds, fun_name=None, **kwargs):
    del seconds, kwargs
    if event == '/jax/core/compile/jaxpr_trace_duration':
      names[fun_name] += 1

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  try:
    run()
  finally:
    jax.monitoring.unregister_event_duration_listener(on_duration)
  return names


@pytest.mark.slow
def test_trains_evaluates_and_logs(corpus, tmp_path, monkeypatch):
  """And traces each step once: the metric sums' zeros, the summed programs and every
  evaluation share one trace of the train step's loss and one of the eval step."""
  loss_traces = []

  def counted(make_loss_fn):
    def make(*args):
      loss_fn = make_loss_fn(*args)
      return lambda *a: loss_traces.append(1) or loss_fn(*a)

    return make

  monkeypatch.setattr(steps, '_make_loss_fn', counted(steps._make_loss_fn))
  config = tiny_config(corpus, tmp_path / 'data', eval_every_steps=2)
  result = {}
  traced = _traced(lambda: result.update(trainer.train_and_evaluate(config, str(tmp_path / 'run'))))
  assert (len(loss_traces), traced['eval_step']) == (1, 1), (loss_traces, traced)
  assert result['step'] == 4
  evals = result['eval_validation']
  assert np.isfinite(evals['bpc']) and evals['bpc'] > 0
  np.testing.assert_allclose(evals['bpc'], evals['loss'] / np.log(2.0))
  run = tmp_path / 'run'
  assert json.loads((run / 'config.json').read_text())['model']['name'] == 'cp_transformer_lm'
  lines = [json.loads(l) for l in (run / 'metrics.jsonl').read_text().splitlines()]
  assert {l['split'] for l in lines} >= {'train', 'eval_validation', 'pool_sigma_mean'}
  assert any(p.name.startswith('events.out.tfevents') for p in (run / 'tensorboard').iterdir())
  train = [l for l in lines if l['split'] == 'train']
  assert [l['step'] for l in train] == [2, 4]
  assert all(np.isfinite(l['loss']) and l['steps_per_sec'] > 0 for l in train)


@pytest.mark.slow
def test_resume_gives_the_same_params_as_an_uninterrupted_run(corpus, tmp_path):
  data_dir = tmp_path / 'data'
  full = tiny_config(corpus, data_dir, num_train_steps=6, eval_every_steps=100)
  trainer.train_and_evaluate(full, str(tmp_path / 'full'))
  half = tiny_config(
      corpus, data_dir, num_train_steps=3, eval_every_steps=100, checkpoint_every_steps=3
  )
  trainer.train_and_evaluate(half, str(tmp_path / 'resumed'))
  resumed = trainer.train_and_evaluate(full, str(tmp_path / 'resumed'))
  assert resumed['step'] == 6
  step_a, params_a = _params(tmp_path / 'full')
  step_b, params_b = _params(tmp_path / 'resumed')
  assert step_a == step_b == 6
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)


@pytest.mark.slow
def test_gradient_accumulation_matches_the_full_batch(corpus, tmp_path):
  data_dir = tmp_path / 'data'
  # SGD: the update is linear in the gradient (Adam's first steps are ~sign(g), which
  # float rounding can flip for near-zero gradients).
  kw = dict(
      num_train_steps=2,
      eval_every_steps=100,
      **{
          'model.dropout_rate': 0.0,
          'optimizer.name': 'sgd',
          'optimizer.momentum': 0.0,
          'optimizer.learning_rate': 0.5,
      },
  )
  trainer.train_and_evaluate(tiny_config(corpus, data_dir, **kw), str(tmp_path / 'a'))
  trainer.train_and_evaluate(
      tiny_config(corpus, data_dir, grad_accum_steps=2, **kw), str(tmp_path / 'b')
  )
  _, a = _params(tmp_path / 'a')
  _, b = _params(tmp_path / 'b')
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5), a, b)


@pytest.mark.slow
def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(corpus, tmp_path):
  # A learning rate this large makes the parameters overflow within a few steps.
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      num_train_steps=40,
      checkpoint_every_steps=1,
      eval_every_steps=1000,
      **{'optimizer.learning_rate': 1e30, 'optimizer.schedule': 'constant'},
  )
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step (\d+)') as err:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  bad = int(err.value.args[0].split('at step ')[1].split(';')[0])
  step, params = _params(tmp_path / 'run')
  assert step == bad  # the checkpoint after the last good update (steps 0..bad-1)
  assert all(np.isfinite(p).all() for p in jax.tree.leaves(params))


@pytest.mark.slow
def test_non_finite_loss_is_caught_at_the_next_log_step_without_per_step_reads(corpus, tmp_path):
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      num_train_steps=40,
      log_every_steps=5,
      checkpoint_every_steps=1000,
      eval_every_steps=1000,
      **{'optimizer.learning_rate': 1e30, 'optimizer.schedule': 'constant'},
  )
  assert config.nan_check_every_steps == 0  # the default: no per-step host sync
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step (\d+)') as err:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  bad = int(err.value.args[0].split('at step ')[1].split(';')[0])
  caught = -(-(bad + 1) // 5) * 5  # the first log step after the bad step ran
  lines = (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()
  logged = [json.loads(l)['step'] for l in lines if json.loads(l)['split'] == 'train']
  assert logged == list(range(5, caught, 5))
  assert all(np.isfinite(json.loads(l)['loss']) for l in lines if json.loads(l)['split'] == 'train')


@pytest.mark.slow
def test_the_loop_reads_devices_only_through_fetch_and_not_every_step(
    corpus, tmp_path, monkeypatch
):
  from contextpool_jax.training import sharding

  calls = []
  fetch = sharding.fetch
  monkeypatch.setattr(sharding, 'fetch', lambda tree: calls.append(1) or fetch(tree))
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      num_train_steps=30,
      log_every_steps=10,
      eval_every_steps=30,
      checkpoint_every_steps=30,
  )
  result = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result['step'] == 30
  # Per log step: NaN check, train sums, pool sizes; per evaluation: its sums;
  # per checkpoint: NaN check; the final step. Not one per step.
  assert len(calls) == 3 * 3 + 1 + 1 + 1


def test_bad_config_fails_before_compiling(corpus, tmp_path):
  with pytest.raises(ValueError, match='config.batch_size=6 with config.grad_accum_steps=4'):
    trainer.train_and_evaluate(
        tiny_config(corpus, tmp_path, batch_size=6, grad_accum_steps=4), str(tmp_path / 'run')
    )
  with pytest.raises(ValueError, match="config.task='vision'"):
    trainer.train_and_evaluate(tiny_config(corpus, tmp_path, task='vision'), str(tmp_path / 'r'))
  with pytest.raises(ValueError, match="model='cp_transformer_lmx' is not registered"):
    trainer.train_and_evaluate(
        tiny_config(corpus, tmp_path, **{'model.name': 'cp_transformer_lmx'}), str(tmp_path / 'r')
    )


@pytest.mark.slow
def test_bpc_of_a_uniform_model_is_eight_bits(corpus, tmp_path):
  """Known input: a model that puts 1/256 on every byte costs exactly log2(256) = 8 bits."""
  import jax.numpy as jnp
  from contextpool_jax.training import objectives

  task = objectives.LanguageModelling()
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 17)), jnp.int32)
  weights = jnp.ones((3, 16)).at[2, :8].set(0.0)  # unscored positions do not count
  batch = {'tokens': tokens, 'weights': weights}
  sums = task.eval_sums(jnp.zeros((3, 16, 256)), batch)
  metrics = task.finalize({k: float(v) for k, v in sums.items()})
  np.testing.assert_allclose(metrics['bpc'], 8.0, rtol=1e-6)
  assert float(sums['weight']) == 40.0
