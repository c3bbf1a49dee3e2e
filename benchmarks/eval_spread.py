r"""How much validation BPC moves with the text it is measured on: ``python -m benchmarks.eval_spread``.

For a trained LM workdir (by default a run of ``configs/default.py``): the
validation split is cut into disjoint slices of each ``--slice_bytes`` (as many
as fit), each scored with the run's own evaluation protocol (overlapping windows
of ``eval_context``, step ``eval_step``); reported per slice size: the number of
slices, their mean BPC, standard deviation and range, next to the whole split's
BPC. A slice of S bytes is what ``eval_max_bytes=S`` scores (the split's first S
bytes; local_text stores its evaluation splits in a seeded order of their
pieces, so any slice is a sample of the split). Writes ``<out>/eval_spread.md``.
"""

from __future__ import annotations

import pathlib
import statistics
import sys

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Slice:
  """Bytes ``[start, start + size)`` of a split, read like the split itself."""

  def __init__(self, corpus, start: int, size: int):
    self.corpus, self.start, self.size = corpus, start, size

  def __len__(self) -> int:
    return self.size

  def read(self, start: int, stop: int):
    return self.corpus.read(self.start + start, self.start + stop)


def _scorer(workdir: str, split: str):
  """``(score, corpus)``: the split's bytes and a function giving the metrics
  (``loss``, ``accuracy``, ``bpc``) of the run's latest checkpoint on a view of them."""
  import jax  # pylint: disable=g-import-not-at-top

  from contextpool_jax.data import lm_input  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import tasks  # pylint: disable=g-import-not-at-top
  from contextpool_jax.runs.workdirs import load  # pylint: disable=g-import-not-at-top

  model, variables, config = load(workdir)
  task = tasks.read(config)
  spec = lm_input.resolve_spec(config)
  objective = tasks.make_objective(task, spec, model)
  corpus = lm_input.load_split(spec, split)

  @jax.jit
  def sums(batch):
    logits = model.apply(variables, *objective.model_args(batch))
    return objective.eval_sums(logits, batch)

  def score(view) -> dict[str, float]:
    total = {}
    for batch in lm_input.corpus_eval_batches(spec, view, len(view)):
      for k, v in sums(batch).items():
        total[k] = total.get(k, 0.0) + float(v)
    return objective.finalize(total)

  return score, corpus


def split_metrics(workdir: str, split: str) -> dict[str, float]:
  """The metrics of a trained LM workdir's latest checkpoint on the whole ``split``."""
  score, corpus = _scorer(workdir, split)
  return score(corpus)


def slice_bpc(workdir: str, slice_bytes: list[int]) -> dict[int, list[float]]:
  """``{S: [BPC of each disjoint S-byte slice of validation]}`` (S = 0: the whole split)."""
  score, corpus = _scorer(workdir, 'validation')
  out = {}
  for size in slice_bytes:
    size = size or len(corpus)
    starts = range(0, len(corpus) - size + 1, size)
    out[size] = [score(Slice(corpus, a, size))['bpc'] for a in starts]
  return out


def paired_slices(mine: dict[int, list[float]], other: dict[int, list[float]]):
  """Per slice size, the slices' BPC differences ``mine - other`` (the same slices)."""
  return {size: [a - b for a, b in zip(mine[size], other[size])] for size in mine}


def _table(title: str, bpcs: dict[int, list[float]]) -> list[str]:
  lines = [
      title,
      '',
      '| slice (bytes) | slices | mean | std | min | max |',
      '| ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for size, values in sorted(bpcs.items()):
    std = f'{statistics.stdev(values):.3f}' if len(values) > 1 else '-'
    lines.append(
        f'| {size:,} | {len(values)} | {statistics.mean(values):.3f} | {std} |'
        f' {min(values):.3f} | {max(values):.3f} |'
    )
  return lines


def report(workdir: str, bpcs: dict[int, list[float]], against=None) -> str:
  """The slices' BPC; with ``against`` (``(workdir, bpcs)`` of a second model),
  also the slices' paired differences, the noise a comparison on S bytes carries."""
  whole = max(bpcs)
  command = f'python -m benchmarks.eval_spread --workdir {workdir}'
  if against:
    command += f' --against {against[0]}'
  lines = [
      '# Validation BPC over disjoint slices of the validation split',
      '',
      f'`{command}`: a trained model, its validation split ({whole:,} bytes) cut into disjoint'
      ' slices, each scored alone.',
      '',
      *_table(f'BPC of `{workdir}`:', bpcs),
  ]
  if against:
    lines += [
        '',
        *_table(
            f'BPC of `{workdir}` minus that of `{against[0]}` on the same slices:',
            paired_slices(bpcs, against[1]),
        ),
    ]
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  if not FLAGS.workdir:
    raise app.UsageError('--workdir is required (a trained LM workdir).')
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  sizes = sorted({int(s) for s in FLAGS.slice_bytes} | {0})
  bpcs = slice_bpc(FLAGS.workdir, sizes)
  against = FLAGS.against and (FLAGS.against, slice_bpc(FLAGS.against, sizes))
  text = report(FLAGS.workdir, bpcs, against)
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'eval_spread.md').write_text(text)
  print(text)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined only when run as a script, so that tests can
  import this module beside others that define the same names)."""
  flags.DEFINE_string('workdir', None, 'A trained LM workdir.')
  flags.DEFINE_list(
      'slice_bytes', ['16384', '32768', '65536'], 'Slice lengths in bytes (0 = the whole split).'
  )
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Output directory.')
  flags.DEFINE_string('against', None, "A second LM workdir: also the slices' differences.")


if __name__ == '__main__':
  define_flags()
  app.run(main)
