"""Shared pytest set-up, applied before JAX is imported.

One persistent compilation cache per run, shared by the workers and subprocesses
(:func:`_share_compilation_cache`).

Tests check the mathematics, not the speed of the generated code, so XLA's CPU
compiler is set for compile speed (:data:`COMPILE_FAST`), and results only
change at float rounding level (the tolerances allow for it). Benchmarks (``python -m
benchmarks``) and users' runs compile with XLA's defaults.
"""

import os
import tempfile

# XLA flags for compile speed: no LLVM optimisation; the program compiled in one piece
# (no codegen threads competing with the other xdist worker); XLA's classic loop emitters
# instead of its MLIR fusion emitters, which build an MLIR pass pipeline per fusion (on
# the decoding, Transformer and blockwise ContextPool tests: XLA compile 656 -> 288 s,
# the three files 522 -> 305 s wall). The classic emitters expand scatters into while
# loops, so the optimised HLO differs from users' in how it computes a scatter, not in
# what it computes.
COMPILE_FAST = {
    '--xla_backend_optimization_level': '0',
    '--xla_cpu_parallel_codegen_split_count': '1',
    '--xla_cpu_use_fusion_emitters': 'false',
}


def _set_xla_flags(flags: dict[str, str]) -> None:
  """Adds ``flags`` to ``XLA_FLAGS`` (inherited by the processes the tests start),
  each unless the caller set it already."""
  current = os.environ.get('XLA_FLAGS', '')
  added = [f'{k}={v}' for k, v in flags.items() if k not in current]
  os.environ['XLA_FLAGS'] = ' '.join([current, *added]).strip()


os.environ.setdefault('JAX_PLATFORMS', 'cpu')
_set_xla_flags(COMPILE_FAST)


def _share_compilation_cache() -> bool:
  """Points JAX's persistent compilation cache at a directory of this run, so the
  xdist workers and the processes the tests start (which inherit the environment)
  compile each program once between them instead of once each: most programs
  (a model's init and step at the tests' tiny shapes) recur across workers and
  subprocesses. A cache the caller set (``JAX_COMPILATION_CACHE_DIR``) is used as is.
  Returns whether this process made the directory (and so removes it at the end)."""
  if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    return False
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='contextpool-jax-xla-cache-')
  # Programs compiled in under 0.1 s are not stored: a file each for little gain.
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.1')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
  return True


_OWN_CACHE = _share_compilation_cache()

import importlib
import pathlib
import shutil
import sys

import pytest

pytest_plugins = ['costs']  # what the tests cost (--costs)

REPO = pathlib.Path(__file__).resolve().parents[1]
# `configs/` lives at the repository root (installed as `contextpool_jax.configs`); the tests
# import it as the checkout's package `configs`, as `python train.py` does.
sys.path.insert(0, str(REPO))

# The pages users read: tests/test_readme.py runs their blocks and commands, tests/test_docs.py
# checks their links. README.md first (its default run trains the workdir other pages load).
PAGES = [
    REPO / 'README.md',
    *sorted(p for p in (REPO / 'docs').rglob('*.md') if '_build' not in p.parts),
    REPO / 'CONTRIBUTING.md',
]


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """A small real-text corpus: this repository's first 12 Python sources."""
  root = tmp_path_factory.mktemp('corpus')
  for i, path in enumerate(sorted((REPO / 'contextpool_jax').rglob('*.py'))[:12]):
    (root / f'{i:02d}.txt').write_bytes(path.read_bytes())
  return root


def pytest_unconfigure(config):
  """Removes the run's compilation cache (in the process that made it)."""
  del config
  if _OWN_CACHE:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


# A test that takes longer says why in its docstring (CONTRIBUTING.md, "The tests").
EXPLAIN_SECONDS = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  """Records on the report whether the test function has a docstring (the report,
  unlike the item, reaches the xdist controller that prints the summary)."""
  report = yield
  if call.when == 'call':
    explained = bool(getattr(getattr(item, 'function', None), '__doc__', None))
    report.user_properties.append(('explained', explained))
  return report


def pytest_terminal_summary(terminalreporter):
  """Names every test over ``EXPLAIN_SECONDS`` (set-up, call and tear-down) whose
  function has no docstring saying why it takes that long."""
  seconds, explained = {}, {}
  for reports in terminalreporter.stats.values():
    for r in reports:
      if isinstance(r, pytest.TestReport):
        seconds[r.nodeid] = seconds.get(r.nodeid, 0.0) + r.duration
        explained.update({r.nodeid: v for k, v in r.user_properties if k == 'explained'})
  unexplained = [n for n, t in seconds.items() if t > EXPLAIN_SECONDS and not explained.get(n)]
  if unexplained:
    terminalreporter.section(f'over {EXPLAIN_SECONDS} s without a docstring saying why')
    for n in sorted(unexplained, key=seconds.get, reverse=True):
      terminalreporter.write_line(f'{seconds[n]:7.1f} s  {n}')


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks set here
def pytest_collection_modifyitems(config, items):
  """The tiers, then the order.

  A test marked ``sweep`` (a parametrized sweep over variants) runs its first case
  in the fast tier (``-m "not slow"``); its other cases are marked ``slow``. So the
  fast tier runs every test function at least once, and the full suite every case.

  Slow tests first (a stable sort): with ``-n auto`` the long ones start at once
  on every worker and the quick ones fill in at the end, instead of one worker
  running a long tail alone."""
  del config
  mark_sweep_cases_slow(items)
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


def mark_sweep_cases_slow(items) -> None:
  """Marks ``slow`` every case but the first of each test function marked ``sweep``."""
  first_seen = set()
  for item in items:
    if item.get_closest_marker('sweep') is not None:
      function = item.nodeid.split('[')[0]
      if function in first_seen:
        item.add_marker(pytest.mark.slow)
      first_seen.add(function)


def config_cases() -> list[tuple[str, str]]:
  """``(config name, argument)`` for every argument (``ARGS``) of every config file
  in ``configs/``: the source of truth the config tests parametrize over."""
  cases = []
  for path in sorted((REPO / 'configs').glob('*.py')):
    if 'def get_config' in path.read_text():
      cases += [(path.stem, arg) for arg in importlib.import_module(f'configs.{path.stem}').ARGS]
  return cases


# tests/multi_device/ needs several (fake) devices, fixed when JAX starts:
# tests/test_multi_device.py runs it in a subprocess that sets them.
collect_ignore = [] if os.environ.get('CONTEXTPOOL_MULTI_DEVICE') else ['multi_device']
