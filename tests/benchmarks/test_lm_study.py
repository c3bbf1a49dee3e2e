"""The LM study runner (benchmarks/lm_study.py): plans, records, resumes, reports."""

import csv
import dataclasses
import json
import math
import pathlib
import shutil
import subprocess
import sys
from types import MappingProxyType

import pytest

from benchmarks import lm_comparisons
from benchmarks import lm_study
from benchmarks import lm_study_figures

TINY = lm_study.Sizes(
    emb_dim=16,
    mlp_dim=32,
    num_heads=2,
    seq_len=16,
    batch_size=4,
    steps=4,
    long_steps=6,
    eval_every=2,
    eval_max_bytes=512,
    max_bytes=64 * 1024,
)


def test_plan_pairs_every_arm_by_seed_without_duplicates():
  runs = lm_study.plan(
      ['depth', 'ablation', 'long'],
      corpora=['code', 'text'],
      depths=[1, 2],
      seeds=[0, 1],
      sizes=TINY,
      ablation_corpus='code',
      ablation_depth=2,
  )
  keys = [r.key for r in runs]
  assert len(keys) == len(set(keys))
  # depth: 2 corpora x 2 depths x 2 arms; ablation adds its arms at depth 2 on
  # code (baseline and cp there are the depth group's); long: its arms.
  per_seed = 2 * 2 * 2 + len(lm_study.ABLATION_ARMS) + len(lm_study.LONG_ARMS)
  assert len(runs) == 2 * per_seed
  for seed in (0, 1):
    mine = {(r.corpus, r.arm, r.depth, r.steps) for r in runs if r.seed == seed}
    other = {(r.corpus, r.arm, r.depth, r.steps) for r in runs if r.seed == 1 - seed}
    assert mine == other
  assert all(lm_study.parse_key(r.key) == r for r in runs)


def _plan_code_depth_2(groups, seeds=(0, 1), results=MappingProxyType({})):
  return lm_study.plan(
      groups,
      corpora=['code'],
      depths=[2],
      seeds=seeds,
      sizes=TINY,
      ablation_corpus='code',
      ablation_depth=2,
      results=results,
  )


def test_runs_with_a_learning_rate_context_or_dropout_name_it_in_their_key(tmp_path):
  runs = _plan_code_depth_2(['sweep'])
  assert {(r.arm, r.lr, r.seed) for r in runs if r.corpus == 'code'} == {
      (a, lr, 0) for a in lm_comparisons.SWEEP_ARMS for lr in lm_comparisons.SWEEP_LRS
  }
  run = lm_study.Run('text', 'cp_kv', 2, 4, 1, lr=4e-3, seq_len=64, dropout=0.1)
  assert run.key == 'text-cp_kv-L2-n4-s1-lr0.004-ctx64-drop0.1'
  assert lm_study.parse_key(run.key) == run
  assert all(lm_study.parse_key(r.key) == r for r in runs)
  assert lm_study.parse_key('code-cp-L2-n4-s0') == lm_study.Run('code', 'cp', 2, 4, 0)
  c = lm_study.make_config(run, TINY, tmp_path)
  base = lm_study.make_config(lm_study.Run('text', 'cp_kv', 2, 4, 1), TINY, tmp_path)
  assert (c.optimizer.learning_rate, c.model.dropout_rate) == (4e-3, 0.1)
  assert c.dataset.seq_len == c.dataset.eval_context == 64 and c.dataset.eval_step == 32
  assert c.batch_size * 64 == base.batch_size * base.dataset.seq_len  # the same bytes per step


def test_tuning_runs_every_arm_at_every_context_on_a_rate_by_warmup_grid(tmp_path):
  lc = lm_comparisons
  runs = _plan_code_depth_2(['tuning'])
  # (contexts x arms + the rotary baseline at the two compared contexts) x rates x warm-ups
  assert len(runs) == len(set(runs)) == (3 * 3 + 2) * 3 * 2
  grid = lambda arms, contexts: {
      (a, c, lr, w, 0)
      for a in arms
      for c in contexts
      for lr in lc.TUNING_LRS
      for w in lc.grid_warmups(a, c)
  }
  assert {(r.arm, r.seq_len or 256, r.lr, r.warmup, r.seed) for r in runs} == grid(
      ('baseline', 'cp_kv', 'cp'), (256, 1024, 2048)
  ) | grid(('baseline_rotary',), (1024, 2048))
  # The result in question first: every 1,024-byte run, then 2,048, then 256.
  order = [r.seq_len or 256 for r in runs]
  assert order == sorted(order, key=(1024, 2048, 256).index)
  c = lm_study.make_config(runs[-1 - 3 * 2 * 3], TINY, tmp_path)  # a 2,048-byte rotary run
  assert c.model.positions == 'rotary' and c.model.context_pool is None
  assert all(lm_study.parse_key(r.key) == r for r in runs)
  run = runs[1]
  assert run.key == f'code-baseline-L2-n4000-s0-lr{run.lr:g}-ctx1024-wu{run.warmup}'
  c = lm_study.make_config(run, TINY, tmp_path)
  assert (c.optimizer.learning_rate, c.optimizer.warmup_steps) == (run.lr, run.warmup)
  assert c.dataset.seq_len == 1024


def test_tuned_setting_is_the_lowest_final_validation_and_says_if_bracketed():
  lc = lm_comparisons
  grid = [(lr, w) for lr in lc.TUNING_LRS for w in lc.TUNING_WARMUPS[1024]]
  assert {w for _, w in grid} == {50, 500}
  key = lambda lr, w: lc.tuning_run('baseline', 1024, lr, w).key

  def results(best, more=()):
    """The grid and the settings ``more``: ``best`` ends at 1.0, the others worse."""
    return {
        key(lr, w): {'val_bpc': 1.0 if (lr, w) == best else 2.0 + lr} for lr, w in (*grid, *more)
    }

  inside = (4e-3, 50)  # a lower and a higher rate at warm-up 50, a longer warm-up at 4e-3
  assert lc.tuned_setting(results(inside), 'baseline', 1024) == (*inside, True)
  assert lc.tuning_extension(results(inside), 'baseline', 1024) is None
  partial = results(inside)
  partial.pop(key(*grid[0]))
  assert lc.tuned_setting(partial, 'baseline', 1024) is None  # not until the grid is done
  assert lc.tuning_extension(partial, 'baseline', 1024) is None
  # The table shows a grid in progress as it stands, and names the arms with no run ended
  # under it instead of a row of dashes each.
  table = lc.tuning_table(partial)
  rows = [l for l in table if l.startswith('| 1,024 | baseline |')]
  assert len(rows) == 2 and all(r.endswith('| - (grid training) |') for r in rows)
  assert not [l for l in table if l.startswith('| 1,024 | cp_kv |')]
  (named,) = [l for l in table if l.startswith('No tuning run ended yet: ')]
  assert 'cp_kv at 1,024' in named and 'baseline at 1,024' not in named

  # The highest rate best: doubled at its warm-up; once that ends worse, it is bracketed.
  edge = (8e-3, 50)
  assert lc.tuned_setting(results(edge), 'baseline', 1024) == (*edge, False)
  assert lc.tuning_extension(results(edge), 'baseline', 1024) == lc.tuning_run(
      'baseline', 1024, 1.6e-2, 50
  )
  table = '\n'.join(lc.tuning_table(results(edge)))
  assert '**1.000**' in table and '0.008, 50 steps (at an edge: extending)' in table
  assert lc.tuned_setting(results(edge, [(1.6e-2, 50)]), 'baseline', 1024) == (*edge, True)
  # The longest warm-up best at a bracketed rate: the warm-up lengthened at that rate.
  longest = (4e-3, 500)
  assert lc.tuned_setting(results(longest), 'baseline', 1024) == (*longest, False)
  assert lc.tuning_extension(results(longest), 'baseline', 1024) == lc.tuning_run(
      'baseline', 1024, 4e-3, 1500
  )
  # It ends best: its rate is bracketed again at warm-up 1,500, higher rate first ...
  extended = results((4e-3, 1500), [(4e-3, 1500)])
  assert lc.tuning_extension(extended, 'baseline', 1024) == lc.tuning_run(
      'baseline', 1024, 8e-3, 1500
  )
  extended = results((4e-3, 1500), [(4e-3, 1500), (8e-3, 1500)])
  assert lc.tuning_extension(extended, 'baseline', 1024) == lc.tuning_run(
      'baseline', 1024, 2e-3, 1500
  )
  # ... then its warm-up lengthened again, to the last of the extended range; worse there,
  # the best is bracketed.
  at_1500 = [(4e-3, 1500), (8e-3, 1500), (2e-3, 1500)]
  extended = results((4e-3, 1500), at_1500)
  assert lc.tuned_setting(extended, 'baseline', 1024) == (4e-3, 1500, False)
  assert lc.tuning_extension(extended, 'baseline', 1024) == lc.tuning_run(
      'baseline', 1024, 4e-3, 3000
  )
  settled = results((4e-3, 1500), [*at_1500, (4e-3, 3000)])
  assert lc.tuned_setting(settled, 'baseline', 1024) == (4e-3, 1500, True)
  assert lc.tuning_extension(settled, 'baseline', 1024) is None
  # Better there, and its rate bracketed: no warm-up is left to try, the best stays at the
  # edge of the extended range.
  extended = results((4e-3, 3000), [*at_1500, (4e-3, 3000), (8e-3, 3000), (2e-3, 3000)])
  assert lc.tuned_setting(extended, 'baseline', 1024) == (4e-3, 3000, False)
  assert lc.tuning_extension(extended, 'baseline', 1024) is None
  table = lc.tuning_table(extended)
  (row,) = [l for l in table if l.startswith('| 1,024 | baseline | 3000 |')]
  assert '**1.000**' in row and 'at the edge of the extended range' in row
  assert [l.split(' | ')[2] for l in table if l.startswith('| 1,024 | baseline |')] == [
      '50',
      '500',
      '1500',
      '3000',
  ]

  # The study plans the extension right after its arm's grid, and the comparisons wait for it.
  runs = _plan_code_depth_2(['tuning'], seeds=[0], results=results(longest))
  assert runs[len(grid)] == lc.tuning_run('baseline', 1024, 4e-3, 1500)
  assert len(runs) == (3 * 3 + 2) * len(grid) + 1
  # The extensions tried stay in the plan (listed done), before the next one.
  runs = _plan_code_depth_2(['tuning'], seeds=[0], results=results((4e-3, 1500), [(4e-3, 1500)]))
  assert runs[len(grid) : len(grid) + 2] == [
      lc.tuning_run('baseline', 1024, 4e-3, 1500),
      lc.tuning_run('baseline', 1024, 8e-3, 1500),
  ]
  assert len(runs) == (3 * 3 + 2) * len(grid) + 2
  assert lc.context_study(results(longest)) == []
  assert lc.context_study(results(longest, [(4e-3, 1500)])) != []


def test_the_2048_grid_starts_at_long_warm_ups_and_a_best_shortest_one_is_shortened():
  lc = lm_comparisons
  grid = [(lr, w) for lr in lc.TUNING_LRS for w in (1500, 3000)]
  key = lambda lr, w: lc.tuning_run('cp', 2048, lr, w).key

  def results(best, more=()):
    return {
        key(lr, w): {'val_bpc': 1.0 if (lr, w) == best else 2.0 + lr} for lr, w in (*grid, *more)
    }

  runs = [r for r in _plan_code_depth_2(['tuning']) if r.seq_len == 2048 and r.arm == 'cp']
  assert [(r.lr, r.warmup) for r in runs] == sorted(grid, key=lambda s: (s[1], s[0]))
  # The grid is done only with its own warm-ups: 50 and 500 are no part of it.
  partial = results((4e-3, 1500))
  partial.pop(key(2e-3, 3000))
  assert lc.tuned_setting(partial | {key(2e-3, 500): {'val_bpc': 3.0}}, 'cp', 2048) is None
  # The shorter warm-up best at a bracketed rate: shortened, to 500 and then to 50.
  assert lc.tuned_setting(results((4e-3, 1500)), 'cp', 2048) == (4e-3, 1500, False)
  assert lc.tuning_extension(results((4e-3, 1500)), 'cp', 2048) == lc.tuning_run(
      'cp', 2048, 4e-3, 500
  )
  worse_at_500 = results((4e-3, 1500), [(4e-3, 500)])
  assert lc.tuned_setting(worse_at_500, 'cp', 2048) == (4e-3, 1500, True)
  assert lc.tuning_extension(worse_at_500, 'cp', 2048) is None
  best_at_500 = results((4e-3, 500), [(4e-3, 500)])
  assert lc.tuning_extension(best_at_500, 'cp', 2048) == lc.tuning_run('cp', 2048, 8e-3, 500)
  at_500 = [(4e-3, 500), (8e-3, 500), (2e-3, 500)]
  assert lc.tuning_extension(results((4e-3, 500), at_500), 'cp', 2048) == lc.tuning_run(
      'cp', 2048, 4e-3, 50
  )
  # 50 steps is the shortest of the range: best there (its rate bracketed there too) with
  # 500 worse, it is bracketed.
  at_50 = [(4e-3, 50), (8e-3, 50), (2e-3, 50)]
  assert lc.tuning_extension(results((4e-3, 50), [*at_500, *at_50[:1]]), 'cp', 2048) == (
      lc.tuning_run('cp', 2048, 8e-3, 50)
  )
  settled = results((4e-3, 50), [*at_500, *at_50])
  assert lc.tuned_setting(settled, 'cp', 2048) == (4e-3, 50, True)
  assert lc.tuning_extension(settled, 'cp', 2048) is None
  # The longest warm-up best: at the edge of the extended range, nothing more to try.
  edge = results((4e-3, 3000))
  assert lc.tuned_setting(edge, 'cp', 2048) == (4e-3, 3000, False)
  assert lc.tuning_extension(edge, 'cp', 2048) is None
  table = lc.tuning_table(edge)
  assert [l.split(' | ')[2] for l in table if l.startswith('| 2,048 | cp |')] == ['1500', '3000']
  # At 256 bytes every grid keeps 50 and 500; at 1,024 the two arms tuned first keep them,
  # and the two tuned after them start at 1,500 and 3,000 as at 2,048.
  contexts = {
      256: ('baseline', 'cp_kv', 'cp'),
      1024: ('baseline', 'cp_kv', 'cp', 'baseline_rotary'),
  }
  assert {(c, a): lc.grid_warmups(a, c) for c, arms in contexts.items() for a in arms} == {
      (256, 'baseline'): (50, 500),
      (256, 'cp_kv'): (50, 500),
      (256, 'cp'): (50, 500),
      (1024, 'baseline'): (50, 500),
      (1024, 'cp_kv'): (50, 500),
      (1024, 'cp'): (1500, 3000),
      (1024, 'baseline_rotary'): (1500, 3000),
  }


def test_the_later_1024_grids_start_long_and_the_settled_arms_plan_nothing_more():
  # The first two arms tuned at 1,024 bytes (grid at 50 and 500, then extensions to 1,500
  # and 3,000) stay settled: no run is added to them, and the comparison keeps their
  # settings; the next arm's grid is its six runs at 1,500 and 3,000.
  lc = lm_comparisons
  ended = {
      'baseline': [(lr, w) for lr in lc.TUNING_LRS for w in (50, 500)]
      + [(4e-3, 1500), (8e-3, 1500), (1.6e-2, 1500), (8e-3, 3000), (1.6e-2, 3000), (4e-3, 3000)],
      'cp_kv': [(lr, w) for lr in lc.TUNING_LRS for w in (50, 500)]
      + [(4e-3, 1500), (8e-3, 1500), (1.6e-2, 1500), (8e-3, 3000)],
  }
  best = {'baseline': (8e-3, 3000), 'cp_kv': (8e-3, 1500)}
  results = {
      lc.tuning_run(arm, 1024, lr, w).key: {'val_bpc': 1.0 if (lr, w) == best[arm] else 2.0 + lr}
      for arm, settings in ended.items()
      for lr, w in settings
  }
  assert lc.tuned_setting(results, 'baseline', 1024) == (8e-3, 3000, False)  # at the range's edge
  assert lc.tuned_setting(results, 'cp_kv', 1024) == (8e-3, 1500, True)
  assert lc.tuning_extension(results, 'baseline', 1024) is None
  assert lc.tuning_extension(results, 'cp_kv', 1024) is None
  planned = [r for r in lc.tuning_runs(results) if r.seq_len == 1024]
  for arm, settings in ended.items():
    assert {(r.lr, r.warmup) for r in planned if r.arm == arm} == set(settings)
  assert [(r.lr, r.warmup) for r in planned if r.arm == 'cp'] == [
      (lr, w) for w in (1500, 3000) for lr in lc.TUNING_LRS
  ]


def test_a_report_of_tuning_runs_alone_tells_their_warm_ups_apart(tmp_path):
  # Two runs that differ only in warm-up, no comparison run yet: the corpus report keeps
  # them apart, the tuning table shows both, and no figure is claimed.
  results = tmp_path / 'study' / 'results'
  results.mkdir(parents=True)
  for warmup in (50, 500):
    run = lm_comparisons.tuning_run('baseline', 1024, 2e-3, warmup)
    result = dict(dataclasses.asdict(run), key=run.key, **_fake_result(1.5 + warmup / 1000))
    (results / f'{run.key}.json').write_text(json.dumps(result))
  out = tmp_path / 'report'
  written = lm_study.write_report(tmp_path / 'study', out)
  assert all(isinstance(p, pathlib.Path) and p.exists() for p in written)
  assert out / 'lm_study_comparisons.md' in written
  md = (out / 'lm_study_comparisons.md').read_text()
  assert '| 1,024 | baseline | 50 | 1.550 | - | - | - (grid training) |' in md
  assert '| 1,024 | baseline | 500 | 2.000 | - | - | - (grid training) |' in md
  assert '### Learning rates' not in md and '### Code, depth 2' not in md  # not run


def test_the_study_plans_again_after_every_run(tmp_path, monkeypatch):
  # The plan is the grid's two runs; once the first has a result, it calls for an
  # extension planned before the second. The extension trains second, not after every
  # run of the plan that was current when the first ended.
  first, extension, second = (
      lm_study.Run('code', 'baseline', 2, 4, 0, lr=lr) for lr in (4e-3, 8e-3, 2e-3)
  )
  trained = []

  def train_one(run, sizes, study_dir):
    del sizes
    trained.append(run)
    lm_study.result_path(study_dir, run).parent.mkdir(parents=True, exist_ok=True)
    lm_study.result_path(study_dir, run).write_text('{}')

  monkeypatch.setattr(lm_study, 'train_one', train_one)
  is_done = lambda run: lm_study.result_path(tmp_path, run).exists()
  planned = lambda: [first, extension, second] if is_done(first) else [first, second]
  last = lm_study.run_as_planned(planned, TINY, tmp_path, in_process=True, log=lambda s: None)
  assert trained == [first, extension, second]
  assert last == [first, extension, second]
  # A pass of run_all trains every run left unless told to stop.
  more = [lm_study.Run('code', 'cp', 2, 4, 0, lr=lr) for lr in (4e-3, 8e-3)]
  assert (
      lm_study.run_all(more, TINY, tmp_path, in_process=True, stop_after=1, log=lambda s: None)
      == more[:1]
  )
  assert lm_study.run_all(more, TINY, tmp_path, in_process=True, log=lambda s: None) == more[1:]


def _fake_result(val_bpc, steps=4000):
  return dict(
      val_bpc=val_bpc,
      test_bpc=val_bpc,
      steps=steps,
      val_curve=[(steps, val_bpc)],
      train_curve=[(steps, val_bpc)],
  )


def _tuned_results(arms_contexts, best=(4e-3, 500)):
  """Fake tuning results of ``arms_contexts``, settled: every run of the grid and of its
  extensions done, ``best`` lowest (so bracketed, no extension pending)."""
  lc = lm_comparisons
  return {
      lc.tuning_run(arm, context, lr, w).key: _fake_result(1.0 if (lr, w) == best else 2.0)
      for arm, context in arms_contexts
      for lr in lc.EXTENDED_LRS
      for w in lc.EXTENDED_WARMUPS
  }


def test_context_comparisons_run_each_arm_at_its_tuned_setting_once_the_baseline_is_tuned():
  lc = lm_comparisons
  assert lc.context_study({}) == [] and _plan_code_depth_2(['context']) == []
  # 1,024 bytes: the baseline and pooled keys and values tuned, the rest not yet.
  results = _tuned_results([('baseline', 1024), ('cp_kv', 1024)]) | _tuned_results(
      [('cp', 1024)], best=(2e-3, 50)
  )
  results.pop(lc.tuning_run('cp', 1024, 8e-3, 3000).key)  # cp's grid unfinished
  (at_1024,) = lc.context_study(results)
  assert at_1024.baseline == lc.tuning_run('baseline', 1024, 4e-3, 500)
  assert at_1024.arms == (lc.tuning_run('cp_kv', 1024, 4e-3, 500),)
  # Both contexts tuned for every arm: 2,048 adds the depth-4 baseline at the baseline's setting.
  everything = _tuned_results(
      [(a, c) for a in ('baseline', *lc.CONTEXT_ARMS) for c in lc.COMPARED_CONTEXTS]
  )
  at_1024, at_2048 = lc.context_study(everything)
  assert [r.arm for r in at_2048.arms] == ['cp_kv', 'cp', 'baseline_rotary', 'baseline']
  assert at_2048.arms[-1].depth == 4 and at_2048.arms[-1].lr == at_2048.baseline.lr
  assert all(r.seq_len == 2048 and (r.lr, r.warmup) == (4e-3, 500) for r in at_2048.arms)
  runs = _plan_code_depth_2(['context'], seeds=[0], results=everything)
  assert len(runs) == 3 * (4 + 5)  # seeds x (arms of 1,024 + of 2,048), baselines included
  # Context-major (1,024 bytes, the result in question, first), seed-major within each.
  assert [(r.seq_len, r.seed) for r in runs] == sorted(
      ((r.seq_len, r.seed) for r in runs), key=lambda cs: (cs[0] != 1024, cs[1])
  )
  assert runs[0].seq_len == 1024 and runs[-1].seq_len == 2048
  assert {r.key for r in runs if r.seed == 0 and r.depth == 2} <= set(everything)  # reused
  table = '\n'.join(lc.comparison_table(at_2048, everything, {}))
  assert 'code-baseline_rotary-L2-n4000-lr0.004-ctx2048-wu500' in table


def test_the_comparison_at_1024_bytes_trains_once_its_arms_are_tuned_before_the_next_grid():
  """With both groups planned, a context's comparison comes before the next context's
  grid, and the seeds of the arms already tuned before the grids of the arms not yet
  tuned (the study plans again after every run, so each arm's seeds 1-2 start as soon as
  it is settled)."""
  lc = lm_comparisons
  tuned_1024 = _tuned_results([(a, 1024) for a in ('baseline', *lc.CONTEXT_ARMS)])
  runs = _plan_code_depth_2(['tuning', 'context'], seeds=[0], results=tuned_1024)
  contexts = [r.seq_len or 256 for r in runs]
  assert contexts == sorted(contexts, key=(1024, 2048, 256).index)  # context-major
  first_2048 = contexts.index(2048)
  new_seeds = [i for i, r in enumerate(runs) if r.seed > 0]
  assert len(new_seeds) == 4 * 2  # the four arms at 1,024 bytes, seeds 1 and 2
  assert all(runs[i].seq_len == 1024 and i < first_2048 for i in new_seeds)
  # The baseline and pooled keys and values settled, the paper's reading and the rotary
  # baseline not started: the two settled arms' seeds 1-2 first, then the two grids.
  two_tuned = _tuned_results([('baseline', 1024), ('cp_kv', 1024)])
  runs = [
      r
      for r in _plan_code_depth_2(['tuning', 'context'], seeds=[0], results=two_tuned)
      if r.key not in two_tuned
  ]
  assert [(r.arm, r.seed) for r in runs[:4]] == [
      ('baseline', 1),
      ('cp_kv', 1),
      ('baseline', 2),
      ('cp_kv', 2),
  ]
  assert {(r.arm, r.seq_len, r.seed) for r in runs[4:16]} == {
      (a, 1024, 0) for a in ('cp', 'baseline_rotary')
  }
  # Before the 1,024-byte arms are settled, no comparison run is planned at all.
  unsettled = dict(tuned_1024)
  unsettled.pop(lc.tuning_run('baseline', 1024, 2e-3, 50).key)
  runs = _plan_code_depth_2(['tuning', 'context'], seeds=[0], results=unsettled)
  assert all(r.seed == 0 for r in runs)


def test_text_corpus_is_the_python_reference_topics(tmp_path):
  from pydoc_data import topics

  path = lm_study.write_text_corpus(tmp_path)
  text = path.read_text(encoding='utf-8')
  assert len(text) > 100_000
  for name in ('assert', 'lambda', 'while'):
    assert topics.topics[name].strip('\n') in text
  mtime = path.stat().st_mtime_ns
  assert lm_study.write_text_corpus(tmp_path).stat().st_mtime_ns == mtime  # not rewritten


def test_arms_build_configs_that_differ_only_where_they_say(tmp_path):
  base = lm_study.make_config(lm_study.Run('code', 'baseline', 2, 4, 0), TINY, tmp_path)
  cp = lm_study.make_config(lm_study.Run('code', 'cp', 2, 4, 0), TINY, tmp_path)
  uniform = lm_study.make_config(lm_study.Run('text', 'cp_uniform', 1, 4, 3), TINY, tmp_path)
  assert base.model.context_pool is None and base.model.name == 'transformer_lm'
  assert cp.model.context_pool.weights == 'learned'
  assert uniform.model.context_pool.weights == 'uniform' and uniform.model.num_layers == 1
  assert uniform.seed == 3 and uniform.dataset.files[0].endswith('python_reference_topics.txt')
  assert base.model.emb_dim == cp.model.emb_dim == TINY.emb_dim
  assert base.dataset.data_dir == cp.dataset.data_dir  # corpora prepared once per study


def test_the_local_arm_reads_less_than_the_whole_context(tmp_path):
  sizes = dataclasses.replace(TINY, seq_len=256)
  local = lm_study.make_config(lm_study.Run('code', 'local', 2, 4, 0), sizes, tmp_path)
  assert local.model.attention == 'local' and local.model.local_window < sizes.seq_len
  # A window as long as the context would train the baseline under another name.
  w = local.model.local_window
  sizes = dataclasses.replace(TINY, seq_len=w)
  with pytest.raises(ValueError, match=rf"'local'.*local_window={w} >= seq_len={w}\b"):
    lm_study.make_config(lm_study.Run('code', 'local', 2, 4, 0), sizes, tmp_path)


@pytest.mark.slow
def test_runs_are_recorded_skipped_on_rerun_and_reported(tmp_path, monkeypatch):
  study = tmp_path / 'study'
  runs = [
      lm_study.Run('code', arm, 1, TINY.steps, seed)
      for seed in (0, 1)
      for arm in ('baseline', 'cp')
  ]
  trained = lm_study.run_all(runs, TINY, study, in_process=True, log=lambda s: None)
  assert trained == runs
  results = lm_study.load_results(study)
  assert len(results) == 4
  for r in results:
    assert [s for s, _ in r['val_curve']] == [2, 4]  # a learning curve, every eval_every
    assert r['val_bpc'] == r['val_curve'][-1][1] and 0 < r['test_bpc'] < 16
    assert r['steps_per_sec_median'] > 0 and len(r['load_average_at_end']) == 3  # rate and load
    assert not (study / 'runs' / r['key'] / 'checkpoints').exists()
  # A rerun trains nothing (the trainer is never called).
  monkeypatch.setattr(lm_study, 'train_one', lambda *a: pytest.fail('retrained a recorded run'))
  assert lm_study.run_all(runs, TINY, study, in_process=True, log=lambda s: None) == []

  keys = lm_study.cost_pairs([*runs, dataclasses.replace(runs[1], seq_len=32)])
  assert keys == [('baseline', 1, None), ('cp', 1, None), ('baseline', 1, 32), ('cp', 1, 32)]
  lm_study.measure_costs(keys, TINY, study, log=lambda s: None, allow_load=True)
  costs = lm_study.load_costs(study)
  for n in (None, 32):
    assert costs[('cp', 1, n)]['gflops'] > costs[('baseline', 1, n)]['gflops'] > 0
    assert costs[('baseline', 1, n)]['step_ratio'] == 1.0 and costs[('cp', 1, n)]['step_ratio'] > 0
    assert not costs[('cp', 1, n)]['gflops_lower_bound']  # dense pooling: no loop in the step
  # Twice the context at the same bytes per step: the MLPs cost the same, attention more.
  assert costs[('baseline', 1, 32)]['gflops'] > costs[('baseline', 1, None)]['gflops']
  assert costs[('baseline', 1, 32)]['gflops'] < 2 * costs[('baseline', 1, None)]['gflops']

  out = tmp_path / 'report'
  written = {p.name for p in lm_study.write_report(study, out)}
  assert written == {'lm_study_runs.csv', 'lm_study_code.md', 'lm_study_cost.png'}
  md = (out / 'lm_study_code.md').read_text()
  by_key = {r['key']: r for r in results}
  diffs = [
      by_key[f'code-cp-L1-n4-s{s}']['val_bpc'] - by_key[f'code-baseline-L1-n4-s{s}']['val_bpc']
      for s in (0, 1)
  ]
  assert f'({diffs[0]:+.3f}, {diffs[1]:+.3f})' in md  # paired per seed
  rows = list(csv.DictReader(open(out / 'lm_study_runs.csv')))
  assert len(rows) == 4 and all(row['load_average_at_end'].startswith('[') for row in rows)


@pytest.mark.slow
def test_a_run_stopped_after_its_last_step_is_recorded_when_resumed(tmp_path, monkeypatch):
  """A run killed between its last checkpoint and its result (here: scoring the
  test split fails once) is resumed at its end: nothing is trained or evaluated
  again, and the result holds the training and validation of its last step."""
  from benchmarks import eval_spread  # pylint: disable=g-import-not-at-top

  study, run = tmp_path / 'study', lm_study.Run('code', 'baseline', 1, TINY.steps, 0)
  score = eval_spread.split_metrics

  def stopped(*a):
    monkeypatch.setattr(eval_spread, 'split_metrics', score)
    raise KeyboardInterrupt('killed')

  monkeypatch.setattr(eval_spread, 'split_metrics', stopped)
  with pytest.raises(KeyboardInterrupt):
    lm_study.run_all([run], TINY, study, in_process=True, log=lambda s: None)
  assert not lm_study.result_path(study, run).exists()
  metrics = study / 'runs' / run.key / 'metrics.jsonl'
  logged = metrics.read_text()
  assert lm_study.run_all([run], TINY, study, in_process=True, log=lambda s: None) == [run]
  assert metrics.read_text() == logged  # resumed at its end: no step trained or evaluated again
  result = json.loads(lm_study.result_path(study, run).read_text())
  last = {(l['split'], l['step']): l for l in map(json.loads, logged.splitlines())}
  assert result['val_bpc'] == last[('eval_validation', TINY.steps)]['bpc']
  assert result['train_loss'] == last[('train', TINY.steps)]['loss']
  assert 0 < result['test_bpc'] < 16


@pytest.mark.slow
def test_long_runs_of_seed_0_keep_checkpoints_and_record_diagnostics(tmp_path, monkeypatch):
  """The long runs of seed 0 keep a checkpoint every DIAGNOSTIC_PERIOD steps and
  record their diagnostics; a recorded run trained again for its diagnostics
  keeps its result and repeats its validation BPC exactly (same seed, same data)."""
  monkeypatch.setattr(lm_study, 'DIAGNOSTIC_PERIOD', 2)
  study = tmp_path / 'study'
  runs = [lm_study.Run('code', arm, 1, TINY.long_steps, 0) for arm in ('baseline', 'cp_gate')]
  runs.append(lm_study.Run('code', 'cp', 1, TINY.steps, 0))  # not long: no diagnostics
  lm_study.run_all(runs, TINY, study, in_process=True, log=lambda s: None)
  for run in runs:
    path = lm_study.diagnostics_path(study, run)
    assert path.exists() == lm_study.diagnosed(run, TINY)
    # A diagnosed run keeps its checkpoints for later probes; the others need none.
    assert (study / 'runs' / run.key / 'checkpoints').exists() == lm_study.diagnosed(run, TINY)
  cp_run = runs[1]
  d = json.loads(lm_study.diagnostics_path(study, cp_run).read_text())
  assert sorted(int(s) for s in d['steps']) == [2, 4, 6]  # kept every 2 steps
  assert set(d['steps']['6']['layers']) == {'layer_0/context_pool'}
  recorded = lm_study.result_path(study, cp_run).read_text()
  assert d['val_bpc_this_training'] == json.loads(recorded)['val_bpc']

  # Diagnosed again from the kept checkpoints (no training), then, with them
  # gone, trained again: the same diagnostics and validation BPC both times.
  rediagnose = lambda: lm_study.run_all(
      runs, TINY, study, in_process=True, diagnose_existing=True, log=lambda s: None
  )
  for drop_checkpoints in (False, True):
    lm_study.diagnostics_path(study, cp_run).unlink()
    if drop_checkpoints:
      shutil.rmtree(study / 'runs' / cp_run.key / 'checkpoints')
    assert lm_study.run_all(runs, TINY, study, in_process=True, log=lambda s: None) == []
    assert rediagnose() == [cp_run]
    assert lm_study.result_path(study, cp_run).read_text() == recorded
    again = json.loads(lm_study.diagnostics_path(study, cp_run).read_text())
    assert again['steps'] == d['steps']
    assert (
        again.get('val_bpc_this_training', again['val_bpc_recorded']) == again['val_bpc_recorded']
    )
  assert 'val_bpc_this_training' in again  # the second time it trained


def test_late_arms_set_the_fields_they_name(tmp_path):
  sizes = dataclasses.replace(TINY, seq_len=32, num_heads=4)
  config = lambda arm: lm_study.make_config(lm_study.Run('code', arm, 2, 6, 0), sizes, tmp_path)
  assert config('cp_static_n').model.context_pool.sigma_length == 32  # the study's seq_len
  assert config('cp_half_heads').model.context_pool_heads == 2
  assert config('cp_kv').model.context_pool_reads == 'kv'
  # The default arm and the ablations read as the study was measured, whatever the config.
  for arm in ('cp', 'cp_uniform', 'cp_gate'):
    assert config(arm).model.context_pool_reads == 'qkv', arm
    assert config(arm).model.context_pool_position == 'attention_input', arm
  assert config('cp_at_output').model.context_pool_position == 'output'
  assert config('cp_after_attention').model.context_pool_first_layer == 1
  assert config('cp_below_top').model.context_pool_last_layer == 0  # the layer below the top
  deep = lm_study.make_config(lm_study.Run('code', 'cp_below_top', 4, 6, 0), sizes, tmp_path)
  assert deep.model.context_pool_last_layer == 2 and deep.model.num_layers == 4
  assert config('cp_gate').model.context_pool.gate is True
  both = config('cp_half_heads_gate').model
  assert both.context_pool.gate is True and both.context_pool_heads == 2
  assert config('cp_gate_closed').model.context_pool.gate_init == 0.0
  assert set(lm_study.LATE_ARMS).isdisjoint(lm_study.ABLATION_ARMS)


def test_paired_difference_interval():
  p = lm_study.paired({0: 1.0, 1: 1.2, 2: 1.1}, {0: 0.5, 1: 0.6, 2: 0.7})
  assert p['diffs'] == pytest.approx([0.5, 0.6, 0.4])
  # mean 0.5, std 0.1, t(2) = 4.303: half-width 4.303 * 0.1 / sqrt(3).
  assert p['mean'] == pytest.approx(0.5) and p['half'] == pytest.approx(
      4.303 * 0.1 / 3**0.5, rel=1e-4
  )
  assert p['significant']
  assert not lm_study.paired({0: 1.0, 1: 0.0}, {0: 0.5, 1: 0.5})['significant']
  assert lm_study.paired({0: 1.0}, {0: 0.5}) is None


def test_sizes_of_a_study_cannot_change(tmp_path):
  from absl import app

  lm_study.check_sizes(tmp_path, TINY)
  assert json.loads((tmp_path / 'sizes.json').read_text())['steps'] == TINY.steps
  lm_study.check_sizes(tmp_path, TINY)
  with pytest.raises(app.UsageError, match='steps'):
    lm_study.check_sizes(tmp_path, dataclasses.replace(TINY, steps=8))


@pytest.mark.slow
def test_images_group_trains_resnets_on_the_digits_and_reports_error(tmp_path):
  sizes = dataclasses.replace(TINY, image_steps=4)
  runs = lm_study.plan(
      ['images'],
      corpora=['code'],
      depths=[1],
      seeds=[0, 1],
      sizes=sizes,
      ablation_corpus='code',
      ablation_depth=2,
      image_depths=[20],
  )
  assert [r.key for r in runs] == [
      f'digits-{a}-L20-n4-s{s}' for s in (0, 1) for a in ('baseline', 'cp')
  ]
  assert lm_study.cost_pairs(runs) == []  # costs are measured for the LMs only
  cp = lm_study.make_config(runs[1], sizes, tmp_path)
  assert cp.model.name == 'cp_resnet20' and cp.dataset.name == 'sklearn_digits'
  assert lm_study.make_config(runs[0], sizes, tmp_path).model.name == 'resnet20'

  study = tmp_path / 'study'
  lm_study.run_all(runs[:2], sizes, study, in_process=True, log=lambda s: None)
  results = lm_study.load_results(study)
  for r in results:
    assert r['metric'] == 'error' and 0 <= r['val_error'] <= 100 and 0 <= r['test_error'] <= 100
    assert [s for s, _ in r['val_curve']] == [1, 2, 3, 4]
    assert r['val_error'] == r['val_curve'][-1][1] and r['val_loss'] > 0
  written = {p.name for p in lm_study.write_report(study, tmp_path / 'report')}
  assert written == {'lm_study_runs.csv', 'lm_study_digits.md'}
  assert 'val error %' in (tmp_path / 'report' / 'lm_study_digits.md').read_text()


def test_report_marks_gflops_counted_through_a_loop_as_a_lower_bound():
  def result(arm, seed, bpc):
    return dict(
        corpus='code',
        arm=arm,
        depth=2,
        steps=10,
        seed=seed,
        key=f'{arm}{seed}',
        val_bpc=bpc,
        test_bpc=bpc,
        val_curve=[[10, bpc]],
    )

  results = [result(a, s, 2.0 + s) for a in ('baseline', 'area') for s in (0, 1)]
  costs = {
      ('baseline', 2, None): dict(gflops=14.0, step_ratio=1.0),
      ('area', 2, None): dict(gflops=11.4, gflops_lower_bound=True, step_ratio=1.7),
  }
  md = lm_study.corpus_report(results, costs, 'code')
  assert '| 14.00 | 1.000x |' in md and '| >=11.40 | 1.700x |' in md
  assert 'lower bound' in md and 'under load' not in md
  costs[('area', 2, None)] = dict(costs[('area', 2, None)], measured_under_load=True)
  md = lm_study.corpus_report(results, costs, 'code')
  assert '| >=11.40 | 1.700x (under load) |' in md and 'its step time is not' in md
  assert 'lower bound' not in lm_study.corpus_report(
      results, {('baseline', 2, None): costs[('baseline', 2, None)]}, 'code'
  )


def test_report_shows_the_training_loss_of_the_longer_runs_in_bits():
  def result(arm, steps, seed, train_nats):
    return dict(
        corpus='code',
        arm=arm,
        depth=2,
        steps=steps,
        seed=seed,
        key=f'{arm}{steps}{seed}',
        val_bpc=1.0,
        test_bpc=1.0,
        val_curve=[[steps, 1.0]],
        train_curve=[[steps // 2, 2 * train_nats], [steps, train_nats]],
    )

  # Seeds 0 and 1 of the long baseline: 1 and 3 bits at the end, mean 2.
  results = [
      result('baseline', 10, 0, math.log(2)),
      result('baseline', 40, 0, math.log(2)),
      result('baseline', 40, 1, 3 * math.log(2)),
      result('cp', 40, 0, 1.5 * math.log(2)),
      {**result('cp', 40, 1, 0.0), 'train_curve': []},  # no training curve recorded
  ]
  md = lm_study.corpus_report(results, {}, 'code')
  train = md.split('### Training loss along the longer runs')[1]
  assert '40 steps, depth 2:' in train and '10 steps' not in train
  # Each row names the seeds it averages (an arm part-way through its seeds, or a seed
  # without that curve, has fewer).
  assert '| baseline | 0, 1 | 4.000 | 2.000 |' in train and '| cp | 0 | 3.000 | 1.500 |' in train
  val = md.split('### Learning curves')[1].split('40 steps, depth 2:')[1]
  assert '| baseline | 0, 1 | 1.000 |' in val and '| cp | 0, 1 | 1.000 |' in val
  # One length only: nothing is longer, so no training-loss table.
  short = [r for r in results if r['steps'] == 10]
  assert 'Training loss' not in lm_study.corpus_report(short, {}, 'code')


def test_report_pairs_fewer_layers_and_the_early_lead_by_seed():
  def result(arm, depth, steps, seed, early, end, lowest=None):
    middle = [] if lowest is None else [[steps // 2, lowest]]  # overfits: lowest before the end
    return dict(
        corpus='code',
        arm=arm,
        depth=depth,
        steps=steps,
        seed=seed,
        key=f'{arm}{depth}{steps}{seed}',
        val_bpc=end,
        test_bpc=end,
        val_curve=[[10, early], *middle, [steps, end]],
        train_curve=[[steps, end * math.log(2)]],  # nats: the same BPC as validation
    )

  results = []
  for s in (0, 1, 2):
    results += [
        result('baseline', 2, 10, s, 3.0, 3.0),
        result('baseline', 2, 40, s, 3.0, 2.0, lowest=1.7),
        result('baseline', 4, 40, s, 2.9, 1.8 + 0.1 * s),
        # cp at depth 2: 0.5 ahead at step 10, behind by 0.1, 0.2, 0.3 at 40,
        # and 0.4 behind at its lowest (step 20), which it reaches before the end.
        result('cp', 2, 40, s, 2.5, 2.0 + 0.1 * (s + 1), lowest=2.1),
    ]
  costs = {('cp', 2, None): dict(gflops=16.0), ('baseline', 4, None): dict(gflops=27.0)}
  md = lm_study.corpus_report(results, costs, 'code')
  fewer = md.split('### Fewer layers')[1].split('###')[0]
  # cp at depth 2 minus the depth-4 baseline: 2.1 - 1.8, 2.2 - 1.9, 2.3 - 2.0.
  assert (
      '| 40 | - | cp | 2 | 4 | +0.300 ± 0.000 (+0.300, +0.300, +0.300) | yes | 16.00 vs 27.00 |'
      in fewer
  )
  assert '| 10 |' not in fewer  # no deeper baseline trained 10 steps
  early = md.split('### Early lead and end')[1].split('###')[0]
  assert '| validation at step 10 |' in early
  row = next(line for line in early.splitlines() if line.startswith('| 40 | 2 | - | cp |'))
  assert '-0.500 ± 0.000 (-0.500, -0.500, -0.500) | yes' in row
  # std 0.1 over 3 seeds: half-width t(0.975, 2) 0.1 / sqrt(3) = 4.303 * 0.0577.
  assert row.count('+0.200 ± 0.248 (+0.100, +0.200, +0.300) | no |') == 2  # validation, training
  assert '| lowest validation along training |' in early
  # The cells in order: step 10, the end, the lowest (2.1 - 1.7), training.
  assert '| +0.400 ± 0.000 (+0.400, +0.400, +0.400) | yes | +0.200' in row
  assert '| 40 | 4 |' not in early  # no arm but the baseline at depth 4


def test_report_keeps_runs_of_different_settings_apart():
  def result(arm, seed, bpc, lr, warmup=None):
    run = lm_study.Run('code', arm, 2, 40, seed, lr=lr, warmup=warmup)
    return dict(
        dataclasses.asdict(run), key=run.key, val_bpc=bpc, test_bpc=bpc, val_curve=[[40, bpc]]
    )

  # Two learning rates, three seeds: cp is 0.1 behind at 4e-3 and 0.3 ahead at 8e-3.
  results = [
      r
      for s in (0, 1, 2)
      for r in (
          result('baseline', s, 1.0 + 0.01 * s, 4e-3),
          result('cp', s, 1.1 + 0.01 * s, 4e-3),
          result('baseline', s, 2.0 + 0.01 * s, 8e-3),
          result('cp', s, 1.7 + 0.01 * s, 8e-3),
      )
  ]
  md = lm_study.corpus_report(results, {}, 'code')
  assert '| 40 | 2 | lr0.004 | cp | 3 | 1.110 ± 0.010 |' in md
  assert '| 40 | 2 | lr0.008 | cp | 3 | 1.710 ± 0.010 |' in md
  assert '| +0.100 ± 0.000 (+0.100, +0.100, +0.100) | yes |' in md
  assert '| -0.300 ± 0.000 (-0.300, -0.300, -0.300) | yes |' in md
  assert '40 steps, depth 2, lr0.008:' in md
  # A group whose runs differ in a setting the report does not tell apart.
  twice = results + [dict(results[0], key='code-baseline-L2-n40-s0-lr0.004-other')]
  with pytest.raises(ValueError, match='code-baseline-L2-n40-s0-lr0.004-other'):
    lm_study.corpus_report(twice, {}, 'code')
  # Runs that differ only in their warm-up (the tuning grid's) are two groups.
  warmups = [result('baseline', 0, 1.5 + w / 1000, 4e-3, w) for w in (50, 500)]
  md = lm_study.corpus_report(warmups, {}, 'code')
  assert '| 40 | 2 | lr0.004-wu50 | baseline | 1 | 1.550' in md
  assert '| 40 | 2 | lr0.004-wu500 | baseline | 1 | 2.000' in md


@pytest.mark.slow
def test_a_run_claimed_by_a_live_study_process_is_left_to_it(tmp_path):
  study = tmp_path / 'study'
  run = lm_study.Run('code', 'baseline', 1, TINY.steps, 0)
  # A stand-in for another study process: its command line names lm_study.
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(60)', 'lm_study'],
      stdout=subprocess.PIPE,
  )
  holder.stdout.readline()  # it runs (its command line is its own, not the forking one's)
  try:
    path = study / 'runs' / f'{run.key}.claim'
    path.parent.mkdir(parents=True)
    path.write_text(str(holder.pid))
    assert lm_study.run_all([run], TINY, study, in_process=True, log=lambda s: None) == []
    assert not lm_study.result_path(study, run).exists() and path.read_text() == str(holder.pid)
  finally:
    holder.kill()
    holder.communicate()
  # Its holder gone, the claim is stale: taken over, trained, released.
  assert lm_study.run_all([run], TINY, study, in_process=True, log=lambda s: None) == [run]
  assert lm_study.result_path(study, run).exists() and not path.exists()
  # A claim by a process that is not a study (pid 1: init) is stale too.
  other = lm_study.Run('code', 'cp', 1, TINY.steps, 0)
  (study / 'runs' / f'{other.key}.claim').write_text('1')
  assert lm_study.claim(study, other) and lm_study.claim(study, other)  # re-entrant for its holder
  lm_study.release(study, other)
  assert not (study / 'runs' / f'{other.key}.claim').exists()


def test_long_curves_draw_every_long_group_whole_and_its_second_half(tmp_path):
  from benchmarks import lm_study_figures  # pylint: disable=g-import-not-at-top

  def result(corpus, arm, seed, offset):
    curve = [[s, 3.0 - s / 20 + offset] for s in range(10, 41, 10)]
    return dict(corpus=corpus, arm=arm, depth=2, steps=40, seed=seed, val_curve=curve)

  results = [result('code', 'baseline', s, 0.1 * s) for s in (0, 1)]
  results += [result('code', 'cp', 0, 0.05), result('text', 'baseline', 0, 0.0)]
  results += [dict(result('code', 'baseline', 0, 0.0), steps=10)]  # not a long run
  path = lm_study_figures.long_curves(results, 40, list(lm_study.ARMS), tmp_path / 'long.png')
  from PIL import Image  # pylint: disable=g-import-not-at-top

  width, height = Image.open(path).size
  assert width > height  # two columns (code, text) of two rows


def _result(run, val, early, lowest, train_bits, test):
  steps = run.steps
  return dict(
      dataclasses.asdict(run),
      key=run.key,
      val_bpc=val,
      test_bpc=test,
      val_curve=[[1000, early], [2000, lowest], [steps, val]],
      train_curve=[[steps, train_bits * math.log(2)]],
  )


def test_comparisons_pair_each_arm_with_its_baseline_by_seed(monkeypatch, tmp_path):
  from benchmarks import lm_comparisons as lc

  study = lc.study('cp_kv')
  runs = [r for c in study for r in c.runs()]
  assert set(study[2].arms) <= set(study[0].arms)  # fewer layers reuses the depth-2 runs
  first = study[0]
  assert {r.seed for r in first.runs()} == set(lc.CONFIRM_SEEDS)
  assert all(r.lr == lc.tuned(r.arm) for r in runs)
  assert {r.seq_len for r in study[1].runs()} == {lc.LONG_CONTEXT}
  # At 1,024 bytes the default ContextPool has fewer seeds than the baseline and the best arm.
  assert {(r.arm, r.seed) for r in study[1].runs()} == {
      (a, s) for a in ('baseline', 'cp_kv') for s in lc.CONFIRM_SEEDS
  } | {('cp', s) for s in lc.CONTEXT_SEEDS}
  assert len(lc.CONTEXT_SEEDS) < len(lc.CONFIRM_SEEDS)
  assert {(r.arm, r.depth) for r in study[2].runs()} == {('baseline', 4), ('cp', 2), ('cp_kv', 2)}
  assert {(r.corpus, r.dropout) for r in study[3].runs()} == {('text', lc.PROSE_DROPOUT)}
  # Synthetic results: the default ContextPool 0.1 behind at the end in every seed,
  # 0.2 ahead at step 1,000; cp_kv only in seed 0 (its difference alone, no interval).
  results = []
  for seed in (0, 1, 2):
    base = dataclasses.replace(first.baseline, seed=seed)
    cp = dataclasses.replace(first.arms[0], seed=seed)
    results.append(_result(base, 1.0 + seed / 10, 2.0, 0.9, 1.2, 1.1))
    results.append(_result(cp, 1.1 + seed / 10, 1.8, 0.95, 1.3, 1.15))
  results.append(_result(dataclasses.replace(first.arms[1], seed=0), 1.05, 2.0, 0.9, 1.2, 1.1))
  md = lc.report(results)
  # Only what has a result: the sweep (its 4e-3 runs are these seeds 0), no tuning, no
  # comparison of another context yet.
  assert '### Learning rates' in md and '### Rate and warm-up' not in md
  assert '### Longer context' not in md and '### Code, depth 2' in md
  row = next(l for l in md.splitlines() if l.startswith('| `code-cp-L2'))
  assert '| 3 | +0.100 ± 0.000 (+0.100, +0.100, +0.100, behind beyond noise)' in row
  assert '-0.200 ± 0.000 (-0.200, -0.200, -0.200, ahead beyond noise)' in row
  assert '+0.050 ± 0.000' in row and '+0.100 ± 0.000' in row  # lowest; training loss
  kv = next(l for l in md.splitlines() if l.startswith('| `code-cp_kv-L2'))
  assert kv.startswith('| `code-cp_kv-L2-n4000') and '| 1 | +0.050 (seed 0 only) |' in kv
  # At 1,024 bytes: the baseline on 3 seeds, each arm paired on the seeds it has.
  longer = study[1]
  longer_results = [
      _result(dataclasses.replace(template, seed=seed), end, 2.0, 0.9, 1.2, 1.1)
      for seed in (0, 1, 2)
      for template, end in ((longer.baseline, 1.5), *((a, 1.4) for a in longer.arms))
  ]
  md = lc.report(results + longer_results)
  rows = md.split('### Longer context')[1].split('###')[0].splitlines()
  assert '(seeds 0, 1, 2)' in rows[2]
  cp_row = next(l for l in rows if l.startswith('| `code-cp-L2'))
  kv_row = next(l for l in rows if l.startswith('| `code-cp_kv-L2'))
  assert '| 2 | -0.100 ± 0.000 (-0.100, -0.100, ahead' in cp_row  # its seed 2 is not planned
  assert '| 3 | -0.100 ± 0.000 (-0.100, -0.100, -0.100, ahead' in kv_row

  # The figure: a column per comparison with a result, a colour per arm in every column.
  png = lc.figure(results, tmp_path / 'comparisons.png')
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  drawn = {}
  monkeypatch.setattr(
      lm_study_figures, 'comparison_curves', lambda columns, path: drawn.setdefault(path, columns)
  )
  assert lc.figure([], 'none.png') is None
  lc.figure(results, 'c.png')
  code, fewer = drawn['c.png']  # the longer context and prose have no result
  assert code[:2] == ('Code, depth 2, 4,000 steps', 4000)
  assert [(label, colour, len(curves)) for label, colour, curves in code[2]] == [
      ('baseline, depth 2', None, 3),
      ('cp, depth 2', 1, 3),
      ('cp_kv, depth 2', 2, 1),
  ]
  assert code[2][1][2][0] == results[1]['val_curve']  # seed 0's ContextPool
  assert fewer[0] == 'Fewer layers'  # no depth-4 baseline yet: the arms alone, same colours
  assert [(label, colour) for label, colour, _ in fewer[2]] == [
      ('cp, depth 2', 1),
      ('cp_kv, depth 2', 2),
  ]


def test_comparison_tables_put_each_arm_s_step_cost_beside_its_bpc():
  from benchmarks import lm_comparisons as lc

  same, longer, fewer = lc.study('cp_kv')[:3]
  cp = same.arms[0]
  costs = {
      same.baseline.cost_key: dict(gflops=10.0, step_ms=100.0, step_ratio=1.0),
      cp.cost_key: dict(gflops=12.0, step_ms=130.0, step_ratio=1.25),
      fewer.baseline.cost_key: dict(gflops=19.0, step_ms=180.0, measured_under_load=True),
  }
  # One depth and context: the paired ratio (1.25), not the medians' (1.30).
  assert lc.cost_cells(cp, same.baseline, costs) == ['12.00 vs 10.00', '1.25x']
  # Depth 2 against depth 4: the medians' ratio 130 / 180, said to be timed apart.
  assert lc.cost_cells(fewer.arms[0], fewer.baseline, costs) == [
      '12.00 vs 19.00',
      '0.72x (timed apart) (under load)',
  ]
  # 1,024 bytes: its own costs, none recorded yet.
  assert lc.cost_cells(longer.arms[0], longer.baseline, costs) == ['- vs -', '-']
  # Dropout is not in the measured step: no cost (the prose comparison has none: 0.0).
  dropped = dataclasses.replace(cp, dropout=0.1)
  assert dropped.cost_key is None and lm_study.cost_pairs([dropped]) == []
  assert lc.cost_cells(dropped, same.baseline, costs) == ['- vs 10.00', '-']
  assert dataclasses.replace(cp, dropout=0.0).cost_key == cp.cost_key
  md = lc.report([], costs=costs)
  assert f'| `{lc._name(cp)}` | 0 |' in md and '| 12.00 vs 10.00 | 1.25x |' in md
  assert 'GFLOPs are exact' in md


def test_the_cost_figure_plots_only_runs_at_the_study_s_own_settings():
  def result(arm, depth, seed, bpc, **options):
    return dict(corpus='code', arm=arm, depth=depth, steps=10, seed=seed, val_bpc=bpc, **options)

  costs = {
      (a, d, None): dict(step_ms=100.0 * d, gflops=float(d), step_ratio=1.0)
      for a in ('baseline', 'cp')
      for d in (1, 2)
  }
  tuned = [result(a, 2, s, 1.5, lr=0.004) for a in ('baseline', 'cp') for s in (0, 1)]
  assert lm_study._cost_points(tuned, costs) == (0, {})  # no figure of nothing
  own = [result('cp', d, s, 2.0 - d / 10 + s / 10) for d in (1, 2) for s in (0, 1)]
  steps, points = lm_study._cost_points(tuned + own, costs)
  assert steps == 10 and list(points) == [('code', 'cp')]
  p1, p2 = points['code', 'cp']
  assert p1[:3] == (100.0, 1.0, pytest.approx(1.95)) and p1[4] == 1
  assert p2[:3] == (200.0, 2.0, pytest.approx(1.85)) and p2[4] == 2
