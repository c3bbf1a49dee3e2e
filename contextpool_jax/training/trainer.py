"""The one training loop: every experiment is a config (plus a task: model, objective, data).

``train_and_evaluate(config, workdir)``:

1. reads and checks the config once into typed specs (:func:`spec.read`, before
   anything is built or compiled; nothing below reads the config) and saves it as
   ``<workdir>/config.json``;
2. builds the task (:func:`tasks.make_task`: model, objective, data), the optax
   optimizer and a 1D ``'data'`` mesh over every device;
3. initialises the train state directly in its shardings, or restores the
   latest readable checkpoint (:mod:`.checkpoints`: params, optimizer state,
   step and the grain iterator state, so a resumed run continues at the exact
   data position and gives bit-identical parameters to an uninterrupted run);
4. runs one jitted, sharded train step per global batch (:mod:`.steps`), and
   at the steps :func:`due` says: logs the train metrics and runs the log hooks,
   runs the evaluators (:mod:`.evaluators`, chosen by the task kind), saves
   checkpoints asynchronously. Metrics go to the writers ``config.writers``
   names (:mod:`.writers`); ``config.profile`` traces chosen steps
   (:mod:`.profiling`).

The loop is task-neutral: it knows a task only through its parts (model,
objective, data, and the evaluators and hooks its kind chooses: the registry,
:mod:`.tasks`) and the evaluators and hooks only through their call signatures.

A step whose loss or gradient norm is not finite leaves the parameters
unchanged and is recorded; the loop stops at the next check (every log step,
before every checkpoint, and every ``nan_check_every_steps`` steps if that is
set) with :class:`NonFiniteLossError` naming the step. Checkpoints are only
written for good states, so the last checkpoint is the last good one. A
SIGTERM saves a checkpoint at the current step and stops (:class:`Preemption`).

``config.dtype='float16'`` adds a dynamic loss scale to the train state (flax's
DynamicScale, :func:`steps.make_train_step`): a step whose float32 loss is
finite but whose float16 gradient overflowed is skipped (the scale halves) and
logged as ``skipped_steps`` with ``loss_scale``, not stopped; a non-finite loss,
or an overflow at the minimum scale, stops the run as above.

The run holds its workdir (:mod:`.runlock`, ``<workdir>/run.lock``) from before
it reads anything until its last checkpoint is written: a second launch on the
same workdir stops with :class:`WorkdirLockedError` naming the holder. A file
that cannot be written (checkpoint, ``metrics.jsonl``, TensorBoard,
``config.json``: a full disk, a file-size limit) stops the run with one
:class:`WriteError` naming the path, the cause and the checkpoint a rerun
resumes from (:mod:`contextpool_jax.io.storage`). A resumed run first cuts ``metrics.jsonl``
back to its start step, so a killed run's lines after its last checkpoint are
logged once, by the rerun.

The host never waits for the step it has just dispatched: metric sums are
accumulated on the devices inside the jitted steps and read (through
:func:`sharding.fetch`, correct with any number of processes) only at log,
evaluation and checkpoint steps, and the host runs at most
``sharding.MAX_STEPS_IN_FLIGHT`` steps ahead of the devices.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from contextpool_jax.io import console, storage
from contextpool_jax.runs import layout, workdirs
from contextpool_jax.base.errors import NonFiniteLossError, WriteError
from contextpool_jax.training import checkpoints, evaluators, optim, runlock
from contextpool_jax.training import sharding
from contextpool_jax.training import spec as spec_lib
from contextpool_jax.training import profiling, programs, steps, tasks, writers

TENSORBOARD_DIR = writers.TENSORBOARD_DIR


def due(done: int, every: int, total: int) -> bool:
  """True every ``every`` steps and at the last step (``done`` steps completed)."""
  return done % every == 0 or done == total


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


# ----------------------------------------------------------------------------
# Logging.
# ----------------------------------------------------------------------------


def _train_summary(sums: dict, seconds: float) -> dict[str, float]:
  sums = {k: float(v) for k, v in sharding.fetch(sums).items()}
  steps_done = max(sums['steps'], 1.0)
  w = max(sums['weight'], 1e-9)
  summary = {
      'loss': sums['loss'] / w,
      'accuracy': sums['accuracy'] / w,
      'grad_norm': sums['grad_norm'] / steps_done,
      'learning_rate': sums['learning_rate'] / steps_done,
      'steps_per_sec': steps_done / max(seconds, 1e-9),
  }
  if 'skipped_steps' in sums:  # float16: a loss scale (steps.make_train_step)
    skipped = sums['skipped_steps']
    summary['grad_norm'] = sums['grad_norm'] / max(steps_done - skipped, 1.0)
    summary.update(skipped_steps=skipped, loss_scale=sums['loss_scale'] / steps_done)
  return summary


# ----------------------------------------------------------------------------
# Set-up.
# ----------------------------------------------------------------------------


def _prepare_on_first_process(task: tasks.Task) -> None:
  """``task.data.prepare()`` on process 0 while the others wait (no concurrent writers)."""
  if jax.process_index() == 0:
    task.data.prepare()
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices('contextpool_jax: task prepared')


# ----------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates ``config`` in ``workdir``; returns the final metrics.

  The config is read once (:func:`spec.read`), its ``config.model`` completed (every
  field of the model, with its default where the config sets none), so ``config.json``
  records the values used.

  Raises (besides the config, data and checkpoint errors): WorkdirLockedError if
  another run holds ``workdir``, before anything is read, written or built;
  WriteError if a file of the run cannot be written.
  """
  specs = spec_lib.read(config)  # every field checked before anything is built
  path = epath.Path(workdir)
  with storage.writing(path):
    path.mkdir(parents=True, exist_ok=True)
  with runlock.hold(path, specs.run.lock_stale_seconds) as lock, storage.quiet_orbax_io_errors():
    return _train(specs, path, lock)


@dataclasses.dataclass
class _Setup:
  """What the loop runs on: the task, the optimizer, the shardings, the initial
  state's function and abstract target, the training iterator."""

  task: tasks.Task
  tx: Any
  schedule: Any
  mesh: Any
  data_sharding: Any
  replicated: Any
  shardings: Any  # of the train state
  init_fn: Any
  init_rng: jax.Array
  train_rng: jax.Array
  target: Any  # the abstract train state with its shardings
  train_iter: Any


def _set_up(specs: spec_lib.Specs, workdir) -> _Setup:
  """Builds the task, optimizer, mesh and train iterator; checks every module (an
  abstract init) before any data is prepared, and every eval split before training."""
  run = specs.run
  task = tasks.make_task(specs.task, specs.model, specs.data, str(workdir))
  tx, schedule = optim.make_optimizer(specs.optimizer, run.num_train_steps)
  mesh = sharding.make_mesh()
  init_rng, train_rng = jax.random.split(jax.random.key(run.seed))
  init_fn = programs.make_init_fn(task, tx, run)
  abstract = programs.abstract_state(init_fn, init_rng)  # runs every module's checks
  _prepare_on_first_process(task)  # after the checks: a bad field fails before any data work
  shardings = sharding.state_shardings(abstract, mesh, run.param_sharding)
  process = (jax.process_index(), jax.process_count())
  train_iter = iter(task.data.train_dataset(*process))
  for split in run.eval_splits:  # a missing or empty split fails now, not after training
    task.data.eval_batches(split, *process)
  return _Setup(
      task=task,
      tx=tx,
      schedule=schedule,
      mesh=mesh,
      data_sharding=sharding.batch_sharding(mesh),
      replicated=sharding.replicated(mesh),
      shardings=shardings,
      init_fn=init_fn,
      init_rng=init_rng,
      train_rng=train_rng,
      target=programs.with_shardings(abstract, shardings),
      train_iter=train_iter,
  )


def _initial_state(setup: _Setup, run: spec_lib.RunSpec, manager, saver, directory):
  """``(start step, state)``: the latest readable checkpoint in ``directory``, or a
  fresh state (with ``run.init_from``'s params if set)."""
  found = checkpoints.restore_latest(
      manager,
      directory,
      lambda: ocp.args.Composite(
          state=ocp.args.StandardRestore(setup.target),
          data=grain.checkpoint.CheckpointRestore(setup.train_iter),
      ),
  )
  if found is not None:
    start, restored = found
    saver.complete = start
    print(f'Resumed from {directory} at step {start}.', flush=True)
    return start, restored['state']
  state = jax.jit(setup.init_fn, out_shardings=setup.shardings)(setup.init_rng)
  if run.init_from:
    previous = checkpoints.restore_params(run.init_from, setup.target)
    state = state.replace(params=previous.params, model_state=previous.model_state)
    print(f'Initialised params from {run.init_from}.', flush=True)
  return 0, state


def _compile_steps(setup: _Setup, run: spec_lib.RunSpec):
  """``(train_step_fn, jitted train step, evaluators.Devices)`` in the run's shardings
  (``programs.make_programs``, which the compile command builds too).

  The steps are jitted once more inside (``train_step_fn``, ``Devices.eval_step_fn``):
  :func:`steps.zero_sums` and the summed programs share one trace of each."""
  built = programs.make_programs(
      setup.task, run, setup.tx, setup.schedule, setup.train_rng, setup.shardings, setup.mesh
  )
  devices = evaluators.Devices(
      state_shardings=setup.shardings,
      data_sharding=setup.data_sharding,
      eval_step_fn=built.eval_step_fn,
      eval_step=built.eval_step,
  )
  return built.train_step_fn, built.train_step, devices


class _Loop:
  """The steps from ``start`` to the end: train, and at the steps :func:`due` says,
  log (and run the hooks), evaluate, check for non-finite values, checkpoint."""

  writer: writers.Writers  # set by the caller, who closes them
  pbar: console.Progress

  def __init__(self, setup: _Setup, run: spec_lib.RunSpec, state, start: int, ctx: dict):
    self.setup, self.run, self.state, self.start = setup, run, state, start
    self.manager, self.saver, self.lock = ctx['manager'], ctx['saver'], ctx['lock']
    self.directory, self.profiler = ctx['directory'], ctx['profiler']
    self.is_main = jax.process_index() == 0
    self.train_step_fn, self.train_step, devices = _compile_steps(setup, run)
    self.evals = setup.task.evaluators(devices, run.eval_splits)
    self.hooks = setup.task.hooks(devices, run.log_pool_sizes)
    self.history: list[dict] = []
    self.result: dict[str, Any] = {}
    self.zeros, self.sums, self.in_flight = None, None, sharding.InFlight()
    self.tick = time.time()

  def check_finite(self) -> None:
    bad = int(sharding.fetch(self.state.bad_step))
    if bad >= 0:
      self.saver.finish()
      raise NonFiniteLossError(
          f'non-finite loss or gradient at step {bad}; training stopped. The last good '
          f'checkpoint is step {self.manager.latest_step()} in {self.directory}.'
      )

  def train(self, done: int, batch) -> None:
    """Dispatches step ``done`` (1-based; traced if ``config.profile`` chose it)."""
    if self.zeros is None:
      self.zeros = steps.zero_sums(self.train_step_fn, self.state, batch, self.setup.replicated)
      if self.is_main:
        self.pbar.write('Compiling the train step (its first call waits for it).')
    with self.profiler.step(done, self.state):
      self.state, self.sums = self.train_step(
          self.state, batch, self.zeros if self.sums is None else self.sums
      )
    self.profiler.stepped(done, (self.state, self.sums))
    self.in_flight.add(self.sums)

  def log(self, done: int, batch) -> None:
    self.check_finite()
    assert self.sums is not None  # train() ran since the last log
    summary = _train_summary(self.sums, time.time() - self.tick)
    self.sums, self.tick = None, time.time()
    self.writer.scalars(done, summary, 'train')
    self.history.append({'step': done, **summary})
    for hook in self.hooks:
      hook(done, self.state, batch, self.writer)
    self.pbar.logged(done, summary['loss'], summary['steps_per_sec'])

  def evaluate(self, done: int) -> None:
    by_split: dict[str, dict[str, float]] = {}
    for evaluate in self.evals:
      by_split.setdefault(evaluate.split, {}).update(evaluate(self.state))
    for split, metrics in by_split.items():
      self.writer.scalars(done, metrics, f'eval_{split}')
      self.result[f'eval_{split}'] = metrics
      self.pbar.write(
          f'step {done}: {split} ' + ', '.join(f'{k}={val:.4f}' for k, val in metrics.items())
      )

  def save(self, done: int) -> None:
    self.check_finite()
    self.saver.save(
        done,
        ocp.args.Composite(
            state=ocp.args.StandardSave(self.state),
            data=grain.checkpoint.CheckpointSave(self.setup.train_iter),
        ),
    )
    if self.is_main:
      self.pbar.write(f'step {done}: saving checkpoint {self.directory / str(done)}')

  def __call__(self, preemption: Preemption) -> None:
    run, total = self.run, self.run.num_train_steps
    every = (run.log_every_steps, run.eval_every_steps, run.checkpoint_every_steps)
    for step in range(self.start, total):
      batch = sharding.put_batch(next(self.setup.train_iter), self.setup.data_sharding)
      done = step + 1
      self.train(done, batch)
      preempted = preemption.reached(done)
      if preempted or any(due(done, n, total) for n in every):
        self.lock.check()  # another run took the workdir over: stop before writing
      if run.nan_check_every_steps and done % run.nan_check_every_steps == 0:
        self.check_finite()
      if due(done, run.log_every_steps, total):
        self.log(done, batch)
      if due(done, run.eval_every_steps, total) and not preempted:
        self.evaluate(done)
      if due(done, run.checkpoint_every_steps, total) or preempted:
        self.save(done)
      self.pbar.update(1)
      if preempted:
        self.result['preempted'] = True
        self.pbar.write(
            f'Preempted (SIGTERM): saved a checkpoint at step {done} in '
            f'{self.directory}; rerun the same command to resume.'
        )
        break


def _close_all(closers, completed: bool, write_error, saver) -> None:
  """Calls every closer even if one fails; a failure (the last checkpoint's
  background write, the last metrics) is raised if the run completed, and a
  WriteError gets the checkpoint a rerun resumes from as its hint."""
  failure = None
  for close in closers:
    try:
      close()
    except Exception as e:  # pylint: disable=broad-except
      failure = failure or e
  if completed and isinstance(failure, WriteError):
    write_error = failure
  if write_error is not None:  # after saver.finish: the checkpoint a rerun resumes from
    write_error.hint = write_error.hint or saver.hint()
  if failure is not None and completed:
    raise failure


def _train(specs: spec_lib.Specs, workdir: epath.Path, lock: runlock.RunLock) -> dict[str, Any]:
  """:func:`train_and_evaluate` once the run holds ``workdir``."""
  run, config = specs.run, specs.config
  is_main = jax.process_index() == 0
  directory = workdir / layout.CHECKPOINTS_DIR
  with storage.writing(directory):
    manager = checkpoints.manager(
        directory,
        keep=run.keep_checkpoints,
        keep_period=run.keep_checkpoint_period,
        asynchronous=run.async_checkpointing,
    )
  saver = checkpoints.Saver(manager, directory, manager.latest_step())
  closers, completed, write_error = [], False, None
  try:  # everything after here closes the manager on the way out
    if manager.latest_step() is not None:
      checkpoints.check_resume_config(workdir, config)
    if is_main:
      workdirs.write_config(workdir, config)
    setup = _set_up(specs, workdir)
    start, state = _initial_state(setup, run, manager, saver, directory)
    profiler = profiling.StepProfiler(specs.profile, workdir, start, run.num_train_steps)
    ctx = dict(manager=manager, saver=saver, lock=lock, directory=directory, profiler=profiler)
    loop = _Loop(setup, run, state, start, ctx)
    record = json.loads(config.to_json_best_effort())
    loop.writer = writer = writers.Writers(specs.writers, record, workdir, is_main, start)
    loop.pbar = pbar = console.Progress(start, run.num_train_steps, is_main and run.progress_bar)
    preemption = Preemption()
    closers = [profiler.close, preemption.close, pbar.close, writer.close]
    loop(preemption)
    completed = True
  except WriteError as e:
    write_error = e
    raise
  finally:
    _close_all(closers + [saver.finish, manager.close], completed, write_error, saver)
  result = loop.result
  result.update(
      step=int(sharding.fetch(loop.state.step)), train_history=loop.history, workdir=str(workdir)
  )
  return result
