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

import sys
import pathlib

# `configs/` lives at the repository root (not in the installed package).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# tests/multi_device/ needs several (fake) devices, fixed when JAX starts:
# tests/test_multi_device.py runs it in a subprocess that sets them.
collect_ignore = [] if os.environ.get('CONTEXTPOOL_MULTI_DEVICE') else ['multi_device']
