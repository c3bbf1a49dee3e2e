"""Shared pytest set-up, applied before JAX is imported.

One persistent compilation cache per run, shared by the workers and subprocesses
(:func:`_share_compilation_cache`); one MLIR context for many lowerings
(:func:`_reuse_mlir_contexts`); with ``-n``, each test file on one worker, the longest
files first (:func:`pytest_xdist_make_scheduler`, :func:`order_by_file_seconds`).

Tests check the mathematics, not the speed of the generated code, so XLA's CPU
compiler is set for compile speed (:data:`COMPILE_FAST`), and results only
change at float rounding level (the tolerances allow for it). Benchmarks (``python -m
benchmarks``) and users' runs compile with XLA's defaults.
"""

import os
import tempfile

# XLA flags for compile speed: no LLVM optimisation; the program compiled in one piece
# (no codegen threads competing with the other xdist worker).
COMPILE_FAST = {
    '--xla_backend_optimization_level': '0',
    '--xla_cpu_parallel_codegen_split_count': '1',
    # The GPU compiler (tests/training/test_aot.py, abstract H100s): no autotuning of its
    # kernels' configurations. The same peak memory (the small LM's and ResNet's steps on
    # h100:8, to the byte) in half the compile time (the ResNet's steps 15.0 -> 7.5 s, side by
    # side on a loaded machine).
    '--xla_gpu_autotune_level': '0',
}
# On the oldest stack (jaxlib 0.10), also XLA's classic loop emitters instead of its MLIR
# fusion emitters, which build an MLIR pass pipeline per fusion (on the decoding, Transformer
# and blockwise ContextPool tests: XLA compile 656 -> 288 s, the three files 522 -> 305 s
# wall). The classic emitters expand scatters into while loops, so the optimised HLO differs
# from users' in how it computes a scatter, not in what it computes. jaxlib 0.11 removed the
# classic emitters and the flag with them (an unknown flag in XLA_FLAGS aborts the process).
CLASSIC_EMITTERS = {'--xla_cpu_use_fusion_emitters': 'false'}


def _jaxlib_version() -> tuple[int, int]:
  """jaxlib's (major, minor), read from its metadata without importing it."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  major, minor = metadata.version('jaxlib').split('.')[:2]
  return int(major), int(minor)


if _jaxlib_version() < (0, 11):
  COMPILE_FAST |= CLASSIC_EMITTERS


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
import json
import pathlib
import shutil
import statistics
import sys

import pytest


def reusing(make, lowerings_per_context: int):
  """``make`` (JAX's ``make_ir_context``) wrapped to return one context for
  ``lowerings_per_context`` calls in turn, then a new one (so none grows without end)."""
  shared = {'context': None, 'uses': 0}

  def reused():
    if shared['uses'] % lowerings_per_context == 0:
      shared['context'] = make()
    shared['uses'] += 1
    return shared['context']

  reused.fresh = make
  return reused


def _reuse_mlir_contexts() -> None:
  """Lowers 500 programs in one MLIR context, then starts a new one (:func:`reusing`).

  JAX makes a fresh context for every program it lowers, loading and registering its
  dialects each time, and the tests lower thousands of small programs (every eager
  operation at a new shape is one); what sharing saves is measured in
  ``benchmarks/results/test_costs.md``. A context only holds the programs' types and
  attributes: the programs are the same (``tests/repo/test_tiers.py``).
  ``CONTEXTPOOL_FRESH_MLIR_CONTEXTS=1`` turns this off."""
  if os.environ.get('CONTEXTPOOL_FRESH_MLIR_CONTEXTS'):
    return
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top

  mlir.make_ir_context = reusing(mlir.make_ir_context, lowerings_per_context=500)


_reuse_mlir_contexts()

pytest_plugins = ['costs']  # what the tests cost (--costs)

REPO = pathlib.Path(__file__).resolve().parents[1]
# `configs/` lives at the repository root (installed as `contextpool_jax.configs`); the tests
# import it as the checkout's package `configs`, as `python train.py` does.
sys.path.insert(0, str(REPO))

# The pages users read: tests/repo/test_readme.py runs their blocks and commands, tests/repo/test_docs.py
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

  The files that took longest first (:func:`order_by_file_seconds`): with ``-n auto``
  the workers start on the long files and the short ones fill in at the end, instead
  of one worker running a long tail alone."""
  del config
  import costs  # pylint: disable=g-import-not-at-top  (the plugin, imported by pytest_plugins)

  mark_sweep_cases_slow(items)
  order_by_file_seconds(items, json.loads(costs.FILE_SECONDS.read_text()))


def order_by_file_seconds(items, seconds: dict[str, float]) -> None:
  """Sorts ``items`` file by file, the files that took most ``seconds`` first (a file
  not in ``seconds`` counts as the median one), each file's tests in their own order."""
  median = statistics.median(seconds.values()) if seconds else 0.0
  file = lambda item: item.nodeid.split('::')[0]
  items.sort(key=lambda item: (-seconds.get(file(item), median), file(item)))


@pytest.hookimpl(optionalhook=True)  # a hook of xdist: runs without it (-p no:xdist) keep working
def pytest_xdist_make_scheduler(config, log):
  """With ``-n``, xdist's ``loadfile`` scheduling in the collection's order: each file's
  tests run on one worker (its module fixtures are set up and its programs compiled
  once), the next file going to the first worker that runs out. xdist's default
  ``load`` scheduling hands each worker a first chunk of a quarter of its share, and
  one worker's chunk held the heaviest tests while the other waited
  (``benchmarks/results/test_costs.md``). An explicit ``--dist`` other than ``load``
  is kept."""
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  if config.getoption('dist') != 'load':
    return None
  config.option.loadscopereorder = False  # the order of pytest_collection_modifyitems
  return LoadFileScheduling(config, log)


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


# tests/training/multi_device/ needs several (fake) devices, fixed when JAX starts:
# tests/training/test_multi_device.py runs it in a subprocess that sets them.
collect_ignore = [] if os.environ.get('CONTEXTPOOL_MULTI_DEVICE') else ['training/multi_device']
