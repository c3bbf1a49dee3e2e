"""The one training loop: every experiment is a config (plus a small task piece).

``train_and_evaluate(config, workdir)``:

1. validates the config (before anything is built or compiled) and saves it
   as ``<workdir>/config.json``;
2. builds the task (model from the registry, data from TFDS + grain), the
   optax optimizer and a 1D ``'data'`` mesh over every device;
3. initialises the train state directly in its shardings, or restores the
   latest checkpoint of ``<workdir>/checkpoints`` (params, optimizer state,
   step and the grain iterator state: a resumed run continues at the exact data
   position and gives bit-identical parameters to an uninterrupted run);
4. runs one jitted, sharded train step per global batch (optional gradient
   accumulation over micro-batches inside the step), logs to TensorBoard and a
   console progress bar, evaluates every ``eval_every_steps`` and saves
   checkpoints asynchronously (orbax ``CheckpointManager``, keep ``keep_checkpoints``).

A step whose loss or gradient norm is not finite leaves the parameters
unchanged and is recorded; the loop stops at the next check (every log step,
before every checkpoint, and every ``nan_check_every_steps`` steps if that is
set) with :class:`NonFiniteLossError` naming the step. Checkpoints are only
written for good states, so the last checkpoint is the last good one.

The host never waits for the step it has just dispatched: metric sums are
accumulated on the devices inside the jitted steps and read (through
:func:`sharding.fetch`, correct with any number of processes) only at log,
evaluation and checkpoint steps, and the host runs at most
:data:`MAX_STEPS_IN_FLIGHT` steps ahead of the devices (see :class:`InFlight`).
"""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
from typing import Any, Callable, Optional

import flax
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers import _validation as v
from contextpool_jax.training import checkpoints, optim, sharding, tasks


class NonFiniteLossError(FloatingPointError):
  """Training produced a NaN/inf loss or gradient."""


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint holds besides the data iterator."""

  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any  # non-parameter collections, e.g. {'batch_stats': ...}
  bad_step: jax.Array  # -1, or the first step whose loss/gradient was not finite


# ----------------------------------------------------------------------------
# Configuration.
# ----------------------------------------------------------------------------

_COMMON_INT_FIELDS = ('num_train_steps', 'batch_size', 'eval_every_steps',
                      'checkpoint_every_steps', 'log_every_steps', 'keep_checkpoints',
                      'grad_accum_steps')


def validate_config(config: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field for any bad common value (before compiling)."""
  for field in ('task', 'model', 'optimizer', 'dataset', 'seed', 'dtype', 'remat',
                'param_sharding', 'nan_check_every_steps', 'log_pool_sizes', 'progress_bar',
                'eval_splits', *_COMMON_INT_FIELDS):
    if field not in config:
      raise ConfigError(f'config.{field} is missing; every config needs it '
                       '(see configs/default.py).')
  for field in _COMMON_INT_FIELDS:
    v.check_positive('config', field, config[field], integer=True)
  v.check_positive('config', 'nan_check_every_steps', config.nan_check_every_steps,
                   integer=True, allow_zero=True)
  v.check_choice('config', 'task', config.task, tasks.TASKS)
  v.check_choice('config', 'param_sharding', config.param_sharding,
                 sharding.PARAM_SHARDINGS)
  tasks._dtype(config.dtype)  # pylint: disable=protected-access
  if 'name' not in config.model:
    raise ConfigError('config.model.name is missing: the registry name of the model '
                     '(contextpool_jax.models.available()).')
  n_dev, n_proc = jax.device_count(), jax.process_count()
  if config.batch_size % n_proc:
    raise ConfigError(f'config.batch_size={config.batch_size} is not divisible by the '
                     f'{n_proc} processes.')
  micro = config.batch_size // config.grad_accum_steps
  if config.batch_size % config.grad_accum_steps or micro % n_dev:
    raise ConfigError(
        f'config.batch_size={config.batch_size} with config.grad_accum_steps='
        f'{config.grad_accum_steps} gives micro-batches of {config.batch_size} / '
        f'{config.grad_accum_steps}; each must be a whole multiple of the {n_dev} devices.')


# ----------------------------------------------------------------------------
# Steps.
# ----------------------------------------------------------------------------


def _split_variables(variables: dict) -> tuple[Any, dict]:
  variables = dict(variables)
  params = variables.pop('params')
  variables.pop('intermediates', None)
  return params, variables


def make_init_fn(task: tasks.Task, tx: optax.GradientTransformation):
  batch = task.init_batch()

  def init_fn(rng: jax.Array) -> TrainState:
    variables = task.model.init({'params': rng, 'dropout': rng}, *task.model_args(batch),
                                train=False)
    params, model_state = _split_variables(variables)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), model_state=model_state,
                      bad_step=jnp.full((), -1, jnp.int32))

  return init_fn


def make_train_step(task: tasks.Task, tx: optax.GradientTransformation, schedule,
                    base_rng: jax.Array, grad_accum_steps: int):
  """``(state, batch) -> (state, metric sums)``; pure, to be jitted with shardings."""
  model = task.model

  def micro_loss(params, model_state, batch, rng, total_weight):
    mix_rng, dropout_rng = jax.random.split(rng)
    batch = task.prepare_train_batch(batch, mix_rng)
    variables = {'params': params, **model_state}
    mutable = list(model_state)
    out = model.apply(variables, *task.model_args(batch), train=True,
                      rngs={'dropout': dropout_rng}, mutable=mutable or False)
    logits, new_model_state = out if mutable else (out, model_state)
    loss_sum, sums = task.loss(logits, batch, rng)
    return loss_sum / total_weight, (sums, dict(new_model_state))

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(base_rng, state.step)
    total_weight = jnp.maximum(task.weight(batch), 1e-9)
    if grad_accum_steps == 1:
      (loss, (sums, model_state)), grads = grad_fn(state.params, state.model_state, batch,
                                                   rng, total_weight)
    else:
      micro = jax.tree.map(
          lambda x: x.reshape(grad_accum_steps, x.shape[0] // grad_accum_steps, *x.shape[1:]),
          batch)

      def body(carry, inputs):
        grads_acc, loss_acc, sums_acc, model_state = carry
        i, mb = inputs
        (loss, (sums, model_state)), grads = grad_fn(
            state.params, model_state, mb, jax.random.fold_in(rng, i), total_weight)
        add = lambda a, b: jax.tree.map(jnp.add, a, b)
        return (add(grads_acc, grads), loss_acc + loss, add(sums_acc, sums), model_state), None

      zeros_g = jax.tree.map(jnp.zeros_like, state.params)
      first = jax.tree.map(lambda x: x[0], micro)
      sums_shape = jax.eval_shape(
          lambda: grad_fn(state.params, state.model_state, first, rng, total_weight)[0][1][0])
      zeros_s = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
      (grads, loss, sums, model_state), _ = jax.lax.scan(
          body, (zeros_g, jnp.zeros((), jnp.float32), zeros_s, state.model_state),
          (jnp.arange(grad_accum_steps), micro))
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = state.replace(
        step=state.step + 1, params=keep(params, state.params),
        opt_state=keep(opt_state, state.opt_state),
        model_state=keep(model_state, state.model_state),
        bad_step=jnp.where((state.bad_step < 0) & ~ok, state.step, state.bad_step))
    metrics = dict(sums, grad_norm=grad_norm, learning_rate=schedule(state.step),
                   steps=jnp.ones((), jnp.float32))
    return new_state, metrics

  return train_step


def make_eval_step(task: tasks.Task):
  """``(state, batch) -> metric sums`` of one evaluation batch; pure."""
  def eval_step(state: TrainState, batch: dict) -> dict:
    variables = {'params': state.params, **state.model_state}
    logits = task.model.apply(variables, *task.model_args(batch), train=False)
    return task.eval_sums(logits, batch)
  return eval_step


def summing(step: Callable) -> Callable:
  """``step(state, batch) -> metrics`` (or ``-> (state, metrics)``) as
  ``(state, batch, sums) -> sums + metrics`` (or ``-> (state, sums + metrics)``).

  The running sums stay on the devices, inside the same jitted program as the
  step: reading them once per log interval costs one host read, and no extra
  program runs per step.
  """
  def summed(state, batch, sums):
    out = step(state, batch)
    if isinstance(out, tuple):
      new_state, metrics = out
      return new_state, jax.tree.map(jnp.add, sums, metrics)
    return jax.tree.map(jnp.add, sums, out)
  return summed


def zero_sums(step: Callable, state, batch, sharding) -> dict:
  """Zeros shaped like the metric sums of ``step(state, batch)``, placed with ``sharding``."""
  out = jax.eval_shape(step, state, batch)
  metrics = out[1] if isinstance(out, tuple) else out
  return jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype), sharding), metrics)


def make_probe(task: tasks.Task):
  """ContextPool pooling sizes per layer on a batch (for the paper's Fig. 4 statistics)."""
  def probe(state: TrainState, batch: dict) -> dict:
    variables = {'params': state.params, **state.model_state}
    _, inter = task.model.apply(variables, *task.model_args(batch), train=False,
                                mutable=['intermediates'])
    flat = flax.traverse_util.flatten_dict(inter.get('intermediates', {}), sep='/')
    return {k[:-len('/pool_sigma')]: val[0] for k, val in flat.items()
            if k.endswith('/pool_sigma')}
  return probe


# ----------------------------------------------------------------------------
# Host and device in step.
# ----------------------------------------------------------------------------

MAX_STEPS_IN_FLIGHT = 2


class InFlight:
  """Lets the host run at most ``depth`` dispatched steps ahead of the devices.

  ``add(marker)`` after dispatching a step (``marker``: any small output of it)
  waits for the step ``depth`` back to finish. The devices always have the
  next ``depth`` steps queued, so they never idle while the host prepares a
  batch, and the queue cannot grow without bound.

  Why a bound at all: each device of XLA's CPU runtime admits at most 32
  computations in flight; a computation with collectives (every sharded
  train or evaluation step: the gradient all-reduce, the loss sums) holds a
  thread of a pool that has max(cores, devices) threads until every device has
  joined. With more than 32 steps queued, one device's launch blocks on that
  limit while the other devices' threads wait in the collective for it, and
  the runtime aborts ("Expected 4 threads to join the rendezvous, but only 3
  of them arrived"). It happened at the first evaluation (33 independent
  evaluation steps dispatched back to back, then about 100 small additions of
  their outputs) and would have happened in training as soon as the loop
  stopped reading the state every step. Measured on this machine: 4 fake
  devices, a chain of jitted steps with an all-reduce, 150 steps; no bound or a
  bound of 33+: aborted every time; a bound of 1-30: finished.
  """

  def __init__(self, depth: int = MAX_STEPS_IN_FLIGHT):
    self._depth = depth
    self._queue: collections.deque = collections.deque()

  def add(self, marker: Any) -> None:
    self._queue.append(marker)
    if len(self._queue) > self._depth:
      jax.block_until_ready(self._queue.popleft())


class Preemption:
  """Whether to save and stop now: a SIGTERM (preemption notice) was received.

  One process: a SIGTERM handler (installed while training, in the main
  thread) sets a flag. Several processes: JAX's preemption service (started by
  ``jax.distributed.initialize``, which handles SIGTERM itself) picks the
  same step on every process (``multihost_utils.reached_preemption_sync_point``,
  called every step), so all of them save that step together.
  """

  def __init__(self):
    self.requested = False
    self._previous = None
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self.requested = True

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      self.requested = multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


def due(done: int, every: int, total: int) -> bool:
  """True every ``every`` steps and at the last step (``done`` steps completed)."""
  return done % every == 0 or done == total

# ----------------------------------------------------------------------------
# Logging.
# ----------------------------------------------------------------------------


class _Writer:
  """TensorBoard event files (tensorboardX) + ``metrics.jsonl``; process 0 only."""

  def __init__(self, workdir: epath.Path, enabled: bool):
    self.enabled = enabled
    if enabled:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      self.tb = tensorboardX.SummaryWriter(str(workdir / 'tensorboard'))
      self.jsonl = open(workdir / 'metrics.jsonl', 'a')

  def scalars(self, step: int, metrics: dict[str, float], prefix: str) -> None:
    if not self.enabled:
      return
    for k, val in metrics.items():
      self.tb.add_scalar(f'{prefix}/{k}', val, step)
    self.jsonl.write(json.dumps({'step': step, 'split': prefix, **metrics}) + '\n')
    self.jsonl.flush()

  def histograms(self, step: int, values: dict[str, np.ndarray], prefix: str) -> None:
    if not self.enabled:
      return
    for k, val in values.items():
      self.tb.add_histogram(f'{prefix}/{k}', np.asarray(val, np.float32).ravel(), step)

  def close(self) -> None:
    if self.enabled:
      self.tb.close()
      self.jsonl.close()


def _scalars(sums: dict) -> dict[str, float]:
  return {k: float(val) for k, val in sharding.fetch(sums).items()}


def _train_summary(sums: dict[str, float], seconds: float) -> dict[str, float]:
  steps = max(sums['steps'], 1.0)
  w = max(sums['weight'], 1e-9)
  out = {'loss': sums['loss'] / w, 'accuracy': sums['accuracy'] / w,
         'grad_norm': sums['grad_norm'] / steps, 'learning_rate': sums['learning_rate'] / steps,
         'steps_per_sec': steps / max(seconds, 1e-9)}
  return out


# ----------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------


def evaluate(task: tasks.Task, eval_step, state: TrainState, split: str,
             data_sharding) -> dict[str, float]:
  """Metrics of ``split``: ``eval_step = jit(summing(make_eval_step(task)))``."""
  sums, in_flight = None, InFlight()
  for batch in task.eval_batches(split, jax.process_index(), jax.process_count()):
    batch = sharding.put_batch(batch, data_sharding)
    if sums is None:
      sums = zero_sums(make_eval_step(task), state, batch,
                       sharding.replicated(data_sharding.mesh))
    sums = eval_step(state, batch, sums)
    in_flight.add(sums)
  if sums is None:
    raise ConfigError(f'config.eval_splits: split {split!r} produced no evaluation batches.')
  metrics = task.finalize(_scalars(sums))
  variables = {'params': state.params, **state.model_state}
  metrics.update(task.extra_evaluation(task.model.apply, variables, split, data_sharding))
  return metrics


def _prepare_on_first_process(task: tasks.Task) -> None:
  """``task.prepare()`` on process 0 while the others wait (no concurrent writers)."""
  if jax.process_index() == 0:
    task.prepare()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('contextpool_jax: task prepared')


def _abstract_with_shardings(abstract, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract, shardings)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates ``config`` in ``workdir``; returns the final metrics."""
  validate_config(config)
  workdir = epath.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  is_main = jax.process_index() == 0
  manager = checkpoints.manager(workdir / 'checkpoints', config)
  preemption = None
  try:  # everything after here closes the manager on the way out
    if manager.latest_step() is not None:
      checkpoints.check_resume_config(workdir, config)
    if is_main:
      (workdir / checkpoints.CONFIG_FILE).write_text(config.to_json_best_effort(indent=2))

    task = tasks.make_task(config, str(workdir))
    _prepare_on_first_process(task)
    tx, schedule = optim.make_optimizer(config.optimizer, config.num_train_steps)
    mesh = sharding.make_mesh()
    data_sharding = sharding.batch_sharding(mesh)

    rng = jax.random.key(config.seed)
    init_rng, train_rng = jax.random.split(rng)
    init_fn = make_init_fn(task, tx)
    abstract = jax.eval_shape(init_fn, init_rng)  # runs every module's checks, no compile
    shardings = sharding.state_shardings(abstract, mesh, config.param_sharding)
    target = _abstract_with_shardings(abstract, shardings)

    train_ds = task.train_dataset(jax.process_index(), jax.process_count())
    train_iter = iter(train_ds)
    for split in config.eval_splits:  # a missing or empty split fails now, not after training
      task.eval_batches(split, jax.process_index(), jax.process_count())
    found = checkpoints.restore_latest(
        manager, workdir / 'checkpoints', lambda: ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            data=grain.checkpoint.CheckpointRestore(train_iter)))
    if found is not None:
      start, restored = found
      state = restored['state']
      print(f'Resumed from {workdir / "checkpoints"} at step {start}.', flush=True)
    else:
      start = 0
      state = jax.jit(init_fn, out_shardings=shardings)(init_rng)
      if config.get('init_from', ''):
        previous = checkpoints.restore_params(config.init_from, target)
        state = state.replace(params=previous.params, model_state=previous.model_state)
        print(f'Initialised params from {config.init_from}.', flush=True)

    replicated = sharding.replicated(mesh)
    train_step_fn = make_train_step(task, tx, schedule, train_rng, config.grad_accum_steps)
    train_step = jax.jit(summing(train_step_fn),
                         in_shardings=(shardings, data_sharding, replicated),
                         out_shardings=(shardings, replicated), donate_argnums=(0,))
    eval_step = jax.jit(summing(make_eval_step(task)),
                        in_shardings=(shardings, data_sharding, replicated),
                        out_shardings=replicated)
    probe = jax.jit(make_probe(task), in_shardings=(shardings, data_sharding))
    log_pool_sizes = config.log_pool_sizes and config.model.get('context_pool') is not None

    writer = _Writer(workdir, is_main)
    total = config.num_train_steps
    pbar = _progress_bar(start, total, enabled=is_main and config.progress_bar)
    nan_every = config.nan_check_every_steps
    history: list[dict] = []
    result: dict[str, Any] = {}
    zeros, sums, in_flight = None, None, InFlight()
    tick = time.time()

    def check_finite():
      bad = int(sharding.fetch(state.bad_step))
      if bad >= 0:
        manager.wait_until_finished()
        raise NonFiniteLossError(
            f'non-finite loss or gradient at step {bad}; training stopped. The last good '
            f'checkpoint is step {manager.latest_step()} in {workdir / "checkpoints"}.')

    preemption = Preemption()
    for step in range(start, total):
      batch = sharding.put_batch(next(train_iter), data_sharding)
      if zeros is None:
        zeros = zero_sums(train_step_fn, state, batch, replicated)
      state, sums = train_step(state, batch, zeros if sums is None else sums)
      in_flight.add(sums)
      done = step + 1
      preempted = preemption.reached(done)
      if nan_every and done % nan_every == 0:
        check_finite()
      if due(done, config.log_every_steps, total):
        check_finite()
        summary = _train_summary(_scalars(sums), time.time() - tick)
        sums, tick = None, time.time()
        writer.scalars(done, summary, 'train')
        history.append({'step': done, **summary})
        if log_pool_sizes:
          sizes = sharding.fetch(probe(state, batch))
          writer.histograms(done, sizes, 'pool_sigma')
          writer.scalars(done, {k: float(np.mean(s)) for k, s in sizes.items()},
                         'pool_sigma_mean')
        pbar.set_postfix(loss=f'{summary["loss"]:.4f}', refresh=False)
      if due(done, config.eval_every_steps, total) and not preempted:
        for split in config.eval_splits:
          metrics_eval = evaluate(task, eval_step, state, split, data_sharding)
          writer.scalars(done, metrics_eval, f'eval_{split}')
          result[f'eval_{split}'] = metrics_eval
          pbar.write(f'step {done}: {split} ' + ', '.join(
              f'{k}={val:.4f}' for k, val in metrics_eval.items()))
      if due(done, config.checkpoint_every_steps, total) or preempted:
        check_finite()
        manager.save(done, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(train_iter)))
      pbar.update(1)
      if preempted:
        result['preempted'] = True
        pbar.write(f'Preempted (SIGTERM): saved a checkpoint at step {done} in '
                   f'{workdir / "checkpoints"}; rerun the same command to resume.')
        break
  finally:
    if preemption is not None:
      preemption.close()
      pbar.close()
      writer.close()
    manager.wait_until_finished()
    manager.close()
  result.update(step=int(sharding.fetch(state.step)), train_history=history,
                workdir=str(workdir))
  return result


def _progress_bar(start: int, total: int, enabled: bool):
  """A console progress bar with steps/s and ETA (tqdm), or a no-op."""
  import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm.tqdm(total=total, initial=start, disable=not enabled, unit='step',
                   dynamic_ncols=True, mininterval=2.0, smoothing=0.1)
