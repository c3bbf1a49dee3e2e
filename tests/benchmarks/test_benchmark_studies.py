"""The measuring scripts of the data and the default LM: ablation, splits, evaluation spread.

Not the measurements: that each script builds the configs it names, records and
resumes, and reports paired differences computed from the results it was given.
"""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from benchmarks import ablation_default
from benchmarks import corpus_splits
from benchmarks import eval_spread
from configs import default as default_config
from helpers import old_workdir_copy  # a trained 2-step LM workdir


def test_ablation_variants_set_the_fields_they_name():
  base = ablation_default.make_config('baseline', 1, 7, None)
  assert base.model.context_pool is None and (base.seed, base.num_train_steps) == (1, 7)
  assert base.eval_every_steps == base.checkpoint_every_steps == 7
  c = ablation_default.make_config('softmax_residual', 0, None, 4e-3)
  assert (c.model.context_pool.size_norm, c.model.context_pool.residual) == ('softmax', True)
  assert c.model.context_pool_position == 'output' and c.optimizer.learning_rate == 4e-3
  # The default variant is configs/default.py's model as it is, at its rate.
  default = ablation_default.make_config(ablation_default.DEFAULT, 0, None, None)
  config = default_config.get_config('')
  assert default.model.to_dict() == config.model.to_dict()
  qkv = ablation_default.make_config('sigmoid_attention_input', 0, None, None).model
  assert (qkv.context_pool_reads, default.model.context_pool_reads) == ('qkv', 'kv')
  assert ablation_default.run_name('sigmoid', 2, 0.004) == 'sigmoid_seed2_lr0.004'
  # The baseline and the default at the config's rates; the other variants at the
  # rate they were screened at.
  assert ablation_default.config_lr('baseline') == base.optimizer.learning_rate
  assert ablation_default.config_lr(ablation_default.DEFAULT) == config.optimizer.learning_rate
  others = set(ablation_default.VARIANTS) - {'baseline', ablation_default.DEFAULT}
  assert {ablation_default.config_lr(v) for v in others} == {ablation_default.SCREEN_LR}


def test_ablation_resumes_recorded_runs_and_reports_paired_differences(tmp_path, monkeypatch):
  bpc = {  # (variant, seed, peak rate): validation BPC
      ('baseline', 0, 2e-3): 2.5,
      ('baseline', 1, 2e-3): 2.4,
      ('baseline', 0, 4e-3): 2.6,
      ('baseline', 1, 4e-3): 2.7,
      ('sigmoid_attention_input', 0, 4e-3): 2.3,
      ('sigmoid_attention_input', 1, 4e-3): 2.1,
  }
  for (variant, seed, lr), value in bpc.items():
    run = tmp_path / ablation_default.run_name(variant, seed, lr)
    run.mkdir()
    record = dict(
        variant=variant, seed=seed, learning_rate=lr, steps=5, val_bpc_whole=value, train_loss=1.0
    )
    (run / 'result.json').write_text(json.dumps(record))
  (tmp_path / 'other_steps').mkdir()  # a run of another length is not reported
  (tmp_path / 'other_steps' / 'result.json').write_text(json.dumps(dict(record, steps=9)))
  monkeypatch.setattr(
      'contextpool_jax.training.trainer.train_and_evaluate',
      lambda *a: (_ for _ in ()).throw(AssertionError('retrained')),
  )
  for key in bpc:
    assert ablation_default.train(tmp_path, *key[:2], None, key[2])['val_bpc_whole'] == bpc[key]
  results = ablation_default.recorded(tmp_path, 5)
  assert len(results) == len(bpc)
  variants = ['baseline', 'sigmoid_attention_input']
  md = ablation_default.report(results, variants, {'baseline': 2e-3, variants[1]: 4e-3})
  tuned, at_2e3, at_4e3 = md.split('## ')[1:]
  row = lambda table, v: next(l for l in table.splitlines() if l.startswith(f'| {v} |'))
  # Each arm at its own rate: ContextPool at 4e-3 paired with the baseline at 2e-3.
  assert '| 0.004 | 2 | 2.200 | 2.300, 2.100 |' in row(tuned, variants[1])
  assert '(-0.200, -0.300)' in row(tuned, variants[1])  # - baseline, per seed
  assert '| 0.002 | 2 | 2.450 |' in row(tuned, 'baseline')
  assert at_2e3.startswith('Peak learning rate 0.002') and f'| {variants[1]} |' not in at_2e3
  assert '(-0.300, -0.600)' in row(at_4e3, variants[1])  # at one rate: the baseline at 4e-3
  # The results are kept beside the repository's: a kept run is never overwritten, and
  # the report reads every kept run of the same length, the workdir's included.
  data = tmp_path / 'data'
  data.mkdir()
  kept = dict(variant='baseline', seed=2, learning_rate=2e-3, steps=5, val_bpc_whole=2.0)
  (data / 'baseline_seed2_lr0.002.json').write_text(json.dumps(kept))
  (data / 'baseline_seed0_lr0.002.json').write_text(json.dumps(dict(kept, seed=0)))
  (data / 'long.json').write_text(json.dumps(dict(kept, steps=9, seed=5)))
  archived = ablation_default.archive(results, data, 5)
  assert len(archived) == len(bpc) + 1 and len(list(data.glob('*.json'))) == len(bpc) + 2
  assert json.loads((data / 'baseline_seed0_lr0.002.json').read_text())['val_bpc_whole'] == 2.0
  assert json.loads((data / 'baseline_seed1_lr0.002.json').read_text())['val_bpc_whole'] == 2.4
  md = ablation_default.report(archived, variants, {'baseline': 2e-3, variants[1]: 4e-3})
  assert '| 0.002 | 3 | 2.133 | 2.000, 2.400, 2.000 |' in row(md.split('## ')[1], 'baseline')


def test_eval_spread_slices_read_their_own_bytes():
  class Split:

    def read(self, a, b):
      return list(range(a, b))

  view = eval_spread.Slice(Split(), 10, 5)
  assert len(view) == 5 and view.read(1, 3) == [11, 12]
  md = eval_spread.report('w', {100: [1.0, 1.2], 200: [1.1]})
  assert '| 100 | 2 | 1.100 | 0.141 | 1.000 | 1.200 |' in md and '| 200 | 1 | 1.100 | - |' in md
  # Against a second model: the differences on the same slices.
  md = eval_spread.report('w', {100: [1.0, 1.2], 200: [1.1]}, ('v', {100: [0.9, 1.0], 200: [0.95]}))
  assert '| 100 | 2 | 0.150 | 0.071 | 0.100 | 0.200 |' in md and 'minus that of `v`' in md


def test_corpus_splits_stray_is_the_largest_share_ratio_of_a_large_folder():
  summary = {
      'corpus': {'bytes': 100, 'folders': {'a': 60, 'b': 36, 'c': 4}},
      'validation': {'bytes': 10, 'folders': {'a': 3, 'b': 3, 'c': 4}},
      'test': {'bytes': 10, 'folders': {'a': 9, 'b': 1}},
  }
  # a: 0.3/0.6 and 0.9/0.6; b: 0.3/0.36 and 0.1/0.36; c holds under 5%: not checked.
  assert abs(corpus_splits.stray(summary) - 1.5) < 1e-12


def test_split_metrics_scores_a_workdir_as_the_trainer_did(tmp_path):
  """The study's end-of-run scorer against the trainer's own evaluation of the same
  checkpoint (the fixture's validation split is smaller than its eval_max_bytes)."""
  workdir = old_workdir_copy(tmp_path)
  logged = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  trainer_eval = [m for m in logged if m['split'] == 'eval_validation'][-1]
  scored = eval_spread.split_metrics(str(workdir), 'validation')
  np.testing.assert_allclose(scored['bpc'], trainer_eval['bpc'], rtol=1e-5)
  np.testing.assert_allclose(scored['accuracy'], trainer_eval['accuracy'], rtol=1e-5)


def test_paper_scale_finds_the_smallest_slice_and_the_largest_batch_that_fits(
    tmp_path, monkeypatch
):
  """With a fake compile that fits when a chip or GPU holds at most 8 rows: the config's
  batch 64 fits from 8 chips on, one chip takes 8, one H100 8 and eight H100 all 64; a
  rerun compiles nothing again."""
  from benchmarks import paper_scale  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  calls = []

  def measure(row, name, batch):
    calls.append((name, batch))
    topology = aot.parse_topology(name)
    fits = batch // topology.chips <= 8
    return dict(row=row.name, topology=topology.name, batch=batch, fits=int(fits))

  monkeypatch.setattr(paper_scale, 'measure', measure)
  monkeypatch.setattr(paper_scale, '_config_batch', lambda row: 64)
  row = paper_scale.Row('toy', 'default')
  paper_scale.run(tmp_path, [row])
  assert calls == [
      ('v5e-1', 64),
      ('v5e-4', 64),
      ('v5e-8', 64),
      ('v5e-1', 32),
      ('v5e-1', 16),
      ('v5e-1', 8),
  ]
  calls.clear()
  paper_scale.run_gpus(tmp_path, [row])
  assert calls == [
      ('h100:1', 64),
      ('h100:1', 32),
      ('h100:1', 16),
      ('h100:1', 8),
      ('h100:8', 64),
  ]
  text = (tmp_path / 'paper_scale.md').read_text()
  for line in (
      '| toy | slice | v5e:2x4 | 64 | yes |',
      '| toy | one chip | v5e:1x1 | 8 | yes |',
      '| toy | one H100 | h100:1 | 8 | yes |',
      '| toy | eight H100 | h100:8 | 64 | yes |',
  ):
    assert line in text
  assert text.index('## TPU v5e') < text.index('| toy | slice |') < text.index('## NVIDIA H100')
  calls.clear()
  paper_scale.run(tmp_path, [row])
  paper_scale.run_gpus(tmp_path, [row])
  assert calls == []


def _from_checkout(row):
  """``row`` with its config by the checkout's file (CI's oldest stack installs the package
  non-editable: the checkout's ``contextpool_jax`` first on the path has no ``configs``)."""
  name, _, arg = row.config.partition(':')
  path = pathlib.Path(default_config.__file__).with_name(f'{name}.py')
  return dataclasses.replace(row, config=f'{path}:{arg}')


def test_paper_scale_gives_gpus_xla_attention_instead_of_the_tpu_kernel():
  from benchmarks import paper_scale  # pylint: disable=g-import-not-at-top

  (lm,) = [r for r in paper_scale.ROWS if r.name.startswith('CP-Transformer(12), enwik8/text8, 2')]
  lm = _from_checkout(lm)
  assert paper_scale._config(lm, 8).model.attention_implementation == 'pallas_tpu'
  assert paper_scale._config(lm, 8, gpu=True).model.attention_implementation is None
  assert paper_scale._config(lm, 8).batch_size == 8


def test_paper_scale_evaluates_the_lm_at_32k_bytes_step_512_at_its_evaluation_batch():
  from benchmarks import paper_scale  # pylint: disable=g-import-not-at-top

  rows = [_from_checkout(r) for r in paper_scale.ROWS if r.step == 'eval']
  assert [r.name.split(',')[0] for r in rows] == ['CP-Transformer(12)', 'Transformer(12)']
  for row in rows:
    config = paper_scale._config(row, 2)
    assert (config.dataset.eval_context, config.dataset.eval_step) == (32768, 512)
    assert config.dataset.eval_batch_size == 2 and paper_scale._config_batch(row) == 8


def test_cp_step_cost_tables_each_arm_against_its_baseline_at_each_context():
  from benchmarks import cp_step_cost  # pylint: disable=g-import-not-at-top

  costs = {}
  for arm, depth, n in cp_step_cost.keys():
    flops = {'baseline': 10.0, 'cp_kv_dense': 11.0, 'cp_kv_blockwise': 10.5}[arm] * (n or 256)
    costs[(arm, depth, n)] = dict(gflops=flops, step_ratio=1.0 if arm == 'baseline' else 1.2)
  text = cp_step_cost.report(costs)
  assert '| 1,024 | cp_kv_dense | 11264.00 (vs 10240.00) | 1.100x | 1.200x |' in text
  assert '| 2,048 | cp_kv_blockwise | 21504.00 (vs 20480.00) | 1.050x | 1.200x |' in text
  assert text.count('| 256 |') == 2


@pytest.mark.slow
def test_gpu_checks_run_at_toy_sizes_on_the_cpu():
  """The script a lent GPU runs (benchmarks/gpu_checks.py), at --small sizes with XLA's
  attention: both models' steps compiled, counted and timed, the table written."""
  from benchmarks import gpu_checks  # pylint: disable=g-import-not-at-top

  results = gpu_checks.run(gpu_checks.SMALL, ('xla',))
  baseline, pooled = results['steps']
  assert (baseline['model'], pooled['model']) == ('baseline', 'contextpool')
  assert 0 < baseline['gflops'] < pooled['gflops']  # the pooling adds work
  for row in (baseline, pooled):
    assert np.isfinite(row['loss']) and row['step_ms'] > 0 and row['peak_gib'] > 0
  assert '| contextpool | xla |' in gpu_checks.table(results)
