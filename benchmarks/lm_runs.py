"""A run of the LM study, its key, and the paired difference of two arms by seed."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Optional

# What a run's step costs depends on: (arm, depth, seq_len); seq_len None is the study's own.
CostKey = tuple[str, int, Optional[int]]


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run. ``lr``, ``seq_len``, ``dropout`` and ``warmup`` (None: the
  study's default) override the peak learning rate, the context (at the same bytes
  per step: the batch shrinks as the context grows), the model's dropout and the
  learning rate's warm-up steps."""

  corpus: str
  arm: str
  depth: int
  steps: int
  seed: int
  lr: Optional[float] = None
  seq_len: Optional[int] = None
  dropout: Optional[float] = None
  warmup: Optional[int] = None

  @property
  def key(self) -> str:
    return f'{self.corpus}-{self.arm}-L{self.depth}-n{self.steps}-s{self.seed}' + self.options

  @property
  def cost_key(self) -> Optional[CostKey]:
    """What the run's step cost depends on (not its learning rate); None with dropout,
    which the costs (measured without) leave out."""
    return None if self.dropout else (self.arm, self.depth, self.seq_len)

  @property
  def options(self) -> str:
    """The key's suffix for the overridden settings ('' when none is)."""
    return ''.join(
        f'-{tag}{value:g}'
        for tag, value in zip(_OPTION_TAGS, (self.lr, self.seq_len, self.dropout, self.warmup))
        if value is not None
    )


_OPTION_TAGS = ('lr', 'ctx', 'drop', 'wu')
_INT_OPTIONS = ('seq_len', 'warmup')


def parse_key(key: str) -> Run:
  corpus, rest = key.split('-', 1)
  options = {}
  for field, tag in reversed(list(zip(('lr', 'seq_len', 'dropout', 'warmup'), _OPTION_TAGS))):
    head, _, last = rest.rpartition(f'-{tag}')
    if head and last and last[0].isdigit() and '-' not in last:
      options[field] = int(last) if field in _INT_OPTIONS else float(last)
      rest = head
  arm, depth, steps, seed = rest.rsplit('-', 3)
  return Run(corpus, arm, int(depth[1:]), int(steps[1:]), int(seed[1:]), **options)


def paired(a: dict[int, float], b: dict[int, float]) -> Optional[dict[str, Any]]:
  """Per-seed differences ``a - b`` over the seeds both have: mean, std, the
  95% t-interval half-width and whether it excludes 0 (None under 2 seeds)."""
  seeds = sorted(set(a) & set(b))
  if len(seeds) < 2:
    return None
  d = [a[s] - b[s] for s in seeds]
  mean, std = statistics.mean(d), statistics.stdev(d)
  from scipy import stats  # pylint: disable=g-import-not-at-top

  half = float(stats.t.ppf(0.975, len(d) - 1)) * std / math.sqrt(len(d))  # 95% Student-t
  return dict(seeds=seeds, diffs=d, mean=mean, std=std, half=half, significant=abs(mean) > half)
