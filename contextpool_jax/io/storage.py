"""Writing a run's files: a write that fails is one clear error, never a hang or a torn file.

A full disk (ENOSPC), a file-size limit (EFBIG), a quota (EDQUOT), a read-only
or vanished directory: every writer of the run raises
:class:`~contextpool_jax.base.errors.WriteError` naming the path and the cause
(``cannot write /w/metrics.jsonl: [Errno 28] No space left on device``).

* :func:`writing` turns an ``OSError`` raised inside it (or an orbax /
  tensorstore error caused by one: :func:`io_cause`) into a WriteError naming
  a path; other errors (a bug) keep their traceback.
* :func:`write_atomic`: a small file (``config.json``, the run lock, an
  export) goes to a temporary name and is renamed over the old one, so a
  reader never sees half a file and a failed write leaves the old file.
* :class:`JsonLines` (``metrics.jsonl``) and :class:`EventFile` (TensorBoard)
  write synchronously from the loop, so an error is raised where it happens.
  (tensorboardX's ``SummaryWriter`` writes from a thread: on a write error that
  thread dies with a traceback and the loop then blocks forever on its full
  queue.)
* :func:`resume_metrics` cuts ``metrics.jsonl`` back to the step a run resumes
  from, so the lines a killed run logged after its last checkpoint (or a line
  torn by a full disk) are neither duplicated nor kept half.
* :func:`quiet_orbax_io_errors`: orbax logs a traceback for each failed write
  before raising it; the trainer reports the failure itself, in one line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
import uuid
from typing import Any, Iterator, Optional

from etils import epath

from contextpool_jax.base.errors import WriteError

_ERRNO_IN_TEXT = (  # an errno quoted in a message: python, tensorstore (in orbax's errors)
    re.compile(r'\[Errno (\d+)\]'),
    re.compile(r"\[os_error_code='?(\d+)'?\]"),
    re.compile(r'\[OS error (\d+)'),
)


def _chain(error: BaseException) -> Iterator[BaseException]:
  """``error`` and every exception it was raised from or during (and a group's members)."""
  seen, todo = set(), [error]
  while todo:
    e = todo.pop(0)
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    yield e
    todo += [e.__cause__, e.__context__, *getattr(e, 'exceptions', ())]


def io_cause(error: BaseException) -> Optional[str]:
  """``'[Errno 28] No space left on device'`` if an operating-system error is behind
  ``error`` (an ``OSError`` with an errno in its chain, or one quoted in an orbax or
  tensorstore message), else None."""
  for e in _chain(error):
    if isinstance(e, OSError) and e.errno:
      return f'[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}'
  for e in _chain(error):
    for pattern in _ERRNO_IN_TEXT:
      match = pattern.search(str(e))
      if match:
        return f'[Errno {match.group(1)}] {os.strerror(int(match.group(1)))}'
  return None


@contextlib.contextmanager
def writing(path: os.PathLike | str) -> Iterator[None]:
  """Raises a failed write inside as ``WriteError(path, cause)``; other errors pass."""
  try:
    yield
  except WriteError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # orbax wraps OSErrors
    cause = io_cause(e)
    if cause is None:
      raise
    raise WriteError(path, cause) from e


def write_atomic(path: epath.PathLike, data: str | bytes) -> epath.Path:
  """Writes ``data`` to ``path`` through a unique temporary file renamed over it: a
  reader sees the old or the new file, never a part; on a failed write the old file
  stays, the temporary one is removed, and the WriteError names ``path``."""
  path = epath.Path(path)
  tmp = path.parent / f'.{path.name}.tmp-{uuid.uuid4().hex}'
  try:
    with writing(path):
      if isinstance(data, bytes):
        tmp.write_bytes(data)
      else:
        tmp.write_text(data)
      return tmp.replace(path)
  finally:
    with contextlib.suppress(OSError):
      if tmp.exists():
        tmp.unlink()


def _is_record(line: bytes, step: int) -> bool:
  try:
    record = json.loads(line)
  except ValueError:
    return False
  return isinstance(record, dict) and isinstance(record.get('step'), int) and record['step'] <= step


def resume_metrics(path: epath.PathLike, step: int) -> int:
  """Keeps the complete lines of ``path`` (``metrics.jsonl``) logged at steps <= ``step``
  (the step the run resumes from; 0: a fresh start) and returns how many it removed:
  lines of steps the previous run logged after its last checkpoint (the resumed run
  logs them again) and a last line torn by a kill or a full disk."""
  path = epath.Path(path)
  if not path.exists():
    return 0
  with writing(path):
    data = path.read_bytes()
  *lines, tail = data.split(b'\n')  # ``tail``: after the last newline (a torn line or b'')
  kept = [line for line in lines if _is_record(line, step)]
  removed = len(lines) - len(kept) + (tail != b'')
  if removed:
    write_atomic(path, ''.join(line.decode() + '\n' for line in kept))
  return removed


class JsonLines:
  """Appends one JSON line per record to ``path``; a line is written whole or the
  write raises WriteError (a torn line is cut off again, as far as the disk lets)."""

  def __init__(self, path: epath.PathLike):
    self.path = epath.Path(path)
    self._fd: Optional[int] = None
    with writing(self.path):
      self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

  def write(self, record: dict[str, Any]) -> None:
    fd = self._fd
    if fd is None:
      raise ValueError(f'{self.path}: written after close().')
    data = memoryview((json.dumps(record) + '\n').encode())
    size = os.fstat(fd).st_size
    with writing(self.path):
      try:
        while data:
          data = data[os.write(fd, data) :]
      except OSError:
        with contextlib.suppress(OSError):
          os.ftruncate(fd, size)
        raise

  def close(self) -> None:
    if self._fd is not None:
      fd, self._fd = self._fd, None
      with writing(self.path):
        os.close(fd)


class EventFile:
  """A TensorBoard event file written from the caller's thread: :meth:`flush` raises
  WriteError where the disk fails. tensorboardX's public ``RecordWriter`` writes the
  records (TFRecord framing and checksums) of ``Event`` protos holding the summaries of
  ``tensorboardX.summary``. (Its ``SummaryWriter`` writes from a thread, which a failed
  write kills, and then blocks the loop on its full queue: tests/io/test_storage.py shows it.)

  ``purge_from``: a rerun of a workdir starts its file with a ``SessionLog.START`` at
  that step, which makes TensorBoard drop the events a killed run logged from that
  step on (the resumed run logs those steps again); tensorboardX's ``purge_step``.
  """

  def __init__(self, directory: epath.PathLike, purge_from: Optional[int] = None):
    # tensorboardX comes with the [train] extra: the rest of this module (write_atomic, the
    # exports') is the core install's.
    import tensorboardX  # pylint: disable=g-import-not-at-top
    from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

    # event_pb2 is generated protobuf code: its message classes are invisible to a type checker.
    self._pb: Any = event_pb2
    directory = epath.Path(directory)
    with writing(directory):
      directory.mkdir(parents=True, exist_ok=True)
    name = f'events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}'
    self.path = directory / name
    self._failed, self._records = False, None
    with self._failing():
      self._records = tensorboardX.RecordWriter(os.fspath(self.path))
    self._write(self._pb.Event(wall_time=time.time(), file_version='brain.Event:2'))
    if purge_from is not None:
      start = self._pb.SessionLog(status=self._pb.SessionLog.START)
      self._write(self._pb.Event(wall_time=time.time(), step=purge_from, session_log=start))
    self.flush()

  def add(self, step: int, summary: Any) -> None:
    """Adds a ``Summary`` proto (``tensorboardX.summary.scalar``/``histogram``) at ``step``."""
    self._write(self._pb.Event(wall_time=time.time(), step=step, summary=summary))

  def _open(self) -> Any:
    if self._records is None:
      raise ValueError(f'{self.path}: written after close().')
    return self._records

  def _write(self, event: Any) -> None:
    records = self._open()
    with self._failing():
      records.write(event.SerializeToString())

  def flush(self) -> None:
    """Writes the buffered events to the file (and fsyncs it)."""
    records = self._open()
    with self._failing():
      records.flush()

  @contextlib.contextmanager
  def _failing(self):
    try:
      with writing(self.path):
        yield
    except WriteError:
      self._failed = True
      raise

  def close(self) -> None:
    """Closes the file; after a failed write, without raising again."""
    if self._records is not None:
      records, self._records = self._records, None
      try:
        with writing(self.path):
          records.close()
      except WriteError:
        if not self._failed:
          raise


def _in_orbax(filename: str) -> bool:
  return f'{os.sep}orbax{os.sep}' in filename


class _DropOrbaxIOErrors(logging.Filter):
  """Drops the ERROR log records of a failed orbax write: orbax's own, and asyncio's
  'Future exception was never retrieved' for the failed save's other writes."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    error = record.exc_info[1] if record.exc_info else None
    frames = traceback.extract_tb(error.__traceback__) if error is not None else []
    if not (_in_orbax(record.pathname) or any(_in_orbax(f.filename) for f in frames)):
      return True
    return io_cause(error if error is not None else Exception(record.getMessage())) is None


def _stray_orbax_error(unraisable: Any) -> bool:
  """An error left behind by an orbax save that failed: its other writes finishing
  after orbax closed their event loop, or its coroutines closed at exit."""
  error, where = unraisable.exc_value, unraisable.object
  if isinstance(error, RuntimeError) and str(error) == 'Event loop is closed':
    return True
  code = getattr(where, 'cr_code', None)
  return code is not None and _in_orbax(code.co_filename)


@contextlib.contextmanager
def quiet_orbax_io_errors() -> Iterator[None]:
  """Inside, orbax's reports of a failed write are not printed: its ERROR logs
  (tracebacks) and the errors the failed save's other writes then raise in its
  threads (dozens of tracebacks, from inside the run and after it: so if a
  WriteError leaves, they stay hidden for the rest of the process). The
  WriteError says it all."""
  loggers, dropper = [logging.getLogger('absl'), logging.getLogger('asyncio')], _DropOrbaxIOErrors()
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _stray_orbax_error(unraisable):
      previous(unraisable)

  for logger in loggers:
    logger.addFilter(dropper)
  sys.unraisablehook = hook
  try:
    yield
  except WriteError:
    raise  # keep them hidden
  except BaseException:
    _restore(loggers, dropper, hook, previous)
    raise
  _restore(loggers, dropper, hook, previous)


def _restore(loggers, dropper, hook, previous) -> None:
  for logger in loggers:
    logger.removeFilter(dropper)
  if sys.unraisablehook is hook:
    sys.unraisablehook = previous
