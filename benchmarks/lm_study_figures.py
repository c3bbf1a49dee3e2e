"""Figures of the LM study's long runs: learning curves and per-position losses.

* :func:`long_curves`: validation BPC along training per arm of each long
  group (corpus, depth, steps): the mean over seeds and, with several seeds,
  the band between the lowest and the highest seed.
* :func:`comparison_curves`: the same per comparison of
  :mod:`benchmarks.lm_comparisons` (the baseline and its arms, paired by seed);
* :func:`position_losses`: from the diagnostics of the seed-0 long runs
  (:mod:`benchmarks.lm_diagnostics`), the validation BPC of each position
  bucket along training, one row per corpus and one panel per bucket.
"""

from __future__ import annotations

import pathlib
import statistics
from typing import Any, Optional, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position


def _style(i: int, baseline: bool) -> dict[str, Any]:
  """The line of the i-th curve: the baseline black and thick, the others a
  colour each (tab20, so a dozen arms do not share colours)."""
  if baseline:
    return dict(lw=2.2, color='k')
  j = i % 20  # the ten dark colours first, then their light pairs
  return dict(
      lw=1.4, color=plt.get_cmap('tab20')(2 * (j % 10) + j // 10), ls='-' if i < 20 else '--'
  )


def _long_groups(results: Sequence[dict[str, Any]], long_steps: int) -> list[tuple[str, int]]:
  return sorted({(r['corpus'], r['depth']) for r in results if r['steps'] == long_steps})


def _curves_column(top, bottom, series, total_steps: int, title: str) -> None:
  """Validation BPC vs step of ``series`` (``[(label, colour, [val_curve per seed])]``,
  ``colour`` an index of :func:`_style`, None for the baseline): the mean over seeds
  and, with several seeds, the band between the lowest and the highest; the whole run
  in ``top`` and its second half, where runs end, in ``bottom``."""
  late = []  # every value drawn in the second half, for its y range
  for label, colour, val_curves in series:
    curves = [dict(c) for c in val_curves]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    lo, hi = ([f(c[s] for c in curves) for s in steps] for f in (min, max))
    mean = [statistics.mean(c[s] for c in curves) for s in steps]
    late += [v for s, a, b in zip(steps, lo, hi) if s >= total_steps // 2 for v in (a, b)]
    label = f'{label} ({len(curves)} seed{"s" * (len(curves) > 1)})'
    for ax in (top, bottom):
      (line,) = ax.plot(steps, mean, label=label, **_style(colour or 0, colour is None))
      if len(curves) > 1:
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
  top.set_ylim(top=min(top.get_ylim()[1], 2.6))
  top.set_title(f'{title}: mean over seeds, band = seed range', fontsize=10)
  top.legend(fontsize=8)
  bottom.set_xlim(total_steps // 2, total_steps)
  if late:
    margin = 0.02 * (max(late) - min(late))
    bottom.set_ylim(min(late) - margin, max(late) + margin)
  bottom.set_title(f'{title}: the second half', fontsize=10)
  for ax in (top, bottom):
    ax.set_xlabel('training step')
    ax.set_ylabel('validation BPC')
    ax.grid(alpha=0.3)


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def long_curves(
    results: Sequence[dict[str, Any]], long_steps: int, arm_order: Sequence[str], path: pathlib.Path
) -> pathlib.Path:
  """One column per long (corpus, depth): validation BPC vs step per arm
  (:func:`_curves_column`)."""
  groups = _long_groups(results, long_steps)
  fig, axes = plt.subplots(2, len(groups), figsize=(7 * len(groups), 9), squeeze=False)
  for col, (corpus, depth) in enumerate(groups):
    mine = [
        r for r in results if (r['corpus'], r['depth'], r['steps']) == (corpus, depth, long_steps)
    ]
    shown = [a for a in arm_order if any(r['arm'] == a for r in mine)]
    series = [
        (arm, None if arm == 'baseline' else i, [r['val_curve'] for r in mine if r['arm'] == arm])
        for i, arm in enumerate(shown)
    ]
    _curves_column(*axes[:, col], series, long_steps, f'{corpus}, depth {depth}')
  return _save(fig, path)


def comparison_curves(
    columns: Sequence[tuple[str, int, Sequence[tuple[str, Optional[int], Sequence[Any]]]]],
    path: pathlib.Path,
) -> pathlib.Path:
  """One column per ``(title, steps, series)`` (:func:`_curves_column`'s series)."""
  fig, axes = plt.subplots(2, len(columns), figsize=(7 * len(columns), 9), squeeze=False)
  for col, (title, steps, series) in enumerate(columns):
    _curves_column(*axes[:, col], series, steps, title)
  return _save(fig, path)


def position_losses(
    diagnostics: dict[str, dict[str, dict[str, Any]]], path: pathlib.Path
) -> pathlib.Path:
  """One row per corpus (``diagnostics``: ``{corpus: {run key: diagnostics}}``),
  one panel per position bucket: validation BPC vs step per diagnosed run; the
  baselines black, the first solid and any other (another depth) dashed."""
  rows = list(diagnostics.items())
  first = next(iter(next(iter(rows[0][1].values()))['steps'].values()))
  names = list(first['val_bpc_by_bucket'])
  fig, axes = plt.subplots(
      len(rows), len(names), figsize=(6 * len(names), 4.5 * len(rows)), squeeze=False
  )
  for (corpus, runs), row in zip(rows, axes):
    for ax, name in zip(row, names):
      baselines = 0
      for i, (key, d) in enumerate(runs.items()):
        steps = sorted(d['steps'], key=int)
        values = [d['steps'][s]['val_bpc_by_bucket'][name] for s in steps]
        style = _style(i, '-baseline-' in key)
        if '-baseline-' in key:
          style['ls'] = '-' if baselines == 0 else '--'
          baselines += 1
        ax.plot([int(s) for s in steps], values, marker='o', ms=3, label=key, **style)
      ax.set_xlabel('training step')
      ax.set_ylabel('validation BPC')
      ax.set_title(f'{corpus}: positions {name} of the window')
      ax.grid(alpha=0.3)
    row[-1].legend(fontsize=7)
  return _save(fig, path)
