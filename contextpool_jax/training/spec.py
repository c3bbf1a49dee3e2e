"""The top-level config fields of a run, read and checked once (:func:`resolve_spec`).

Every config (``configs/common.py`` sets them all) has the fields of
:class:`RunSpec`; the sections have their own readers: ``config.optimizer``
(:func:`contextpool_jax.training.optim.resolve_spec`), ``config.dataset`` (the
data modules' ``resolve_spec``), ``config.model`` (the model registry and the
modules' own checks). All raise :class:`~contextpool_jax.base.errors.ConfigError`
naming the field before anything is compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from contextpool_jax.io import config_readers
from contextpool_jax.runs import config_fields
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import runlock, sharding, tasks


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """What the loop needs from the top level of a config (see ``configs/common.py``).
  ``config.task`` is the task registry's (:func:`tasks.kind_of` checks it)."""

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


def resolve_spec(
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
  tasks.kind_of(config)  # an unknown task: ConfigError naming the kinds
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
