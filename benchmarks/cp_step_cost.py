r"""ContextPool's training step against the baseline's at long context: ``python -m benchmarks.cp_step_cost``.

The LM study's model (``configs/default.py`` at the study's sizes: 2 layers of width 128, the
same bytes per step at every context) with pooled keys and values on each of ContextPool's
implementations (the dense ``[batch, m, n]`` pooling matrix, and the memory-linear blockwise
one), at 256, 1,024 and 2,048 bytes of context. Per (arm, context): the compiled step's GFLOPs
against the baseline's, and its step time paired step by step with the baseline's in one
process (``benchmarks.lm_study.measure_costs``, on ``benchmarks.harness``: a loaded machine is
refused, ``benchmarks/quiet.py``). The GFLOPs ratio is the bound a perfect implementation
reaches: the pooling's added work. Writes ``<out>/cp_step_cost.md``; the measured rows are
kept as JSON under ``--costs_dir``'s ``costs/`` (a rerun measures only what is missing).
"""

from __future__ import annotations

import pathlib
import platform
import sys

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))
# pylint: disable=g-import-not-at-top,wrong-import-position
from benchmarks import lm_study  # its flags too: --allow_load is the study's

# pylint: enable=g-import-not-at-top,wrong-import-position
ARMS = ('baseline', 'cp_kv_dense', 'cp_kv_blockwise')
CONTEXTS = (256, 1024, 2048)
PAPER_RATIO = 1.07  # ContextPool's step time over the baseline's (paper, Sec. 4.1)


def keys(depth: int = 2):
  return [(arm, depth, None if n == 256 else n) for n in CONTEXTS for arm in ARMS]


def report(costs, depth: int = 2) -> str:
  """The table: per context, each arm's GFLOPs and step time against the baseline's."""
  lines = [
      "# ContextPool's training step against the baseline's, by context",
      '',
      f"`python -m benchmarks.cp_step_cost` (Python {platform.python_version()}): the LM study's"
      ' model (depth 2, width 128, 4 heads; the same 4,096 bytes per step at every context),'
      " pooled keys and values (`context_pool_reads='kv'`) on the dense and on the blockwise"
      ' (memory-linear) implementation. Step time: the median of per-pair ratios, each'
      ' ContextPool step alternating with a baseline step in one process (20 pairs). The'
      ' GFLOPs ratio is what the pooling adds: the bound on the step-time ratio of an'
      f" implementation that runs at the baseline's FLOP rate. The paper reports {PAPER_RATIO}x.",
      '',
      '| context | arm | GFLOPs (vs baseline) | GFLOPs ratio | step time ratio | load |',
      '| ---: | --- | ---: | ---: | ---: | --- |',
  ]
  for n in CONTEXTS:
    base = costs.get(('baseline', depth, None if n == 256 else n))
    for arm in ARMS[1:]:
      row = costs.get((arm, depth, None if n == 256 else n))
      if not row or not base:
        continue
      load = f'{row.get("load_average", "?")}, others {row.get("others_cpu", "?")}'
      lines.append(
          f'| {n:,} | {arm} | {row["gflops"]:.2f} (vs {base["gflops"]:.2f}) |'
          f' {row["gflops"] / base["gflops"]:.3f}x | {row["step_ratio"]:.3f}x | {load} |'
      )
  return '\n'.join(lines) + '\n'


FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  study = pathlib.Path(FLAGS.costs_dir)
  lm_study.measure_costs(keys(), lm_study.Sizes(), study, allow_load=FLAGS.allow_load)
  costs = lm_study.load_costs(study)
  text = report(costs)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'cp_step_cost.md').write_text(text)
  print(text)


def define_flags() -> None:
  flags.DEFINE_string('costs_dir', '/tmp/cp_step_cost', 'Where the measured rows are kept.')
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Report directory.')


if __name__ == '__main__':
  define_flags()
  app.run(main)
