"""The LM study's comparisons on representative splits, and their tables.

A :class:`Comparison` names a baseline run and the arms run against it, each
with its own learning rate, context and dropout; every arm is paired with the
baseline by seed. :data:`STUDY` is the study of ContextPool against the tuned
baseline (``python -m benchmarks.lm_study --groups comparisons``):

* the learning-rate sweep (:data:`SWEEP_LRS`) of the baseline and the
  default ContextPool at the long setup, which sets :data:`TUNED_LR`;
* the arms at the long setup, 3 seeds: the default ContextPool, pooled keys and
  values only (``context_pool_reads='kv'``), and the paper's LM placement (the
  residual stream pooled after every block but the last);
* longer context (``seq_len`` 1,024, the same bytes per step): the default
  ContextPool 2 seeds, the best arm and the baseline 3;
* fewer layers: ContextPool at depth 2 against the baseline at depth 4;
* prose with dropout against overfitting, chosen on the baseline: the best arm
  against the baseline.

:func:`report` writes, per comparison, each arm's difference to the baseline
at the end, early, at its lowest along training and in training loss, paired
by seed with a 95% t-interval; and the sweep's table.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

from benchmarks.lm_runs import CostKey, Run, paired

# The learning-rate sweep at the long setup (code, depth 2, 4,000 steps, seed 0).
SWEEP_ARMS = ('baseline', 'cp')
SWEEP_LRS = (2e-3, 4e-3, 8e-3)
# Peak learning rate per arm, from the sweep on the earlier corpus (its table is the first
# of benchmarks/results/archive_stdlib_corpus/lm_study_comparisons.md): each arm's lowest
# validation BPC at the end of the long setup. ContextPool arms not swept use the default
# ContextPool's.
TUNED_LR: dict[str, float] = {'baseline': 4e-3, 'cp': 4e-3}
LONG = dict(corpus='code', depth=2, steps=4000)
CONFIRM_SEEDS = (0, 1, 2)
# At 1,024 bytes the default ContextPool ended far behind on both of these seeds and got no
# third; the best arm, ahead on both, did (the earlier corpus: its archive's README).
CONTEXT_SEEDS = (0, 1)
LONG_CONTEXT = 1024
PROSE_DROPOUTS = (0.1, 0.2)
# Chosen on the baseline at seed 0 (validation BPC at the end: 1.397 at 0, 1.503 at 0.1, 1.767
# at 0.2): at 4,000 steps the prose baseline barely overfits (lowest 1.389), so no dropout.
PROSE_DROPOUT = 0.0
EARLY_STEP = 1000


def tuned(arm: str) -> float:
  return TUNED_LR.get(arm, TUNED_LR['cp'])


def run(arm: str, seed: int = 0, *, corpus='code', depth=2, steps=4000, **options) -> Run:
  """An arm's run at its tuned learning rate (``options``: seq_len, dropout, lr)."""
  options.setdefault('lr', tuned(arm))
  return Run(corpus, arm, depth, steps, seed, **options)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Arms against a baseline, paired by seed (the seeds of ``baseline`` and
  ``arms`` are replaced by each of ``seeds``; an arm in ``fewer_seeds`` runs only
  those listed there: ``((arm, seeds), ...)``)."""

  name: str
  baseline: Run
  arms: tuple[Run, ...]
  seeds: tuple[int, ...]
  fewer_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()

  def seeds_of(self, template: Run) -> tuple[int, ...]:
    return dict(self.fewer_seeds).get(template.arm, self.seeds)

  def runs(self) -> list[Run]:
    return [
        dataclasses.replace(r, seed=s)
        for s in self.seeds
        for r in (self.baseline, *self.arms)
        if s in self.seeds_of(r)
    ]


def study(best_arm: str = 'cp_kv') -> list[Comparison]:
  """The comparisons, ``best_arm`` the arm the longer context and fewer layers add
  to the default ContextPool, and the one arm on prose."""
  arms = ('cp', 'cp_kv', 'cp_output_below_top')
  return [
      Comparison(
          'Code, depth 2, 4,000 steps (each arm at its tuned learning rate)',
          run('baseline'),
          tuple(run(a) for a in arms),
          CONFIRM_SEEDS,
      ),
      Comparison(
          f'Longer context: {LONG_CONTEXT} bytes, the same bytes per step',
          run('baseline', seq_len=LONG_CONTEXT),
          tuple(run(a, seq_len=LONG_CONTEXT) for a in dict.fromkeys(('cp', best_arm))),
          CONFIRM_SEEDS,
          (('cp', CONTEXT_SEEDS),) if best_arm != 'cp' else (),
      ),
      Comparison(
          'Fewer layers: ContextPool at depth 2 against the baseline at depth 4',
          run('baseline', depth=4),
          tuple(run(a) for a in dict.fromkeys(('cp', best_arm))),
          CONFIRM_SEEDS,
      ),
      Comparison(
          f'Prose with dropout {PROSE_DROPOUT} (chosen on the baseline)',
          run('baseline', corpus='text', dropout=PROSE_DROPOUT),
          (run(best_arm, corpus='text', dropout=PROSE_DROPOUT),),
          CONFIRM_SEEDS,
      ),
  ]


# Issue 68: every arm compared at a context is tuned at that context. Peak rate x
# warm-up for the baseline, both ContextPool readings (pooled keys and values, the
# config's; queries, keys and values, the paper's) and, at the contexts of the
# comparisons, the baseline with rotary positions; seed 0, at the long setup, the
# context at the same bytes per step (batch 16, 4 and 2). Run order: 1,024 bytes (the
# result in question), then 2,048, then 256. A best setting at the edge of the grid is
# extended one step beyond it before the comparisons use it (:func:`tuning_extension`):
# the rate halved or doubled at the best warm-up, the warm-up lengthened (or shortened) at
# the best rate; 50 steps, already 1.25% of the run, is not shortened.
TUNING_ARMS = ('baseline', 'cp_kv', 'cp')
ROTARY_BASELINE = 'baseline_rotary'
COMPARED_CONTEXTS = (1024, 2048)
# The study's own context: its runs' keys name no ctx (Run.seq_len None).
OWN_CONTEXT = 256
TUNING = tuple(
    (context, TUNING_ARMS + ((ROTARY_BASELINE,) if context in COMPARED_CONTEXTS else ()))
    for context in (*COMPARED_CONTEXTS, OWN_CONTEXT)
)
TUNING_LRS = (2e-3, 4e-3, 8e-3)
# The grid's two warm-ups at each context. 2,048 bytes starts at 1,500 and 3,000: at 1,024
# bytes warm-up 50 ended behind 500 at every rate of both arms tuned first (the baseline,
# pooled keys and values: by 0.06-0.60), and the baseline's best was the longest of the
# extended range, reached after six extension runs. A shorter warm-up is still tried where
# the shorter of the two ends best (:func:`tuning_extension`), so the grid's start changes
# how many runs the tuning takes, not what it can find.
LONG_WARMUPS = (1500, 3000)
TUNING_WARMUPS = MappingProxyType({1024: (50, 500), 2048: LONG_WARMUPS, OWN_CONTEXT: (50, 500)})
# At 1,024 bytes the two arms whose grids had not started when the first two were tuned
# (the paper's reading, the rotary baseline) start at 1,500 and 3,000 too, for the same
# reason: the first two arms' 12 runs at warm-ups 50 and 500 all ended behind their best at
# 1,500 or 3,000 (by 0.04-0.79), and reaching those took each arm four to six extension runs.
LONG_WARMUP_GRIDS = frozenset({(1024, 'cp'), (1024, ROTARY_BASELINE)})
# Every setting a tuning run may have: the grid, one rate beyond each of its edges, and
# warm-ups from 50 up to 3,000 of the 4,000 steps (the cosine then decays over the last
# 1,000): at 1,024 bytes the baseline's best warm-up was the longest tried at 500 and at 1,500.
EXTENDED_LRS = (1e-3, *TUNING_LRS, 1.6e-2)
EXTENDED_WARMUPS = (50, 500, 1500, 3000)


def grid_warmups(arm: str, context: int) -> tuple[int, ...]:
  """The two warm-ups of ``arm``'s grid at ``context`` (:data:`TUNING_WARMUPS`,
  :data:`LONG_WARMUP_GRIDS`)."""
  return LONG_WARMUPS if (context, arm) in LONG_WARMUP_GRIDS else TUNING_WARMUPS[context]


def tuning_run(arm: str, context: int, lr: float, warmup: int) -> Run:
  """One tuning run (the study's own context, 256, keeps the key of its other runs)."""
  seq_len = None if context == OWN_CONTEXT else context
  return Run(
      LONG['corpus'], arm, LONG['depth'], LONG['steps'], 0, lr=lr, seq_len=seq_len, warmup=warmup
  )


def _ended(
    results: Mapping[str, Mapping[str, Any]], arm: str, context: int
) -> dict[tuple[float, int], float]:
  """``{(lr, warmup): final validation BPC}`` of the tuning runs of ``arm`` at ``context``
  with a result, extensions included."""
  ended = {}
  for lr in EXTENDED_LRS:
    for w in EXTENDED_WARMUPS:
      result = results.get(tuning_run(arm, context, lr, w).key)
      if result is not None:
        ended[(lr, w)] = result['val_bpc']
  return ended


def _tried(
    results: Mapping[str, Mapping[str, Any]], arm: str, context: int
) -> Optional[dict[tuple[float, int], float]]:
  """:func:`_ended`, or None until every run of the grid has a result."""
  tried = _ended(results, arm, context)
  if any((lr, w) not in tried for lr in TUNING_LRS for w in grid_warmups(arm, context)):
    return None
  return tried


def tuned_setting(
    results: Mapping[str, Mapping[str, Any]], arm: str, context: int
) -> Optional[tuple[float, int, bool]]:
  """``(lr, warmup, bracketed)``: the setting of ``arm`` at ``context`` with the lowest
  validation BPC at the end of its tuning run (extensions included), and whether it is
  bracketed (at its warm-up a lower and a higher rate, at its rate a longer warm-up and,
  unless it is the shortest of :data:`EXTENDED_WARMUPS`, a shorter one, all ended worse);
  None until every run of the grid has a result."""
  tried = _tried(results, arm, context)
  return None if tried is None else _best(tried)


def _best(tried: Mapping[tuple[float, int], float]) -> tuple[float, int, bool]:
  """:func:`tuned_setting` of the settings ``tried``."""
  lr, warmup = min(tried, key=tried.get)
  rates = sorted(r for r, w in tried if w == warmup)
  warmups = sorted(w for r, w in tried if r == lr)
  shorter = warmup > warmups[0] or warmup == EXTENDED_WARMUPS[0]
  return lr, warmup, rates[0] < lr < rates[-1] and warmup < warmups[-1] and shorter


def tuning_extension(
    results: Mapping[str, Mapping[str, Any]], arm: str, context: int
) -> Optional[Run]:
  """The next run past the edge of ``arm``'s grid at ``context``: its best rate is the
  highest (lowest) tried at its warm-up -> twice (half) that rate; else its warm-up is the
  longest (shortest) tried at its rate -> the next (previous) of :data:`EXTENDED_WARMUPS`.
  None while the grid is not done, once the best is bracketed, or at the end of the
  extended range."""
  tried = _tried(results, arm, context)
  if tried is None:
    return None
  lr, warmup, bracketed = _best(tried)
  if bracketed:
    return None
  rates = sorted(r for r, w in tried if w == warmup)
  i = EXTENDED_LRS.index(lr)
  if lr == rates[-1] and i + 1 < len(EXTENDED_LRS):
    return tuning_run(arm, context, EXTENDED_LRS[i + 1], warmup)
  if lr == rates[0] and i > 0:
    return tuning_run(arm, context, EXTENDED_LRS[i - 1], warmup)
  warmups = sorted(w for r, w in tried if r == lr)
  j = EXTENDED_WARMUPS.index(warmup)
  if warmup == warmups[-1] and j + 1 < len(EXTENDED_WARMUPS):
    return tuning_run(arm, context, lr, EXTENDED_WARMUPS[j + 1])
  if warmup == warmups[0] and j > 0:
    return tuning_run(arm, context, lr, EXTENDED_WARMUPS[j - 1])
  return None


def tuning_runs(results: Mapping[str, Mapping[str, Any]] = MappingProxyType({})) -> list[Run]:
  """The grid of every arm at every context, each arm's grid followed by the extensions
  it has tried and its next one (:func:`tuning_extension`) where ``results`` call for one."""
  runs = []
  for context, arms in TUNING:
    for arm in arms:
      grid = [(lr, warmup) for warmup in grid_warmups(arm, context) for lr in TUNING_LRS]
      tried = [s for s in _tried(results, arm, context) or {} if s not in grid]
      runs += [tuning_run(arm, context, lr, warmup) for lr, warmup in [*grid, *tried]]
      extension = tuning_extension(results, arm, context)
      runs += [extension] if extension else []
  return runs


def tuning_table(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """Per context and arm, validation BPC at the end of each tuning run (rows: warm-up,
  columns: peak rate; the grid's and any extension's); the best in bold, and whether it
  is bracketed. An arm with no tuning run ended yet is named under the table instead."""
  ended = {
      (arm, context): _ended(results, arm, context) for context, arms in TUNING for arm in arms
  }
  lrs = sorted({*TUNING_LRS, *(lr for t in ended.values() for lr, _ in t)})
  lines = [
      '### Rate and warm-up at every context (code, depth 2, 4,000 steps, seed 0; cosine schedule;'
      ' the same bytes per step)',
      '',
      '| context | arm | warm-up | ' + ' | '.join(f'{lr:g}' for lr in lrs) + ' | best |',
      '| ---: | --- | ---: | ' + ' | '.join('---:' for _ in lrs) + ' | --- |',
  ]
  untrained = []
  for context, arms in TUNING:
    for arm in arms:
      if not ended[(arm, context)]:
        untrained.append(f'{arm} at {context:,}')
        continue
      best = tuned_setting(results, arm, context)
      if best is None:
        verdict = '- (grid training)'
      elif best[2]:
        verdict = f'{best[0]:g}, {best[1]} steps'
      elif tuning_extension(results, arm, context):
        verdict = f'{best[0]:g}, {best[1]} steps (at an edge: extending)'
      else:
        verdict = f'{best[0]:g}, {best[1]} steps (at the edge of the extended range)'
      warmups = sorted({*grid_warmups(arm, context), *(w for _, w in ended[(arm, context)])})
      for warmup in warmups:
        cells = []
        for lr in lrs:
          r = results.get(tuning_run(arm, context, lr, warmup).key)
          cell = '-' if r is None else f'{r["val_bpc"]:.3f}'
          cells.append(f'**{cell}**' if best and best[:2] == (lr, warmup) else cell)
        lines.append(f'| {context:,} | {arm} | {warmup} | ' + ' | '.join(cells) + f' | {verdict} |')
  if untrained:
    lines += ['', 'No tuning run ended yet: ' + ', '.join(untrained) + '.']
  return lines + ['']


# Issue 68's comparisons: at each compared context, the baseline, both ContextPool
# readings and the rotary baseline, each at its setting tuned at that context, 3 seeds
# (seed 0 is its tuning run); at the longest context also the baseline at depth 4 (at
# the depth-2 baseline's setting), the "more layers" reference.
CONTEXT_ARMS = ('cp_kv', 'cp', ROTARY_BASELINE)
MORE_LAYERS_DEPTH = 4


def context_study(results: Mapping[str, Mapping[str, Any]]) -> list[Comparison]:
  """The comparisons of :data:`COMPARED_CONTEXTS` whose baseline is tuned (its grid
  done and no extension pending), with the arms tuned so far; empty until then. Each arm
  runs at its own best rate and warm-up (:func:`tuned_setting`), bracketed or at the edge
  of the extended range (the table says which)."""
  comparisons = []
  for context in COMPARED_CONTEXTS:
    tuned_runs = {}
    for arm in ('baseline', *CONTEXT_ARMS):
      setting = tuned_setting(results, arm, context)
      if setting is not None and tuning_extension(results, arm, context) is None:
        tuned_runs[arm] = tuning_run(arm, context, *setting[:2])
    if 'baseline' not in tuned_runs:
      continue
    baseline = tuned_runs.pop('baseline')
    arms = tuple(tuned_runs.values())
    if context == COMPARED_CONTEXTS[-1]:
      arms += (dataclasses.replace(baseline, depth=MORE_LAYERS_DEPTH),)
    comparisons.append(
        Comparison(
            f'{context:,} bytes of context, each arm at its rate and warm-up tuned there',
            baseline,
            arms,
            CONFIRM_SEEDS,
        )
    )
  return comparisons


def by_context(tuning: Sequence[Run], context: Sequence[Run]) -> list[Run]:
  """``tuning`` and ``context`` runs in the order they train: per context in
  :data:`TUNING`'s order (1,024, 2,048, 256 bytes), its comparison's runs (seed-major),
  then its tuning runs. A comparison has runs only for the arms already tuned
  (:func:`context_study`), so the baseline's and pooled keys and values' seeds 1-2 at
  1,024 bytes (the result in question) train as soon as both are settled, before the
  grids of the arms tuned after them, and each later arm's seeds as soon as it is."""
  context_of = lambda r: r.seq_len or OWN_CONTEXT
  return [
      r
      for c, _ in TUNING
      for r in (
          *sorted((x for x in context if context_of(x) == c), key=lambda x: x.seed),
          *(t for t in tuning if context_of(t) == c),
      )
  ]


def sweep_runs() -> list[Run]:
  """The learning-rate sweep and the prose dropout choice (seed 0)."""
  runs = [
      Run(LONG['corpus'], a, LONG['depth'], LONG['steps'], 0, lr=lr)
      for lr in SWEEP_LRS
      for a in SWEEP_ARMS
  ]
  runs += [run('baseline', corpus='text', dropout=d) for d in (0.0, *PROSE_DROPOUTS)]
  return runs


# ----------------------------------------------------------------------------
# Tables.
# ----------------------------------------------------------------------------


def _lowest(result: Mapping[str, Any]) -> float:
  return min(v for _, v in result['val_curve'])


def _at(result: Mapping[str, Any], field: str, step: int, unit: float = 1.0) -> Optional[float]:
  value = dict(result.get(field, [])).get(step)
  return None if value is None else value / unit


MEASURES = (  # (column, value of one result)
    ('validation at the end', lambda r: r['val_bpc']),
    (f'validation at step {EARLY_STEP:,}', lambda r: _at(r, 'val_curve', EARLY_STEP)),
    ('lowest validation along training', _lowest),
    ('training loss at the end (BPC)', lambda r: _at(r, 'train_curve', r['steps'], math.log(2))),
    ('test at the end', lambda r: r['test_bpc']),
)


def _cell(p: Optional[dict[str, Any]]) -> str:
  if p is None:
    return '-'
  sign = 'behind' if p['mean'] > 0 else 'ahead'
  verdict = f', {sign} beyond noise' if p['significant'] else ''
  return (
      f'{p["mean"]:+.3f} ± {p["half"]:.3f} ({", ".join(f"{d:+.3f}" for d in p["diffs"])}{verdict})'
  )


def _name(template: Run) -> str:
  """A run's key without its seed (``code-cp-L2-n4000-lr0.002``)."""
  return template.key.replace(f'-s{template.seed}', '', 1)


def cost_cells(arm: Run, baseline: Run, costs: Mapping[CostKey, Mapping[str, Any]]) -> list[str]:
  """GFLOPs per step (arm vs baseline) and the arm's step time over the baseline's:
  paired step by step where both have one depth and context, else the ratio of
  their median step times measured one after the other (``timed apart``)."""
  from benchmarks import harness  # pylint: disable=g-import-not-at-top

  mine, base = (costs.get(r.cost_key, {}) for r in (arm, baseline))
  gflops = f'{harness.gflops_cell(mine)} vs {harness.gflops_cell(base)}'
  if (arm.depth, arm.seq_len) == (baseline.depth, baseline.seq_len):
    ratio = f'{mine["step_ratio"]:.2f}x' if mine.get('step_ratio') else '-'
  elif mine.get('step_ms') and base.get('step_ms'):
    ratio = f'{mine["step_ms"] / base["step_ms"]:.2f}x (timed apart)'
  else:
    ratio = '-'
  if ratio != '-' and (mine.get('measured_under_load') or base.get('measured_under_load')):
    ratio += ' (under load)'
  return [gflops, ratio]


def comparison_table(
    comparison: Comparison,
    results: Mapping[str, Mapping[str, Any]],
    costs: Mapping[CostKey, Mapping[str, Any]],
) -> list[str]:
  """The arms − the baseline (BPC), paired by the seeds both have, one row per arm,
  with their step's cost beside (:func:`cost_cells`); a pair of one seed shows its
  difference alone (no interval)."""

  def by_seed(template: Run) -> dict[int, Mapping[str, Any]]:
    keys = {s: dataclasses.replace(template, seed=s).key for s in comparison.seeds_of(template)}
    return {s: results[k] for s, k in keys.items() if k in results}

  base = by_seed(comparison.baseline)
  values = ', '.join(f'{base[s]["val_bpc"]:.3f}' for s in sorted(base)) or '-'
  seeds = ', '.join(map(str, sorted(base))) or 'none yet'
  lines = [
      f'### {comparison.name}',
      '',
      f'Baseline `{_name(comparison.baseline)}`: validation BPC at the end {values} (seeds'
      f' {seeds}). Arm − baseline, mean ± 95% t-interval (per seed):',
      '',
      '| arm | seeds | '
      + ' | '.join(name for name, _ in MEASURES)
      + ' | GFLOPs/step (arm vs baseline) | step time (arm / baseline) |',
      '| --- | ---: |' + ' --- |' * (len(MEASURES) + 2),
  ]
  for arm in comparison.arms:
    mine = by_seed(arm)
    cells = []
    for _, value in MEASURES:
      a = {s: value(r) for s, r in mine.items() if value(r) is not None}
      b = {s: value(r) for s, r in base.items() if value(r) is not None}
      common = sorted({*a} & {*b})
      if len(common) == 1:  # one seed: its difference, no interval
        cells.append(f'{a[common[0]] - b[common[0]]:+.3f} (seed {common[0]} only)')
      else:
        cells.append(_cell(paired(a, b)))
    cells += cost_cells(arm, comparison.baseline, costs)
    lines.append(f'| `{_name(arm)}` | {len(mine)} | ' + ' | '.join(cells) + ' |')
  return lines + ['']


def sweep_table(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """Per swept arm and learning rate (seed 0): validation at the end and at its
  lowest, training loss at the end; the lowest final validation per arm in bold."""
  lines = [
      '### Learning rates (code, depth 2, 4,000 steps, seed 0; cosine schedule, 50 warm-up steps)',
      '',
      '| arm | peak learning rate | validation at the end | lowest validation | training loss'
      ' at the end (BPC) |',
      '| --- | ---: | ---: | ---: | ---: |',
  ]
  for arm in SWEEP_ARMS:
    rows = [
        (lr, results.get(Run(LONG['corpus'], arm, LONG['depth'], LONG['steps'], 0, lr=lr).key))
        for lr in SWEEP_LRS
    ]
    done = [(lr, r) for lr, r in rows if r]
    best = min((r['val_bpc'] for _, r in done), default=None)
    for lr, r in done:
      val = f'{r["val_bpc"]:.3f}'
      val = f'**{val}**' if r['val_bpc'] == best else val
      train = _at(r, 'train_curve', r['steps'], math.log(2))
      lines.append(
          f'| {arm} | {lr:g} | {val} | {_lowest(r):.3f} |'
          f' {"-" if train is None else f"{train:.3f}"} |'
      )
  return lines + ['']


def figure(results: Sequence[Mapping[str, Any]], path, best_arm: str = 'cp_kv'):
  """``path``: validation BPC along training of each comparison with a result, the
  baseline and each arm (mean over seeds, band = seed range); None if none has one."""
  from benchmarks import lm_study_figures  # pylint: disable=g-import-not-at-top

  by_key = {r['key']: r for r in results}
  comparisons = study(best_arm)
  # One colour per arm in every column, in the order arms first appear.
  arms = list(dict.fromkeys(r.arm for c in comparisons for r in c.arms))
  columns = []
  for comparison in comparisons:
    series = []
    for template in (comparison.baseline, *comparison.arms):
      curves = [
          by_key[k]['val_curve']
          for k in (
              dataclasses.replace(template, seed=s).key for s in comparison.seeds_of(template)
          )
          if k in by_key
      ]
      if curves:
        label = f'{template.arm}, depth {template.depth}'
        colour = None if template is comparison.baseline else 1 + arms.index(template.arm)
        series.append((label, colour, curves))
    if series:
      title = comparison.name.split(':')[0].split(' (')[0]
      columns.append((title, comparison.baseline.steps, series))
  return lm_study_figures.comparison_curves(columns, path) if columns else None


def report(
    results: Sequence[Mapping[str, Any]],
    best_arm: str = 'cp_kv',
    costs: Optional[Mapping[CostKey, Mapping[str, Any]]] = None,
) -> str:
  """The sweep's table, the tuning table and each comparison's, each where a run of it has a
  result or a measured cost (``costs``: :func:`benchmarks.lm_study.load_costs`)."""
  by_key = {r['key']: r for r in results}
  has_results = lambda runs: any(r.key in by_key for r in runs)
  lines = ['## ContextPool against the tuned baseline (representative splits)', '']
  if has_results(sweep_runs()):
    lines += sweep_table(by_key)
  if has_results(tuning_runs()):
    lines += tuning_table(by_key)
  for comparison in context_study(by_key):
    lines += comparison_table(comparison, by_key, costs or {})
  for comparison in study(best_arm):
    runs = comparison.runs()
    if has_results(runs) or any(r.cost_key in (costs or {}) for r in runs):
      lines += comparison_table(comparison, by_key, costs or {})
  if any(c.get('measured_under_load') for c in (costs or {}).values()):
    lines += [
        '`(under load)`: a step time measured while other jobs shared the cores; GFLOPs are'
        ' exact, that step time is not.',
        '',
    ]
  return '\n'.join(lines)
