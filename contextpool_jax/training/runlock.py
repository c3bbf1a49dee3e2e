"""One run per workdir: ``<workdir>/run.lock``, held by the run for its life.

A second launch on a live workdir (a scheduler relaunching a job whose first copy
still runs, the same command started twice) stops with
:class:`~contextpool_jax.base.errors.WorkdirLockedError` before it reads a checkpoint,
writes a file or builds the model (with several processes, the only computation
before it is the broadcast of process 0's verdict), in one line naming the
workdir and the holder::

  /w is in use by another run: host node7, pid 4242, started 2026-11-26 12:00:01 UTC (run
  3f2a9c1e, 2 process(es); lock /w/run.lock). Stop that run first, or use another --workdir.

The protocol:

* **The lock** is ``<workdir>/run.lock``, JSON: ``run_id``, ``host``, ``pid``,
  ``started``, ``processes``, ``heartbeat`` (and ``pid_start``, ``boot_id``,
  ``pid_namespace`` to recognise a reused pid or a rebooted machine). Process 0
  creates it atomically: written in full to a temporary file, then hard-linked to
  ``run.lock``, which fails if the file exists (``os.link``: atomic on local
  filesystems and on NFS, the classic NFS-safe lock file; with no hard links,
  ``O_CREAT | O_EXCL``). No ``flock``: it is not reliable over NFS and absent on
  object stores, and a kill -9 must leave a lock the next run can judge. Not
  ``flufl.lock`` (the same hard-link protocol, with lifetimes): it takes a dead
  holder's lock over only when its lifetime ends, its file names only the host and
  pid, and it needs hard links (tests/training/test_runlock.py tries it).
* **One lock per run**, not per process: the other processes of a multi-process
  run take none; they learn from process 0 (``broadcast_one_to_all``) the run id,
  or that the workdir is held, and then stop with it.
* **Released** when the run ends: normally, with an exception, on SIGTERM (the
  trainer's preemption save) or Ctrl-C; after the last checkpoint is written, so
  a rerun never starts while it is. Process 0 rewrites ``heartbeat`` every
  ``stale_seconds / 10`` seconds (at most 60) from a thread.
* **A stale lock** (its holder died: kill -9, an out-of-memory kill, a lost
  machine) is taken over with a warning naming the old holder. Stale means:
  same machine (host name, boot id and pid namespace equal): its process is not
  running, or its pid now belongs to another process (start time in
  ``/proc/<pid>/stat``), judged at once; same host name but another boot id: the
  machine restarted; another machine or container (no way to see its processes):
  its heartbeat is older than ``config.lock_stale_seconds`` (default 600; clocks
  must agree to well within that, as NTP keeps them). A takeover renames the
  stale file aside first, so of two launches taking over at once one wins.
* **Fencing**: at every step where the run writes (log, evaluation, checkpoint,
  preemption), :meth:`RunLock.check` verifies that ``run.lock`` still names this
  run; if another run took it over (this run's heartbeat stopped for longer than
  the staleness timeout, or someone deleted the lock and started a run), this run
  stops before writing anything more.

**Filesystems without locks.** On a POSIX filesystem, local or NFS, all of the
above holds. On an object-store mount without hard links or atomic exclusive
create across machines (gcsfuse, mountpoint-s3), and for a workdir given as a
URL (``gs://``, ``s3://``; create-if-absent is then check-then-write): a
second launch started after the first one wrote its lock (the relaunch case:
seconds to hours later) is refused and stale locks are judged as above, but two
launches started within the same second on different machines can both pass the
check; the fencing check stops one of them at its first log or checkpoint step.
Where files cannot be renamed (mountpoint-s3) the heartbeat is rewritten in place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import socket
import threading
import time
import uuid
import warnings
from typing import Any, Iterator, Optional

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from contextpool_jax.io import storage
from contextpool_jax.base.errors import WorkdirLockedError

LOCK_FILE = 'run.lock'
DEFAULT_STALE_SECONDS = 600
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK)
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_TAKEOVER_ATTEMPTS = 8


# ----------------------------------------------------------------------------
# This machine and its processes.
# ----------------------------------------------------------------------------


def _read(path: str) -> Optional[str]:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return None


def process_start(pid: int) -> Optional[int]:
  """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat``
  field 22); None without ``/proc`` or if there is no such process."""
  stat = _read(f'/proc/{pid}/stat')
  if not stat:
    return None
  try:
    return int(stat.rsplit(')', 1)[1].split()[19])  # fields from 3 on follow the ')'
  except (IndexError, ValueError):
    return None


def _running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _pid_namespace() -> Optional[str]:
  try:
    return os.readlink('/proc/self/ns/pid')
  except OSError:
    return None


def _this_process() -> dict[str, Any]:
  pid = os.getpid()
  return dict(
      host=socket.gethostname(),
      pid=pid,
      pid_start=process_start(pid),
      boot_id=_read('/proc/sys/kernel/random/boot_id'),
      pid_namespace=_pid_namespace(),
  )


def describe(info: dict[str, Any]) -> str:
  """``'host h, pid 7, started 2026-11-26 12:00:01 UTC'`` of a lock's holder."""
  return f'host {info.get("host", "?")}, pid {info.get("pid", "?")}, started {info.get("started", "?")}'


def stale_reason(info: dict[str, Any], stale_seconds: float, *, now: float) -> Optional[str]:
  """Why the run that wrote ``info`` is not running any more, or None if it may be."""
  me = _this_process()
  same_host = info.get('host') == me['host']
  if same_host and info.get('boot_id') and me['boot_id'] and info['boot_id'] != me['boot_id']:
    return f'host {me["host"]} has restarted since it started'
  same_machine = (
      same_host
      and info.get('boot_id') == me['boot_id']
      and info.get('pid_namespace') == me['pid_namespace']
  )
  pid = info.get('pid')
  if same_machine and isinstance(pid, int):
    if not _running(pid):
      return f'its process {pid} is not running'
    now_start = process_start(pid)
    if (
        info.get('pid_start') is not None
        and now_start is not None
        and now_start != info['pid_start']
    ):
      return f'its pid {pid} now belongs to another process'
    return None
  age = now - float(info.get('heartbeat', 0))
  if age > stale_seconds:
    return f'its last heartbeat was {age:.0f} s ago (config.lock_stale_seconds={stale_seconds:g})'
  return None


# ----------------------------------------------------------------------------
# The lock file.
# ----------------------------------------------------------------------------


def _is_url(path: epath.Path) -> bool:
  return re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*://', str(path)) is not None


def _load(path: epath.Path) -> Optional[tuple[str, dict[str, Any]]]:
  """``(text, info)`` of the lock file, or None if there is none. An unreadable file
  (being written on a filesystem without hard links) counts as written now."""
  try:
    text = path.read_bytes().decode('utf-8', errors='replace')
    stamp = path.stat().mtime
  except FileNotFoundError:
    return None
  try:
    info = json.loads(text)
  except ValueError:
    info = None
  if not isinstance(info, dict):
    info = {'host': '?', 'pid': '?', 'started': '?', 'heartbeat': stamp, 'unreadable': text[:80]}
  return text, info


def _create(path: epath.Path, text: str) -> bool:
  """Creates ``path`` holding ``text`` if it does not exist; False if it does."""
  if _is_url(path):
    if path.exists():
      return False
    with storage.writing(path):
      path.write_text(text)
    found = _load(path)
    return found is not None and found[0] == text
  tmp = path.parent / f'.{path.name}.tmp-{uuid.uuid4().hex}'
  try:
    with storage.writing(path):
      tmp.write_text(text)
      try:
        os.link(tmp, path)
        return True
      except FileExistsError:
        return False
      except OSError as e:
        if e.errno not in _NO_HARD_LINKS:
          raise
      try:  # no hard links here (an object-store mount): exclusive create
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
      except FileExistsError:
        return False
      try:
        with os.fdopen(fd, 'w') as f:
          f.write(text)
      except OSError:
        path.unlink()  # an empty lock would hold the workdir until it is stale
        raise
      return True
  finally:
    with contextlib.suppress(OSError):
      tmp.unlink()


def _move_aside(path: epath.Path, seen: str) -> None:
  """Removes the stale lock ``path`` whose text was ``seen``; if it changed since (a
  heartbeat, or another launch took it over first), puts it back."""
  aside = path.parent / f'.{path.name}.stale-{uuid.uuid4().hex}'
  try:
    path.rename(aside)
  except FileNotFoundError:
    return
  try:
    if aside.read_text() != seen:
      _create(path, aside.read_text())  # fails (False) if yet another lock is there
  finally:
    with contextlib.suppress(OSError):
      aside.unlink()


@dataclasses.dataclass
class RunLock:
  """The run's hold on ``workdir`` (on every process; only process 0 has the file)."""

  workdir: epath.Path
  run_id: str
  stale_seconds: float
  owner: bool  # process 0: created the file, heartbeats and removes it
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
  _thread: Optional[threading.Thread] = None

  @property
  def path(self) -> epath.Path:
    return self.workdir / LOCK_FILE

  def _text(self) -> str:
    return json.dumps({**self.info, 'heartbeat': time.time()}, indent=1)

  def _heartbeat(self) -> None:
    interval = max(0.1, min(60.0, self.stale_seconds / 10))
    while not self._stop.wait(interval):
      found = _load(self.path)
      if found is None or found[1].get('run_id') != self.run_id:
        return  # lost: check() says so at the next step that writes
      text = self._text()
      try:
        storage.write_atomic(self.path, text)
      except OSError as e:
        if getattr(e.__cause__ or e, 'errno', None) in _NO_SPACE:
          continue  # a full disk: try again next time
        with contextlib.suppress(OSError):  # no rename here (an object-store mount)
          self.path.write_text(text)

  def _lost_to(self) -> Optional[dict[str, Any]]:
    found = _load(self.path)
    if found is None:  # deleted under the run: take it again if nobody else has
      if _create(self.path, self._text()):
        return None
      found = _load(self.path) or ('', {})
    return None if found[1].get('run_id') == self.run_id else found[1]

  def check(self) -> None:
    """Raises WorkdirLockedError on every process if another run holds the workdir
    now; every process must call it at the same steps."""
    holder = self._lost_to() if self.owner else None
    lost = holder is not None
    if jax.process_count() > 1:
      lost = bool(multihost_utils.broadcast_one_to_all(np.int32(lost)))
    if lost:
      who = describe(holder) if holder else 'see process 0'
      raise WorkdirLockedError(
          f'{self.workdir}: this run (run {self.run_id[:8]}) lost its lock {self.path} to '
          f'another run ({who}); stopped without writing more. Two runs must not share a '
          'workdir: stop one, then rerun the command to resume from the last checkpoint.'
      )

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self.owner:
      self.owner = False
      found = _load(self.path)
      if found is not None and found[1].get('run_id') == self.run_id:
        with contextlib.suppress(FileNotFoundError):
          self.path.unlink()


def _refusal(
    workdir: epath.Path, path: epath.Path, info: dict[str, Any], stale_seconds: float
) -> str:
  message = (
      f'{workdir} is in use by another run: {describe(info)} (run '
      f'{str(info.get("run_id", "?"))[:8]}, {info.get("processes", "?")} process(es); lock '
      f'{path}). Stop that run first, or use another --workdir.'
  )
  if 'heartbeat' in info and info.get('host') != socket.gethostname():
    age = time.time() - float(info['heartbeat'])
    message += (
        f' Its last heartbeat was {age:.0f} s ago; if it is dead, delete {path} or rerun '
        f'after it is {stale_seconds:g} s old (config.lock_stale_seconds).'
    )
  return message


def _acquire(workdir: epath.Path, run_id: str, stale_seconds: float) -> RunLock:
  """Process 0: creates the lock, taking over a stale one; WorkdirLockedError if live."""
  lock = RunLock(workdir, run_id, stale_seconds, owner=True)
  lock.info = dict(
      run_id=run_id,
      **_this_process(),
      started=time.strftime('%Y-%m-%d %H:%M:%S %Z'),
      processes=jax.process_count(),
  )
  path, taken_from = lock.path, None
  for _ in range(_TAKEOVER_ATTEMPTS):
    if _create(path, lock._text()):  # pylint: disable=protected-access
      if taken_from is not None:
        warnings.warn(
            f'Took over {path} from a run that is not running ({taken_from[1]}): '
            f'{describe(taken_from[0])} (run {str(taken_from[0].get("run_id", "?"))[:8]}).'
        )
      return lock
    found = _load(path)
    if found is None:
      continue
    text, info = found
    reason = stale_reason(info, stale_seconds, now=time.time())
    if reason is None:
      raise WorkdirLockedError(_refusal(workdir, path, info, stale_seconds))
    taken_from = (info, reason)
    _move_aside(path, text)
  raise WorkdirLockedError(
      f'{workdir}: could not take {path}: other launches kept taking it; is the same command '
      'being started in a loop?'
  )


@contextlib.contextmanager
def hold(
    workdir: epath.PathLike, stale_seconds: float = DEFAULT_STALE_SECONDS
) -> Iterator[RunLock]:
  """Holds ``workdir`` for a run (every process calls it; process 0 takes the lock).

  Raises:
    WorkdirLockedError: another live run holds ``workdir`` (on every process).
    WriteError: the lock file cannot be written (process 0).
  """
  workdir = epath.Path(workdir)
  run_id, status, failure, lock = uuid.uuid4().hex, 0, None, None
  if jax.process_index() == 0:
    try:
      lock = _acquire(workdir, run_id, stale_seconds)
    except WorkdirLockedError as e:
      status, failure = 1, e
    except BaseException as e:  # pylint: disable=broad-except  # tell the others, then raise
      status, failure = 2, e
  if jax.process_count() > 1:
    message = np.zeros(17, np.int32)
    message[0], message[1:] = status, np.frombuffer(bytes.fromhex(run_id), np.uint8)
    message = np.asarray(multihost_utils.broadcast_one_to_all(message))
    status, run_id = int(message[0]), bytes(message[1:].astype(np.uint8)).hex()
  if failure is not None:
    raise failure
  if status:
    found = _load(workdir / LOCK_FILE) if status == 1 else None
    raise WorkdirLockedError(
        _refusal(workdir, workdir / LOCK_FILE, found[1], stale_seconds)
        if found
        else f'{workdir}: process 0 could not take {workdir / LOCK_FILE}; see its message.'
    )
  if lock is None:
    lock = RunLock(workdir, run_id, stale_seconds, owner=False)
  else:
    lock._thread = threading.Thread(  # pylint: disable=protected-access
        target=lock._heartbeat, name='contextpool_jax run.lock heartbeat', daemon=True  # pylint: disable=protected-access
    )
    lock._thread.start()  # pylint: disable=protected-access
  try:
    yield lock
  finally:
    lock.release()
