"""The run lock (``training/runlock.py``): a stale lock is taken over with a warning naming its
holder, a live one refuses with one message naming it, the holder heartbeats and never removes
another run's lock; and what flufl.lock, the library it is not, lacks. (Launches on a locked
workdir, and a run whose lock is taken over: tests/training/test_cluster_faults.py.)"""

import errno
import json
import os
import re
import subprocess
import sys
import time

import pytest

from contextpool_jax.base.errors import WorkdirLockedError
from contextpool_jax.training import runlock
from helpers import lock_info
from helpers import sleeper  # pylint: disable=unused-import  # a fixture

pytestmark = pytest.mark.slow  # holder processes started and killed, heartbeats waited for


def _dead_pid():
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


STALE = {
    # kill -9, an out-of-memory kill: the holder's process is gone
    'process_not_running': (
        lambda live: lock_info(pid=_dead_pid(), pid_start=None),
        r'its process \d+ is not running',
    ),
    # ... and its pid was given to another process since
    'pid_reused': (
        lambda live: lock_info(pid=live.pid, pid_start=runlock.process_start(live.pid) + 1),
        r'its pid \d+ now belongs to another process',
    ),
    'machine_restarted': (
        lambda live: lock_info(pid=live.pid, boot_id='another-boot'),
        r'host \S+ has restarted since it started',
    ),
    # a lost machine: its processes cannot be seen from here, its heartbeat stopped
    'other_machine_without_heartbeat': (
        lambda live: lock_info(host='node-b', pid=4242, heartbeat=time.time() - 700),
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
    'process_running_here': lambda live: lock_info(
        pid=live.pid, pid_start=runlock.process_start(live.pid)
    ),
    'other_machine_with_a_recent_heartbeat': lambda live: lock_info(
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
    other = lock_info(run_id='b' * 32)
    (tmp_path / 'run.lock').write_text(json.dumps(other))  # another run took it over
    with pytest.raises(WorkdirLockedError, match='lost its lock'):
      lock.check()
  assert json.loads((tmp_path / 'run.lock').read_text()) == other


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
  (ours / 'run.lock').write_text(json.dumps(lock_info(pid=holder.pid, pid_start=None)))
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
