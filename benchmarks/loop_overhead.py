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

The run lasts ``2P + L`` steps (550 for the default config: cadence ``P =
max(eval_every, checkpoint_every)`` = 250, log interval ``L`` = 50). The
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

Usage:
  python -m benchmarks.loop_overhead [--config configs/default.py] [--repeats 3]
      [--out benchmarks/results/loop_overhead_cpu.md] [--set dataset.data_dir=/tmp/tfds ...]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import ml_collections

CANDIDATES = ('bare', 'loop', 'loop+eval+ckpt')


def load_config(spec: str) -> ml_collections.ConfigDict:
  """``path[:argument]`` of a config file, as ``train.py --config`` takes it."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_loop_overhead_config', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def override(config: ml_collections.ConfigDict, assignment: str) -> None:
  """``key.path=value`` (a Python literal, or a plain string) set on ``config``."""
  key, _, text = assignment.partition('=')
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  *parents, leaf = key.split('.')
  target = config
  for parent in parents:
    target = target[parent]
  target[leaf] = value


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


def loop_rates(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict[str, float]:
  """``train_and_evaluate``'s steps/s over both windows of one run in a fresh ``workdir``."""
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top

  result = trainer.train_and_evaluate(run_config(config), str(workdir))
  history, log_every = result['train_history'], config.log_every_steps
  return {
      name: window_rate(history, log_every, *window) for name, window in windows(config).items()
  }


class BareStep:
  """The trainer's compiled step on batches held on the devices (built once)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: pathlib.Path, steps: int):
    import jax  # pylint: disable=g-import-not-at-top

    from contextpool_jax.training import config_fields  # pylint: disable=g-import-not-at-top
    from contextpool_jax.training import sharding, trainer  # pylint: disable=g-import-not-at-top
    from contextpool_jax.training import steps as steps_lib  # pylint: disable=g-import-not-at-top

    config = config_fields.complete(run_config(config))
    run = trainer.validate_config(config)
    setup = trainer._set_up(config, run, workdir)  # pylint: disable=protected-access
    step_fn, self._step, _ = trainer._compile_steps(setup, run)  # pylint: disable=protected-access
    self._state = jax.jit(setup.init_fn, out_shardings=setup.shardings)(setup.init_rng)
    self._batches = [
        sharding.put_batch(next(setup.train_iter), setup.data_sharding) for _ in range(steps)
    ]
    self._zeros = steps_lib.zero_sums(step_fn, self._state, self._batches[0], setup.replicated)
    self._block = jax.block_until_ready
    self.rate()  # compiles and warms up

  def rate(self) -> float:
    """Steps per second of one pass over the held batches."""
    state, sums = self._state, self._zeros
    self._block(state)
    start = time.perf_counter()
    for batch in self._batches:
      state, sums = self._step(state, batch, sums)
    self._block((state, sums))
    seconds = time.perf_counter() - start
    self._state = state  # donated: the next pass continues from here
    return len(self._batches) / seconds


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
  for r in range(repeats):
    times['bare'].append(bare.rate())
    for name, rate in loop_rates(config, root / f'run_{r}').items():
      times[name].append(rate)
    log(
        f'repeat {r + 1}/{repeats}: '
        + ', '.join(f'{name} {times[name][-1]:.2f} steps/s' for name in CANDIDATES)
    )
  ratio = lambda name: [t / b for t, b in zip(times[name], times['bare'])]
  return {
      'steps_per_sec': times,
      'median': {name: statistics.median(t) for name, t in times.items()},
      'ratio_excluded': statistics.median(ratio('loop')),
      'ratio_included': statistics.median(ratio('loop+eval+ckpt')),
      'ratios_excluded': ratio('loop'),
      'ratios_included': ratio('loop+eval+ckpt'),
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
  per = lambda name: ', '.join(f'{t:.2f}' for t in r['steps_per_sec'][name])
  ratios = {'loop': r['ratios_excluded'], 'loop+eval+ckpt': r['ratios_included']}
  lines += [
      '',
      '| candidate | steps/s (median) | / bare step (median ratio) | steps/s per repeat | '
      'ratios per repeat |',
      '|---|---:|---:|---|---|',
      f'| bare compiled step, batches in memory | {r["median"]["bare"]:.2f} | 1 | {per("bare")} | |',
      f'| train.py loop, evaluation and checkpoints excluded | {r["median"]["loop"]:.2f} | '
      f'{r["ratio_excluded"]:.3f} | {per("loop")} | '
      + ', '.join(f'{x:.3f}' for x in ratios['loop'])
      + ' |',
      f'| train.py loop, evaluation and checkpoints every {b} steps | '
      f'{r["median"]["loop+eval+ckpt"]:.2f} | {r["ratio_included"]:.3f} | '
      f'{per("loop+eval+ckpt")} | '
      + ', '.join(f'{x:.3f}' for x in ratios['loop+eval+ckpt'])
      + ' |',
  ]
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
