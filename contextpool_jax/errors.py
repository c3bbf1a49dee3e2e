"""The project's own error types, shared by every layer of the package.

:class:`ConfigError` marks a bad configuration value (a module field, a config
entry): its message names the field, the value and what is allowed, and
``train.py`` prints it as one line. Any other exception (a shape bug in a module
you edited, a JAX error) keeps its traceback.
"""

from __future__ import annotations

import os


class ConfigError(ValueError):
  """A configuration value is not allowed; the message names field, value and choices."""


class DataError(ValueError):
  """The data a config points at exists but cannot be used (binary, too short, empty
  split); the message names the setting and the file or split."""


class WriteError(OSError):
  """A file of a run could not be written: a full disk, a file-size limit, a read-only
  or vanished directory. The message names the path and the cause (``cannot write
  PATH: [Errno 28] No space left on device``) and, from the trainer, the checkpoint a
  rerun resumes from."""

  def __init__(self, path: os.PathLike | str, cause: str, hint: str = ''):
    super().__init__(f'cannot write {path}: {cause}')
    self.path, self.cause, self.hint = str(path), cause, hint

  def __str__(self) -> str:
    return f'cannot write {self.path}: {self.cause}' + (f'. {self.hint}' if self.hint else '')


class WorkdirLockedError(RuntimeError):
  """Another live run holds the workdir (``<workdir>/run.lock``); the message names the
  workdir and the holder (host, process id, start time)."""
