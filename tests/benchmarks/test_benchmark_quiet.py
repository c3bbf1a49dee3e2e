"""The quiet-machine rule of the benchmarks (``benchmarks/quiet.py``): others' share of the
cores from the machine's busy time less this process tree's, a loaded timing refused unless
allowed, and a loaded row never replacing a quiet one."""

import subprocess
import sys

import pytest

from benchmarks import harness, quiet
from helpers import mlp_workload


def test_others_are_the_machines_busy_time_less_this_process_trees(monkeypatch):
  clock = iter([100.0, 102.0])  # a 2-second timing
  busy = iter([50.0, 53.0])  # 3 core-seconds busy on the machine
  mine = iter([10.0, 11.0])  # 1 of them this process tree's
  monkeypatch.setattr(quiet.time, 'monotonic', lambda: next(clock))
  monkeypatch.setattr(quiet, '_busy_seconds', lambda: next(busy))
  monkeypatch.setattr(quiet, '_tree_seconds', lambda pid: next(mine))
  loads = iter([(0.5, 0, 0), (1.5, 0, 0)])
  monkeypatch.setattr(quiet.os, 'getloadavg', lambda: next(loads))
  monkeypatch.setattr(quiet.os, 'cpu_count', lambda: 4)
  with quiet.watch() as load:
    pass
  assert load() == quiet.Load(0.5, 1.5, 2.0 / (2.0 * 4))  # 2 core-seconds of 8
  assert not load().quiet
  assert load().fields() == dict(
      load_average='0.50-1.50', others_cpu=0.25, measured_under_load=True
  )
  with pytest.raises(quiet.LoadedMachine, match=r"the step of 'x': load average 0.50 before"):
    quiet.check(load(), "the step of 'x'", allow_load=False)
  quiet.check(load(), "the step of 'x'", allow_load=True)
  quiet.check(quiet.Load(0.1, 0.1, quiet.MAX_OTHERS), 'x', allow_load=False)  # quiet enough


def test_this_process_tree_counts_its_childrens_cpu():
  before = quiet._tree_seconds(__import__('os').getpid())
  spin = 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass'
  subprocess.run([sys.executable, '-c', spin], check=True)
  assert quiet._tree_seconds(__import__('os').getpid()) - before >= 0.45


def test_a_loaded_row_never_replaces_a_quiet_one():
  old = [
      {'variant': 'a', 'step_ms': '10', 'load_average': '0.1-0.1', 'measured_under_load': 'False'},
      {'variant': 'b', 'step_ms': '20', 'load_average': '3.0-3.0', 'measured_under_load': 'True'},
  ]
  new = [
      {'variant': 'a', 'step_ms': 99, 'load_average': '4-4', 'measured_under_load': True},
      {'variant': 'b', 'step_ms': 21, 'load_average': '0.1-0.1', 'measured_under_load': False},
      {'variant': 'c', 'step_ms': 30, 'load_average': '4-4', 'measured_under_load': True},
  ]
  kept = quiet.keep_quiet_rows(old, new)
  assert [r['step_ms'] for r in kept] == ['10', 21, 30]


def test_the_harness_records_the_load_and_refuses_a_loaded_timing(monkeypatch):
  monkeypatch.setattr(quiet, 'MAX_OTHERS', -1.0)  # every timing counts as loaded
  build = lambda: mlp_workload(8)
  with pytest.raises(quiet.LoadedMachine, match=r"the step of 'mlp'"):
    harness.measure('mlp', build, warmup=0, repeats=1)
  row = harness.measure('mlp', build, warmup=0, repeats=1, allow_load=True)
  assert row['measured_under_load'] is True and row['step_ms'] > 0
