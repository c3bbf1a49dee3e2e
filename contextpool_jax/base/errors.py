"""The project's own error types, shared by every layer of the package.

Every error a user can act on from its message derives from
:class:`ContextPoolJaxError` (and from the built-in type it always was, e.g.
``ValueError`` for :class:`ConfigError`, so existing ``except`` clauses keep
working). ``train.py`` and the sampling command line catch that one class and
print the message as one line; any other exception (a shape bug in a module you
edited, a JAX error) keeps its traceback.

:class:`ConfigError` marks a bad configuration value (a module field, a config
entry): its message names the field, the value and what is allowed. The other
errors are defined here too, next to their base, and re-exported by the modules
that raise them (``workdirs.WorkdirError``, ``training.checkpoints.CheckpointError``,
``training.trainer.NonFiniteLossError``, ``data.DatasetNotFoundError``).
"""

from __future__ import annotations

import os


class ContextPoolJaxError(Exception):
  """The base of every user-facing error of contextpool_jax: its message is complete
  in one line (what, where, and what to do)."""


class ConfigError(ContextPoolJaxError, ValueError):
  """A configuration value is not allowed; the message names field, value and choices."""


class DataError(ContextPoolJaxError, ValueError):
  """The data a config points at exists but cannot be used (binary, too short, empty
  split); the message names the setting and the file or split."""


class WriteError(ContextPoolJaxError, OSError):
  """A file of a run could not be written: a full disk, a file-size limit, a read-only
  or vanished directory. The message names the path and the cause (``cannot write
  PATH: [Errno 28] No space left on device``) and, from the trainer, the checkpoint a
  rerun resumes from."""

  def __init__(self, path: os.PathLike | str, cause: str, hint: str = ''):
    super().__init__(f'cannot write {path}: {cause}')
    self.path, self.cause, self.hint = str(path), cause, hint

  def __str__(self) -> str:
    return f'cannot write {self.path}: {self.cause}' + (f'. {self.hint}' if self.hint else '')


class WorkdirLockedError(ContextPoolJaxError, RuntimeError):
  """Another live run holds the workdir (``<workdir>/run.lock``); the message names the
  workdir and the holder (host, process id, start time)."""


class ArgumentError(ContextPoolJaxError, ValueError):
  """A function argument (not a config entry) is not allowed; the message names the
  argument, the value and what is expected (:func:`contextpool_jax.base.checks.check_argument`)."""


class DatasetNotFoundError(ContextPoolJaxError, FileNotFoundError):
  """A dataset is not prepared; the message says how to prepare it."""


class WorkdirError(ContextPoolJaxError, FileNotFoundError):
  """A workdir (or export) is missing, incomplete, or has no such step; the message says
  which directory and what it holds."""


class CheckpointError(ContextPoolJaxError, RuntimeError):
  """A workdir's checkpoints cannot be used; the message says which and why."""


class NonFiniteLossError(ContextPoolJaxError, FloatingPointError):
  """Training produced a NaN/inf loss or gradient."""
