r"""Cost tables of the papers, measured side by side: ``python -m benchmarks``.

For every row of every table: parameters, FLOPs of one compiled training step
(forward + backward + optimizer update), its temp and total memory as XLA
plans it, and the median step time after warm-up -- each absolute and
relative to the table's baseline row, next to the papers' reported numbers.

  python -m benchmarks --quick                  # CPU-sized shapes, minutes
  python -m benchmarks                          # the papers' shapes (GPU/TPU)
  python -m benchmarks --tables=contextpool_nmt,area --repeats=20
  python -m benchmarks --notiming               # compile-only: params, FLOPs, memory
  python -m benchmarks --quick --sizes=nmt_layers=6,vit_layers=12

Tables: contextpool (= contextpool_nmt, contextpool_vit, contextpool_resnet),
area, lambda (see ``benchmarks/tables.py``). Writes ``<out>/benchmarks.md``
and ``<out>/benchmarks.csv``.
"""

from __future__ import annotations

import pathlib

from absl import app
from absl import flags

_QUICK = flags.DEFINE_bool(
    'quick', False, 'CPU-sized shapes (tables.QUICK) instead of the ' "papers' (tables.FULL)."
)
_TABLES = flags.DEFINE_list(
    'tables',
    ['contextpool', 'area', 'lambda'],
    'Tables to run: contextpool, contextpool_nmt, contextpool_vit, '
    'contextpool_resnet, area, lambda.',
)
_OUT = flags.DEFINE_string(
    'out',
    str(pathlib.Path(__file__).resolve().parent / 'results'),
    'Output directory for benchmarks.md and benchmarks.csv.',
)
_ALL_ROWS = flags.DEFINE_bool(
    'all_rows',
    False,
    'With --quick, also the rows only run at '
    "the papers' shapes by default (the ViT-B/16 ablations, "
    "Table S1's ResNet variants).",
)
_REPEATS = flags.DEFINE_integer(
    'repeats',
    None,
    'Timed steps per row (median reported); ' 'default 10 with --quick, 20 otherwise.',
)
_MIN_REPEATS = flags.DEFINE_integer(
    'min_repeats', 3, 'Fewest timed steps per row when ' '--row_budget_s cuts timing short.'
)
_ROW_BUDGET_S = flags.DEFINE_float(
    'row_budget_s',
    None,
    'Stop timing a row after this many '
    'seconds of timed steps (at least --min_repeats); '
    'default 4 with --quick, unlimited otherwise (0 = '
    'unlimited).',
)
_WARMUP = flags.DEFINE_integer(
    'warmup', None, 'Untimed steps per row before timing; default ' '1 with --quick, 3 otherwise.'
)
_TIMING = flags.DEFINE_bool(
    'timing',
    True,
    'Run the steps to time them; --notiming only '
    'compiles (params, FLOPs and memory at any shape, no device '
    'memory needed).',
)
_SIZES = flags.DEFINE_string(
    'sizes',
    '',
    'Comma-separated overrides of the shapes, e.g. '
    '"nmt_batch=4,nmt_layers=6,dtype=bfloat16" (fields of '
    'tables.Sizes).',
)
_MAX_RUN_GB = flags.DEFINE_float(
    'max_run_gb',
    None,
    'Rows whose compiled step needs more '
    'memory than this are compiled but not run; default 6 on '
    "CPU, 90% of the device's memory elsewhere.",
)
_CP_IMPLEMENTATION = flags.DEFINE_string(
    'cp_implementation',
    '',
    'ContextPool '
    '`implementation` for every CP row (default: the '
    "layer's). Note: XLA counts a while loop's body "
    "once, so GFLOPs of 'blockwise' rows are too low.",
)
_NOTE = flags.DEFINE_string(
    'note', '', 'A note printed under every table header (e.g. ' '"measured under load").'
)
_ALLOW_LOAD = flags.DEFINE_bool(
    'allow_load',
    False,
    'Time rows while other processes load the machine (benchmarks/quiet.py): they are marked '
    'measured_under_load instead of refused.',
)


def main(argv):
  del argv
  from benchmarks import report  # imports JAX
  from benchmarks import tables as tables_lib

  quick = _QUICK.value
  sizes = (tables_lib.QUICK if quick else tables_lib.FULL).replace(_SIZES.value)
  cp_defaults = tables_lib.cp_implementation_defaults(_CP_IMPLEMENTATION.value)
  tables = [tables_lib.TABLES[n](sizes, cp_defaults) for n in tables_lib.resolve(_TABLES.value)]
  max_run_gb = _MAX_RUN_GB.value
  if max_run_gb is None:
    max_run_gb = report.default_max_run_gb()
  budget = _ROW_BUDGET_S.value if _ROW_BUDGET_S.value is not None else (4.0 if quick else 0.0)
  options = report.Options(
      timing=_TIMING.value,
      warmup=_WARMUP.value if _WARMUP.value is not None else (1 if quick else 3),
      repeats=_REPEATS.value if _REPEATS.value is not None else (10 if quick else 20),
      min_repeats=_MIN_REPEATS.value,
      row_budget_s=budget or None,
      max_run_gb=max_run_gb,
      all_rows=_ALL_ROWS.value or not quick,
      note=_NOTE.value,
      allow_load=_ALLOW_LOAD.value,
      mode='--quick shapes' if quick else "the papers' shapes",
  )
  report.run(tables, options, pathlib.Path(_OUT.value), log=lambda s: print(s, flush=True))


if __name__ == '__main__':
  app.run(main)
