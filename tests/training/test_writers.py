"""config.writers: the registry of metric writers (jsonl, TensorBoard, W&B offline, MLflow
on a local store, your own)."""

import importlib.metadata
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from conftest import REPO
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import trainer, writers
from helpers import tiny_config


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


@pytest.fixture
def mlflow_offline(monkeypatch):
  """MLflow installed, and no telemetry (the writer's default too, asserted below)."""
  pytest.importorskip('mlflow')
  pytest.importorskip('sqlalchemy')
  monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
  monkeypatch.delenv('MLFLOW_DISABLE_TELEMETRY', raising=False)


def _mlflow_client(workdir):
  """A client on the writer's default store, ``<workdir>/mlruns/mlflow.db``."""
  from mlflow.tracking import MlflowClient

  return MlflowClient(tracking_uri=f'sqlite:///{workdir / "mlruns" / "mlflow.db"}')


def _mlflow_history(client, run_id, key):
  """``{step: value}`` of one MLflow metric."""
  return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _wandb_records(run_dir):
  """The records of an offline W&B run (its .wandb log, read by wandb's own reader)."""
  out = subprocess.run(
      # wandb's command beside this Python: its virtualenv need not be on PATH.
      [pathlib.Path(sys.executable).parent / 'wandb', 'leet', 'inspect', '--json', str(run_dir)],
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]


@pytest.mark.slow
def test_every_writer_gets_the_config_the_scalars_and_the_histograms(
    corpus, tmp_path, recorder, wandb_offline, mlflow_offline
):
  workdir = tmp_path / 'run'
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      writers=('jsonl', 'tensorboard', 'wandb', 'mlflow', 'recorder'),
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

  # MLflow, on its default SQLite store in the workdir: read back through its client.
  import os

  assert os.environ['MLFLOW_DISABLE_TELEMETRY'] == 'true'  # no network unless asked
  client = _mlflow_client(workdir)
  experiment = client.get_experiment_by_name('contextpool-jax')
  (run,) = client.search_runs([experiment.experiment_id])
  assert run.info.run_id == (workdir / 'mlruns' / 'run_id').read_text().strip()
  assert run.info.status == 'FINISHED' and run.info.run_name == 'run'
  saved = json.loads((workdir / 'config.json').read_text())
  params = run.data.params
  assert params['model.name'] == 'cp_transformer_lm'
  assert params['num_train_steps'] == str(saved['num_train_steps'])
  assert json.loads(params['writers']) == saved['writers']
  assert params['dataset.files'] == json.dumps(saved['dataset']['files'])
  assert client.download_artifacts(run.info.run_id, 'config.json', str(tmp_path)).endswith('json')
  assert json.loads((tmp_path / 'config.json').read_text()) == saved
  for line in jsonl:
    for key, value in line.items():
      if key not in ('step', 'split'):
        logged = _mlflow_history(client, run.info.run_id, f'{line["split"]}/{key}')
        np.testing.assert_allclose(logged[line['step']], value, rtol=1e-6)
  # Histograms: summary metrics per layer, from the values the loop handed the writers.
  for kind, step, prefix, values in rec.records:
    if kind == 'histograms':
      for layer, v in values.items():
        for stat, expect in (('min', v.min()), ('p50', np.median(v)), ('max', v.max())):
          logged = _mlflow_history(client, run.info.run_id, f'{prefix}/{layer}/{stat}')
          np.testing.assert_allclose(logged[step], expect, rtol=1e-6)
        ordered = np.sort(v.ravel()).astype(np.float64)
        for stat, q in (('p10', 0.1), ('p90', 0.9)):  # between the order statistics around q
          logged = _mlflow_history(client, run.info.run_id, f'{prefix}/{layer}/{stat}')[step]
          at = q * (ordered.size - 1)
          assert ordered[int(np.floor(at))] <= logged <= ordered[int(np.ceil(at))], (stat, logged)


def test_mlflow_params_are_the_flattened_config_cut_to_the_limit():
  config = {'a': {'b': 1, 'c': 'x' * 50, 'd': {}}, 'e': [1, 'f'], 'g': None, 'h': True}
  params = writers.mlflow_params(config, limit=20)
  assert params == {
      'a.b': '1',
      'a.c': 'x' * 17 + '...',
      'a.d': '{}',
      'e': '[1, "f"]',
      'g': 'null',
      'h': 'true',
  }
  assert all(len(v) <= 20 for v in params.values())
  assert writers.mlflow_params(config, limit=1000)['a.c'] == 'x' * 50


@pytest.mark.slow
def test_a_resumed_run_keeps_its_wandb_and_mlflow_runs_and_metrics_jsonl_is_cut_as_before(
    corpus, tmp_path, wandb_offline, mlflow_offline
):
  workdir = tmp_path / 'run'
  kw = dict(writers=('jsonl', 'wandb', 'mlflow'), eval_every_steps=100, **{'wandb.mode': 'offline'})
  first = tiny_config(corpus, tmp_path / 'data', num_train_steps=2, **kw)
  trainer.train_and_evaluate(first, str(workdir))
  mlflow_run_id = (workdir / 'mlruns' / 'run_id').read_text().strip()
  with (workdir / 'metrics.jsonl').open('a') as f:  # a line a killed run logged after step 2
    f.write(json.dumps({'step': 3, 'split': 'train', 'loss': 0.0}) + '\n')
  trainer.train_and_evaluate(tiny_config(corpus, tmp_path / 'data', **kw), str(workdir))
  steps = [json.loads(l)['step'] for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert steps == [2] * 3 + [4] * 3  # train, pool_sigma_mean, eval; step 3's line was cut
  runs = sorted((workdir / 'wandb').glob('offline-run-*'))
  run_id = (workdir / 'wandb' / 'run_id').read_text().strip()
  assert len(runs) == 2 and all(r.name.endswith(run_id) for r in runs)
  # MLflow: the same run, continued; params keep the first start's values (MLflow's
  # params cannot change), the config.json artifact holds the latest config.
  client = _mlflow_client(workdir)
  (run,) = client.search_runs([client.get_experiment_by_name('contextpool-jax').experiment_id])
  assert run.info.run_id == mlflow_run_id == (workdir / 'mlruns' / 'run_id').read_text().strip()
  assert run.info.status == 'FINISHED'
  assert sorted(_mlflow_history(client, mlflow_run_id, 'train/loss')) == [2, 4]
  assert run.data.params['num_train_steps'] == '2'
  client.download_artifacts(mlflow_run_id, 'config.json', str(tmp_path))
  assert json.loads((tmp_path / 'config.json').read_text())['num_train_steps'] == 4


@pytest.mark.slow
def test_an_mlflow_run_id_its_store_does_not_hold_starts_a_new_run(
    corpus, tmp_path, mlflow_offline, capsys
):
  workdir = tmp_path / 'run'
  (workdir / 'mlruns').mkdir(parents=True)
  (workdir / 'mlruns' / 'run_id').write_text('0123456789abcdef\n')  # another store's run
  config = tiny_config(corpus, tmp_path / 'data', writers=('mlflow',), num_train_steps=2)
  trainer.train_and_evaluate(config, str(workdir))
  run_id = (workdir / 'mlruns' / 'run_id').read_text().strip()
  assert run_id != '0123456789abcdef'
  assert 'MLflow run 0123456789abcdef is not in this store; starting a new run' in (
      capsys.readouterr().out
  )
  assert _mlflow_client(workdir).get_run(run_id).info.status == 'FINISHED'


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
      writers.resolve_spec(
          tiny_config(corpus, tmp_path, writers=('wandb',), **{'wandb.mode': 'offlin'})
      )
  if all(importlib.util.find_spec(p) for p in writers.REGISTRY['mlflow'].packages):
    bad = {'writers': ('mlflow',), 'mlflow': {'experiment': 3}}  # e.g. a config file's typo
    with pytest.raises(
        ConfigError, match=r'^config.mlflow.experiment=3 is invalid; expected a string'
    ):
      writers.resolve_spec(bad)
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


@pytest.mark.parametrize('quiet', [True, False])
@pytest.mark.sweep  # the fast tier: quiet; the full suite also shows the chatter when not quiet
def test_a_new_mlflow_store_says_nothing_on_a_quiet_console(quiet, tmp_path, mlflow_offline, capfd):
  from configs import default as default_config
  from contextpool_jax.io import console

  console.set_quiet(quiet)
  try:
    writer = writers.MlflowWriter(
        writers.Run({}, default_config.get_config().to_dict(), tmp_path, 0)
    )
    writer.close()
  finally:
    console.set_quiet(False)
  said = capfd.readouterr()
  chatter = 'Creating initial MLflow database tables'
  assert (chatter in said.out + said.err) is not quiet, said  # train.py --verbosity: all shows
  assert (tmp_path / 'mlruns' / 'mlflow.db').is_file()


def test_the_mlflow_writer_names_a_missing_package_and_its_extra(corpus, tmp_path, monkeypatch):
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
      importlib.util,
      'find_spec',
      lambda name, *a: None if name == 'sqlalchemy' else find_spec(name, *a),
  )
  with pytest.raises(ConfigError) as error:
    writers.resolve_spec(tiny_config(corpus, tmp_path, writers=('jsonl', 'mlflow')))
  assert str(error.value) == (
      "config.writers includes 'mlflow', which needs the Python package sqlalchemy, not "
      "installed here: pip install 'contextpool-jax[mlflow]' (or pip install sqlalchemy), or "
      "remove 'mlflow' from config.writers."
  )


def test_tensorboard_reads_the_event_file_back(tmp_path):
  """The TensorBoard writer's files, read by TensorBoard's own reader: the config as text, the
  scalars, a histogram (64 bins over the finite values: a NaN is not counted), and a rerun's
  file, which drops what the first run logged after the step it resumes from."""
  from tensorboard.backend.event_processing import event_accumulator

  record = {'model': {'name': 'cp_transformer_lm'}}
  first = writers.TensorBoardWriter(writers.Run({}, record, tmp_path, 0))
  for step in (1, 2, 3):
    first.scalars(step, {'loss': 1.0 / step}, 'train')
  first.histograms(2, {'layer_0': np.array([[1.0, 2.0], [4.0, np.nan]])}, 'pool_sigma')
  first.close()
  rerun = writers.TensorBoardWriter(writers.Run({}, record, tmp_path, 2))  # resumed from step 2
  rerun.scalars(3, {'loss': 0.125}, 'train')
  rerun.close()
  files = sorted((tmp_path / 'tensorboard').iterdir())
  assert len(files) == 2 and all(p.name.startswith('events.out.tfevents.') for p in files)
  reader = event_accumulator.EventAccumulator(
      str(tmp_path / 'tensorboard'), size_guidance={event_accumulator.HISTOGRAMS: 0}
  )
  reader.Reload()
  assert [(e.step, e.value) for e in reader.Scalars('train/loss')] == [
      (1, 1.0),
      (2, 0.5),
      (3, 0.125),  # the rerun's; the first run's step 3 was dropped
  ]
  (histogram,) = reader.Histograms('pool_sigma/layer_0')
  assert histogram.step == 2 and histogram.histogram_value.num == 4
  assert sum(histogram.histogram_value.bucket) == 3
  assert histogram.histogram_value.bucket_limit[-1] == 4.0
  assert 'config/text_summary' in reader.Tags()['tensors']


def _extra_distributions(extras, name):
  """The distributions ``pip install 'contextpool-jax[<name>]'`` asks for (self-references
  followed)."""
  out = set()
  for requirement in extras[name]:
    dist, _, rest = requirement.partition('[')
    dist = re.split(r'[<>=!~; ]', dist)[0]
    if dist == 'contextpool-jax':
      for inner in rest.split(']')[0].split(','):
        out |= _extra_distributions(extras, inner.strip())
    else:
      out.add(dist.lower().replace('_', '-'))
  return out


def test_every_writer_extra_installs_the_packages_the_writer_imports():
  extras = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']['optional-dependencies']
  installed_by = importlib.metadata.packages_distributions()
  for name, kind in writers.REGISTRY.items():
    if not kind.packages:
      continue
    assert kind.extra in extras, (name, kind.extra)
    wanted = _extra_distributions(extras, kind.extra)
    for package in kind.packages:
      dists = {d.lower().replace('_', '-') for d in installed_by.get(package, ())}
      if dists:  # installed here: one of its distributions is in the extra
        assert dists & wanted, (name, package, dists, sorted(wanted))


@pytest.mark.slow
def test_the_default_writers_are_jsonl_and_tensorboard(corpus, tmp_path):
  assert writers.resolve_spec(tiny_config(corpus, tmp_path)).names == ('jsonl', 'tensorboard')
  assert writers.resolve_spec({}).names == writers.DEFAULT_WRITERS  # a config without the field
