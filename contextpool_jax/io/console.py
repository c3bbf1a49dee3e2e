"""What a training run prints: one line per event; the libraries' chatter only on request.

``train.py`` calls :func:`set_quiet` once, after its flags are parsed: quiet
unless the command line passes absl's ``--verbosity`` (``-v``). Quiet means

* TFDS draws no progress bars (``tfds.disable_progress_bar()``: while it
  prepares a dataset it would print a bare bar per split and per shuffle);
* the TFDS warnings a user of this project cannot act on are dropped
  (:data:`QUIET_TFDS_WARNINGS`, a filter on absl's logger): every ``local_text``
  corpus is a "custom data configuration", logged each time a split is opened,
  and a dataset prepared for the first time has "no dataset_info.json" yet;
* TFDS's own lines around preparing a dataset (printed to stdout, with sizes
  it does not know for our builders) are replaced by ours
  (:func:`library_output` around the call that prepares);
* a library's INFO logs about its own housekeeping are dropped
  (:func:`library_logs`: MLflow creating the tables of its SQLite store).

Any other warning still shows. With ``--verbosity`` (e.g. ``--verbosity=0``
or ``-v 1``) nothing is dropped: absl's level is the one asked for and TFDS
prints as it does by default.

Library code (notebooks, tests that call the trainer directly) is not quiet
unless it calls :func:`set_quiet` itself.

The training loop's progress (:class:`Progress`) is a bar on a terminal and one plain line per
log step where stdout is a file or a pipe (a run redirected into a log file): a log holds no
redrawn frames.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from typing import Iterator, TextIO

# TFDS warnings (their unformatted message templates) that say nothing a user can act on.
QUIET_TFDS_WARNINGS = (
    'Using custom data configuration',  # every local_text corpus: its files are the config
    'Variant folder %s has no %s',  # a dataset not prepared yet (it is about to be)
)

_state = {'quiet': False}


class _DropTfdsChatter(logging.Filter):
  """Drops :data:`QUIET_TFDS_WARNINGS` (and TFDS's INFO logs) logged through absl."""

  def filter(self, record: logging.LogRecord) -> bool:
    if f'{os.sep}tensorflow_datasets{os.sep}' not in record.pathname:
      return True
    if record.levelno < logging.WARNING:
      return False
    return not (record.levelno < logging.ERROR and str(record.msg).startswith(QUIET_TFDS_WARNINGS))


_FILTER = _DropTfdsChatter()


def set_quiet(quiet: bool) -> None:
  """Quiet (or not) TFDS's progress bars, its non-actionable warnings and its prints
  (nothing to do for TFDS where it is not installed: the core install, whose commands
  then name the extra they need)."""
  _state['quiet'] = quiet
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ModuleNotFoundError:
    return
  absl_logger = logging.getLogger('absl')
  if quiet:
    tfds.disable_progress_bar()
    if _FILTER not in absl_logger.filters:
      absl_logger.addFilter(_FILTER)
  else:
    tfds.enable_progress_bar()
    absl_logger.removeFilter(_FILTER)


@contextlib.contextmanager
def library_output() -> Iterator[None]:
  """Inside, what a library prints to stdout is dropped when quiet (TFDS announces
  the dataset it prepares with sizes our builders do not know, then that it is
  done); our own line says it instead. Errors are raised as usual."""
  if not _state['quiet']:
    yield
    return
  with contextlib.redirect_stdout(io.StringIO()):
    yield


@contextlib.contextmanager
def library_logs(*names: str) -> Iterator[None]:
  """Inside, the named loggers drop their INFO and DEBUG records when quiet (a
  library announcing its own housekeeping, e.g. MLflow creating its tables);
  warnings and errors still show."""
  if not _state['quiet']:
    yield
    return
  loggers = [logging.getLogger(name) for name in names]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    logger.setLevel(max(logger.level, logging.WARNING))
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)


def event(message: str) -> None:
  """One line on the console (and nothing else): an event of the run."""
  print(message, flush=True)


class Progress:
  """The training loop's progress from step ``start`` to ``total``.

  Where stderr is a terminal, tqdm's bar there (steps/s, time left) with the last logged loss
  beside it. Where stdout is not a terminal (a run redirected into a log file), one line per
  log step in it, ``step 50/500: loss 2.1234, 1.26 steps/s, 05:57 left`` (the rate of the
  steps since the last log): a file holds no bar's redrawn frames, and a terminal keeps its
  bar. Disabled (``config.progress_bar=False``, or not the first process), neither.
  :meth:`write` prints an event line to stdout in every case (above the bar).
  """

  def __init__(
      self,
      start: int,
      total: int,
      enabled: bool,
      out: TextIO | None = None,
      err: TextIO | None = None,
  ):
    import tqdm  # pylint: disable=g-import-not-at-top

    self.out = sys.stdout if out is None else out
    bar_file: TextIO = sys.stderr if err is None else err
    self.total = total
    self.lines = enabled and not self.out.isatty()
    self.bar = tqdm.tqdm(
        total=total,
        initial=start,
        disable=not (enabled and bar_file.isatty()),
        unit='step',
        dynamic_ncols=True,
        mininterval=2.0,
        smoothing=0.1,
        file=bar_file,
    )

  def write(self, message: str) -> None:
    self.bar.write(message, file=self.out)

  def update(self, steps: int = 1) -> None:
    self.bar.update(steps)

  def logged(self, step: int, loss: float, steps_per_sec: float) -> None:
    """A log step's loss and rate: beside the bar, and a line of its own off a terminal."""
    self.bar.set_postfix(loss=f'{loss:.4f}', refresh=False)
    if self.lines:
      left = self.bar.format_interval((self.total - step) / max(steps_per_sec, 1e-9))
      self.write(
          f'step {step}/{self.total}: loss {loss:.4f}, {steps_per_sec:.2f} steps/s, {left} left'
      )

  def close(self) -> None:
    self.bar.close()
