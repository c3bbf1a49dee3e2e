"""A ``jax.profiler`` trace of chosen training steps (``config.profile``).

``config.profile``:

* ``num_steps`` (``0``: off, the default): how many steps to trace;
* ``start_step`` (``10``): the first traced step, numbered as ``metrics.jsonl``
  numbers them (step N is the update that completes N steps). A run's first step
  compiles the train step, so a trace never starts on it: a run resumed inside
  the window starts its trace one step later, one resumed after it traces nothing;
* ``all_processes`` (``False``): trace every process, not only process 0.

The trace goes to ``<workdir>/profile/`` (with several processes, process i's
to ``<workdir>/profile/process_<i>/``) in the layout TensorBoard's Profile tab
(XProf) reads: ``plugins/profile/<time>/<host>.xplane.pb``, next to a
``perfetto_trace.json.gz`` for https://ui.perfetto.dev. Each traced step is a
``StepTraceAnnotation`` named ``train`` with its ``step_num``. Before the trace
starts the host waits for the steps in flight, and before it stops for the last
traced step's outputs, so the trace holds exactly those steps' device work (and
whatever the loop does at them: a log step's metrics, an evaluation, a
checkpoint). Profiling changes no value the run computes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator

import jax
from etils import epath

from contextpool_jax.io import config_readers

PROFILE_DIR = 'profile'


@dataclasses.dataclass(frozen=True)
class ProfileSpec:
  start_step: int
  num_steps: int  # 0: off
  all_processes: bool


def resolve_spec(config: Any) -> ProfileSpec:
  """Reads and checks ``config.profile`` (absent: off); ConfigError names a bad field."""
  return ProfileSpec(
      start_step=config_readers.read_int(config, 'profile.start_step', minimum=1, default=10),
      num_steps=config_readers.read_int(config, 'profile.num_steps', minimum=0, default=0),
      all_processes=config_readers.read_bool(config, 'profile.all_processes', default=False),
  )


def trace_dir(workdir: epath.PathLike, process_index: int, process_count: int) -> epath.Path:
  """Where process ``process_index`` writes its trace."""
  root = epath.Path(workdir) / PROFILE_DIR
  return root if process_count == 1 else root / f'process_{process_index}'


class StepProfiler:
  """Starts and stops the trace around the steps of ``spec`` this run executes.

  In the loop, for the step that will complete ``n`` steps::

    with profiler.step(n, state):        # waits for ``state`` and starts, at the first
      state, sums = train_step(...)
    profiler.stepped(n, (state, sums))   # waits for them and stops, at the last
  """

  def __init__(self, spec: ProfileSpec, workdir: epath.PathLike, start: int, total: int):
    process, count = jax.process_index(), jax.process_count()
    first = max(spec.start_step, start + 2)  # this run's first step (start + 1) compiles
    last = min(spec.start_step + spec.num_steps - 1, total)
    on = spec.num_steps > 0 and first <= last and (process == 0 or spec.all_processes)
    self.window = (first, last) if on else None
    self.log_dir = trace_dir(workdir, process, count)
    self.is_main = process == 0
    self.tracing = False

  @contextlib.contextmanager
  def step(self, n: int, previous: Any) -> Iterator[None]:
    """Around the call of step ``n``; ``previous``: the outputs of the step before."""
    if self.window is not None and n == self.window[0]:
      jax.block_until_ready(previous)  # the steps before are not in the trace
      self.log_dir.mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(str(self.log_dir), create_perfetto_trace=True)
      self.tracing = True
    if not self.tracing:
      yield
      return
    with jax.profiler.StepTraceAnnotation('train', step_num=n):
      yield

  def stepped(self, n: int, outputs: Any) -> None:
    """After the call of step ``n``: at the window's last step, waits for ``outputs``
    and writes the trace."""
    if self.tracing and self.window is not None and n == self.window[1]:
      jax.block_until_ready(outputs)
      self._stop()
      if self.is_main:
        import tqdm  # pylint: disable=g-import-not-at-top  # beside the progress bar

        first, last = self.window
        tqdm.tqdm.write(f'step {n}: profile of steps {first}-{last} written to {self.log_dir}')

  def _stop(self) -> None:
    self.tracing = False
    jax.profiler.stop_trace()

  def close(self) -> None:
    """Stops a trace still running (the loop ended inside the window)."""
    if self.tracing:
      self._stop()
