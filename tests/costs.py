"""What the tests cost, by file: ``python -m pytest -n auto --costs`` (a pytest plugin that
``tests/conftest.py`` loads).

Per test (set-up, call and tear-down), measured in the process that runs it:
wall seconds; CPU seconds of that process; CPU seconds of the processes it started and waited
for (subprocess runs, notebook kernels, the multi-process clusters); and of the test process's
time, the seconds JAX spent tracing and lowering programs and XLA compiling them (a compile
served by the persistent cache counts its read). The summary adds them up by file, most
core-seconds first: the table in CONTRIBUTING.md ("What the suite costs"); then, per xdist
worker, its seconds in tests and its idle seconds before its first test and after its last
(the start-up, and the wait for the other worker's last tests).

``--save-costs`` (which implies ``--costs``; on the full suite) writes each file's wall seconds to
:data:`FILE_SECONDS`, the order in which ``tests/conftest.py`` hands files to the workers.
"""

import json
import os
import pathlib
import resource
import time

import pytest

# What jax.monitoring reports per program: tracing, lowering to MLIR, XLA's compile.
TRACE_EVENTS = (
    '/jax/core/compile/jaxpr_trace_duration',
    '/jax/core/compile/jaxpr_to_mlir_module_duration',
)
COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'
COLUMNS = ('wall', 'cpu', 'children', 'trace', 'compile')
_SECONDS = {'trace': 0.0, 'compile': 0.0}  # this process's totals so far
_START = pytest.StashKey[dict]()
# Wall seconds of each test file in the last full run measured with --costs --save-costs.
FILE_SECONDS = pathlib.Path(__file__).with_name('file_seconds.json')


def pytest_addoption(parser):
  parser.addoption('--costs', action='store_true', help='Print what the tests cost, by file.')
  parser.addoption(
      '--save-costs',
      action='store_true',
      help=f"--costs, and write each file's wall seconds to {FILE_SECONDS.name} (run the full suite).",
  )


def pytest_configure(config):
  del config
  import jax.monitoring  # pylint: disable=g-import-not-at-top

  def on_duration(event, seconds, **kwargs):
    del kwargs
    if event in TRACE_EVENTS:
      _SECONDS['trace'] += seconds
    elif event == COMPILE_EVENT:
      _SECONDS['compile'] += seconds

  jax.monitoring.register_event_duration_secs_listener(on_duration)


def _now() -> dict[str, float]:
  own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  return {
      'time': time.time(),  # comparable across the workers
      'wall': time.perf_counter(),
      'cpu': own.ru_utime + own.ru_stime,
      'children': children.ru_utime + children.ru_stime,
      **_SECONDS,
  }


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  item.stash[_START] = _now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  """Adds ``('costs', {column: seconds})`` and ``('span', (worker, start, end))`` to the
  tear-down's report (which, unlike the item, reaches the xdist controller)."""
  report = yield
  if call.when == 'teardown' and _START in item.stash:
    start, end = item.stash[_START], _now()
    report.user_properties.append(('costs', {c: end[c] - start[c] for c in COLUMNS}))
    worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
    report.user_properties.append(('span', (worker, start['time'], end['time'])))
  return report


def by_file(reports) -> dict[str, dict[str, float]]:
  """``{file: {'tests': n, column: seconds}}`` of the reports' costs."""
  files = {}
  for r in reports:
    for key, costs in r.user_properties:
      if key == 'costs':
        row = files.setdefault(r.nodeid.split('::')[0], dict.fromkeys(('tests', *COLUMNS), 0.0))
        row['tests'] += 1
        for c in COLUMNS:
          row[c] += costs[c]
  return files


def by_worker(reports) -> dict[str, dict[str, float]]:
  """``{worker: {'tests', 'busy', 'first', 'last'}}``: its tests' seconds, and when its first
  test started and its last ended (``time.time()``)."""
  workers = {}
  for r in reports:
    for key, span in r.user_properties:
      if key == 'span':
        name, start, end = span
        w = workers.setdefault(name, dict(tests=0, busy=0.0, first=start, last=end))
        w.update(tests=w['tests'] + 1, busy=w['busy'] + end - start)
        w.update(first=min(w['first'], start), last=max(w['last'], end))
  return workers


def worker_lines(workers: dict[str, dict[str, float]]) -> list[str]:
  """One line per worker: its tests, its busy seconds, and its idle seconds from the
  first test anywhere to the last (the start-up before and the wait after its own)."""
  if not workers:
    return []
  first = min(w['first'] for w in workers.values())
  last = max(w['last'] for w in workers.values())
  return [
      f'{name}: {w["tests"]:.0f} tests, {w["busy"]:.0f} s in tests, idle '
      f'{w["first"] - first:.0f} s before its first and {last - w["last"]:.0f} s after its last'
      for name, w in sorted(workers.items())
  ]


def table(files: dict[str, dict[str, float]]) -> list[str]:
  """Markdown rows, most core-seconds (own CPU + children's) first, and a total."""
  core = lambda row: row['cpu'] + row['children']
  lines = [
      '| file | tests | wall s | core s | of which subprocesses | trace+lower | XLA compile |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  total = {k: sum(row[k] for row in files.values()) for k in ('tests', *COLUMNS)}
  for name, row in [*sorted(files.items(), key=lambda kv: -core(kv[1])), ('total', total)]:
    lines.append(
        f'| {name} | {row["tests"]:.0f} | {row["wall"]:.0f} | {core(row):.0f} | '
        f'{row["children"]:.0f} | {row["trace"]:.0f} | {row["compile"]:.0f} |'
    )
  return lines


def pytest_terminal_summary(terminalreporter, config):
  if not (config.getoption('costs') or config.getoption('save_costs')):
    return
  reports = [
      r for rs in terminalreporter.stats.values() for r in rs if isinstance(r, pytest.TestReport)
  ]
  files = by_file(reports)
  terminalreporter.section('what the tests cost, by file (seconds)')
  for line in table(files) + worker_lines(by_worker(reports)):
    terminalreporter.write_line(line)
  if config.getoption('save_costs'):
    FILE_SECONDS.write_text(file_seconds_json(files))


def file_seconds_json(files: dict[str, dict[str, float]]) -> str:
  """``{file: wall seconds}``, longest first, as :data:`FILE_SECONDS` holds it."""
  seconds = sorted(
      ((name, round(row['wall'], 1)) for name, row in files.items()), key=lambda kv: -kv[1]
  )
  return json.dumps(dict(seconds), indent=1) + '\n'
