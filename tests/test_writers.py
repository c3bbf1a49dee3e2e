"""config.writers: the registry of metric writers (jsonl, TensorBoard, W&B offline, your own)."""

import json
import subprocess

import numpy as np
import pytest

from contextpool_jax.errors import ConfigError
from contextpool_jax.training import trainer, writers
from test_training import tiny_config


class Recorder:
  """A writer that keeps what it is given (registered by name, as any writer is)."""

  runs = []

  def __init__(self, run):
    self.records, self.closed = [], False
    self.config = run.config_dict()
    Recorder.runs.append(self)

  def scalars(self, step, metrics, prefix):
    self.records.append(('scalars', step, prefix, dict(metrics)))

  def histograms(self, step, values, prefix):
    self.records.append(('histograms', step, prefix, {k: np.asarray(v) for k, v in values.items()}))

  def close(self):
    self.closed = True


@pytest.fixture
def recorder(monkeypatch):
  monkeypatch.setitem(writers.REGISTRY, 'recorder', writers.Kind(Recorder))
  Recorder.runs = []
  return Recorder


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
  """W&B without network or a home directory: offline mode, its files under tmp_path."""
  pytest.importorskip('wandb')
  for var, value in {
      'WANDB_MODE': 'offline',
      'WANDB_SILENT': 'true',
      'WANDB_CONFIG_DIR': str(tmp_path / 'wandb_config'),
      'WANDB_CACHE_DIR': str(tmp_path / 'wandb_cache'),
      'WANDB_DATA_DIR': str(tmp_path / 'wandb_data'),
  }.items():
    monkeypatch.setenv(var, value)


def _wandb_records(run_dir):
  """The records of an offline W&B run (its .wandb log, read by wandb's own reader)."""
  out = subprocess.run(
      ['wandb', 'leet', 'inspect', '--json', str(run_dir)],
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]


@pytest.mark.slow
def test_every_writer_gets_the_config_the_scalars_and_the_histograms(
    corpus, tmp_path, recorder, wandb_offline
):
  workdir = tmp_path / 'run'
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      writers=('jsonl', 'tensorboard', 'wandb', 'recorder'),
      **{'wandb.mode': 'offline'},
  )
  trainer.train_and_evaluate(config, str(workdir))
  jsonl = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]

  # A writer the trainer knows only by its registered name: the same records.
  (rec,) = recorder.runs
  assert rec.closed and rec.config['model']['name'] == 'cp_transformer_lm'
  scalars = [{'step': s, 'split': p, **m} for kind, s, p, m in rec.records if kind == 'scalars']
  assert scalars == jsonl
  hists = [(s, p, sorted(v)) for kind, s, p, v in rec.records if kind == 'histograms']
  assert [(s, p) for s, p, _ in hists] == [(2, 'pool_sigma'), (4, 'pool_sigma')]
  means = next(l for l in jsonl if l['split'] == 'pool_sigma_mean')
  assert hists[0][2] == sorted(k for k in means if k not in ('step', 'split'))

  # TensorBoard: the config as text, besides the scalars and histograms.
  (events,) = (workdir / 'tensorboard').iterdir()
  assert b'cp_transformer_lm' in events.read_bytes()

  # W&B, offline: the run's config, the same scalars against 'step', the histograms.
  (run_dir,) = (workdir / 'wandb').glob('offline-run-*')
  run_id = (workdir / 'wandb' / 'run_id').read_text().strip()
  assert run_dir.name.endswith(run_id)
  records = _wandb_records(run_dir)
  (run,) = [r['run'] for r in records if r['type'] == 'run']
  assert run['run_id'] == run_id and run['project'] == 'contextpool-jax'
  assert run['config']['update']['model']['name'] == 'cp_transformer_lm'
  history = [r['history']['item'] for r in records if r['type'] == 'history']
  for line in jsonl:
    logged = next(
        h
        for h in history
        if h.get('step') == line['step'] and any(k.startswith(line['split'] + '/') for k in h)
    )
    for key, value in line.items():
      if key not in ('step', 'split'):
        np.testing.assert_allclose(logged[f'{line["split"]}/{key}'], value, rtol=1e-6)
  sigma = [k for h in history for k in h if k.startswith('pool_sigma/')]
  assert sigma and all(k.endswith(('._type', '.bins', '.values')) for k in sigma), sigma


@pytest.mark.slow
def test_a_resumed_run_keeps_its_wandb_run_and_metrics_jsonl_is_cut_as_before(
    corpus, tmp_path, wandb_offline
):
  workdir = tmp_path / 'run'
  kw = dict(writers=('jsonl', 'wandb'), eval_every_steps=100, **{'wandb.mode': 'offline'})
  first = tiny_config(corpus, tmp_path / 'data', num_train_steps=2, **kw)
  trainer.train_and_evaluate(first, str(workdir))
  with (workdir / 'metrics.jsonl').open('a') as f:  # a line a killed run logged after step 2
    f.write(json.dumps({'step': 3, 'split': 'train', 'loss': 0.0}) + '\n')
  trainer.train_and_evaluate(tiny_config(corpus, tmp_path / 'data', **kw), str(workdir))
  steps = [json.loads(l)['step'] for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert steps == [2] * 3 + [4] * 3  # train, pool_sigma_mean, eval; step 3's line was cut
  runs = sorted((workdir / 'wandb').glob('offline-run-*'))
  run_id = (workdir / 'wandb' / 'run_id').read_text().strip()
  assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)


def test_an_unknown_writer_or_a_missing_package_fails_before_anything_is_built(
    corpus, tmp_path, monkeypatch
):
  with pytest.raises(ConfigError, match="config.writers: 'tensorbord' is not a writer"):
    trainer.train_and_evaluate(
        tiny_config(corpus, tmp_path, writers=('jsonl', 'tensorbord')), str(tmp_path / 'a')
    )
  if writers.REGISTRY['wandb'].packages and all(
      __import__('importlib').util.find_spec(p) for p in writers.REGISTRY['wandb'].packages
  ):
    with pytest.raises(ConfigError, match="config.wandb.mode='offlin' is not supported"):
      writers.check(tiny_config(corpus, tmp_path, writers=('wandb',), **{'wandb.mode': 'offlin'}))
  monkeypatch.setitem(
      writers.REGISTRY,
      'wandb',
      writers.Kind(writers.WandbWriter, packages=('wandb_not_installed_here',), extra='wandb'),
  )
  with pytest.raises(ConfigError) as error:
    trainer.train_and_evaluate(
        tiny_config(corpus, tmp_path, writers=('jsonl', 'wandb')), str(tmp_path / 'b')
    )
  assert str(error.value) == (
      "config.writers includes 'wandb', which needs the Python package "
      "wandb_not_installed_here, not installed here: pip install 'contextpool-jax[wandb]' "
      "(or pip install wandb_not_installed_here), or remove 'wandb' from config.writers."
  )
  assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()


@pytest.mark.slow
def test_the_default_writers_are_jsonl_and_tensorboard(corpus, tmp_path):
  assert writers.check(tiny_config(corpus, tmp_path)) == ('jsonl', 'tensorboard')
  assert writers.check({}) == writers.DEFAULT_WRITERS  # a config without the field
