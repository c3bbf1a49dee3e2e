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
