"""Faults that clusters and shared machines produce (issue 30).

* Two runs on one workdir: the second launch stops with one line naming the
  workdir and the live holder, before compiling; a holder that died (kill -9,
  a lost machine) is taken over with a warning; a run whose lock was taken over
  stops before writing more.
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

import errno
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

from contextpool_jax.io import storage
from contextpool_jax.base.errors import WorkdirLockedError
from contextpool_jax.training import runlock, sharding, trainer
from contextpool_jax.runs.workdirs import load_variables
from conftest import REPO
from helpers import committed_steps, flags, tiny_run_config

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
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
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
  path.write_text(_DRIVER.format(repo=str(REPO), train=str(REPO / 'train.py')))
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


def _info(**overrides):
  """A lock file's content as a run on this machine writes it."""
  return {
      'run_id': 'a' * 32,
      **runlock._this_process(),  # pylint: disable=protected-access
      'started': '2026-11-26 12:00:00 UTC',
      'processes': 1,
      'heartbeat': time.time(),
      **overrides,
  }


@pytest.fixture
def sleeper():
  """A live process on this machine (the holder of a live lock)."""
  proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
  yield proc
  proc.kill()
  proc.wait()


def _dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


STALE = {
    # kill -9, an out-of-memory kill: the holder's process is gone
    'process_not_running': (
        lambda live: _info(pid=_dead_pid(), pid_start=None),
        r'its process \d+ is not running',
    ),
    # ... and its pid was given to another process since
    'pid_reused': (
        lambda live: _info(pid=live.pid, pid_start=runlock.process_start(live.pid) + 1),
        r'its pid \d+ now belongs to another process',
    ),
    'machine_restarted': (
        lambda live: _info(pid=live.pid, boot_id='another-boot'),
        r'host \S+ has restarted since it started',
    ),
    # a lost machine: its processes cannot be seen from here, its heartbeat stopped
    'other_machine_without_heartbeat': (
        lambda live: _info(host='node-b', pid=4242, heartbeat=time.time() - 700),
        r'its last heartbeat was 70\d s ago \(config.lock_stale_seconds=600\)',
    ),
}


@pytest.mark.parametrize('case', sorted(STALE))
def test_a_stale_lock_is_taken_over_with_a_warning_naming_its_holder(tmp_path, sleeper, case):
  info, reason = STALE[case]
  old = info(sleeper)
  (tmp_path / 'run.lock').write_text(json.dumps(old))
  expected = (
      rf'Took over {re.escape(str(tmp_path))}/run\.lock from a run that is not running \({reason}\): '
      rf'host {old["host"]}, pid {old["pid"]}, started 2026-11-26 12:00:00 UTC \(run aaaaaaaa\)'
  )
  with pytest.warns(UserWarning, match=expected):
    with runlock.hold(tmp_path, stale_seconds=600) as lock:
      held = json.loads((tmp_path / 'run.lock').read_text())
      assert held['run_id'] == lock.run_id != old['run_id']
      assert held['pid'] == os.getpid()
  assert not (tmp_path / 'run.lock').exists()  # released
  assert [p.name for p in tmp_path.iterdir()] == []  # no temporary or moved-aside file left


LIVE = {
    'process_running_here': lambda live: _info(
        pid=live.pid, pid_start=runlock.process_start(live.pid)
    ),
    'other_machine_with_a_recent_heartbeat': lambda live: _info(
        host='node-b', pid=4242, heartbeat=time.time() - 30
    ),
}


@pytest.mark.parametrize('case', sorted(LIVE))
def test_a_live_lock_refuses_with_one_message_naming_the_holder(tmp_path, sleeper, case):
  old = LIVE[case](sleeper)
  text = json.dumps(old)
  (tmp_path / 'run.lock').write_text(text)
  with pytest.raises(WorkdirLockedError) as raised:
    with runlock.hold(tmp_path, stale_seconds=600):
      pytest.fail('held a live lock')
  message = str(raised.value)
  assert '\n' not in message
  assert message.startswith(
      f'{tmp_path} is in use by another run: host {old["host"]}, pid {old["pid"]}, started '
      f'2026-11-26 12:00:00 UTC (run aaaaaaaa, 1 process(es); lock {tmp_path}/run.lock). '
      'Stop that run first, or use another --workdir.'
  )
  if old['host'] == 'node-b':  # liveness by heartbeat: say when it would count as dead
    assert re.search(r'Its last heartbeat was 3\d s ago; if it is dead, delete', message)
  assert (tmp_path / 'run.lock').read_text() == text  # untouched


def test_the_holder_heartbeats_and_never_removes_another_runs_lock(tmp_path):
  with runlock.hold(tmp_path, stale_seconds=1):  # a heartbeat every 0.1 s
    first = json.loads((tmp_path / 'run.lock').read_text())['heartbeat']
    deadline = time.time() + 30
    while json.loads((tmp_path / 'run.lock').read_text())['heartbeat'] == first:
      assert time.time() < deadline, 'no heartbeat'
      time.sleep(0.05)
  assert not (tmp_path / 'run.lock').exists()
  with runlock.hold(tmp_path, stale_seconds=600) as lock:  # next heartbeat in 60 s
    other = _info(run_id='b' * 32)
    (tmp_path / 'run.lock').write_text(json.dumps(other))  # another run took it over
    with pytest.raises(WorkdirLockedError, match='lost its lock'):
      lock.check()
  assert json.loads((tmp_path / 'run.lock').read_text()) == other


def test_a_run_whose_lock_was_taken_over_stops_before_writing_more(corpus, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  other = _info(run_id='b' * 32, host='node-b', pid=77)
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


# A process that takes a flufl.lock (argv[1]) with runlock's default staleness as its lifetime.
_FLUFL_HOLDER = """
import sys, time
from flufl.lock import Lock
Lock(sys.argv[1], lifetime=600).lock()
print('locked', flush=True)
time.sleep(600)
"""


def test_flufl_lock_lacks_what_the_run_lock_is_tested_for(tmp_path, monkeypatch):
  """Why training/runlock.py is not flufl.lock (the same NFS-safe hard-link protocol, with
  lifetimes), tried on flufl.lock itself against what the tests above require:

  * A holder killed on this machine (kill -9, an out-of-memory kill): flufl.lock sees it
    (``LockState.stale``) but ``lock()`` breaks a lock only once its lifetime is over, and the
    lifetime must outlast any gap between two heartbeats (runlock's default: 600 s), so the
    rerun after a kill would wait ten minutes; runlock takes it over at once
    (test_a_stale_lock_is_taken_over_with_a_warning_naming_its_holder).
  * The lock file holds the name of flufl.lock's claim file (host, pid) and nothing else: no
    start time, run id or process count for a refusal to name
    (test_a_live_lock_refuses_with_one_message_naming_the_holder); and a killed holder's claim
    file stays in the workdir beside the lock.
  * Without hard links (gcsfuse, mountpoint-s3: docs/failures.md) flufl.lock raises; runlock
    falls back to an exclusive create.
  """
  from flufl import lock as flufl  # pylint: disable=g-import-not-at-top  # a test dependency

  path = tmp_path / 'flufl' / 'run.lock'
  path.parent.mkdir()
  holder = subprocess.Popen(
      [sys.executable, '-c', _FLUFL_HOLDER, str(path)], stdout=subprocess.PIPE, text=True
  )
  try:
    assert holder.stdout.readline() == 'locked\n'
  finally:
    holder.kill()  # kill -9
    holder.wait()
  lock = flufl.Lock(str(path), lifetime=600)
  assert lock.state == flufl.LockState.stale  # it knows the holder is gone ...
  with pytest.raises(flufl.TimeOutError):
    lock.lock(timeout=1)  # ... and waits for its lifetime to end all the same
  host, pid, _ = lock.details
  assert lock.details == (host, holder.pid, str(path))  # all the lock says of its holder
  claim = f'run.lock|{host}|{holder.pid}|'
  assert path.read_text().startswith(f'{path}|{host}|{holder.pid}|')
  names = sorted(p.name for p in path.parent.iterdir())
  assert len(names) == 2 and names[0] == 'run.lock' and names[1].startswith(claim), names
  # runlock, the same dead holder: taken over at once.
  ours = tmp_path / 'ours'
  ours.mkdir()
  (ours / 'run.lock').write_text(json.dumps(_info(pid=holder.pid, pid_start=None)))
  with pytest.warns(UserWarning, match=rf'\(its process {holder.pid} is not running\)'):
    with runlock.hold(ours, stale_seconds=600):
      pass

  # No hard links: flufl.lock raises; runlock takes the workdir all the same.
  def no_hard_links(*args, **kwargs):
    raise PermissionError(errno.EPERM, 'Operation not permitted')

  monkeypatch.setattr(os, 'link', no_hard_links)
  (tmp_path / 'no_links').mkdir()
  with pytest.raises(PermissionError):
    flufl.Lock(str(tmp_path / 'no_links' / 'flufl.lock')).lock(timeout=1)
  with runlock.hold(tmp_path / 'no_links', stale_seconds=600) as held:
    assert json.loads((tmp_path / 'no_links' / 'run.lock').read_text())['run_id'] == held.run_id
  assert sorted(p.name for p in (tmp_path / 'no_links').iterdir()) == []


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
  holder = _info(pid=sleeper.pid, pid_start=runlock.process_start(sleeper.pid), processes=2)
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
      'import resource, signal, sys\n'
      'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
      'resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))\n'
      'from contextpool_jax.base.errors import WriteError\n'
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


def test_metrics_are_cut_back_to_the_resumed_step_and_a_torn_line_dropped(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  lines = [json.dumps({'step': s, 'split': 'train', 'loss': 1.0 / s}) for s in range(1, 7)]
  path.write_text('\n'.join(lines) + '\n' + '{"step": 7, "spl')  # torn by a full disk
  assert storage.resume_metrics(path, 4) == 3
  assert path.read_text() == '\n'.join(lines[:4]) + '\n'
  assert storage.resume_metrics(path, 4) == 0
  assert storage.resume_metrics(tmp_path / 'absent.jsonl', 4) == 0


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
