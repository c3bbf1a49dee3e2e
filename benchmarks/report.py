"""Runs tables (``benchmarks.tables``) and writes them as markdown and CSV."""

from __future__ import annotations

import csv

import dataclasses
import datetime
import os
import pathlib
import platform
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import jax

from benchmarks import harness
from benchmarks import quiet
from benchmarks import tables as tables_lib


@dataclasses.dataclass(frozen=True)
class Options:
  """How rows are measured (see ``python -m benchmarks --help``)."""

  timing: bool = True
  warmup: int = 1
  repeats: int = 10
  min_repeats: int = 3
  row_budget_s: Optional[float] = None
  max_run_gb: Optional[float] = None
  all_rows: bool = True
  note: str = ''
  mode: str = ''
  allow_load: bool = False  # benchmarks/quiet.py: loaded rows marked, not refused


def default_max_run_gb() -> Optional[float]:
  """6 GB on CPU (a shared machine); 90% of the first device's memory elsewhere
  (None if the backend does not say)."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return 6.0
  try:
    limit = (device.memory_stats() or {}).get('bytes_limit')
  except Exception:  # pylint: disable=broad-except  # backends without memory_stats
    limit = None
  return 0.9 * limit / 2**30 if limit else None


def _baseline_row(table: tables_lib.Table) -> tables_lib.Row:
  return next(r for r in table.rows if r.variant == table.baseline)


def verdicts(table: tables_lib.Table, rows: Sequence[Mapping[str, Any]]) -> list[str]:
  """One markdown bullet per target of ``table``: the measured ratio, met or MISSED."""
  lines = []
  by_name = {r['variant']: r for r in rows}
  for t in table.targets:
    value = by_name.get(t.variant, {}).get(t.column)
    paper = f', paper {t.paper:.3f}x' if t.paper is not None else ''
    if value is None:
      lines.append(f'- {t.label}: not measured (target <= {t.limit:.2f}x{paper}).')
      continue
    verdict = 'met' if value <= t.limit else 'MISSED'
    lines.append(f'- {t.label}: {value:.3f}x baseline, target <= {t.limit:.2f}x{paper}: {verdict}.')
  return lines


def header(o: Options) -> str:
  device = jax.devices()[0]
  steps = f'median of {o.repeats} steps'
  if o.row_budget_s:
    steps += f' (fewer, at least {o.min_repeats}, once they took {o.row_budget_s:g} s)'
  timing = (
      f'step time = {steps} after {o.warmup} warm-up steps'
      if o.timing
      else 'compiled only (--notiming)'
  )
  return (
      f'Measured {datetime.datetime.now().isoformat(timespec="seconds")} on '
      f'{jax.default_backend()} ({getattr(device, "device_kind", device.platform)}, '
      f'{jax.device_count()} device(s), {os.cpu_count()} CPU cores, '
      f'{platform.processor() or platform.machine()}), jax {jax.__version__}'
      f'{"; " + o.mode if o.mode else ""}; {timing}.'
  )


def run(
    tables: Sequence[tables_lib.Table],
    options: Options,
    out: Optional[pathlib.Path],
    log: Callable[[str], None] = print,
) -> list[tuple[tables_lib.Table, list[dict]]]:
  """Measures every row of ``tables`` (a workload shared by tables is measured
  once), prints each table, and writes ``out/benchmarks.{md,csv}`` (if ``out``).

  Returns ``(table, rows)`` pairs; rows carry the ``*_rel`` columns.
  """
  o = options
  head = header(o)
  log(head)
  start = time.perf_counter()
  cache: dict[tuple, dict[str, Any]] = {}
  md = ['# Benchmarks', '', head, '']
  if o.note:
    md += [f'**{o.note}**', '']
  results = []
  csv_rows: list[dict[str, Any]] = []
  paper_columns: list[harness.PaperColumn] = []
  # Baseline runners stay alive (their state on the device) until the last
  # table with that baseline is done: every other row's steps are paired with them.
  runners: dict[tuple, Optional[harness.Runner]] = {}
  base_keys = [_baseline_row(t).key for t in tables]
  paired_with: dict[tuple, tuple] = {}
  for index, table in enumerate(tables):
    log(f'\n== {table.title}\n   {table.shapes}')
    skipped = [row.variant for row in table.rows if not (row.quick or o.all_rows)]
    base_row = _baseline_row(table)
    ordered = [base_row] + [r for r in table.rows if r is not base_row]
    rows_by_variant = {}
    for row in ordered:
      if row.variant in skipped:
        continue
      if row.key not in cache:
        is_base = row is base_row
        measured, runner = harness.measure_row(
            row.variant,
            row.build,
            timing=o.timing,
            warmup=o.warmup,
            repeats=o.repeats,
            min_repeats=o.min_repeats,
            time_budget_s=o.row_budget_s or None,
            max_run_bytes=None if o.max_run_gb is None else o.max_run_gb * 2**30,
            baseline=None if is_base else runners.get(base_row.key),
            allow_load=o.allow_load,
            log=log,
        )
        if is_base:
          runners[row.key] = runner
        else:
          if runner is not None:
            runner.close()
          if runners.get(base_row.key) is not None:
            paired_with[row.key] = base_row.key
        cache[row.key] = measured
      measured = dict(cache[row.key])
      if paired_with.get(row.key) != base_row.key:
        measured['step_ratio'] = None  # paired with another baseline, or not at all
      rows_by_variant[row.variant] = {**measured, 'variant': row.variant, **row.paper}
    rows = [rows_by_variant[r.variant] for r in table.rows if r.variant in rows_by_variant]
    if base_row.key not in base_keys[index + 1 :] and runners.get(base_row.key) is not None:
      runners.pop(base_row.key).close()
    rows = harness.add_relative(rows, table.baseline, table.paper_columns)
    text = [f'## {table.title}', '', f'Shapes: {table.shapes}.', '']
    if o.note:
      text += [f'**{o.note}**', '']
    text += [harness.markdown(rows, table.paper_columns), '']
    if table.paper_note:
      text += [table.paper_note, '']
    if any(r.get('step_ratio') is not None for r in rows[1:]):
      text += [
          'Step time rel: the median ratio over pairs of steps (each step of the row '
          'alternates with a step of the baseline), not the ratio of the two medians: '
          'robust to the machine slowing down while a row runs.',
          '',
      ]
    if skipped:
      text += [f'Not run with --quick (add --all_rows): {", ".join(skipped)}.', '']
    lines = verdicts(table, rows)
    if lines:
      text += ['Targets:', '', *lines, '']
    log('\n' + '\n'.join(text))
    md += text
    paper_columns += [p for p in table.paper_columns if p not in paper_columns]
    csv_rows += [{**r, 'table': table.name, 'shapes': table.shapes} for r in rows]
    results.append((table, rows))
  elapsed = time.perf_counter() - start
  md += [f'Total wall time: {elapsed:.0f} s.', '']
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    (out / 'benchmarks.md').write_text('\n'.join(md))
    csv_path = out / 'benchmarks.csv'
    if csv_path.exists():  # a loaded row never replaces a quiet one (benchmarks/quiet.py)
      with open(csv_path, newline='') as f:
        old = [r for r in csv.DictReader(f)]
      csv_rows = quiet.keep_quiet_rows(
          [dict(r, key=(r.get('table'), r.get('variant'))) for r in old],
          [dict(r, key=(r.get('table'), r.get('variant'))) for r in csv_rows],
          key='key',
      )
    harness.write_csv(str(csv_path), csv_rows, harness.csv_fields(paper_columns))
    log(
        f'Total wall time: {elapsed:.0f} s. Wrote {out / "benchmarks.md"} and '
        f'{out / "benchmarks.csv"}.'
    )
  return results
