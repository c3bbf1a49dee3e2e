"""The benchmark harness on tiny workloads: row fields, relative columns, outputs.

Not a timing test: only that every column is measured and reported.
"""

import csv
import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from benchmarks import harness
from benchmarks import report
from benchmarks import tables
from contextpool_jax.models.common import count_params
from helpers import Mlp, mlp_workload

TINY = dataclasses.replace(
    tables.QUICK,
    nmt_batch=1,
    nmt_length=8,
    nmt_layers=1,
    vit_batch=1,
    vit_image=32,
    vit_layers=1,
    resnet_batch=2,
    lambda_batch=1,
    lambda_size=8,
    lambda_channels=16,
)


def _tiny_table() -> tables.Table:
  rows = tuple(
      tables.Row(f'mlp{w}', lambda w=w: mlp_workload(w), ('mlp', w), {'paper_x': float(w)})
      for w in (16, 32)
  )
  return tables.Table(
      name='tiny',
      title='Tiny',
      shapes='batch 4 x 8',
      baseline='mlp16',
      rows=rows,
      paper_columns=(harness.PaperColumn('paper_x', 'paper x'),),
      targets=(tables.Target('mlp32', 'params_rel', 10.0, None, 'mlp32 params'),),
  )


def test_measure_row_fields():
  # allow_load: the suite's other workers load the machine (benchmarks/quiet.py).
  row = harness.measure('mlp', lambda: mlp_workload(16), warmup=1, repeats=2, allow_load=True)
  variables = Mlp(16).init(jax.random.key(0), jnp.zeros((4, 8)))
  assert row['params'] == count_params(variables['params']) == 8 * 16 + 16 + 16 * 3 + 3
  assert row['gflops'] > 0 and row['temp_mib'] >= 0 and row['total_mib'] > 0
  assert row['step_ms'] > 0 and row['step_ms_min'] <= row['step_ms'] <= row['step_ms_max']
  assert row['repeats'] == 2 and math.isfinite(row['loss'])
  assert row['others_cpu'] >= 0 and row['measured_under_load'] == (row['others_cpu'] > 0.05)
  assert len(row['load_average'].split('-')) == 2


def test_measure_over_memory_budget_compiles_only():
  row = harness.measure('mlp', lambda: mlp_workload(16), max_run_bytes=1.0)
  assert row['gflops'] > 0 and row['step_ms'] is None and row['note'].startswith('not run')


def test_run_writes_relative_markdown_and_csv(tmp_path):
  options = report.Options(warmup=0, repeats=1, allow_load=True)
  [(table, rows)] = report.run([_tiny_table()], options, tmp_path, log=lambda s: None)
  base, other = rows
  for column in harness.MEASURED:
    assert base[f'{column}_rel'] == 1.0
  assert other['params_rel'] == pytest.approx(other['params'] / base['params'])
  # The second row's steps were timed in pairs with the baseline's.
  assert other['step_ratio'] > 0 and other['step_ms_rel'] == other['step_ratio']
  assert other['paper_x_rel'] == 2.0
  md = (tmp_path / 'benchmarks.md').read_text()
  assert '| mlp32 |' in md and 'mlp32 params' in md and 'met' in md
  with open(tmp_path / 'benchmarks.csv') as f:
    csv_rows = list(csv.DictReader(f))
  assert [r['variant'] for r in csv_rows] == ['mlp16', 'mlp32']
  assert float(csv_rows[0]['gflops_rel']) == 1.0 and int(csv_rows[1]['params']) > 0
  assert table.name == csv_rows[0]['table']


def _params(row: tables.Row) -> int:
  w = row.build()
  batch = jax.eval_shape(w.make_batch, jax.random.key(0))
  return count_params(harness.init_shapes(w, batch)[0])


def test_lambda_table():
  table = tables.lambda_table(TINY, {})
  assert all(_params(row) > 0 for row in table.rows)
  table = dataclasses.replace(table, rows=table.rows[:2])  # compile two of them
  [(_, rows)] = report.run([table], report.Options(timing=False), None, log=lambda s: None)
  assert [r['variant'] for r in rows] == [row.variant for row in table.rows]
  assert all(r['params'] > 0 and r['gflops'] > 0 and r['temp_mib'] > 0 for r in rows)
  assert rows[0]['temp_mib_rel'] == 1.0 and rows[1]['step_ms'] is None


def test_tables_build_their_workloads():
  """Every table's rows build, have distinct names and the baseline among them;
  parameter counts (abstract, nothing compiled) differ where the model differs."""
  for name, make in tables.TABLES.items():
    table = make(TINY, {})
    names = [row.variant for row in table.rows]
    assert len(set(names)) == len(names) and table.baseline in names, name
    assert all(t.variant in names for t in table.targets), name
  area = {row.variant: row for row in tables.area(TINY, {}).rows}
  standard, basic, rich = (
      _params(area[v])
      for v in (
          'Transformer-Base',
          'area attention, basic (Eq. 3-4)',
          'area attention, rich (Eq. 9, 4)',
      )
  )
  assert standard == basic < rich  # basic area attention has no parameters; Eq. 9 has


def test_sizes_and_table_names():
  s = tables.QUICK.replace('nmt_batch=4,dtype=bfloat16')
  assert s.nmt_batch == 4 and s.dtype == 'bfloat16' and s.vit_batch == tables.QUICK.vit_batch
  with pytest.raises(ValueError, match='fields'):
    tables.QUICK.replace('nmt_size=4')
  assert tables.resolve(['contextpool', 'lambda']) == [
      'contextpool_nmt',
      'contextpool_vit',
      'contextpool_resnet',
      'lambda',
  ]
  with pytest.raises(ValueError, match='unknown table'):
    tables.resolve(['nope'])


def test_gaussian_skip_scales_learned_sizes_as_r_n_s():
  """benchmarks.gaussian_skip: the learned s and a cycled to length n, sigma_i = r (i + 1) s_i."""
  import numpy as np

  from benchmarks import gaussian_skip

  s, a = np.array([0.1, 0.5, 1.0]), np.array([-1.0, -2.0, -3.0])
  inputs = gaussian_skip.pool_inputs({'s': s, 'a': a}, 0.1, 7, 4)
  want_s = np.array([0.1, 0.5, 1.0, 0.1, 0.5, 1.0, 0.1])
  np.testing.assert_allclose(
      np.asarray(inputs.centres.sigma[0]), 0.1 * np.arange(1, 8) * want_s, rtol=1e-6
  )
  np.testing.assert_allclose(np.asarray(inputs.context.log_w[0]), np.resize(a, 7))
  assert inputs.context.x.shape == (1, 7, 4)


def test_gaussian_skip_needed_share_bounds():
  """benchmarks.gaussian_skip.needed_share: tiny sigmas need only the diagonal
  (each row's maximum is its own position), equal log weights and huge sigmas
  need every causal pair; tiles round up to whole needed tiles."""
  import numpy as np

  from benchmarks import gaussian_skip

  n = 16
  causal = n * (n + 1) / 2
  narrow = gaussian_skip.needed_share(
      {'s': np.full(n, 1e-9), 'a': np.zeros(n)}, 0.1, n, 18.0, (4,), 8
  )
  assert narrow[1] == n / causal  # the diagonal
  assert narrow[4] == 4 * (4 * 5 / 2) / causal  # the diagonal tiles' causal pairs
  assert narrow[('sorted', 4)] == n * 4 / causal  # one whole 4 x 4 tile per row group
  wide = gaussian_skip.needed_share({'s': np.full(n, 1e9), 'a': np.zeros(n)}, 0.1, n, 18.0, (4,), 8)
  assert wide[1] == 1.0 and wide[4] == 1.0
  # With wide sigmas, an input whose log weight is 100 nats above the rest is the
  # maximum of every row and the only pair within 18 nats of it.
  a = np.zeros(n)
  a[0] = 100.0
  heavy = gaussian_skip.needed_share({'s': np.full(n, 1e9), 'a': a}, 0.1, n, 18.0, (4,), 8)
  assert heavy[1] == n / causal
  assert heavy[4] == (n // 4) * 16 / causal - (16 - 10) / causal  # column 0's tiles


def test_a_loop_the_program_writes_is_flagged_since_xla_counts_its_body_once():
  """cost_analysis() counts a while loop's body once: a program doing the same
  matmul 8 times in lax.map reports (about) the FLOPs of one, and is flagged;
  a gather's gradient (a scatter, which the tests' classic emitters expand into
  a loop) is not."""
  x = jnp.ones((8, 64, 64), jnp.float32)
  looped = jax.jit(lambda x: jax.lax.map(lambda a: a @ a, x)).lower(x)
  unrolled = jax.jit(lambda x: jnp.einsum('bij,bjk->bik', x, x)).lower(x)
  embed_grad = jax.jit(jax.grad(lambda e, i: e[i].sum())).lower(x[0], jnp.array([3, 1, 3]))
  assert harness.writes_a_loop(looped) and not harness.writes_a_loop(unrolled)
  assert not harness.writes_a_loop(embed_grad)
  loop_cost, flat_cost = (harness.compiled_cost(p.compile()) for p in (looped, unrolled))
  assert loop_cost['flops'] < flat_cost['flops'] / 4  # why the flag is needed
  assert harness.gflops_cell({'gflops': 1.5, 'gflops_lower_bound': True}) == '>=1.50'
  assert harness.gflops_cell({'gflops': 1.5}) == '1.50'
  assert harness.gflops_cell({'gflops': None, 'gflops_lower_bound': True}) == '-'
