"""Faults that clusters and shared machines produce (issue 30).

* Two runs on one workdir: the second launch stops with one line naming the
  workdir and the live holder, before compiling; a holder that died (kill -9,
  a lost machine) is taken over with a warning (the lock itself:
  tests/training/test_runlock.py); a run whose lock was taken over stops before
  writing more.
* A full disk: a checkpoint (written at once or in orbax's background thread),
  a metrics line, a TensorBoard event or an export that cannot be written stops
  with one line naming the path and the cause; the last complete checkpoint stays
  readable and the rerun resumes from it, ending exactly as an uninterrupted run.
  Simulated with a file-size limit of 0 (``RLIMIT_FSIZE``; SIGXFSZ ignored, so
  every write that grows a file fails with EFBIG) set inside the run at a chosen
  call: no file may grow any more, like a full disk (and unlike ``chmod``, it
  also stops root).
* Kills at random moments: SIGKILL of the whole run (every process) at seeded
  random points, several times, each followed by a resume; the final
  parameters, optimizer state and metrics lines equal an uninterrupted run's,
  bit for bit; one process and two processes.

Every run goes through ``train.py`` (or the local multi-process launcher) with
the fault injected by a driver script (``_DRIVER``).
"""

import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from contextpool_jax.base.errors import WorkdirLockedError
from contextpool_jax.training import runlock, sharding, trainer
from contextpool_jax.runs.workdirs import load_variables
from conftest import REPO
from helpers import FULL_DISK_SETUP, cap_file_size, committed_steps, flags, lock_info, tiny_run_config
from helpers import sleeper  # pylint: disable=unused-import  # a fixture

pytestmark = pytest.mark.slow  # processes killed, disks filled, runs on two processes

# Runs train.py (its flags are argv[1:]) with the fault that the environment
# variable CONTEXTPOOL_TEST_FAULT describes (JSON):
#   process:  the process (--process_id) that injects it (0 with one process);
#   triggers: [[module:function, n], ...]: the fault fires at the n-th call of
#             the first function, counted from the start; with several, the
#             calls of each are counted after the previous one fired;
#   when:     'before' or 'after' that call;
#   action:   'kill': SIGKILL of the whole process group (every process of the
#             run and the launcher: a scheduler killing a job, a lost machine);
#             'full': RLIMIT_FSIZE = 0, so no file of the process may grow.
#   log:      a file to which it appends 'fault: <action> on thread <name>' just
#             before acting (stderr may not get through a killed launcher).
_DRIVER = r"""
import importlib, json, os, resource, runpy, signal, sys, threading
sys.path.insert(0, {repo!r})
spec = json.loads(os.environ.get('CONTEXTPOOL_TEST_FAULT') or 'null')
process = next((int(a.split('=')[1]) for a in sys.argv if a.startswith('--process_id=')), 0)
if spec and spec['process'] == process:
  exec({setup!r})
  state = {{'trigger': 0, 'calls': 0}}
  guard = threading.Lock()

  def act():
    with open(spec['log'], 'a') as f:
      f.write(f"fault: {{spec['action']}} on thread {{threading.current_thread().name}}\n")
    if spec['action'] == 'kill':
      os.killpg(os.getpgrp(), signal.SIGKILL)
    else:
      resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

  def patch(index, target, n):
    module_name, attr = target.split(':')
    owner = importlib.import_module(module_name)
    *path, name = attr.split('.')
    for part in path:
      owner = getattr(owner, part)
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
      with guard:
        fire = False
        if state['trigger'] == index:
          state['calls'] += 1
          if state['calls'] == n:
            state['trigger'], state['calls'] = index + 1, 0
            fire = state['trigger'] == len(spec['triggers'])
      if fire and spec['when'] == 'before':
        act()
      out = original(*args, **kwargs)
      if fire and spec['when'] == 'after':
        act()
      return out

    setattr(owner, name, wrapped)

  for i, (target, n) in enumerate(spec['triggers']):
    patch(i, target, n)
runpy.run_path({train!r}, run_name='__main__')
"""

STEPS = 12  # checkpoints at every even step, a log line every step, evaluation at 4, 8, 12


@pytest.fixture(scope='module')
def driver(tmp_path_factory):
  path = tmp_path_factory.mktemp('driver') / 'fault_driver.py'
  path.write_text(
      _DRIVER.format(repo=str(REPO), train=str(REPO / 'train.py'), setup=FULL_DISK_SETUP)
  )
  return path


def _flags(corpus, data, workdir, **overrides):
  config = dict(log_every_steps=1, checkpoint_every_steps=2, eval_every_steps=4)
  return flags(corpus, data, workdir, steps=STEPS, **{**config, **overrides})


def _run(driver, args, *, fault=None, processes=1, env=None, timeout=600):
  """Runs train.py (``processes`` > 1: through the launcher, 2 devices each) in a new
  process group, so that a 'kill' fault ends exactly this run. With a fault,
  ``out.fault`` is what the driver logged when it fired (None if it did not)."""
  full_env = dict(os.environ, JAX_PLATFORMS='cpu', **(env or {}))
  full_env.pop('CONTEXTPOOL_TEST_FAULT', None)
  log = pathlib.Path(driver).parent / f'fault-{time.time_ns()}.log'
  if fault is not None:
    fault = {'process': 0, 'when': 'after', 'log': str(log), **fault}
    full_env['CONTEXTPOOL_TEST_FAULT'] = json.dumps(fault)
  if processes == 1:
    cmd = [sys.executable, str(driver), *args]
  else:
    cmd = [
        sys.executable,
        '-m',
        'contextpool_jax.commands.launch',
        f'--num_processes={processes}',
        '--devices_per_process=2',
        f'--script={driver}',
        '--',
        *args,
    ]
  out = subprocess.run(
      cmd,
      env=full_env,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=timeout,
      start_new_session=True,
  )
  out.fault = log.read_text().strip() if log.exists() else None
  return out


def _ok(out):
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
  return out


def _lines(workdir):
  """metrics.jsonl as (step, split, every value but the timing), in file order."""
  records = []
  for line in (pathlib.Path(workdir) / 'metrics.jsonl').read_text().splitlines():
    record = json.loads(line)
    record.pop('steps_per_sec', None)
    records.append(record)
  return records


def _state(workdir):
  """``(step, state)``: the latest checkpoint's whole TrainState (params, optimizer
  state, step, ...) as numpy arrays, restored on this one-device process."""
  step = committed_steps(workdir)[-1]
  state_dir = pathlib.Path(workdir) / 'checkpoints' / str(step) / 'state'
  metadata = ocp.PyTreeCheckpointer().metadata(state_dir).item_metadata
  tree = getattr(metadata, 'tree', metadata)
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  options = ocp.CheckpointManagerOptions(read_only=True, create=False)
  with ocp.CheckpointManager(pathlib.Path(workdir) / 'checkpoints', options=options) as mgr:
    restored = mgr.restore(
        step,
        args=ocp.args.Composite(state=ocp.args.PyTreeRestore(item=tree, restore_args=restore_args)),
    )
  return step, restored['state']


def _assert_same_run(workdir, reference):
  """Final params, optimizer state, data position and metrics lines, bit for bit."""
  step, state = _state(workdir)
  step_ref, state_ref = _state(reference)
  assert step == step_ref == STEPS
  assert state['params'] and state['opt_state']
  chex.assert_trees_all_equal(state, state_ref)
  data = lambda w: sorted((pathlib.Path(w) / 'checkpoints' / str(STEPS) / 'data').glob('process_*'))
  assert [p.read_text() for p in data(workdir)] == [p.read_text() for p in data(reference)] != []
  lines, lines_ref = _lines(workdir), _lines(reference)
  keys = [(r['step'], r['split']) for r in lines]
  assert len(set(keys)) == len(keys), 'a metrics line is duplicated'
  assert keys == [(r['step'], r['split']) for r in lines_ref], 'a metrics line is missing'
  assert lines == lines_ref


@pytest.fixture(scope='module')
def reference(corpus, tmp_path_factory, driver):
  """An uninterrupted one-process run (prepares the data the other runs share)."""
  root = tmp_path_factory.mktemp('reference')
  args = lambda workdir: _flags(corpus, root / 'data', workdir)
  _ok(_run(driver, args(root / 'uninterrupted')))
  return args, root / 'uninterrupted'


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith('error: ')]


# ----------------------------------------------------------------------------
# 1. Two runs on one workdir.
# ----------------------------------------------------------------------------


def test_a_run_whose_lock_was_taken_over_stops_before_writing_more(corpus, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  other = lock_info(run_id='b' * 32, host='node-b', pid=77)
  original, calls = sharding.put_batch, [0]

  def put_batch(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 3:  # during step 3 another run takes the workdir over
      (workdir / 'run.lock').write_text(json.dumps(other))
    return original(*args, **kwargs)

  monkeypatch.setattr(sharding, 'put_batch', put_batch)
  w = re.escape(str(workdir))
  with pytest.raises(
      WorkdirLockedError,
      match=rf'{w}: this run \(run \w{{8}}\) lost its lock {w}/run\.lock to another '
      r'run \(host node-b, pid 77, started 2026-11-26 12:00:00 UTC\); stopped without writing',
  ):
    trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 6), str(workdir))
  assert committed_steps(workdir) == [2]  # nothing written at step 4
  assert {r['step'] for r in _lines(workdir)} == {2}
  assert json.loads((workdir / 'run.lock').read_text()) == other  # the other run's, kept


def test_a_second_launch_on_a_live_workdir_is_refused_before_compiling(reference, driver, tmp_path):
  args, _ = reference
  workdir = tmp_path / 'run'
  first_args = args(workdir) + ['--config.num_train_steps=400', '--config.log_every_steps=2']
  env = dict(os.environ, JAX_PLATFORMS='cpu', JAX_LOG_COMPILES='1')
  first = subprocess.Popen(
      [sys.executable, str(REPO / 'train.py'), *first_args],
      env=env,
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  try:
    log = workdir / 'metrics.jsonl'
    deadline = time.time() + 600
    while not (log.exists() and '"train"' in log.read_text()) and time.time() < deadline:
      time.sleep(0.1)
    config_written = (workdir / 'config.json').stat().st_mtime_ns
    # JAX_LOG_COMPILES: every compilation would be logged ('Compiling ...').
    second = _run(driver, first_args, env={'JAX_LOG_COMPILES': '1'})
    assert first.poll() is None  # the first run goes on
  finally:
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=600)
  assert second.returncode == 1, second.stderr[-3000:]
  (line,) = _error_lines(second.stderr)
  assert re.fullmatch(
      rf'error: {re.escape(str(workdir))} is in use by another run: host \S+, pid {first.pid}, '
      rf'started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \S+ \(run \w{{8}}, 1 process\(es\); lock '
      rf'{re.escape(str(workdir))}/run\.lock\)\. Stop that run first, or use another --workdir\.',
      line,
  ), line
  assert 'Compiling' in err  # the check can fail: JAX_LOG_COMPILES logs each compilation
  assert 'Compiling' not in second.stderr and 'Traceback' not in second.stderr
  assert 'Resumed' not in second.stdout
  assert (workdir / 'config.json').stat().st_mtime_ns == config_written  # not rewritten
  # The first run, stopped by SIGTERM, saved its step and released the workdir.
  assert first.returncode == 143, err[-3000:]
  assert not (workdir / 'run.lock').exists()


def test_a_second_launch_of_two_processes_is_refused_on_both(reference, driver, tmp_path, sleeper):
  args, _ = reference
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = lock_info(pid=sleeper.pid, pid_start=runlock.process_start(sleeper.pid), processes=2)
  (workdir / 'run.lock').write_text(json.dumps(holder))
  out = _run(driver, args(workdir), processes=2, env={'JAX_LOG_COMPILES': '1'})
  assert out.returncode == 1, out.stdout[-3000:]
  # The one computation before the refusal: process 0's verdict, broadcast.
  compiled = re.findall(r'Compiling (\S+) ', out.stdout)
  assert compiled and set(compiled) == {'jit(_psum)'}, compiled
  # Each process's message, up to its last word: the processes share one pipe, and
  # Gloo's C++ logging may land between a message and its newline.
  messages = [m.group(0) for m in re.finditer(r'(\[1\] )?error: .*?--workdir\.', out.stdout)]
  expected = (
      f'error: {workdir} is in use by another run: host {holder["host"]}, pid {sleeper.pid}, '
      f'started 2026-11-26 12:00:00 UTC (run aaaaaaaa, 2 process(es); lock '
      f'{workdir}/run.lock). Stop that run first, or use another --workdir.'
  )
  assert sorted(messages) == sorted([expected, f'[1] {expected}']), out.stdout[-3000:]
  assert 'Traceback' not in out.stdout
  assert sorted(p.name for p in workdir.iterdir()) == ['run.lock']  # nothing else written


# ----------------------------------------------------------------------------
# 2. A full disk.
# ----------------------------------------------------------------------------

_SAVE = 'orbax.checkpoint:CheckpointManager.save'
# Called in orbax's background thread, once per array, to write it (tensorstore).
_ARRAY_WRITE = 'orbax.checkpoint._src.serialization.serialization:async_serialize_from_host'

# The disk fills up (before the given call): (triggers, the path the error names,
# relative to the workdir (a regex), the last complete checkpoint, resumed?).
FULL_DISK = {
    # the step-8 save fails at once (its first small files)
    'checkpoint_write': ([(_SAVE, 4)], 'checkpoints/8', 6, False),
    # the step-12 arrays fail in orbax's background thread; the run reports it
    # when it waits for that write (at the next save, here at the end)
    'checkpoint_write_in_the_background': (
        [(_SAVE, 6), (_ARRAY_WRITE, 1)],
        'checkpoints/12',
        10,
        True,
    ),
    # the train line of step 6 (2 lines a step, 3 at an evaluation step)
    'metrics_line': (
        [('contextpool_jax.training.writers:Writers.scalars', 12)],
        'metrics.jsonl',
        4,
        True,
    ),
    # the pool-size histograms of step 5
    'tensorboard_event': (
        [('contextpool_jax.training.writers:Writers.histograms', 5)],
        r'tensorboard/events\.out\.tfevents\.[^:]+',
        4,
        False,
    ),
}


@pytest.mark.parametrize('case', sorted(FULL_DISK))
def test_a_full_disk_stops_with_one_message_and_the_rerun_resumes(
    reference, driver, tmp_path, case
):
  triggers, path, complete, resume = FULL_DISK[case]
  args, uninterrupted = reference
  workdir = tmp_path / 'run'
  extra = [] if path.startswith('checkpoints') else ['--config.async_checkpointing=False']
  fault = {'triggers': triggers, 'when': 'before', 'action': 'full'}
  out = _run(driver, args(workdir) + extra, fault=fault)
  assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-5000:]
  (thread,) = re.findall(r'fault: full on thread (.*)', out.fault)
  assert (thread != 'MainThread') == ('background' in case), thread
  (line,) = _error_lines(out.stderr)
  w = re.escape(str(workdir))
  assert re.fullmatch(
      rf'error: cannot write {w}/{path}: \[Errno 27\] File too large\. Checkpoint step '
      rf'{complete} in {w}/checkpoints is complete; rerun the same command once the cause '
      r'is fixed to resume from it\.',
      line,
  ), line
  assert 'Traceback' not in out.stderr, out.stderr[-5000:]
  # The last complete checkpoint is readable; the run released the workdir.
  assert load_variables(workdir)[1] == complete
  assert not (workdir / 'run.lock').exists()
  if resume:
    resumed = _ok(_run(driver, args(workdir)))
    assert f'Resumed from {workdir / "checkpoints"} at step {complete}.' in resumed.stdout
    _assert_same_run(workdir, uninterrupted)


def test_an_export_that_cannot_be_written_leaves_no_export(reference, tmp_path):
  _, uninterrupted = reference
  out_dir = tmp_path / 'export'
  # config.json (1.5 kB) and the model card fit under 20 kB, the parameters (~100 kB) do not.
  script = (
      cap_file_size(20000) + 'from contextpool_jax.base.errors import WriteError\n'
      'from contextpool_jax.runs.export import export_params\n'
      'try:\n'
      '  export_params(sys.argv[1], sys.argv[2])\n'
      'except WriteError as e:\n'
      '  print(f"error: {e}")\n'
  )
  out = subprocess.run(
      [sys.executable, '-c', script, str(uninterrupted), str(out_dir)],
      env=dict(os.environ, JAX_PLATFORMS='cpu'),
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert out.stdout.strip() == (
      f'error: cannot write {out_dir}/model.safetensors: [Errno 27] File too large'
  ), (out.stdout + out.stderr[-3000:])
  assert sorted(p.name for p in out_dir.iterdir()) == ['README.md', 'config.json']  # not an export
  from contextpool_jax.runs.export import export_params  # pylint: disable=g-import-not-at-top

  export_params(uninterrupted, out_dir)  # with room, the same export works
  assert load_variables(out_dir)[1] == -1


# ----------------------------------------------------------------------------
# 3. Kills at random moments.
# ----------------------------------------------------------------------------


def _evals(start, end):
  return sum(1 for s in range(start + 1, end + 1) if s % 4 == 0)


# Where a kill lands: (what, its triggers given the number k drawn in [1, count(r)],
# where r is the step the run resumes from; every count is >= 1 while r < STEPS).
KILL_POINTS = {
    # after the k-th batch (of training or of an evaluation) is put on the devices
    'a batch': lambda r, k: [('contextpool_jax.training.sharding:put_batch', k)],
    # right after a metrics line (train, pool sizes or evaluation) was written
    'a metrics line': lambda r, k: [('contextpool_jax.training.writers:Writers.scalars', k)],
    # while a checkpoint is written asynchronously (save returned, commit pending)
    'an asynchronous checkpoint': lambda r, k: [(_SAVE, k)],
    # inside orbax's background thread, as it starts writing the k-th array
    'an array write in the background': lambda r, k: [(_SAVE, 1), (_ARRAY_WRITE, k)],
    # during an evaluation (its first batch is on the devices)
    'an evaluation': lambda r, k: [('contextpool_jax.training.steps:zero_sums', k + 1)],
}
KILL_COUNTS = {
    'a batch': lambda r: STEPS - r,
    'a metrics line': lambda r: 2 * (STEPS - r),
    'an asynchronous checkpoint': lambda r: (STEPS - r) // 2,
    'an array write in the background': lambda r: 8,
    'an evaluation': lambda r: _evals(r, STEPS),
}


def _kills_then_resume(driver, args, workdir, uninterrupted, *, seed, kills, processes):
  """Kills the run ``kills`` times at points drawn with ``seed``, resuming each time,
  then lets it finish; returns the kill points."""
  rng = random.Random(seed)
  done, log = [], []
  for _ in range(kills):
    r = (committed_steps(workdir) or [0])[-1]
    process = rng.randrange(processes)
    # Array writes: process 0 writes some of every checkpoint (the others may write none).
    points = [p for p in sorted(KILL_POINTS) if KILL_COUNTS[p](r) >= 1]
    points = [p for p in points if process == 0 or p != 'an array write in the background']
    what = rng.choice(points)
    k = rng.randint(1, KILL_COUNTS[what](r))
    fault = {'triggers': KILL_POINTS[what](r, k), 'action': 'kill', 'process': process}
    out = _run(driver, args, fault=fault, processes=processes)
    text = out.stdout + out.stderr
    assert out.returncode == -signal.SIGKILL, f'{what} #{k} (from step {r}): ' + text[-4000:]
    assert out.fault.startswith('fault: kill on thread')
    done.append(f'{what} #{k} from step {r} on process {process}')
    # The killed run's lock stays behind: the run's, not one per process.
    held = json.loads((workdir / 'run.lock').read_text())
    assert held['processes'] == processes
    log.append(text)
  final = _ok(_run(driver, args, processes=processes))
  for text in log[1:] + [final.stdout + final.stderr]:
    assert 'Took over' in text and 'from a run that is not running (its process' in text
  assert not (workdir / 'run.lock').exists()
  _assert_same_run(workdir, uninterrupted)
  return done


def test_kills_at_random_moments_then_resumes_equal_an_uninterrupted_run(
    reference, driver, tmp_path
):
  args, uninterrupted = reference
  workdir = tmp_path / 'run'
  points = _kills_then_resume(
      driver, args(workdir), workdir, uninterrupted, seed=30, kills=3, processes=1
  )
  print('killed at:', points)


def test_kills_at_random_moments_on_two_processes_then_resumes_equal_an_uninterrupted_run(
    reference, driver, tmp_path
):
  """Slow (about a minute on 2 cores): two real processes on a loopback cluster are started,
  killed at random moments and restarted, each start paying process start-up, JAX's
  distributed initialisation and compilation; the kills are the point of the test. Two
  kills (the one-process test makes three): a killed run is resumed, killed again and
  resumed, and the equality at the end needs one more uninterrupted two-process run."""
  args, _ = reference
  uninterrupted = tmp_path / 'uninterrupted'
  _ok(_run(driver, args(uninterrupted), processes=2))
  workdir = tmp_path / 'run'
  points = _kills_then_resume(
      driver, args(workdir), workdir, uninterrupted, seed=41, kills=2, processes=2
  )
  print('killed at:', points)
