"""A run's config, read and checked once: :func:`read` turns the ``ConfigDict`` into :class:`Specs`.

Everything below the command line takes these typed specs, never the config: the
trainer, the task (model, objective, data pipeline), the optimizer, the writers, the
profiler and the compile command. :func:`read` is the one place that reads a run's
config; each section has its reader beside the code that uses its values, and only
:func:`read` calls them:

==================  =================================================  =========================
section             reader                                             spec
==================  =================================================  =========================
top level           :func:`read_run` (this module)                     :class:`RunSpec`
``model``           ``runs.config_fields.build_model``                 the model (a flax module:
                                                                       its fields are the spec)
``task`` (+ BLEU,   ``tasks.read``                                     ``tasks.TaskSpec``
label smoothing)
``dataset``         the task kind's data module's ``resolve_spec``     e.g. ``lm_input.LMDataSpec``
``optimizer``       ``optim.resolve_spec``                             ``optim.OptimizerSpec``
``writers``, ...    ``writers.resolve_spec``                           ``writers.WritersSpec``
``profile``         ``profiling.resolve_spec``                         ``profiling.ProfileSpec``
==================  =================================================  =========================

All raise :class:`~contextpool_jax.base.errors.ConfigError` naming the field, the value
and what is allowed, before anything is built or compiled. ``config.model`` is
completed first (every field of the model, with its default where the config sets
none: :func:`~contextpool_jax.runs.config_fields.complete`), so :attr:`Specs.config`
is what ``config.json`` records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from contextpool_jax.io import config_readers
from contextpool_jax.runs import config_fields
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import optim, profiling, runlock, sharding, tasks, writers


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """What the loop needs from the top level of a config (see ``configs/common.py``).
  ``config.task`` and its kind's fields are :func:`tasks.read`'s."""

  seed: int
  num_train_steps: int
  batch_size: int  # global, over all processes and devices
  grad_accum_steps: int
  log_every_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int
  keep_checkpoints: int
  keep_checkpoint_period: int  # 0: off
  async_checkpointing: bool
  nan_check_every_steps: int  # 0: only at log and checkpoint steps
  eval_splits: tuple[str, ...]
  dtype: Any  # compute dtype (jnp.float32 / jnp.bfloat16 / jnp.float16)
  remat: str  # a policy of models.common.REMAT_POLICIES (an old bool read as one)
  param_sharding: str
  init_from: str
  progress_bar: bool
  log_pool_sizes: bool
  lock_stale_seconds: int  # run.lock of another machine: stale after this long without heartbeat


def read_run(
    config: ml_collections.ConfigDict,
    *,
    process_count: int | None = None,
    device_count: int | None = None,
) -> RunSpec:
  """Reads and checks the top-level fields; ConfigError names a bad one.

  ``batch_size`` must divide into the processes (each reads its own rows) and,
  per gradient-accumulation micro-batch, into the devices (defaults: this
  run's ``jax.process_count()`` and ``jax.device_count()``).
  """
  read_int = lambda field, minimum=1: config_readers.read_int(config, field, minimum=minimum)
  flag = lambda field: config_readers.read_bool(config, field)
  config_readers.read_str(config, 'model.name')  # the registry name; the model checks the rest
  for section in ('optimizer', 'dataset'):
    config_readers.lookup(config, section)
  dtype, remat = config_fields.model_settings(config)
  splits = config_readers.lookup(config, 'eval_splits')
  splits = (splits,) if isinstance(splits, str) else tuple(splits)
  if not splits or not all(isinstance(s, str) and s for s in splits):
    raise ConfigError(f'config.eval_splits={splits!r} is invalid; expected split names.')
  spec = RunSpec(
      seed=config_readers.read_int(config, 'seed', minimum=-(2**63)),
      num_train_steps=read_int('num_train_steps'),
      batch_size=read_int('batch_size'),
      grad_accum_steps=read_int('grad_accum_steps'),
      log_every_steps=read_int('log_every_steps'),
      eval_every_steps=read_int('eval_every_steps'),
      checkpoint_every_steps=read_int('checkpoint_every_steps'),
      keep_checkpoints=read_int('keep_checkpoints'),
      keep_checkpoint_period=config_readers.read_int(config, 'keep_checkpoint_period', default=0),
      async_checkpointing=flag('async_checkpointing'),
      nan_check_every_steps=read_int('nan_check_every_steps', minimum=0),
      eval_splits=splits,
      dtype=dtype,
      remat=remat,
      param_sharding=config_readers.read_choice(config, 'param_sharding', sharding.PARAM_SHARDINGS),
      init_from=config_readers.lookup(config, 'init_from', ''),
      progress_bar=flag('progress_bar'),
      log_pool_sizes=flag('log_pool_sizes'),
      lock_stale_seconds=config_readers.read_int(
          config, 'lock_stale_seconds', minimum=1, default=runlock.DEFAULT_STALE_SECONDS
      ),
  )
  processes = jax.process_count() if process_count is None else process_count
  devices = jax.device_count() if device_count is None else device_count
  config_readers.share(spec.batch_size, processes, 'batch_size')
  micro, rest = divmod(spec.batch_size, spec.grad_accum_steps)
  if rest or micro % devices:
    raise ConfigError(
        f'config.batch_size={spec.batch_size} with config.grad_accum_steps='
        f'{spec.grad_accum_steps} gives micro-batches of {spec.batch_size} / '
        f'{spec.grad_accum_steps}; each must be a whole multiple of the {devices} devices.'
    )
  return spec


@dataclasses.dataclass(frozen=True)
class Specs:
  """Everything a run reads from its config, typed (module docstring): what the
  trainer, the task, the optimizer, the writers and the compile command take."""

  config: ml_collections.ConfigDict  # completed: what config.json records (never read below)
  run: RunSpec
  model: nn.Module
  task: tasks.TaskSpec
  data: Any  # the task kind's data spec (lm_input.LMDataSpec, ...)
  optimizer: optim.OptimizerSpec
  writers: writers.WritersSpec
  profile: profiling.ProfileSpec


def read(
    config: ml_collections.ConfigDict,
    *,
    process_count: int | None = None,
    device_count: int | None = None,
) -> Specs:
  """Reads and checks every section of ``config`` (module docstring); ConfigError
  names the first bad field. ``process_count`` and ``device_count``: as for
  :func:`read_run` (defaults: this run's)."""
  run = read_run(config, process_count=process_count, device_count=device_count)
  config = config_fields.complete(config)
  task = tasks.read(config)
  return Specs(
      config=config,
      run=run,
      model=config_fields.build_model(config),
      task=task,
      data=tasks.KINDS[task.kind].read_data(config),
      optimizer=optim.resolve_spec(config.optimizer),
      writers=writers.resolve_spec(config),
      profile=profiling.resolve_spec(config),
  )
