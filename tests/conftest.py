"""Shared pytest set-up, applied before JAX is imported.

Tests check the mathematics, not the speed of the generated code, so XLA's
backend optimisation is turned off: compilation is ~2x faster on CPU and
results only change at float rounding level (the tolerances allow for it).
Benchmarks (``python -m benchmarks``) run with the default optimisation.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
_flags = os.environ.get('XLA_FLAGS', '')
if '--xla_backend_optimization_level' not in _flags:
  os.environ['XLA_FLAGS'] = f'{_flags} --xla_backend_optimization_level=0'.strip()

import importlib
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# `configs/` lives at the repository root (not in the installed package).
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
