"""The fast tier (``-m "not slow"``) keeps the first case of every sweep (``tests/conftest.py``)."""

import pytest

from conftest import mark_sweep_cases_slow


class _Item:
  """What the rule reads of a collected test: its node id and marks."""

  def __init__(self, nodeid, *marks):
    self.nodeid, self.marks = nodeid, [getattr(pytest.mark, name).mark for name in marks]

  def get_closest_marker(self, name):
    return next((m for m in self.marks if m.name == name), None)

  def add_marker(self, marker):
    self.marks.append(marker.mark)

  def slow(self):
    return self.get_closest_marker('slow') is not None


def test_a_sweep_keeps_its_first_case_fast_and_other_tests_are_untouched():
  items = [
      _Item('t.py::test_a[x]', 'sweep'),
      _Item('t.py::test_b[x]'),
      _Item('t.py::test_a[y]', 'sweep'),
      _Item('t.py::test_b[y]'),
      _Item('t.py::test_c', 'slow'),
      _Item('t.py::test_a[z]', 'sweep'),
      _Item('u.py::test_a[x]', 'sweep'),
  ]
  mark_sweep_cases_slow(items)
  assert [i.slow() for i in items] == [False, False, True, False, True, True, False]


def test_costs_add_up_by_file_with_the_most_core_seconds_first():
  import costs  # pylint: disable=g-import-not-at-top

  def report(nodeid, **seconds):
    r = type('Report', (), {})()
    r.nodeid, r.user_properties = nodeid, [('explained', True), ('costs', seconds)]
    return r

  zero = dict.fromkeys(costs.COLUMNS, 0.0)
  reports = [
      report('a.py::t1', **{**zero, 'wall': 3.0, 'cpu': 1.0, 'compile': 0.5}),
      report('b.py::t1', **{**zero, 'wall': 9.0, 'cpu': 1.0, 'children': 7.0}),
      report('a.py::t2', **{**zero, 'wall': 2.0, 'cpu': 2.0, 'trace': 0.25}),
  ]
  files = costs.by_file(reports)
  assert files['a.py'] == dict(tests=2, wall=5.0, cpu=3.0, children=0.0, trace=0.25, compile=0.5)
  rows = costs.table(files)
  assert [r.split(' | ')[0] for r in rows[2:]] == ['| b.py', '| a.py', '| total']
  assert rows[-1] == '| total | 3 | 14 | 11 | 7 | 0 | 0 |'


def test_costs_name_each_workers_busy_and_idle_seconds():
  import costs  # pylint: disable=g-import-not-at-top

  def report(worker, start, end):
    r = type('Report', (), {})()
    r.user_properties = [('costs', {}), ('span', (worker, start, end))]
    return r

  reports = [report('gw0', 100.0, 130.0), report('gw1', 102.0, 110.0), report('gw0', 131.0, 140.0)]
  workers = costs.by_worker(reports)
  assert workers['gw0'] == dict(tests=2, busy=39.0, first=100.0, last=140.0)
  assert costs.worker_lines(workers) == [
      'gw0: 2 tests, 39 s in tests, idle 0 s before its first and 0 s after its last',
      'gw1: 1 tests, 8 s in tests, idle 2 s before its first and 30 s after its last',
  ]
