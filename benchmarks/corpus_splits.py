r"""What local_text's evaluation splits hold, per ``split_block_bytes``: ``python -m benchmarks.corpus_splits``.

For the default corpus (the pinned snapshot, ``corpus_snapshot``) and the running
Python's standard library (``'<stdlib>'``), both at ``configs/default.py``'s cap,
and each block length, over several split seeds: the share of the corpus that
validation and test get; how far the top folders holding at least 5% of the
corpus stray from their share in them (the largest ratio of a folder's share of
an evaluation split to its share of the corpus); and the share of each split's
bytes whose context of :data:`CONTEXTS` bytes reaches across a seam into
unrelated text (``text_splits.crossing_share``). Then what each split of the
default holds (``text_splits.summary``). Writes ``<out>/corpus_splits.md``. Reads
file sizes and the used bytes only; trains nothing.
"""

from __future__ import annotations

import pathlib
import platform
import sys

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]

LARGE_FOLDER = 0.05  # a folder holding this share of the corpus is checked
CONTEXTS = (256, 1024, 2048)  # bytes of context: the study's training lengths
CORPORA = (((), 'snapshot (default)'), (('<stdlib>',), 'this Python (`<stdlib>`)'))


def _dataset():
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  from configs import default  # pylint: disable=g-import-not-at-top

  return default.get_config().dataset


def stray(summary) -> float:
  """The largest (share of an evaluation split) / (share of the corpus) of a top
  folder holding at least :data:`LARGE_FOLDER` of the corpus."""
  corpus = summary['corpus']
  worst = 0.0
  for folder, n in corpus['folders'].items():
    share = n / corpus['bytes']
    if share < LARGE_FOLDER:
      continue
    for split in ('validation', 'test'):
      held = summary[split]['folders'].get(folder, 0) / summary[split]['bytes']
      worst = max(worst, held / share)
  return worst


def measure(files, block: int, seeds: int):
  """Per seed: (validation share, test share, :func:`stray`, validation files,
  ``{split: [unrelated-seam share at each of CONTEXTS]}``)."""
  import os  # pylint: disable=g-import-not-at-top

  from contextpool_jax.data import text_builders as tb  # pylint: disable=g-import-not-at-top
  from contextpool_jax.data import text_splits as ts  # pylint: disable=g-import-not-at-top

  dataset = _dataset()
  rows = []
  for seed in range(seeds):
    config = tb.make_local_text_config(
        files, max_bytes=dataset.max_bytes, split_block_bytes=block, split_seed=seed
    )
    sizes = {p: os.path.getsize(os.path.join(config.root, p)) for p, _, _, _ in config.inputs}
    s = ts.summary(config.splits)
    total = s['corpus']['bytes']
    crossing = {
        split: [ts.crossing_share(config.splits[split], sizes, c)[0] for c in CONTEXTS]
        for split in ts.SPLITS
    }
    rows.append(
        (
            s['validation']['bytes'] / total,
            s['test']['bytes'] / total,
            stray(s),
            s['validation']['files'],
            crossing,
        )
    )
  return rows


def _range(values, fmt):
  return f'{fmt.format(min(values))}-{fmt.format(max(values))}'


def report(blocks, seeds) -> str:
  from contextpool_jax.data import text_builders as tb  # pylint: disable=g-import-not-at-top
  from contextpool_jax.data import text_splits as ts  # pylint: disable=g-import-not-at-top

  dataset = _dataset()
  lines = [
      "# What local_text's evaluation splits hold",
      '',
      f'`python -m benchmarks.corpus_splits` (Python {platform.python_version()}): the default'
      " corpus (the pinned snapshot of CPython 3.11.7's `Lib/*.py`, whole files of at most"
      " 64 KiB) and this Python's standard library (`files=('<stdlib>',)`), each capped at"
      f' {dataset.max_bytes:,} bytes. Per `split_block_bytes`, over split seeds 0-{seeds - 1}: the'
      " evaluation splits' share of the corpus; the largest ratio of a top folder's share of"
      ' validation or test to its share of the corpus, over folders holding at least'
      f' {LARGE_FOLDER:.0%} of it (1 = exactly its share); and the share of bytes whose context'
      ' of 2,048 bytes reaches across a seam into unrelated text (a block boundary inside a file,'
      ' not a file boundary), the largest over the seeds (`text_splits.crossing_share`).',
      '',
      '| corpus | `split_block_bytes` | validation share | test share | largest folder ratio'
      ' (per seed) | validation files | unrelated context at 2,048: train | validation | test |',
      '| --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: |',
  ]
  for files, label in CORPORA:
    for block in blocks:
      rows = measure(files, block, seeds)
      worst = {s: max(r[4][s][-1] for r in rows) for s in ts.SPLITS}
      lines.append(
          f'| {label} | {block or "0 (files whole)"} | {_range([r[0] for r in rows], "{:.1%}")}'
          f' | {_range([r[1] for r in rows], "{:.1%}")}'
          f' | {", ".join(f"{r[2]:.1f}" for r in rows)} | {_range([r[3] for r in rows], "{}")}'
          f' | {" | ".join(f"{worst[s]:.1%}" for s in ts.SPLITS)} |'
      )
  config = tb.make_local_text_config(
      dataset.files,
      max_bytes=dataset.max_bytes,
      split_block_bytes=dataset.split_block_bytes,
      split_seed=dataset.split_seed,
  )
  summary = ts.summary(config.splits)
  corpus = summary['corpus']
  rows = measure(dataset.files, dataset.split_block_bytes, 1)[0][4]
  lines += [
      '',
      f'## The default (`split_block_bytes={dataset.split_block_bytes}`,'
      f' `split_seed={dataset.split_seed}`)',
      '',
      *[l.strip() for l in ts.summary_lines(summary)],
      '',
      'Share of bytes whose context reaches across a seam into unrelated text, at '
      + ', '.join(f'{c:,}' for c in CONTEXTS)
      + ' bytes: '
      + '; '.join(f'{s} ' + ', '.join(f'{x:.1%}' for x in rows[s]) for s in ts.SPLITS)
      + '.',
      '',
      '| top folder | corpus | train | validation | test |',
      '| --- | ---: | ---: | ---: | ---: |',
  ]
  for folder, n in corpus['folders'].items():
    if n < 0.01 * corpus['bytes']:
      continue
    cells = [
        f'{100 * summary[s]["folders"].get(folder, 0) / summary[s]["bytes"]:.1f}%'
        for s in ('train', 'validation', 'test')
    ]
    lines.append(f'| `{folder}` | {100 * n / corpus["bytes"]:.1f}% | {" | ".join(cells)} |')
  rest = sum(n for n in corpus['folders'].values() if n < 0.01 * corpus['bytes'])
  lines.append(
      f'| {sum(1 for n in corpus["folders"].values() if n < 0.01 * corpus["bytes"])}'
      f' folders under 1% each | {100 * rest / corpus["bytes"]:.1f}% | | | |'
  )
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  text = report([int(b) for b in FLAGS.blocks], FLAGS.seeds)
  (out / 'corpus_splits.md').write_text(text)
  print(text)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined only when run as a script, so that tests can
  import this module beside others that define the same names)."""
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Output directory.')
  flags.DEFINE_integer('seeds', 8, 'Split seeds 0..seeds-1 per block length.')
  flags.DEFINE_list('blocks', ['0', '4096', '65536'], 'split_block_bytes values.')


if __name__ == '__main__':
  define_flags()
  app.run(main)
