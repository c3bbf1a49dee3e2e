"""Where a run's metrics go: the writers ``config.writers`` names, from a registry.

Every writer gets the same records from the loop, on process 0 only: the run's
config when it starts, the scalars of every log and evaluation step (train
loss, learning rate, ..., ``eval_<split>`` metrics, ``pool_sigma_mean``) and the
histograms of the log hooks (ContextPool's pooling sizes per layer). The loop
and the hooks talk to one :class:`Writers` (fan-out, in the order of
``config.writers``) and do not know which writers exist.

========================  ==================================================================
``config.writers`` entry  What it writes (extra dependency)
========================  ==================================================================
``'jsonl'``               ``<workdir>/metrics.jsonl``, one JSON line per record (none)
``'tensorboard'``         ``<workdir>/tensorboard/`` event files (none: tensorboardX is in
                          ``[train]``)
``'wandb'``               a Weights & Biases run (``pip install 'contextpool-jax[wandb]'``);
                          ``config.wandb``: ``project``, ``entity``, ``name``, ``mode``
``'mlflow'``              an MLflow run, by default in ``<workdir>/mlruns/mlflow.db`` (SQLite,
                          offline; ``pip install 'contextpool-jax[mlflow]'``); histograms as
                          per-layer summary metrics; ``config.mlflow``: ``tracking_uri``,
                          ``experiment``, ``run_name``
========================  ==================================================================

The default is ``('jsonl', 'tensorboard')``. A new writer is a factory
registered with :func:`register` (a name, the Python packages it needs, the
pip extra that installs them, the settings it reads); :func:`resolve_spec` reads
``config.writers`` and each writer's section into a :class:`WritersSpec`, and names a
missing package, before anything is compiled.

Resuming: ``metrics.jsonl`` is cut back to the step the run resumes from and
the TensorBoard file of a rerun starts with a ``SessionLog.START`` there, so
the lines a killed run logged after its last checkpoint are logged once
(:mod:`contextpool_jax.io.storage`). A W&B or MLflow run continues the same tracker run (its id
is kept in ``<workdir>/wandb/run_id``, ``<workdir>/mlruns/run_id``); the trackers
keep what they were sent, so those steps show twice there. A write that fails
raises WriteError from the loop (jsonl, TensorBoard).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import time
import uuid
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
from etils import epath

from contextpool_jax.io import config_readers, console, storage
from contextpool_jax.runs import layout
from contextpool_jax.base.errors import ConfigError

TENSORBOARD_DIR = 'tensorboard'
WANDB_DIR = 'wandb'
MLFLOW_DIR = 'mlruns'
# The W&B project and the MLflow experiment (config.wandb.project, config.mlflow.experiment)
# when the config names none.
PROJECT = 'contextpool-jax'
DEFAULT_WRITERS = ('jsonl', 'tensorboard')


class MetricWriter(Protocol):
  """One destination of the run's records."""

  def scalars(self, step: int, metrics: Mapping[str, float], prefix: str) -> None:
    ...

  def histograms(self, step: int, values: Mapping[str, np.ndarray], prefix: str) -> None:
    ...

  def close(self) -> None:
    ...


@dataclasses.dataclass(frozen=True)
class Run:
  """What a writer factory gets: its settings (its config section, read by its kind's
  ``read``), the config's record, the workdir, the step the run starts from."""

  settings: Mapping[str, str]
  record: Mapping[str, Any]  # the config as plain JSON values (what config.json holds)
  workdir: epath.Path
  start: int

  def config_dict(self) -> dict[str, Any]:
    """The config's record (a copy)."""
    return json.loads(json.dumps(self.record))


@dataclasses.dataclass(frozen=True)
class Kind:
  """A registered writer: its factory, the modules it imports, the pip extra."""

  factory: Callable[[Run], MetricWriter]
  packages: tuple[str, ...] = ()
  extra: Optional[str] = None
  read: Optional[Callable[[Any], Mapping[str, str]]] = None  # its config section (ConfigError)


REGISTRY: dict[str, Kind] = {}


def register(
    name: str,
    factory: Callable[[Run], MetricWriter],
    packages: Sequence[str] = (),
    extra: Optional[str] = None,
    read: Optional[Callable[[Any], Mapping[str, str]]] = None,
) -> None:
  """Adds a writer ``config.writers`` can name; ``packages``: modules it needs,
  installed by ``pip install 'contextpool-jax[<extra>]'``; ``read(config)`` reads and
  checks its settings (:attr:`Run.settings`) before anything is compiled."""
  REGISTRY[name] = Kind(factory, tuple(packages), extra, read)


@dataclasses.dataclass(frozen=True)
class WritersSpec:
  """``config.writers`` and the settings of each writer it names."""

  names: tuple[str, ...] = DEFAULT_WRITERS
  settings: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)


def resolve_spec(config: Any) -> WritersSpec:
  """The writers ``config.writers`` names (default :data:`DEFAULT_WRITERS`), with
  their settings.

  Raises:
    ConfigError: an unknown or repeated name, or a writer whose package is not
      installed (naming the writer, the package and the pip extra).
  """
  names = config_readers.lookup(config, 'writers', DEFAULT_WRITERS)
  names = (names,) if isinstance(names, str) else names
  if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
    raise ConfigError(
        f'config.writers={names!r} is invalid; expected a tuple of names from '
        f'{tuple(REGISTRY)}.'
    )
  names = tuple(names)
  for name in names:
    if name not in REGISTRY:
      raise ConfigError(
          f'config.writers: {name!r} is not a writer; allowed values: '
          f'{", ".join(repr(n) for n in REGISTRY)}.'
      )
    if names.count(name) > 1:
      raise ConfigError(f'config.writers={names!r} names {name!r} twice.')
    kind = REGISTRY[name]
    missing = [p for p in kind.packages if importlib.util.find_spec(p) is None]
    if missing:
      how = f"pip install 'contextpool-jax[{kind.extra}]'" if kind.extra else 'pip install'
      raise ConfigError(
          f'config.writers includes {name!r}, which needs the Python package '
          f'{", ".join(missing)}, not installed here: {how} (or pip install '
          f'{" ".join(missing)}), or remove {name!r} from config.writers.'
      )
  readers = {n: REGISTRY[n].read for n in names}
  return WritersSpec(names, {n: read(config) for n, read in readers.items() if read is not None})


class Writers:
  """The writers of ``spec`` as one; does nothing unless ``enabled`` (process 0
  writes, the others compute the same values). ``record``: the run's config as plain
  JSON values (what ``config.json`` holds), which the writers log."""

  def __init__(
      self,
      spec: WritersSpec,
      record: Mapping[str, Any],
      workdir: epath.PathLike,
      enabled: bool,
      start: int = 0,
  ):
    self.enabled = enabled
    self.writers: list[MetricWriter] = []
    if enabled:
      try:
        for name in spec.names:
          run = Run(spec.settings.get(name, {}), record, epath.Path(workdir), start)
          self.writers.append(REGISTRY[name].factory(run))
      except BaseException:
        self.close()
        raise

  def scalars(self, step: int, metrics: Mapping[str, float], prefix: str) -> None:
    for writer in self.writers:
      writer.scalars(step, metrics, prefix)

  def histograms(self, step: int, values: Mapping[str, np.ndarray], prefix: str) -> None:
    for writer in self.writers:
      writer.histograms(step, values, prefix)

  def close(self) -> None:
    """Closes every writer; raises the first failure after trying them all."""
    writers, self.writers, self.enabled = self.writers, [], False
    failure = None
    for writer in writers:
      try:
        writer.close()
      except Exception as e:  # pylint: disable=broad-except
        failure = failure or e
    if failure is not None:
      raise failure


# ----------------------------------------------------------------------------
# The writers.
# ----------------------------------------------------------------------------


class JsonlWriter:
  """``<workdir>/metrics.jsonl``: ``{"step": N, "split": prefix, **metrics}`` per line
  (histograms are not written; their means are scalars of their own)."""

  def __init__(self, run: Run):
    path = run.workdir / layout.METRICS_FILE
    removed = storage.resume_metrics(path, run.start)
    if removed:
      print(
          f'{path}: removed {removed} line(s) after step {run.start}, logged '
          'by a run that stopped before its next checkpoint.',
          flush=True,
      )
    self.jsonl = storage.JsonLines(path)

  def scalars(self, step, metrics, prefix):
    self.jsonl.write({'step': step, 'split': prefix, **metrics})

  def histograms(self, step, values, prefix):
    del step, values, prefix

  def close(self):
    self.jsonl.close()


# A histogram's bins (TensorBoard's and W&B's), even over the finite values' range.
HISTOGRAM_BINS = 64


class TensorBoardWriter:
  """``<workdir>/tensorboard/``: scalars ``<prefix>/<name>``, histograms, and the
  run's config as text (tag ``config``, at the start step). A rerun's file tells
  TensorBoard to drop the earlier runs' events after its start step."""

  def __init__(self, run: Run):
    from tensorboardX import summary  # pylint: disable=g-import-not-at-top

    self._summary = summary
    tb_dir = run.workdir / TENSORBOARD_DIR
    rerun = tb_dir.exists() and any('tfevents' in p.name for p in tb_dir.iterdir())
    self.tb = storage.EventFile(tb_dir, purge_from=run.start + 1 if rerun else None)
    text = '```\n' + json.dumps(run.config_dict(), indent=2) + '\n```'
    self.tb.add(run.start, summary.text('config', text))
    self.tb.flush()

  def scalars(self, step, metrics, prefix):
    for k, val in metrics.items():
      self.tb.add(step, self._summary.scalar(f'{prefix}/{k}', val))
    self.tb.flush()

  def histograms(self, step, values, prefix):
    for k, val in values.items():
      flat = np.asarray(val, np.float32).ravel()
      edges = np.histogram_bin_edges(flat[np.isfinite(flat)], HISTOGRAM_BINS)  # NaN: not counted
      self.tb.add(step, self._summary.histogram(f'{prefix}/{k}', flat, edges))
    self.tb.flush()

  def close(self):
    self.tb.close()


WANDB_MODES = ('', 'online', 'offline', 'disabled')


def _read_strings(config: Any, section: str, keys: Sequence[str]) -> dict[str, str]:
  """``config.<section>.<key>`` for each key: a string ('' when absent)."""
  out = {}
  for key in keys:
    value = config_readers.lookup(config, f'{section}.{key}', '')
    if not isinstance(value, str):
      raise ConfigError(f'config.{section}.{key}={value!r} is invalid; expected a string.')
    out[key] = value
  return out


def _read_wandb(config: Any) -> dict[str, str]:
  settings = _read_strings(config, 'wandb', ('project', 'entity', 'name'))
  settings['mode'] = config_readers.read_choice(config, 'wandb.mode', WANDB_MODES, default='')
  return settings


def kept_run_id(path: epath.Path, make: Callable[[], str]) -> str:
  """The tracker's run id kept in ``path`` (``make()`` once, when there is none), so
  a resumed run continues the same tracker run."""
  if path.exists():
    return path.read_text().strip()
  with storage.writing(path.parent):
    path.parent.mkdir(parents=True, exist_ok=True)
  run_id = make()
  storage.write_atomic(path, run_id + '\n')
  return run_id


def wandb_run_id(workdir: epath.Path) -> str:
  """The W&B run id of ``workdir`` (kept in ``<workdir>/wandb/run_id``, made once)."""
  return kept_run_id(workdir / WANDB_DIR / 'run_id', lambda: uuid.uuid4().hex[:16])


class WandbWriter:
  """A Weights & Biases run in ``<workdir>/wandb/``: the config, scalars
  ``<prefix>/<name>`` and histograms, all against the metric ``step`` (the
  training step, as in ``metrics.jsonl``).

  ``config.wandb``: ``project``, ``entity`` ('' = your default), ``name`` ('' =
  the workdir's name), ``mode`` ('' = W&B's default, ``WANDB_MODE`` or online;
  ``'offline'``: written to disk only, ``wandb sync <workdir>/wandb/offline-run-*``
  uploads it later; ``'disabled'``).
  """

  def __init__(self, run: Run):
    import wandb  # pylint: disable=g-import-not-at-top

    self._wandb = wandb
    get = lambda key: run.settings.get(key, '')
    self.run = wandb.init(
        project=get('project') or PROJECT,
        entity=get('entity') or None,
        name=get('name') or run.workdir.name,
        dir=str(run.workdir),
        id=wandb_run_id(run.workdir),
        resume='allow',
        mode=get('mode') or None,  # pyright: ignore[reportArgumentType]  # one of WANDB_MODES
        config=run.config_dict(),
    )
    self.run.define_metric('step')
    self.run.define_metric('*', step_metric='step')

  def scalars(self, step, metrics, prefix):
    self.run.log({'step': step, **{f'{prefix}/{k}': float(v) for k, v in metrics.items()}})

  def histograms(self, step, values, prefix):
    # wandb.Histogram annotates its data as a Sequence; its docs and its code take an array.
    data = {
        f'{prefix}/{k}': self._wandb.Histogram(
            np.asarray(v, np.float32).ravel(),  # pyright: ignore[reportArgumentType]  # array_like
            num_bins=HISTOGRAM_BINS,
        )
        for k, v in values.items()
    }
    self.run.log({'step': step, **data})

  def close(self):
    self.run.finish()


MLFLOW_STATS = {
    'min': np.min,
    'p10': lambda v: np.percentile(v, 10),
    'p50': np.median,
    'p90': lambda v: np.percentile(v, 90),
    'max': np.max,
}


def _read_mlflow(config: Any) -> dict[str, str]:
  return _read_strings(config, 'mlflow', ('tracking_uri', 'experiment', 'run_name'))


def mlflow_store(workdir: epath.Path, tracking_uri: str) -> tuple[str, Optional[str]]:
  """``(tracking URI, artifact location of a new experiment)``: ``tracking_uri``
  as given (its server chooses where artifacts go), or by default a SQLite file
  ``<workdir>/mlruns/mlflow.db`` with artifacts in ``<workdir>/mlruns/artifacts``."""
  if tracking_uri:
    return tracking_uri, None
  if '://' in os.fspath(workdir):
    raise ConfigError(
        f"config.mlflow.tracking_uri='' keeps a SQLite store in the workdir, which must be "
        f'a local directory; {workdir} is not: set config.mlflow.tracking_uri (e.g. a server).'
    )
  root = pathlib.Path(os.fspath(workdir)).absolute() / MLFLOW_DIR
  with storage.writing(root):
    root.mkdir(parents=True, exist_ok=True)
  return f'sqlite:///{root / "mlflow.db"}', (root / 'artifacts').as_uri()


def mlflow_params(config: Mapping[str, Any], limit: int) -> dict[str, str]:
  """The config as MLflow params: dotted keys (``model.emb_dim``), strings as
  they are, other values as JSON, each cut to ``limit`` characters (MLflow's
  longest param value; a cut value ends in ``...``)."""
  flat = {}

  def visit(prefix: str, node: Any) -> None:
    if isinstance(node, Mapping) and node:
      for key, value in node.items():
        visit(f'{prefix}.{key}' if prefix else str(key), value)
      return
    text = node if isinstance(node, str) else json.dumps(node)
    flat[prefix] = text if len(text) <= limit else text[: limit - 3] + '...'

  visit('', config)
  return flat


def _param_limit() -> int:
  """The longest param value the installed MLflow client accepts."""
  from mlflow.utils import validation  # pylint: disable=g-import-not-at-top

  return getattr(validation, 'MAX_PARAM_VAL_LENGTH', 500)


class MlflowWriter:
  """An MLflow run, offline by default (a SQLite store in ``<workdir>/mlruns/``).

  It logs the config as params (dotted keys, values cut to MLflow's limit: see
  :func:`mlflow_params`) and as the artifact ``config.json`` (whole; rewritten at
  every start, so it holds the latest config while params keep the first start's
  values, which MLflow does not let change), the scalars as metrics
  ``<prefix>/<name>`` at the training ``step``, and each histogram as summary
  metrics ``<prefix>/<name>/<stat>`` (stat: ``min``, ``p10``, ``p50``, ``p90``,
  ``max`` of the values, e.g. one layer's pooling sizes), so they plot as curves.

  ``config.mlflow``: ``tracking_uri`` ('' = ``sqlite:///<workdir>/mlruns/mlflow.db``,
  artifacts in ``<workdir>/mlruns/artifacts``; or a server, ``http://host:5000``),
  ``experiment`` ('' = :data:`PROJECT`), ``run_name`` ('' = the workdir's
  name). The run id is kept in ``<workdir>/mlruns/run_id``: a resumed run continues
  that MLflow run. MLflow's usage telemetry is off unless ``MLFLOW_DISABLE_TELEMETRY``
  is set otherwise (no network at run time).
  """

  def __init__(self, run: Run):
    os.environ.setdefault('MLFLOW_DISABLE_TELEMETRY', 'true')
    from mlflow import entities, tracking  # pylint: disable=g-import-not-at-top

    self._entities = entities
    get = lambda key: run.settings.get(key, '')
    uri, artifacts = mlflow_store(run.workdir, get('tracking_uri'))
    with console.library_logs('mlflow.store.db.utils', 'alembic'):
      self.client = tracking.MlflowClient(tracking_uri=uri)  # a new store creates its tables
    self.run_id = self._run_id(run, get('experiment') or PROJECT, artifacts)
    self._log_config(run.config_dict())

  def _run_id(self, run: Run, experiment: str, artifacts: Optional[str]) -> str:
    """The workdir's MLflow run (made in ``experiment`` the first time), running."""
    found = self.client.get_experiment_by_name(experiment)
    experiment_id = (
        found.experiment_id
        if found is not None
        else self.client.create_experiment(experiment, artifact_location=artifacts)
    )
    name = run.settings.get('run_name', '') or run.workdir.name
    make = lambda: self.client.create_run(experiment_id, run_name=name).info.run_id
    path = run.workdir / MLFLOW_DIR / 'run_id'
    run_id = kept_run_id(path, make)
    if not self._exists(run_id):  # e.g. another tracking_uri than the first start's
      console.event(f'{path}: MLflow run {run_id} is not in this store; starting a new run.')
      run_id = make()
      storage.write_atomic(path, run_id + '\n')
    self.client.update_run(run_id, status='RUNNING')
    return run_id

  def _exists(self, run_id: str) -> bool:
    from mlflow import exceptions  # pylint: disable=g-import-not-at-top

    try:
      self.client.get_run(run_id)
    except exceptions.MlflowException as e:
      if e.error_code != 'RESOURCE_DOES_NOT_EXIST':
        raise
      return False
    return True

  def _log_config(self, config: dict[str, Any]) -> None:
    logged = self.client.get_run(self.run_id).data.params
    params = [
        self._entities.Param(k, v)
        for k, v in mlflow_params(config, _param_limit()).items()
        if k not in logged  # a resumed run: the params of the first start stay
    ]
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
      self.client.log_batch(self.run_id, params=params[i : i + 100])
    self.client.log_dict(self.run_id, config, 'config.json')

  def _log(self, step: int, metrics: Mapping[str, float]) -> None:
    now = int(time.time() * 1000)
    metric = self._entities.Metric
    self.client.log_batch(
        self.run_id, metrics=[metric(k, float(v), now, step) for k, v in metrics.items()]
    )

  def scalars(self, step, metrics, prefix):
    self._log(step, {f'{prefix}/{k}': v for k, v in metrics.items()})

  def histograms(self, step, values, prefix):
    flat = {k: np.asarray(v, np.float64).ravel() for k, v in values.items()}
    self._log(
        step,
        {f'{prefix}/{k}/{stat}': f(v) for k, v in flat.items() for stat, f in MLFLOW_STATS.items()},
    )

  def close(self):
    self.client.set_terminated(self.run_id)


register('jsonl', JsonlWriter)
register('tensorboard', TensorBoardWriter, packages=('tensorboardX',), extra='train')
register('wandb', WandbWriter, packages=('wandb',), extra='wandb', read=_read_wandb)
register(
    'mlflow',
    MlflowWriter,
    packages=('mlflow', 'sqlalchemy', 'alembic'),
    extra='mlflow',
    read=_read_mlflow,
)
