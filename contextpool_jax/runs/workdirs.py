"""A run's workdir: its config, and loading it back for use (a workdir or an export, local or
on the Hub).

A workdir written by ``train.py`` / :func:`contextpool_jax.training.trainer.train_and_evaluate`
holds ``config.json`` (:func:`write_config`) and orbax checkpoints ``checkpoints/<step>/``
with the items ``'state'`` (step, params, opt_state, model_state, bad_step) and ``'data'``
(the grain iterator). :func:`load` reads the config, builds the model with
:func:`contextpool_jax.runs.config_fields.build_model` (as the trainer does) and restores only
``params`` and ``model_state`` (e.g. BatchNorm statistics) of one step: no optimizer state,
no data iterator, no dataset.

:func:`~contextpool_jax.runs.export.export_params` writes a params-only export, a directory
with ``config.json``,
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
(tests/repo/test_readme.py runs these examples against a short run of it):

  >>> import jax.numpy as jnp
  >>> from contextpool_jax.runs.export import export_params
  >>> from contextpool_jax.runs.workdirs import load
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
from typing import Any, Optional

from flax import serialization
import flax.linen as nn
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from contextpool_jax.io import storage
from contextpool_jax.runs import config_fields, hub
from contextpool_jax.runs.layout import CHECKPOINTS_DIR, CONFIG_FILE, EXPORT_FILE, HUB_PREFIX, PathLike, RESTORED_FIELDS, SAFETENSORS_FILE, STATE_ITEM, WEIGHTS_FILES
from contextpool_jax.base.errors import ArgumentError, WorkdirError


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


def safetensors_numpy():
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
    return unflatten_variables(safetensors_numpy().load(data))
  variables = serialization.msgpack_restore((path / EXPORT_FILE).read_bytes())
  if not isinstance(variables, dict):
    raise WorkdirError(f'{path / EXPORT_FILE} does not hold a variables dict.')
  return variables


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
  tree = getattr(metadata, 'tree', metadata) or {}
  missing = [f for f in RESTORED_FIELDS if f not in tree]
  if missing:
    raise WorkdirError(
        f'{state_dir} has no {missing} (it holds {sorted(tree)}); '
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
  ``workdir`` may also be a directory written by :func:`~contextpool_jax.runs.export.export_params` (its
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
    workdir = hub.hub_snapshot(repo_id, revision=revision or None)
  config = read_config(workdir)
  variables, _ = load_variables(workdir, step)
  return config_fields.build_model(config), variables, config


def load_from_hub(
    repo_id: str,
    revision: Optional[str] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    local_files_only: bool = False,
) -> tuple[nn.Module, dict[str, Any], ml_collections.ConfigDict]:
  """:func:`load` of an export in Hugging Face Hub model repo ``repo_id`` (uploaded
  from a directory of :func:`~contextpool_jax.runs.export.export_params`); the arguments are
  :func:`~contextpool_jax.runs.hub.hub_snapshot`'s.
  ``load('hf://user/repo@revision')`` is the same with the default cache.

  Raises:
    ImportError: huggingface_hub is not installed (``pip install 'contextpool-jax[hub]'``).
    WorkdirError: as :func:`load`, e.g. the repo holds no export.
  """
  return load(
      hub.hub_snapshot(repo_id, revision, cache_dir=cache_dir, local_files_only=local_files_only)
  )
