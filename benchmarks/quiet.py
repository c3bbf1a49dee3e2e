"""The quiet-machine rule for timings: what else ran on the machine while a timing ran.

A ratio measured while other processes compete for the cores is not the ratio a user
gets (benchmarks/results/peers_cpu.md: under a load of 9-12 on 2 cores, timm's conv
lambda forward took 147-262 ms; on a quiet machine 11-13 ms). So every timing records:

* the 1-minute **load average** before and after it (``os.getloadavg``), and
* **others' CPU**: the share of all the machine's cores that processes outside this
  process tree (this process and its children: the peers' workers, XLA's threads)
  used during it, from ``/proc/stat`` and ``/proc/<pid>/stat`` (Linux).

A timing with others' CPU above :data:`MAX_OTHERS` is *loaded*: :func:`check` refuses it
(:class:`LoadedMachine`, naming the numbers) unless the caller allows load, and then
the row says ``measured_under_load``; :func:`keep_quiet_rows` never lets a loaded row
replace a quiet one in a results file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

# Others may use this share of the cores during a timing (a tenth of one of 2 cores is 5%:
# an editor, a shell; a second training run is 50%).
MAX_OTHERS = 0.05
_TICKS = os.sysconf('SC_CLK_TCK')


class LoadedMachine(RuntimeError):
  """A timing ran while other processes used the machine."""


@dataclasses.dataclass(frozen=True)
class Load:
  """What else ran during a timing: load averages before/after, others' share of the cores."""

  load_before: float
  load_after: float
  others: float

  @property
  def quiet(self) -> bool:
    return self.others <= MAX_OTHERS

  def fields(self) -> dict[str, Any]:
    """The row fields a timing carries."""
    return dict(
        load_average=f'{self.load_before:.2f}-{self.load_after:.2f}',
        others_cpu=round(self.others, 3),
        measured_under_load=not self.quiet,
    )

  def describe(self) -> str:
    return (
        f'load average {self.load_before:.2f} before, {self.load_after:.2f} after; other'
        f' processes used {self.others:.0%} of the {os.cpu_count()} cores'
    )


def _busy_seconds() -> float:
  """CPU seconds all cores spent busy since boot (``/proc/stat``'s first line)."""
  with open('/proc/stat') as f:
    fields = [int(x) for x in f.readline().split()[1:]]
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
  return (sum(fields[:8]) - idle) / _TICKS


def _tree_seconds(root: int) -> float:
  """CPU seconds used by ``root`` and its descendants (live ones, and the waited-for
  children their parents have counted)."""
  parents, used = {}, {}
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        stat = f.read()
    except OSError:  # the process ended meanwhile
      continue
    fields = stat[stat.rindex(')') + 2 :].split()
    parents[int(entry)] = int(fields[1])
    used[int(entry)] = sum(int(x) for x in fields[11:15]) / _TICKS  # utime stime cutime cstime
  tree, frontier = {root}, [root]
  while frontier:
    pid = frontier.pop()
    children = [p for p, parent in parents.items() if parent == pid and p not in tree]
    tree.update(children)
    frontier += children
  return sum(used.get(p, 0.0) for p in tree)


@contextlib.contextmanager
def watch() -> Iterator[Callable[[], Load]]:
  """``with watch() as load: <timing>``; then ``load()`` is the :class:`Load` of the block."""
  before = (os.getloadavg()[0], _busy_seconds(), _tree_seconds(os.getpid()), time.monotonic())
  result: list[Load] = []
  yield lambda: result[0]
  wall = max(time.monotonic() - before[3], 1e-9)
  others = (_busy_seconds() - before[1]) - (_tree_seconds(os.getpid()) - before[2])
  result.append(Load(before[0], os.getloadavg()[0], max(0.0, others) / (wall * os.cpu_count())))


def check(load: Load, what: str, allow_load: bool) -> None:
  """Raises :class:`LoadedMachine` for a loaded timing of ``what`` unless ``allow_load``."""
  if not load.quiet and not allow_load:
    raise LoadedMachine(
        f'{what}: {load.describe()} (more than {MAX_OTHERS:.0%}): time on a quiet machine,'
        ' or allow load (--allow_load), which marks the row measured_under_load.'
    )


def keep_quiet_rows(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], key: str = 'variant'
) -> list[Mapping[str, Any]]:
  """``new``, except that a loaded row of ``new`` whose ``key`` has a quiet row in ``old``
  keeps the old one (rows read back from a CSV hold strings: 'True' / 'False')."""
  loaded = lambda row: str(row.get('measured_under_load', '')) == 'True'
  quiet_old = {row[key]: row for row in old if not loaded(row) and row.get('load_average')}
  return [quiet_old.get(row[key], row) if loaded(row) else row for row in new]
