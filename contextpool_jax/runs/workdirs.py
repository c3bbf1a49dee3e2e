"""A run's workdir: its layout, its config, and loading it back for use.

A workdir written by ``train.py`` / :func:`contextpool_jax.training.trainer.train_and_evaluate`
holds ``config.json`` (:func:`write_config`) and orbax checkpoints ``checkpoints/<step>/``
with the items ``'state'`` (step, params, opt_state, model_state, bad_step) and ``'data'``
(the grain iterator). :func:`load` reads the config, builds the model with
:func:`contextpool_jax.runs.config_fields.build_model` (as the trainer does) and restores only
``params`` and ``model_state`` (e.g. BatchNorm statistics) of one step: no optimizer state,
no data iterator, no dataset.

:func:`export_params` writes a params-only export, a directory with ``config.json``,
``model.safetensors`` (the variables dict, one tensor per nested path joined with ``/``:
``params/decoder/layer_0/...``), ``variables.msgpack`` (the same dict, ``flax.serialization``
msgpack, which 0.1.0 reads) and a model card ``README.md`` (model, config, data and split,
metrics at export, how to load it). :func:`load` reads it back like a workdir, from
either weights file (safetensors first), so an export can be shared without the optimizer
state (about a third of the size with Adam) and without orbax. ``load('hf://user/repo')``
(:func:`load_from_hub`) reads an export uploaded to a Hugging Face Hub model repo
(``pip install 'contextpool-jax[hub]'``).

This module sits below both the trainer and inference: both use it, neither is used by it.

With ``/tmp/cp`` a workdir of ``python train.py --config configs/default.py --workdir /tmp/cp``
(tests/test_readme.py runs these examples against a short run of it):

  >>> import jax.numpy as jnp
  >>> from contextpool_jax.runs.workdirs import export_params, load
  >>> model, variables, config = load('/tmp/cp')           # the latest step
  >>> tokens = jnp.asarray([list(b'def main():')], jnp.int32)
  >>> model.apply(variables, tokens).shape                  # [batch, length, 256]
  (1, 11, 256)
  >>> export_params('/tmp/cp', '/tmp/cp_params')
  PosixPath('/tmp/cp_params')
  >>> model, variables, config = load('/tmp/cp_params')    # an export loads like a workdir
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
from collections.abc import Mapping
from typing import Any, Optional, Union

import flax
import flax.linen as nn
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from contextpool_jax.io import storage
from contextpool_jax.runs import config_fields
from contextpool_jax.base.errors import ArgumentError, WorkdirError
from contextpool_jax.models import common as model_common

PathLike = Union[str, pathlib.Path]

# A training workdir's layout (written by the trainer): CONFIG_FILE (write_config),
# CHECKPOINTS_DIR/<step>/ and METRICS_FILE; an export's: CONFIG_FILE, SAFETENSORS_FILE,
# EXPORT_FILE and CARD_FILE.
CONFIG_FILE = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
METRICS_FILE = 'metrics.jsonl'
EXPORT_FILE = 'variables.msgpack'
SAFETENSORS_FILE = 'model.safetensors'
CARD_FILE = 'README.md'
# The files of an export: what load_from_hub downloads.
EXPORT_FILES = (CONFIG_FILE, SAFETENSORS_FILE, EXPORT_FILE, CARD_FILE)
# The weights files, in the order load reads them (the first present).
WEIGHTS_FILES = (SAFETENSORS_FILE, EXPORT_FILE)
HUB_PREFIX = 'hf://'
STATE_ITEM = 'state'
# What load restores from a checkpoint's 'state' item (TrainState fields).
RESTORED_FIELDS = ('params', 'model_state')


@contextlib.contextmanager
def _quiet_orbax():
  """Hides orbax's notices about read-only managers and per-item metadata (absl WARNING)."""
  logger = logging.getLogger('absl')
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


@contextlib.contextmanager
def _read_only_manager(directory: pathlib.Path):
  """An orbax ``CheckpointManager`` that never writes, quietly."""
  with _quiet_orbax():
    options = ocp.CheckpointManagerOptions(read_only=True, create=False)
    with ocp.CheckpointManager(directory, options=options) as manager:
      yield manager


def _contents(path: pathlib.Path, limit: int = 12) -> str:
  """``'a, b/, c'``: what a directory holds (for error messages)."""
  if not path.exists():
    return 'it does not exist'
  if not path.is_dir():
    return 'it is a file, not a directory'
  names = sorted(p.name + ('/' if p.is_dir() else '') for p in path.iterdir())
  if not names:
    return 'it is empty'
  more = f', ... ({len(names)} entries)' if len(names) > limit else ''
  return 'it holds: ' + ', '.join(names[:limit]) + more


def _is_export(path: pathlib.Path) -> bool:
  return any((path / f).is_file() for f in WEIGHTS_FILES) and not (path / CHECKPOINTS_DIR).exists()


def flatten_variables(variables: Any) -> dict[str, np.ndarray]:
  """``{'params/decoder/layer_0/...': array}``: the leaves of a nested variables dict, keyed
  by their paths joined with ``/`` (the keys of ``model.safetensors``), as numpy arrays.

  Raises:
    ArgumentError: a key is not a non-empty string without ``/`` (the path would not
      read back).
  """
  flat = {}

  def visit(prefix: tuple[str, ...], node: Any) -> None:
    if isinstance(node, Mapping):
      for key, value in node.items():
        if not isinstance(key, str) or not key or '/' in key:
          raise ArgumentError(
              f'variables key {key!r} at {"/".join(prefix) or "the top"} cannot be a '
              "safetensors path: keys must be non-empty strings without '/'."
          )
        visit(prefix + (key,), value)
    else:
      flat['/'.join(prefix)] = np.ascontiguousarray(np.asarray(node))

  visit((), variables)
  return flat


def unflatten_variables(flat: dict[str, Any]) -> dict[str, Any]:
  """The nested dict of :func:`flatten_variables`'s ``{'a/b/c': array}``."""
  nested: dict[str, Any] = {}
  for key in sorted(flat):
    node = nested
    *parents, leaf = key.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = flat[key]
  return nested


def _safetensors_numpy():
  """``safetensors.numpy``, imported on first use (a dependency of the package since
  exports carry ``model.safetensors``; an environment installed before may lack it)."""
  try:
    import safetensors.numpy  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        f'{SAFETENSORS_FILE} is read and written with the safetensors package, not installed '
        f'here: pip install safetensors ({e}).'
    ) from e
  return safetensors.numpy


def _read_export(path: pathlib.Path) -> dict[str, Any]:
  """The variables of an export, from ``model.safetensors`` or else ``variables.msgpack``."""
  if (path / SAFETENSORS_FILE).is_file():
    data = (path / SAFETENSORS_FILE).read_bytes()
    return unflatten_variables(_safetensors_numpy().load(data))
  return flax.serialization.msgpack_restore((path / EXPORT_FILE).read_bytes())


def _tuples(value: Any) -> Any:
  """JSON lists back to the tuples configs use (JSON has no tuples)."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return value


def write_config(directory: epath.PathLike, config: ml_collections.ConfigDict) -> epath.Path:
  """Writes ``config`` as ``directory/CONFIG_FILE``, atomically: to a unique
  temporary file, then renamed over it. On a resume, the other processes read
  this file (:func:`~contextpool_jax.training.checkpoints.check_resume_config`)
  while process 0 rewrites it. A plain write truncates first, so a reader could
  see an empty file and stop with a JSON error, leaving process 0 at its next
  barrier."""
  return storage.write_atomic(
      epath.Path(directory) / CONFIG_FILE, config.to_json_best_effort(indent=2)
  )


def read_config(workdir: PathLike) -> ml_collections.ConfigDict:
  """The config a workdir (or export) was trained with, from its ``config.json``.

  Raises:
    WorkdirError: no such directory or no ``config.json`` in it.
  """
  path = pathlib.Path(workdir)
  config_path = path / CONFIG_FILE
  if not config_path.is_file():
    raise WorkdirError(
        f'{path} is not a training workdir: no {CONFIG_FILE} ({_contents(path)}). A workdir '
        f'written by train.py holds {CONFIG_FILE} and {CHECKPOINTS_DIR}/<step>/; an export by '
        f'export_params holds {CONFIG_FILE} and {SAFETENSORS_FILE} (or {EXPORT_FILE}).'
    )
  try:
    data = json.loads(config_path.read_text())
  except json.JSONDecodeError as e:
    raise WorkdirError(f'{config_path} is not valid JSON: {e}') from e
  return ml_collections.ConfigDict(_tuples(data))


def checkpoint_steps(workdir: PathLike) -> list[int]:
  """The steps of the finished checkpoints under ``<workdir>/checkpoints``, ascending.

  Raises:
    WorkdirError: no checkpoint directory, or no finished checkpoint in it.
  """
  path = pathlib.Path(workdir)
  directory = path / CHECKPOINTS_DIR
  if not directory.is_dir():
    raise WorkdirError(
        f'{path} has no {CHECKPOINTS_DIR}/ directory ({_contents(path)}); '
        'train it first (train.py --workdir ...).'
    )
  with _read_only_manager(directory) as manager:
    steps = sorted(manager.all_steps())
  if not steps:
    raise WorkdirError(f'{directory} has no finished checkpoint ({_contents(directory)}).')
  return steps


def _resolve_step(workdir: pathlib.Path, step: Optional[int]) -> int:
  steps = checkpoint_steps(workdir)
  if step is None:
    return steps[-1]
  if step not in steps:
    raise WorkdirError(
        f'step={step!r} is not a checkpoint of {workdir / CHECKPOINTS_DIR}; '
        f'its steps are {steps}.'
    )
  return step


def _restore_checkpoint(workdir: pathlib.Path, step: int) -> dict[str, Any]:
  """``{'params': ..., 'model_state': ...}`` of one step, as numpy arrays.

  A partial restore of the ``'state'`` item: the optimizer state and the data
  iterator are never read. Arrays come back as host numpy arrays, so a checkpoint
  saved on any device layout (e.g. FSDP over 8 devices) loads on one CPU.
  """
  state_dir = workdir / CHECKPOINTS_DIR / str(step) / STATE_ITEM
  with _quiet_orbax():
    metadata = ocp.PyTreeCheckpointer().metadata(state_dir).item_metadata
  tree = getattr(metadata, 'tree', metadata)
  missing = [f for f in RESTORED_FIELDS if f not in (tree or {})]
  if missing:
    raise WorkdirError(
        f'{state_dir} has no {missing} (it holds {sorted(tree or {})}); '
        'not a checkpoint written by the trainer.'
    )
  item = {f: tree[f] for f in RESTORED_FIELDS}
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  with _read_only_manager(workdir / CHECKPOINTS_DIR) as manager:
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.PyTreeRestore(
                    item=item, restore_args=restore_args, partial_restore=True
                )
            }
        ),
    )
  return restored[STATE_ITEM]


def _variables(params: Any, model_state: Any) -> dict[str, Any]:
  """The Flax variables dict ``{'params': ..., **model_state}`` as jax arrays."""
  return jax.tree.map(jax.numpy.asarray, {'params': params, **dict(model_state or {})})


def load_variables(workdir: PathLike, step: Optional[int] = None) -> tuple[dict[str, Any], int]:
  """``(variables, step)``: params and model state of a workdir's checkpoint (latest by
  default), or of an export (step -1). ``variables`` is ``{'params': ..., **model_state}``.

  Raises:
    WorkdirError: as :func:`load`.
  """
  path = pathlib.Path(workdir)
  if _is_export(path):
    if step is not None:
      raise WorkdirError(
          f'{path} is a params-only export (one set of parameters); step={step!r} must be None.'
      )
    return jax.tree.map(jax.numpy.asarray, _read_export(path)), -1
  step = _resolve_step(path, step)
  restored = _restore_checkpoint(path, step)
  return _variables(restored['params'], restored['model_state']), step


def load(
    workdir: PathLike, step: Optional[int] = None
) -> tuple[nn.Module, dict[str, Any], ml_collections.ConfigDict]:
  """Loads a trained model: ``(model, variables, config)``.

  Works for any config (every task and model): the model is
  ``config_fields.build_model(config)`` from ``<workdir>/config.json``; ``variables`` is
  the Flax variables dict ``{'params': ..., **model_state}`` (e.g. ``'batch_stats'``)
  of checkpoint ``step`` (None: the latest), so ``model.apply(variables, ...,
  train=False)`` runs it. Only parameters and model state are restored (not the
  optimizer state nor the data iterator), and the dataset is never needed.
  ``workdir`` may also be a directory written by :func:`export_params` (its
  ``model.safetensors``, or else ``variables.msgpack``), or ``'hf://user/repo'``
  (``'hf://user/repo@revision'``): such an export uploaded to the Hugging Face Hub
  (:func:`load_from_hub`).

  Raises:
    WorkdirError: (a ``FileNotFoundError``) the directory does not exist, has no
      ``config.json``, no checkpoints, or no checkpoint ``step``; the message names
      the directory and what it holds.
    ImportError: an ``hf://`` path without huggingface_hub installed.
  """
  if isinstance(workdir, str) and workdir.startswith(HUB_PREFIX):
    repo_id, _, revision = workdir[len(HUB_PREFIX) :].partition('@')
    workdir = hub_snapshot(repo_id, revision=revision or None)
  config = read_config(workdir)
  variables, _ = load_variables(workdir, step)
  return config_fields.build_model(config), variables, config


def _huggingface_hub():
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        'loading from the Hugging Face Hub needs huggingface_hub, not installed here: '
        f"pip install 'contextpool-jax[hub]' ({e})."
    ) from e
  return huggingface_hub


def hub_snapshot(
    repo_id: str,
    revision: Optional[str] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    local_files_only: bool = False,
) -> pathlib.Path:
  """The local directory of an export in Hugging Face Hub model repo ``repo_id``
  (``'user/repo'``) at ``revision`` (a branch, tag or commit; None: the default branch):
  ``huggingface_hub.snapshot_download`` of the export's files only (``EXPORT_FILES``)
  into the Hub cache (``cache_dir``; None: ``$HF_HUB_CACHE``, by default
  ``~/.cache/huggingface/hub``). ``local_files_only=True`` (or ``HF_HUB_OFFLINE=1``)
  reads the cache without the network.

  Raises:
    ImportError: huggingface_hub is not installed (``pip install 'contextpool-jax[hub]'``).
  """
  hub = _huggingface_hub()
  path = hub.snapshot_download(
      repo_id,
      revision=revision,
      cache_dir=None if cache_dir is None else str(cache_dir),
      local_files_only=local_files_only,
      allow_patterns=list(EXPORT_FILES),
      library_name='contextpool-jax',
  )
  return pathlib.Path(path)


def load_from_hub(
    repo_id: str,
    revision: Optional[str] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    local_files_only: bool = False,
) -> tuple[nn.Module, dict[str, Any], ml_collections.ConfigDict]:
  """:func:`load` of an export in Hugging Face Hub model repo ``repo_id`` (uploaded
  from a directory of :func:`export_params`); the arguments are :func:`hub_snapshot`'s.
  ``load('hf://user/repo@revision')`` is the same with the default cache.

  Raises:
    ImportError: huggingface_hub is not installed (``pip install 'contextpool-jax[hub]'``).
    WorkdirError: as :func:`load`, e.g. the repo holds no export.
  """
  return load(
      hub_snapshot(repo_id, revision, cache_dir=cache_dir, local_files_only=local_files_only)
  )


# The int fields of config.model a card lists (the model's sizes) come from the config; these
# top-level fields are the run's.
_CARD_RUN_FIELDS = ('task', 'seed', 'num_train_steps', 'batch_size', 'dtype')


def _latest_eval(workdir: pathlib.Path, step: int) -> tuple[Optional[int], dict[str, dict]]:
  """``(step, {split: metrics})``: the evaluation records (``split`` ``eval_*``) of
  ``metrics.jsonl`` at the last step <= ``step`` that has any, or ``(None, {})``."""
  path = workdir / METRICS_FILE
  if not path.is_file():
    return None, {}
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue  # a line cut by a crash
    if (
        isinstance(record, dict)
        and str(record.get('split', '')).startswith('eval')
        and isinstance(record.get('step'), int)
        and (step < 0 or record['step'] <= step)
    ):
      records.append(record)
  if not records:
    return None, {}
  last = max(r['step'] for r in records)
  out = {}
  for r in records:
    if r['step'] == last:
      out[r['split']] = {k: v for k, v in r.items() if k not in ('step', 'split')}
  return last, out


def _value(v: Any) -> str:
  if isinstance(v, float):
    return f'{v:.6g}'
  return f'`{json.dumps(v)}`' if not isinstance(v, str) else f'`{v}`'


def model_card(
    config: ml_collections.ConfigDict,
    variables: dict[str, Any],
    step: int,
    metrics: tuple[Optional[int], dict[str, dict]] = (None, {}),
    source: str = '',
) -> str:
  """The ``README.md`` of an export: a Hugging Face model card (:func:`_card_text`: YAML
  metadata, the library and tags) with the model (name, size fields, parameter count), the
  run's key config fields, the data and its split, the evaluation metrics at export
  (``metrics``: :func:`_latest_eval`'s) and how to load it."""
  name = config.model.get('name', '?')
  lines = [
      '',
      f'# {name}',
      '',
      f'A `{name}` model of contextpool-jax, exported by '
      '`contextpool_jax.runs.workdirs.export_params`'
      + (f' from step {step}' if step >= 0 else '')
      + (f' of `{source}`' if source else '')
      + f': parameters and model state only (no optimizer state), in `{SAFETENSORS_FILE}` '
      f'(keys: the nested paths joined with `/`, e.g. `params/...`) and `{EXPORT_FILE}`.',
  ]
  lines += _card_model(config.model, variables) + _card_config(config)
  lines += _card_data(config.get('dataset', ml_collections.ConfigDict()))
  lines += _card_metrics(*metrics, step) + _CARD_LOADING
  tags = list(dict.fromkeys(['jax', 'flax', 'contextpool-jax', str(name)]))
  return _card_text({'library_name': 'contextpool-jax', 'tags': tags}, '\n'.join(lines))


def _card_text(metadata: dict[str, Any], body: str) -> str:
  """A model card: ``metadata`` as its YAML block, then ``body`` (Markdown), rendered by
  ``huggingface_hub.ModelCard`` (the ``[hub]`` extra). Without huggingface_hub (the core and
  ``[train]`` installs export too), PyYAML writes the block as huggingface_hub does
  (``yaml.dump``: keys in order, unicode kept): the same text
  (tests/test_export_weights.py compares them)."""
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
  except ImportError:
    import yaml  # pylint: disable=import-outside-toplevel  # flax's and ml_collections' dependency

    block = yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True).strip()
    return f'---\n{block}\n---\n{body}'
  block = huggingface_hub.ModelCardData(**metadata).to_yaml()
  return str(huggingface_hub.ModelCard(f'---\n{block}\n---\n{body}'))


def _card_model(model: ml_collections.ConfigDict, variables: dict[str, Any]) -> list[str]:
  """The card's model section: name, parameter count (and state), the size fields."""
  n = model_common.count_params(variables.get('params', {}))
  state = sorted(k for k in variables if k != 'params')
  lines = ['', '## Model', '', f'- name: `{model.get("name", "?")}`']
  lines += [f'- parameters: {n:,}' + (f' (model state: {", ".join(state)})' if state else '')]
  sizes = [
      (k, v) for k, v in sorted(model.items()) if isinstance(v, int) and not isinstance(v, bool)
  ]
  return lines + [f'- {k}: {_value(v)}' for k, v in sizes]


def _card_config(config: ml_collections.ConfigDict) -> list[str]:
  """The card's config section: where the whole config is, and its key fields."""
  lines = [
      '',
      '## Config',
      '',
      f'The full config is `{CONFIG_FILE}` beside this file (what `load` builds the model '
      'from). Key fields:',
      '',
  ]
  lines += [f'- {k}: {_value(config[k])}' for k in _CARD_RUN_FIELDS if k in config]
  if 'optimizer' in config:
    opt = config.optimizer
    lines += [
        f'- optimizer: {_value(opt.get("name"))}, learning_rate {_value(opt.get("learning_rate"))}'
        f', schedule {_value(opt.get("schedule"))}'
    ]
  return lines


def _card_data(data: ml_collections.ConfigDict) -> list[str]:
  """The card's data section: the dataset's source fields and how it was split."""
  lines = ['', '## Data and split', '', f'- dataset: {_value(data.get("name", "?"))}']
  lines += [
      f'- {k}: {_value(data[k])}'
      for k in ('files', 'data_dir', 'max_bytes', 'seq_len')
      if k in data
  ]
  if 'split_block_bytes' not in data and 'split_seed' not in data:
    return lines + ["- split: the dataset's own train / validation / test splits"]
  return lines + [
      f'- split: the seeded `local_text` rule (docs/data.md, `contextpool_jax/data/'
      'text_splits.py`): files cut into blocks of `split_block_bytes` (0: whole files), '
      "about 5% of each top folder's bytes to validation and 5% to test, by hashes seeded with "
      f'`split_seed`; split_block_bytes: {_value(data.get("split_block_bytes"))}, '
      f'split_seed: {_value(data.get("split_seed"))}'
  ]


def _card_metrics(metric_step: Optional[int], splits: dict[str, dict], step: int) -> list[str]:
  """The card's metrics section: a table of the last evaluation up to the export's step."""
  lines = ['', '## Metrics at export', '']
  if not splits:
    return lines + [f"No evaluation metrics (no eval records in the run's `{METRICS_FILE}`)."]
  keys = sorted({k for m in splits.values() for k in m})
  lines += [
      f"From the run's `{METRICS_FILE}`, evaluation at step {metric_step}"
      + (f' (the export is of step {step})' if metric_step != step and step >= 0 else '')
      + ':',
      '',
      '| split | ' + ' | '.join(keys) + ' |',
      '| --- |' + ' --- |' * len(keys),
  ]
  for split in sorted(splits):
    row = [_value(splits[split][k]) if k in splits[split] else '' for k in keys]
    lines += [f'| {split} | ' + ' | '.join(row) + ' |']
  return lines


_CARD_LOADING = [
    '',
    '## How to load',
    '',
    'With `pip install contextpool-jax` (and `[hub]` for the Hub):',
    '',
    '```python',
    'from contextpool_jax.runs.workdirs import load',
    '',
    "model, variables, config = load('path/to/this/directory')   # or load('hf://user/repo')",
    "outputs = model.apply(variables, inputs, train=False)   # inputs as the config's dataset makes them",
    '```',
    '',
]


def export_params(
    workdir: PathLike, out_dir: PathLike, step: Optional[int] = None, *, msgpack: bool = True
) -> pathlib.Path:
  """Writes a params-only export of checkpoint ``step`` (None: latest) to ``out_dir``.

  ``out_dir`` gets ``config.json`` (a copy), ``model.safetensors`` (the variables dict:
  params and model state, no optimizer state; keys are the nested paths joined with ``/``,
  ``params/decoder/layer_0/...``), ``variables.msgpack`` (the same dict,
  ``flax.serialization`` msgpack, as 0.1.0 wrote and reads; ``msgpack=False``: not
  written) and ``README.md``, a model card (:func:`model_card`: the model, the config's
  key fields, data and split, the workdir's latest evaluation metrics up to ``step``, how
  to load it). ``load(out_dir)`` reads it back. The directory can be uploaded as a
  Hugging Face Hub model repo as it is. Returns ``out_dir``.

  Each file is written whole (a temporary file renamed), the weights last: an export that
  cannot be written (a full disk) leaves no file ``load`` would read as an export.

  Raises:
    WorkdirError: as :func:`load`.
    FileExistsError: ``out_dir`` already holds an export.
    WriteError: a file of the export cannot be written; names it and the cause.
  """
  source = pathlib.Path(workdir)
  config = read_config(source)  # checks the workdir first
  variables, exported_step = load_variables(source, step)
  out = pathlib.Path(out_dir)
  for name in WEIGHTS_FILES:
    if (out / name).exists():
      raise FileExistsError(f'{out / name} exists; choose another out_dir.')
  state = jax.tree.map(np.asarray, variables)
  tensors = _safetensors_numpy().save(flatten_variables(state), metadata={'format': 'flax'})
  card = model_card(
      config, state, exported_step, _latest_eval(source, exported_step), source=source.name
  )
  with storage.writing(out):
    out.mkdir(parents=True, exist_ok=True)
  write_config(out, config)
  storage.write_atomic(out / CARD_FILE, card)
  storage.write_atomic(out / SAFETENSORS_FILE, tensors)
  if msgpack:
    try:
      storage.write_atomic(out / EXPORT_FILE, flax.serialization.msgpack_serialize(state))
    except BaseException:
      (out / SAFETENSORS_FILE).unlink()  # no half export: load would read it
      raise
  return out
