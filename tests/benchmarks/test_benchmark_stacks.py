"""benchmarks/stacks.py: the layers' outputs saved per stack, and their comparison."""

import numpy as np
import pytest

from benchmarks import stacks


def test_compare_reports_the_largest_difference_against_the_largest_value():
  a = {'y': np.array([1.0, -4.0, 2.0]), 'y params': np.array([0.5, 0.25])}
  b = {'y': np.array([1.0, -4.0, 2.001]), 'y params': np.array([0.5, 0.25])}
  table = stacks.compare(a, b).splitlines()
  assert table[0] == '| array | max abs difference | max abs value | ratio |'
  assert table[2] == '| y | 1.00e-03 | 4.00e+00 | 2.5e-04 |'
  assert table[3] == '| y params | 0.00e+00 | 5.00e-01 | 0.0e+00 |'
  with pytest.raises(ValueError, match=r"different arrays: \['z'\]"):
    stacks.compare(a, {**b, 'z': np.zeros(1)})
  with pytest.raises(ValueError, match=r'y: shapes \(3,\) and \(2,\) differ'):
    stacks.compare(a, {**b, 'y': np.zeros(2)})


def test_an_unknown_command_line_prints_the_usage():
  with pytest.raises(SystemExit, match='usage: --save OUT.npz'):
    stacks.main(['--stdlib', '/usr/lib/python3'])  # no `--` before train.py's flags


@pytest.mark.slow
def test_every_layer_is_saved_with_its_parameters_and_repeats_exactly(tmp_path):
  """Slow (six layers compiled op by op, seconds)."""
  path = tmp_path / 'layers.npz'
  stacks.main(['--save', str(path)])
  saved = dict(np.load(path))
  assert set(saved) == set(stacks.CASES) | {f'{name} params' for name in stacks.CASES}
  for name, ((_, _), shape) in stacks.CASES.items():
    assert saved[name].shape[:-1] == shape[:-1] and np.isfinite(saved[name]).all(), name
  again = stacks.layer_outputs()
  assert all(np.array_equal(saved[k], again[k]) for k in saved)
