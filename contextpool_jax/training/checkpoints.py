"""Checkpoints of the training loop: save, resume safely, start from another run.

``<workdir>/checkpoints/<step>/`` (orbax ``CheckpointManager``) holds the items
``'state'`` (the ``TrainState``) and ``'data'`` (the grain iterator). Orbax
writes a step to a temporary directory and renames it when complete, so a
process killed while writing leaves no half checkpoint behind, only a
temporary directory that is ignored. On top of that:

* :func:`check_resume_config`: resuming with a different model (or task,
  optimizer, dataset) than the saved ``config.json`` is one clear error naming
  what differs, raised before anything is restored.
* :func:`restore_latest`: a latest checkpoint that cannot be read (a file missing
  or truncated) is moved to ``<workdir>/damaged_checkpoints/`` with a warning
  naming it and the step used instead; if no checkpoint can be read the run
  stops with :class:`CheckpointError` naming the directory, never restarting
  from step 0.
* :class:`Saver`: a checkpoint that cannot be written (a full disk, a file-size
  limit), also in orbax's background thread, is one
  :class:`~contextpool_jax.base.errors.WriteError` naming the step's directory and
  the cause; the previous checkpoints stay complete (orbax commits a step by a
  rename) and :meth:`Saver.hint` names the one a rerun resumes from.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any, Callable, Optional

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from contextpool_jax.io import storage
from contextpool_jax.runs import config_fields, layout
from contextpool_jax.base.errors import CheckpointError, ConfigError
from contextpool_jax.training import steps

# Where a damaged checkpoint is moved (next to layout.CHECKPOINTS_DIR).
DAMAGED_DIR = 'damaged_checkpoints'
# Config fields a resumed run must share with the saved one: they fix the
# structure and meaning of the saved state. Everything else (steps, rates,
# evaluation, logging, sharding) may change between runs.
RESUME_KEYS = ('task', 'model', 'optimizer.name', 'dataset.name')


def manager(
    directory: epath.Path, *, keep: int, keep_period: int = 0, asynchronous: bool = True
) -> ocp.CheckpointManager:
  """The run's orbax manager: keeps the newest ``keep`` steps and, with
  ``keep_period`` > 0, every step that is a multiple of it (e.g. for analyses
  of the model along training); writes in the background."""
  policies = ocp.checkpoint_managers
  preservation = policies.LatestN(keep)
  if keep_period:
    preservation = policies.AnyPreservationPolicy([preservation, policies.EveryNSteps(keep_period)])
  options = ocp.CheckpointManagerOptions(
      preservation_policy=preservation, enable_async_checkpointing=asynchronous
  )
  return ocp.CheckpointManager(directory, options=options)


class Saver:
  """Saves the run's checkpoints through ``mgr`` (asynchronously if it does).

  A step that cannot be written raises
  :class:`~contextpool_jax.base.errors.WriteError` naming ``<directory>/<step>`` and
  the cause: from :meth:`save` if it fails at once, and from the next
  :meth:`save` or :meth:`finish` if it fails in orbax's background thread
  (orbax itself re-raises such an error only at its next call).
  """

  def __init__(self, mgr: ocp.CheckpointManager, directory: epath.Path, latest: Optional[int]):
    self.mgr, self.directory = mgr, directory
    self.complete = latest  # the newest step known to be written in full (None: none)
    self._pending: Optional[int] = None

  def save(self, step: int, args: ocp.args.CheckpointArgs) -> None:
    self.finish()
    with storage.writing(self.directory / str(step)):
      self.mgr.save(step, args=args)
    self._pending = step

  def finish(self) -> None:
    """Waits for the pending save; WriteError if it failed."""
    if self._pending is not None:
      step, self._pending = self._pending, None
      with storage.writing(self.directory / str(step)):
        self.mgr.wait_until_finished()
      self.complete = step

  def hint(self) -> str:
    """What a rerun after a failed write does."""
    if self.complete is None:
      return 'No checkpoint is complete yet; rerun the same command once the cause is fixed.'
    return (
        f'Checkpoint step {self.complete} in {self.directory} is complete; rerun the same '
        'command once the cause is fixed to resume from it.'
    )


def _flat(tree: Any, prefix: str = '') -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f'{prefix}{k}.'))
    return out or {prefix[:-1]: {}}
  return {prefix[:-1]: tree}


def _select(flat: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
  return {k: v for k, v in flat.items() if any(k == p or k.startswith(p + '.') for p in keys)}


def config_differences(
    saved: dict, config: ml_collections.ConfigDict, keys: tuple[str, ...] = RESUME_KEYS
) -> list[str]:
  """``'field: saved X, now Y'`` for every field under ``keys`` that differs."""
  now = _select(_flat(json.loads(config.to_json_best_effort())), keys)
  before = _select(_flat(saved), keys)
  missing = object()
  return [
      f'{k}: saved {before.get(k, missing)!r}, now {now.get(k, missing)!r}'.replace(
          repr(missing), '(absent)'
      )
      for k in sorted(set(now) | set(before))
      if before.get(k, missing) != now.get(k, missing)
  ]


def _completed(saved: dict) -> dict:
  """A saved config with its ``model``'s absent fields at their defaults
  (:func:`config_fields.complete_model`), in JSON form: a ``config.json`` written
  before a field existed (or before the fields were filled in) compares on the values
  that run used (the fields' defaults), not as absent."""
  model = saved.get('model')
  if not isinstance(model, dict):
    return saved
  try:
    model = config_fields.complete_model(model)
  except ConfigError:  # a model name no longer registered: compare what was saved
    return saved
  return {**saved, 'model': json.loads(json.dumps(model))}


def _loss_scale_difference(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
  """``config.dtype`` may change on a resume (float32 <-> bfloat16) unless float16
  is on one side only: a float16 run's state also holds its loss scale
  (:class:`steps.ScaledTrainState`), so the saved and the new state differ."""
  before, now = saved.get('dtype', 'float32'), config.get('dtype', 'float32')
  if steps.uses_loss_scaling(before) == steps.uses_loss_scaling(now):
    return []
  return [f'dtype: saved {before!r}, now {now!r} (a float16 state holds its loss scale)']


def check_resume_config(workdir: epath.Path, config: ml_collections.ConfigDict) -> None:
  """Raises CheckpointError if ``config`` (the trainer's, with every model field:
  :func:`config_fields.complete`) differs from the saved one in ``RESUME_KEYS`` (its
  absent model fields at their defaults: :func:`_completed`) or in whether ``dtype``
  is float16 (:func:`_loss_scale_difference`)."""
  path = workdir / layout.CONFIG_FILE
  if not path.exists():
    return
  try:
    saved = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(
        f'{path} is not valid JSON ({e}); it records the config the '
        f'checkpoints in {workdir / layout.CHECKPOINTS_DIR} were trained with.'
    ) from e
  diffs = config_differences(_completed(saved), config)
  diffs += _loss_scale_difference(saved, config)
  if diffs:
    raise CheckpointError(
        f'{workdir} holds checkpoints of a different configuration than the one given '
        f'(saved {path} vs now):\n  ' + '\n  '.join(diffs) + '\nUse a new --workdir, or set '
        '--config.init_from to that workdir to start a new run from its parameters.'
    )


def _move_aside(directory: epath.Path, step: int) -> epath.Path:
  """Moves a damaged step out of the checkpoint directory (process 0; all wait)."""
  target = directory.parent / DAMAGED_DIR / f'{step}-{time.strftime("%Y%m%d-%H%M%S")}'
  if jax.process_index() == 0:
    target.parent.mkdir(parents=True, exist_ok=True)
    (directory / str(step)).rename(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f'contextpool_jax: moved checkpoint {step}')
  return target


def _all_ok(ok: bool) -> bool:
  """True only if ``ok`` on every process (they must agree on the step they use)."""
  if jax.process_count() == 1:
    return ok
  return bool(multihost_utils.process_allgather(int(ok)).min())


def restore_latest(
    mgr: ocp.CheckpointManager,
    directory: epath.Path,
    args: Callable[[], ocp.args.CheckpointArgs],
    *,
    move_damaged: bool = True,
) -> Optional[tuple[int, Any]]:
  """``(step, restored)`` of the newest checkpoint that restores, or None if there is none.

  ``args()`` builds the restore arguments (fresh for each attempt). A step that
  fails to restore is (with ``move_damaged``) moved to
  ``<workdir>/damaged_checkpoints/``, so the resumed run can write that step
  again, with a warning naming it and the step tried next; if every step
  fails, CheckpointError.
  """
  steps = sorted(mgr.all_steps(), reverse=True)
  damaged = []
  for step in steps:
    try:
      restored, error = mgr.restore(step, args=args()), None
    except Exception as e:  # pylint: disable=broad-except  # any damage: missing, truncated
      restored, error = None, f'{type(e).__name__}: {str(e)[:300]}'
    if _all_ok(error is None):
      if damaged:
        warnings.warn(
            f'Resuming from checkpoint step {step} in {directory}; newer ones '
            'could not be read:\n  ' + '\n  '.join(damaged)
        )
      return step, restored
    where = 'left in place'
    if move_damaged:
      where = f'moved to {_move_aside(directory, step)}'
      mgr.reload()
    damaged.append(f'step {step} ({where}): {error or "failed on another process"}')
  if steps:
    raise CheckpointError(
        f'No checkpoint in {directory} could be read:\n  '
        + '\n  '.join(damaged)
        + '\nIf the config changed since they were written, use a new --workdir; otherwise '
        'remove the directory to start from step 0.'
    )
  return None


def restore_params(path: str, target: Any) -> Any:
  """``target`` (a train state) with the ``params`` and ``model_state`` of the
  latest checkpoint under ``path`` (a workdir or its ``checkpoints/``), restored
  into ``target``'s shapes and shardings. Only those two are read (a partial
  restore), so the other run's state may differ in the rest: float16 or not
  (:class:`steps.ScaledTrainState`), another optimizer."""
  directory = epath.Path(path)
  if (directory / layout.CHECKPOINTS_DIR).exists():
    directory = directory / layout.CHECKPOINTS_DIR
  item = {'params': target.params, 'model_state': target.model_state}
  restore = lambda: ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
          item=item,
          restore_args=ocp.checkpoint_utils.construct_restore_args(item),
          partial_restore=True,
      )
  )
  with ocp.CheckpointManager(directory) as mgr:
    found = restore_latest(mgr, directory, restore, move_damaged=False)
  if found is None:
    raise CheckpointError(f'config.init_from={path!r}: no checkpoint in {directory}.')
  restored = found[1]['state']
  return target.replace(params=restored['params'], model_state=restored['model_state'])
