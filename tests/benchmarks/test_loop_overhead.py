"""benchmarks.loop_overhead on a tiny config: it runs and reports both ratios.

Not a timing test: the speed target lives in benchmarks/results/loop_overhead_cpu.md.
"""

import math

import pytest

from benchmarks import loop_overhead
from helpers import tiny_config


def test_window_rate_sums_the_log_intervals_of_the_window():
  history = [{'step': s, 'steps_per_sec': 2.0 if s <= 4 else 4.0} for s in (2, 4, 6, 8)]
  # steps 5-8: two intervals of 2 steps at 4 steps/s -> 4 steps in 1 s
  assert loop_overhead.window_rate(history, 2, 5, 8) == pytest.approx(4.0)
  with pytest.raises(ValueError, match='do not cover'):
    loop_overhead.window_rate(history, 2, 5, 10)


def test_windows_leave_out_the_one_time_costs(corpus, tmp_path):
  config = tiny_config(corpus, tmp_path / 'data', eval_every_steps=6, checkpoint_every_steps=3)
  assert loop_overhead.period(config) == 6
  # log every 2: compile in 1-2, the probe's compile in 3-4, first eval + checkpoint at 6
  assert loop_overhead.windows(config) == {'loop': (5, 6), 'loop+eval+ckpt': (9, 14)}
  assert loop_overhead.run_config(config).num_train_steps == 14
  config.log_every_steps = 4
  with pytest.raises(ValueError, match='log_every_steps=4'):
    loop_overhead.period(config)
  config.log_every_steps = 3
  with pytest.raises(ValueError, match='at least 3 log intervals'):
    loop_overhead.windows(config)


@pytest.mark.slow
def test_reports_both_ratios_on_a_tiny_config(corpus, tmp_path):
  config = tiny_config(corpus, tmp_path / 'data', eval_every_steps=6, checkpoint_every_steps=6)
  result = loop_overhead.measure(config, repeats=1, root=tmp_path / 'runs')
  for name in loop_overhead.CANDIDATES:
    assert len(result['steps_per_sec'][name]) == 1 and result['median'][name] > 0
  for key in ('ratio_excluded', 'ratio_included', 'cpu_ratio_excluded', 'cpu_ratio_included'):
    assert math.isfinite(result[key]) and result[key] > 0
  text = loop_overhead.markdown(result, 'tiny')
  assert 'steps 5-6, with them at their cadence over steps 9-14' in text
  assert f'{result["ratio_excluded"]:.3f}' in text and f'{result["ratio_included"]:.3f}' in text


def test_clock_rates_from_the_marks():
  marks = [(2, 10.0, 1.0), (4, 12.0, 2.0), (6, 13.0, 2.5)]
  assert loop_overhead.clock_rates(marks, 3, 6) == pytest.approx((4 / 3.0, 4 / 1.5))
  with pytest.raises(ValueError, match='no log line'):
    loop_overhead.clock_rates(marks, 2, 6)


def test_loads_the_default_config_as_train_py_does():
  """configs/default.py imports its package's helpers (a relative import)."""
  from conftest import REPO  # pylint: disable=g-import-not-at-top

  config = loop_overhead.load_config(str(REPO / 'configs/default.py'))
  assert config.model.name == 'cp_transformer_lm' and config.num_train_steps == 500
  assert (
      loop_overhead.load_config(f"{REPO / 'configs/default.py'}:baseline").model.context_pool
      is None
  )
