"""benchmarks/peers.py without its peers: the worker protocol, records, errors.

The peers themselves (TensorFlow + tensor2tensor, PyTorch + timm) are never
installed for the tests; the protocol runs against this interpreter.
"""

import math
import sys

import pytest

from benchmarks import peers


def _fake(name, framework, fb, f=1.0):
  cand = peers.Candidate(name, framework, lambda cmd: 0.0, lambda: (2.0**20, 'test'), {'v': 1})
  cand.times = {'fb': list(fb), 'f': [f]}
  return cand


def test_worker_error_is_reported_as_a_failed_candidate():
  cand = peers._peer('bogus peer', 'TF', sys.executable, {'kind': 'no_such_worker'})
  assert 'FAILED' in cand.name and 'no_such_worker' in cand.name
  assert math.isnan(cand.step('fb'))
  cand.close()


def test_area_ratios_are_to_the_same_framework_and_mode():
  t2t_xla, std_xla, t2t_graph, std_graph, ours, std_jax = [3, 5, 4], [1, 2], [9], [3], [8], [2]
  cands = [
      _fake('tensor2tensor area_attention.py, TF + XLA', 'TF', t2t_xla),
      _fake('standard attention, TF + XLA', 'TF', std_xla),
      _fake('tensor2tensor area_attention.py, TF graph mode', 'TF', t2t_graph),
      _fake('standard attention, TF graph mode', 'TF', std_graph),
      _fake('ours: dot_product_area_attention', 'JAX', ours),
      _fake('standard attention, JAX', 'JAX', std_jax),
  ]
  recs = {r['name']: r for r in peers.row_records('area', cands)}
  assert recs['tensor2tensor area_attention.py, TF + XLA']['ratio'] == pytest.approx(4 / 1.5)
  assert recs['tensor2tensor area_attention.py, TF graph mode']['ratio'] == pytest.approx(9 / 3)
  assert recs['ours: dot_product_area_attention']['ratio'] == pytest.approx(8 / 2)
  assert all('ratio' not in r for n, r in recs.items() if n.startswith('standard'))
  text = peers.markdown(list(recs.values()), repeats=3)
  for name, rec in recs.items():
    assert name in text
    if 'ratio' in rec:
      assert f'{rec["ratio"]:.2f}x' in text


def test_lambda_rows_have_no_ratio():
  recs = peers.row_records(
      'lambda_global', [_fake('timm', 'PyTorch', [5]), _fake('ours', 'JAX', [4])]
  )
  assert [r['fb_ms'] for r in recs] == [5, 4]
  assert all('ratio' not in r for r in recs)
  assert all(r['memory_mib'] == 1.0 for r in recs)


def test_unknown_row_raises_before_anything_runs():
  with pytest.raises(ValueError, match=r"--rows='area,nope'.*\['nope'\].*'lambda_global'"):
    peers.main(['--rows', 'area,nope', '--no_install'])


def test_missing_env_without_install_raises(tmp_path):
  with pytest.raises(RuntimeError, match='missing or out of date'):
    peers.ensure_env(tmp_path, 'torch', install=False, log=print)


def test_ours_relative_to_the_fastest_peer_forward_and_fb():
  cands = [
      _fake('tensor2tensor area_attention.py, TF + XLA', 'TF', [8], f=6.0),
      _fake('tensor2tensor area_attention.py, TF graph mode', 'TF', [10], f=3.0),
      _fake('standard attention, TF graph mode', 'TF', [1], f=0.5),
      _fake('ours: dot_product_area_attention', 'JAX', [4], f=1.5),
      _fake('standard attention, JAX', 'JAX', [2], f=0.5),
  ]
  recs = {r['name']: r for r in peers.row_records('area', cands)}
  ours = recs['ours: dot_product_area_attention']
  assert ours['f_vs_peer'] == pytest.approx(1.5 / 3.0)  # graph mode's forward is the faster
  assert ours['fb_vs_peer'] == pytest.approx(4 / 8)  # XLA's f+b is the faster
  assert all('f_vs_peer' not in r for n, r in recs.items() if not n.startswith('ours'))
  assert '| 0.50x | 0.50x |' in peers.markdown(list(recs.values()), repeats=1)


def test_every_row_says_the_load_it_was_timed_under():
  recs = peers.row_records(
      'lambda_conv, batch 2', [_fake('timm', 'PyTorch', [5]), _fake('ours', 'JAX', [4])]
  )
  quiet = dict(load_average='1.07-1.10', others_cpu=0.004, measured_under_load=False)
  loaded = dict(load_average='9.50-11.20', others_cpu=0.62, measured_under_load=True)
  text = peers.markdown([{**recs[0], **quiet}, {**recs[1], **loaded}], repeats=1)
  assert '| 1.07-1.10, 0% |' in text and '| 9.50-11.20, 62% (loaded) |' in text
  assert '| not recorded |' in peers.markdown(recs, repeats=1)  # rows of an older run
