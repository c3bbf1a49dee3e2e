"""A run's workdir: its layout, its config, and loading it back for use.

A workdir written by ``train.py`` / :func:`contextpool_jax.training.trainer.train_and_evaluate`
holds ``config.json`` (:func:`write_config`) and orbax checkpoints ``checkpoints/<step>/``
with the items ``'state'`` (step, params, opt_state, model_state, bad_step) and ``'data'``
(the grain iterator). :func:`load` reads the config, builds the model with
:func:`contextpool_jax.config_fields.build_model` (as the trainer does) and restores only
``params`` and ``model_state`` (e.g. BatchNorm statistics) of one step: no optimizer state,
no data iterator, no dataset.

:func:`export_params` writes a params-only export, a directory with ``config.json`` and
``variables.msgpack`` (``flax.serialization`` msgpack of the variables dict);
:func:`load` reads it back like a workdir, so an export can be shared without the
optimizer state (about a third of the size with Adam) and without orbax.

This module sits below both the trainer and inference: both use it, neither is used by it.

With ``/tmp/cp`` a workdir of ``python train.py --config configs/default.py --workdir /tmp/cp``
(tests/test_readme.py runs these examples against a short run of it):

  >>> import jax.numpy as jnp
  >>> from contextpool_jax.workdirs import export_params, load
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
from typing import Any, Optional, Union

import flax
import flax.linen as nn
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from contextpool_jax import config_fields, storage
from contextpool_jax.errors import WorkdirError

PathLike = Union[str, pathlib.Path]

# A training workdir's layout (written by the trainer): CONFIG_FILE (write_config) and
# CHECKPOINTS_DIR/<step>/; an export's: CONFIG_FILE and EXPORT_FILE.
CONFIG_FILE = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
EXPORT_FILE = 'variables.msgpack'
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
  return (path / EXPORT_FILE).is_file() and not (path / CHECKPOINTS_DIR).exists()


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
        f'export_params holds {CONFIG_FILE} and {EXPORT_FILE}.'
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
    state = flax.serialization.msgpack_restore((path / EXPORT_FILE).read_bytes())
    return jax.tree.map(jax.numpy.asarray, state), -1
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
  ``workdir`` may also be a directory written by :func:`export_params`.

  Raises:
    WorkdirError: (a ``FileNotFoundError``) the directory does not exist, has no
      ``config.json``, no checkpoints, or no checkpoint ``step``; the message names
      the directory and what it holds.
  """
  config = read_config(workdir)
  variables, _ = load_variables(workdir, step)
  return config_fields.build_model(config), variables, config


def export_params(workdir: PathLike, out_dir: PathLike, step: Optional[int] = None) -> pathlib.Path:
  """Writes a params-only export of checkpoint ``step`` (None: latest) to ``out_dir``.

  ``out_dir`` gets ``config.json`` (a copy) and ``variables.msgpack`` (the variables
  dict: params and model state, no optimizer state; ``flax.serialization``
  msgpack). ``load(out_dir)`` reads it back. Returns ``out_dir``.

  Both files are written whole (a temporary file renamed), ``variables.msgpack``
  last: an export that cannot be written (a full disk) leaves no file ``load``
  would read as an export.

  Raises:
    WorkdirError: as :func:`load`.
    FileExistsError: ``out_dir`` already holds an export.
    WriteError: a file of the export cannot be written; names it and the cause.
  """
  source = pathlib.Path(workdir)
  config = read_config(source)  # checks the workdir first
  variables, _ = load_variables(source, step)
  out = pathlib.Path(out_dir)
  if (out / EXPORT_FILE).exists():
    raise FileExistsError(f'{out / EXPORT_FILE} exists; choose another out_dir.')
  with storage.writing(out):
    out.mkdir(parents=True, exist_ok=True)
  state = jax.tree.map(np.asarray, variables)
  write_config(out, config)
  storage.write_atomic(out / EXPORT_FILE, flax.serialization.msgpack_serialize(state))
  return out
