r"""The training loop's own cost: ``python -m benchmarks.loop_overhead``.

``train.py``'s steady-state steps per second on a config (default
``configs/default.py``) against *the same compiled train step* fed from memory,
side by side in one process; each repeat runs every candidate in turn:

* ``bare``: the trainer's own jitted step (``trainer._compile_steps``: the same
  function, shardings and donation), its batches taken from the run's training
  pipeline and put on the devices beforehand, run back to back with no
  logging, no host reads and no bound on the steps in flight; one
  ``block_until_ready`` at the end.
* ``loop`` and ``loop+eval+ckpt``: ``trainer.train_and_evaluate`` as
  configured (logging, its host reads, the log hooks such as ContextPool's
  pool-size probe, the writers, the progress bar, evaluation and asynchronous
  checkpoints at the config's cadence) in a fresh workdir, one run per repeat
  timed over two windows of its steps.

The run lasts ``2P + L`` steps, with the cadence ``P = max(eval_every,
checkpoint_every)`` and the log interval ``L`` (the default config evaluates
once, at its end: ``P`` = 500 and 1,050 steps; the recorded runs set
``eval_every_steps=250``: 550 steps, an evaluation and a checkpoint every 250). The
loop's time over a window is the sum of the trainer's own log intervals in it
(``train_history``: ``L`` steps over ``steps_per_sec``, the wall time from one
log line to the next, which includes whatever runs after a log line: hooks,
evaluation, checkpoint). Both windows leave out the one-time costs: the train
step's compilation (first interval), the pool-size probe's (it first runs at
step L, so in the second interval), and the first evaluation's and
checkpoint's (at step P, in the interval after it):

* evaluation and checkpoints excluded: steps ``2L + 1 .. P`` (101-250), none
  of either in them;
* included at their cadence: steps ``P + L + 1 .. 2P + L`` (301-550), ``P``
  steps holding exactly one evaluation and one checkpoint (those at step 2P,
  both compiled and set up by then).

The bare step is timed over ``P - 2L`` steps, as many as the first window.
Reported: the medians over the repeats, and each ratio ``loop / bare`` as the
median of the per-repeat ratios (each pairs runs made under the same load).

Both in wall time and in the process's CPU time (``time.process_time``: all
its threads, the host's Python work included). On a shared machine the wall
time of a step moves with the other jobs' load (+-15% between log intervals
of one run here), so a few percent of overhead cannot be read from it; the CPU
time a step costs moves much less. The loop's CPU clock is read by a metric
writer registered for the run (``config.writers`` plus ``'loop_clock'``),
called at each log line right after the trainer's own clock; it misses only
time the process spends idle (the devices waiting for the host), which the
wall-time ratio includes.

Usage:
  python -m benchmarks.loop_overhead [--config configs/default.py] [--repeats 3]
      [--out benchmarks/results/loop_overhead_cpu.md] [--set dataset.data_dir=/tmp/tfds ...]
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import ml_collections

CANDIDATES = ('bare', 'loop', 'loop+eval+ckpt')
CLOCK_WRITER = 'loop_clock'


class ClockWriter:
  """A metric writer that only notes ``(step, wall, cpu)`` at each train log line."""

  marks: list[tuple[int, float, float]] = []  # the current run's, reset per run

  def __init__(self, run):
    del run
    ClockWriter.marks = []

  def scalars(self, step, metrics, prefix):
    del metrics
    if prefix == 'train':
      ClockWriter.marks.append((step, time.perf_counter(), time.process_time()))

  def histograms(self, step, values, prefix):
    del step, values, prefix

  def close(self):
    pass


def _register_clock() -> None:
  from contextpool_jax.training import writers  # pylint: disable=g-import-not-at-top

  writers.register(CLOCK_WRITER, ClockWriter)


def clock_rates(
    marks: list[tuple[int, float, float]], first: int, last: int
) -> tuple[float, float]:
  """(steps per wall second, steps per CPU second) over steps ``first .. last``."""
  at = {step: (wall, cpu) for step, wall, cpu in marks}
  if first - 1 not in at or last not in at:
    raise ValueError(f'no log line at step {first - 1} or {last}: {sorted(at)}')
  (wall0, cpu0), (wall1, cpu1) = at[first - 1], at[last]
  steps = last - first + 1
  return steps / (wall1 - wall0), steps / (cpu1 - cpu0)


def load_config(spec: str) -> ml_collections.ConfigDict:
  """``path[:argument]`` of a config file, as ``train.py --config`` reads it."""
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  return command_line.load_config_file(spec)


def override(config: ml_collections.ConfigDict, assignment: str) -> None:
  """``key.path=value`` (a Python literal, or a plain string) set on ``config``."""
  key, _, text = assignment.partition('=')
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  config.update_from_flattened_dict({key: value})


def period(config: ml_collections.ConfigDict) -> int:
  """The cadence P: evaluation and checkpoint steps repeat every P steps."""
  every = max(config.eval_every_steps, config.checkpoint_every_steps)
  for name in ('eval_every_steps', 'checkpoint_every_steps'):
    if every % config[name]:
      raise ValueError(f'config.{name}={config[name]} does not divide the cadence {every}.')
  if every % config.log_every_steps:
    raise ValueError(
        f'config.log_every_steps={config.log_every_steps} does not divide the cadence {every}: '
        'the timed window must be whole log intervals.'
    )
  return every


def windows(config: ml_collections.ConfigDict) -> dict[str, tuple[int, int]]:
  """The timed windows (first, last step) of a run: module docstring."""
  every, log_every = period(config), config.log_every_steps
  if every < 3 * log_every:
    raise ValueError(
        f'the cadence {every} must be at least 3 log intervals ({log_every} steps): the '
        'window without evaluation starts after the first two.'
    )
  return {
      'loop': (2 * log_every + 1, every),
      'loop+eval+ckpt': (every + log_every + 1, 2 * every + log_every),
  }


def run_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config of a timed run: ``2P + L`` steps, everything else as given."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.num_train_steps = windows(config)['loop+eval+ckpt'][1]
  return config


def window_rate(history: list[dict[str, Any]], log_every: int, first: int, last: int) -> float:
  """Steps per second over steps ``first .. last`` from the trainer's log intervals."""
  seconds = [
      log_every / h['steps_per_sec'] for h in history if first + log_every - 1 <= h['step'] <= last
  ]
  if len(seconds) * log_every != last - first + 1:
    raise ValueError(f'the log lines do not cover steps {first}-{last}: {history}')
  return (last - first + 1) / sum(seconds)


def loop_rates(
    config: ml_collections.ConfigDict, workdir: pathlib.Path
) -> dict[str, tuple[float, float]]:
  """``train_and_evaluate``'s (wall, CPU) steps/s over both windows of one run in a
  fresh ``workdir``; the wall rate from the trainer's own log intervals."""
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top

  _register_clock()
  config = run_config(config)
  config.writers = tuple(config.writers) + (CLOCK_WRITER,)
  result = trainer.train_and_evaluate(config, str(workdir))
  history, log_every = result['train_history'], config.log_every_steps
  return {
      name: (
          window_rate(history, log_every, *window),
          clock_rates(ClockWriter.marks, *window)[1],
      )
      for name, window in windows(config).items()
  }


class BareStep:
  """The trainer's compiled step on batches held on the devices (built once)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: pathlib.Path, steps: int):
    import jax  # pylint: disable=g-import-not-at-top

    from contextpool_jax.training import sharding, spec, trainer  # pylint: disable=g-import-not-at-top
    from contextpool_jax.training import steps as steps_lib  # pylint: disable=g-import-not-at-top

    specs = spec.read(run_config(config))
    setup = trainer._set_up(specs, workdir)  # pylint: disable=protected-access
    step_fn, self._step, _ = trainer._compile_steps(setup, specs.run)  # pylint: disable=protected-access
    self._state = jax.jit(setup.init_fn, out_shardings=setup.shardings)(setup.init_rng)
    self._batches = [
        sharding.put_batch(next(setup.train_iter), setup.data_sharding) for _ in range(steps)
    ]
    self._zeros = steps_lib.zero_sums(step_fn, self._state, self._batches[0], setup.replicated)
    self._block = jax.block_until_ready
    self.rate(warmup=True)  # compiles and warms up

  def rate(self, warmup: bool = False) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second) of one pass over the held batches
    (``warmup``: three steps only)."""
    batches = self._batches[:3] if warmup else self._batches
    state, sums = self._state, self._zeros
    self._block(state)
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
      state, sums = self._step(state, batch, sums)
    self._block((state, sums))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    self._state = state  # donated: the next pass continues from here
    return len(batches) / seconds, len(batches) / cpu_seconds


def measure(
    config: ml_collections.ConfigDict,
    repeats: int,
    root: pathlib.Path,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
  """Steps/s of every candidate per repeat, their medians and the ratios to ``bare``."""
  first, last = windows(config)['loop']
  bare = BareStep(config, root / 'bare', last - first + 1)
  times: dict[str, list[float]] = {name: [] for name in CANDIDATES}
  cpu: dict[str, list[float]] = {name: [] for name in CANDIDATES}
  for r in range(repeats):
    wall_rate, cpu_rate = bare.rate()
    times['bare'].append(wall_rate)
    cpu['bare'].append(cpu_rate)
    for name, (wall_rate, cpu_rate) in loop_rates(config, root / f'run_{r}').items():
      times[name].append(wall_rate)
      cpu[name].append(cpu_rate)
    log(
        f'repeat {r + 1}/{repeats}: '
        + ', '.join(
            f'{name} {times[name][-1]:.3f} steps/s ({cpu[name][-1]:.3f} per CPU second)'
            for name in CANDIDATES
        )
    )
  ratio = lambda d, name: [t / b for t, b in zip(d[name], d['bare'])]
  return {
      'steps_per_sec': times,
      'steps_per_cpu_sec': cpu,
      'median': {name: statistics.median(t) for name, t in times.items()},
      'median_cpu': {name: statistics.median(t) for name, t in cpu.items()},
      'ratio_excluded': statistics.median(ratio(times, 'loop')),
      'ratio_included': statistics.median(ratio(times, 'loop+eval+ckpt')),
      'ratios_excluded': ratio(times, 'loop'),
      'ratios_included': ratio(times, 'loop+eval+ckpt'),
      'cpu_ratio_excluded': statistics.median(ratio(cpu, 'loop')),
      'cpu_ratio_included': statistics.median(ratio(cpu, 'loop+eval+ckpt')),
      'windows': windows(config),
      'bare_steps': last - first + 1,
  }


def markdown(r: dict[str, Any], config_name: str, note: str = '') -> str:
  (a, b), (c, d) = r['windows']['loop'], r['windows']['loop+eval+ckpt']
  lines = [
      f'`{config_name}`, one {d}-step run per repeat: steady state without evaluation and '
      f'checkpoints over steps {a}-{b}, with them at their cadence over steps {c}-{d} (one '
      f'evaluation and one checkpoint, at step {2 * b}); the bare compiled step over '
      f'{r["bare_steps"]} batches held in memory. {len(r["steps_per_sec"]["bare"])} repeats, '
      'each running every candidate in turn; ratios: median of the per-repeat ratios.',
  ]
  if note:
    lines.append(note)
  labels = {
      'bare': 'bare compiled step, batches in memory',
      'loop': 'train.py loop, evaluation and checkpoints excluded',
      'loop+eval+ckpt': f'train.py loop, evaluation and checkpoints every {b} steps',
  }
  ratio = {
      'bare': (1.0, 1.0),
      'loop': (r['ratio_excluded'], r['cpu_ratio_excluded']),
      'loop+eval+ckpt': (r['ratio_included'], r['cpu_ratio_included']),
  }
  per = lambda key, name: ', '.join(f'{t:.3f}' for t in r[key][name])
  lines += [
      '',
      '| candidate | steps/s (median) | / bare (wall) | steps per CPU second (median) | '
      '/ bare (CPU) | steps/s per repeat | steps per CPU second per repeat |',
      '|---|---:|---:|---:|---:|---|---|',
  ]
  for name in CANDIDATES:
    lines.append(
        f'| {labels[name]} | {r["median"][name]:.3f} | {ratio[name][0]:.3f} | '
        f'{r["median_cpu"][name]:.3f} | {ratio[name][1]:.3f} | '
        f'{per("steps_per_sec", name)} | {per("steps_per_cpu_sec", name)} |'
    )
  return '\n'.join(lines) + '\n'


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='configs/default.py', help='path[:argument]')
  parser.add_argument('--set', action='append', default=[], help='key.path=value override')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--workdir', default=None, help='runs go here (default: a temp dir)')
  parser.add_argument('--out', default=None, help='also write the markdown here')
  parser.add_argument('--note', default='', help='a line printed under the header')
  args = parser.parse_args(argv)
  config = load_config(args.config)
  for assignment in args.set:
    override(config, assignment)
  log = lambda s: print(s, file=sys.stderr, flush=True)
  with tempfile.TemporaryDirectory(prefix='loop_overhead_') as tmp:
    root = pathlib.Path(args.workdir or tmp)
    result = measure(config, args.repeats, root, log)
  name = args.config + ''.join(f' --config.{a}' for a in args.set)
  text = markdown(result, name, args.note)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text)
  return result


if __name__ == '__main__':
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  main()
