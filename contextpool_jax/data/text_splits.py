"""How ``local_text`` cuts a corpus of files into train / validation / test.

The rule, a pure function of the files' paths relative to the corpus root, their
sizes and ``seed`` (no absolute path, no working directory, no file system order):

1. **Pieces.** A file of at most ``block_bytes`` goes whole; a larger file is cut
   into blocks of ``block_bytes`` (the last one shorter). ``block_bytes=0`` keeps
   every file whole. A corpus that would have fewer than :data:`MIN_PIECES`
   pieces gets smaller blocks, so that it still has about that many, but a corpus is never cut into more than
   about :data:`MAX_PIECES` (a small cap on a large tree; :func:`block_size`).
2. **Cap.** If the pieces hold more than ``max_bytes``, a seeded sample of them is
   kept: pieces in the order of a hash of ``(seed, path, offset)`` until the cap
   (the last one in part), so the sample is drawn from the whole tree.
3. **Splits, by bytes per top folder.** In each top folder of the tree (the folders
   of fewer than :data:`MIN_FOLDER_PIECES` pieces pooled into one), its pieces
   in the order of another seeded hash go to the evaluation split holding less of
   the folder so far (validation on a tie), or else to the other, while that split
   holds less than :data:`EVAL_SHARE` (5%) of the folder's bytes and the piece does
   not take it past that share by more than :data:`OVERSHOOT` of it; the rest go
   to train. So every large folder gives each evaluation split its
   share of bytes, whether the pieces are small or large. An evaluation split
   that gets nothing (a tiny corpus) takes the train piece first in that order.
4. **Order.** Train is stored in tree order; validation and test in hash order,
   so any prefix of them (``eval_max_bytes``) is a sample of the whole split.

Why 64 KiB blocks by default (docs/data.md#local_text-splits): a window of context
that crosses from one piece into an unrelated one reads text the model cannot
use. With whole files it only ever crosses a file boundary; a block boundary
inside a file is rare at 64 KiB (the default corpus's files are all smaller:
:mod:`.corpus_snapshot`), where the old 4 KiB blocks put a fifth to a half of the
evaluation bytes at 1-2 KiB of context behind such a boundary
(:func:`crossing_share`, benchmarks/results/corpus_splits.md).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
from typing import Iterable, Mapping, NamedTuple, Sequence

SPLITS = ('train', 'validation', 'test')
EVAL_SPLITS = SPLITS[1:]
EVAL_SHARE = 0.05  # of each top folder's bytes, for validation and for test
OVERSHOOT = 0.1  # a piece may take a split past its share by this much of the share
MIN_FOLDER_PIECES = 20  # a top folder of fewer pieces is pooled with the other small ones
MIN_PIECES = 200  # blocks shrink (never below 1 byte) so that a small corpus has this many
MAX_PIECES = 2**16  # ... but not below (tree bytes) / this: hashing every piece stays cheap
DEFAULT_BLOCK_BYTES = 2**16
RULE = 'pieces-v3'  # in the prepared data's fingerprint: a new rule, new directories


class Piece(NamedTuple):
  """Bytes ``[offset, offset + length)`` of the file ``path`` (relative to the
  corpus root, '/'-separated). Pieces sort in tree order (a tuple: cheap to make
  and sort by the thousand)."""

  path: str
  offset: int
  length: int


def relative_paths(paths: Sequence[str]) -> tuple[str, list[str]]:
  """``(root, relative paths)``: the deepest directory holding every path, and
  each path relative to it with '/' separators (the same on every machine)."""
  absolute = [os.path.abspath(p) for p in paths]
  root = os.path.commonpath([os.path.dirname(p) for p in absolute])
  start = len(os.path.join(root, ''))  # root and its separator (root may be '/' itself)
  return root, [p[start:].replace(os.sep, '/') for p in absolute]


def block_size(block_bytes: int, sizes: Mapping[str, int], kept_bytes: int) -> int:
  """The block length used for files of ``sizes`` (``{path: bytes}``) of which
  ``kept_bytes`` are kept: ``block_bytes`` (0: files whole) when the kept bytes
  hold about :data:`MIN_PIECES` pieces at that length; otherwise shorter blocks,
  ``kept_bytes // MIN_PIECES``, so that a small corpus still splits, but at least
  (all the files' bytes) / :data:`MAX_PIECES` and 1 byte, so that a small cap on a
  large tree is not a sample of millions of tiny pieces."""
  if not block_bytes:
    return 0
  tree_bytes = sum(sizes.values())
  pieces = sum(-(-n // block_bytes) for n in sizes.values())
  if pieces * kept_bytes >= MIN_PIECES * tree_bytes:
    return block_bytes
  return max(1, min(block_bytes, max(kept_bytes // MIN_PIECES, tree_bytes // MAX_PIECES)))


def cut(sizes: Mapping[str, int], block: int) -> list[Piece]:
  """Every file (``{relative path: bytes}``) as pieces, in tree order."""
  pieces = []
  for path in sorted(sizes):
    size = sizes[path]
    step = block if block and size > block else size
    pieces += [Piece(path, o, min(step, size - o)) for o in range(0, size, step)]
  return pieces


def _rank(seed: int, purpose: str, piece: Piece) -> bytes:
  """A machine-independent pseudo-random key of ``piece``."""
  return hashlib.sha256(f'{seed}/{purpose}/{piece.path}/{piece.offset}'.encode()).digest()


def sample(pieces: Sequence[Piece], max_bytes: int, seed: int) -> list[Piece]:
  """The pieces kept under ``max_bytes`` (0: all), in tree order (rule, step 2)."""
  if not max_bytes or sum(p.length for p in pieces) <= max_bytes:
    return list(pieces)
  kept, total = [], 0
  for piece in sorted(pieces, key=lambda p: _rank(seed, 'keep', p)):
    if total >= max_bytes:
      break
    kept.append(piece._replace(length=min(piece.length, max_bytes - total)))
    total += kept[-1].length
  return sorted(kept)


@functools.lru_cache(maxsize=16)
def kept_pieces(
    sizes: tuple[tuple[str, int], ...], block: int, max_bytes: int, seed: int
) -> tuple[Piece, ...]:
  """:func:`sample` of :func:`cut` (rule, steps 1-2) for ``sizes`` (sorted ``(relative
  path, bytes)`` pairs), remembered per process: a run reads its corpus config for
  every split, and a small cap on a large tree ranks up to ``MAX_PIECES`` pieces."""
  return tuple(sample(cut(dict(sizes), block), max_bytes, seed))


def assign(pieces: Sequence[Piece], seed: int) -> dict[str, list[Piece]]:
  """``{split: pieces in storage order}`` (rule, steps 3-4); ``pieces`` in tree order."""
  by_folder: dict[str, list[Piece]] = collections.defaultdict(list)
  for piece in pieces:
    by_folder[top_folder(piece.path)].append(piece)
  folders: dict[str, list[Piece]] = collections.defaultdict(list)  # small ones pooled
  for folder, held_pieces in by_folder.items():
    folders[folder if len(held_pieces) >= MIN_FOLDER_PIECES else ''] += held_pieces
  chosen: dict[Piece, str] = {}
  for folder in sorted(folders):
    share = EVAL_SHARE * sum(p.length for p in folders[folder])
    held = dict.fromkeys(EVAL_SPLITS, 0)
    for piece in sorted(folders[folder], key=lambda p: _rank(seed, 'split', p)):
      for split in sorted(EVAL_SPLITS, key=lambda s: held[s]):  # the one holding less first
        if held[split] < share and held[split] + piece.length <= (1 + OVERSHOOT) * share:
          chosen[piece] = split
          held[split] += piece.length
          break
  empty = [split for split in EVAL_SPLITS if split not in chosen.values()]
  if empty:  # a tiny corpus: one piece to each empty split, while train keeps one
    left = sorted((p for p in pieces if p not in chosen), key=lambda p: _rank(seed, 'split', p))
    chosen.update((piece, split) for split, piece in zip(empty, left[:-1]))
  out = {split: [p for p in pieces if chosen.get(p, 'train') == split] for split in SPLITS}
  for split in EVAL_SPLITS:
    out[split].sort(key=lambda p: _rank(seed, 'order', p))
  return out


def crossing_share(
    stored: Sequence[Piece], sizes: Mapping[str, int], context: int
) -> tuple[float, float]:
  """How much of one split reads context across a seam, at ``context`` bytes.

  ``stored``: the split's pieces in storage order; ``sizes``: ``{path: bytes}`` of
  the files. A byte reads the ``context`` bytes before it in the stored split (as
  many as there are). Returns the share of the split's bytes whose context reaches
  across (a) a seam that is not a file boundary, i.e. into unrelated text: not the
  end of one file followed by the start of another (a block of a file followed by
  a block of another, or by a non-adjacent block of the same file); and (b) any seam
  between two pieces that are not consecutive bytes of one file (a new document,
  whole or not)."""
  total = sum(p.length for p in stored)
  if not total:
    return 0.0, 0.0
  position, unrelated, seams = 0, [], []
  for a, b in zip(stored, stored[1:]):
    position += a.length
    if a.path == b.path and a.offset + a.length == b.offset:
      continue
    seams.append(position)
    if a.offset + a.length != sizes[a.path] or b.offset != 0:
      unrelated.append(position)

  def share(starts):
    # The byte at stream position i reads [i - context, i), so it crosses the seam
    # before position q when q <= i < q + context.
    covered, reached = 0, 0
    for q in starts:
      lo, hi = max(q, reached), min(q + context, total)
      covered += max(0, hi - lo)
      reached = max(reached, hi)
    return covered / total

  return share(unrelated), share(seams)


def top_folder(path: str) -> str:
  """The first component of a relative path; ``'.'`` for a file at the root."""
  return path.split('/', 1)[0] if '/' in path else '.'


def _folder_bytes(pieces: Iterable[Piece]) -> collections.Counter:
  counts = collections.Counter()
  for p in pieces:
    counts[top_folder(p.path)] += p.length
  return counts


def summary(splits: Mapping[str, Sequence[Piece]]) -> dict:
  """What each split holds: bytes, pieces, files, and bytes per top folder.

  ``{'corpus': {...}, 'train': {...}, ...}``, each ``{'bytes', 'pieces', 'files',
  'shared_files', 'folders': {folder: bytes}}`` (``shared_files``: files with bytes
  in another split too, i.e. cut into blocks that went to different splits), and
  ``'pieces'``: ``{split: [[path, offset, length], ...]}`` in storage order.
  """
  files = {split: {p.path for p in splits[split]} for split in SPLITS}

  def describe(pieces, others):
    held = {p.path for p in pieces}
    return {
        'bytes': sum(p.length for p in pieces),
        'pieces': len(pieces),
        'files': len(held),
        'shared_files': len(held & others),
        'folders': dict(_folder_bytes(pieces).most_common()),
    }

  everything = [p for split in SPLITS for p in splits[split]]
  out = {'corpus': describe(everything, set())}
  for split in SPLITS:
    others = set().union(*(files[s] for s in SPLITS if s != split))
    out[split] = describe(splits[split], others)
  out['pieces'] = {s: [[p.path, p.offset, p.length] for p in splits[s]] for s in SPLITS}
  return out


def summary_lines(info: Mapping) -> list[str]:
  """:func:`summary` in a few lines: per split its bytes and share, its pieces and
  files, and its largest top folders with their share of the split and of the corpus."""
  corpus = info['corpus']
  total = corpus['bytes']
  lines = []
  for split in SPLITS:
    s = info[split]
    folders = ', '.join(
        f'{name} {100 * n / s["bytes"]:.0f}% ({100 * corpus["folders"][name] / total:.0f}%)'
        for name, n in list(s['folders'].items())[:4]
    )
    lines.append(
        f'  {split}: {s["bytes"]:,} bytes ({100 * s["bytes"] / total:.1f}%), {s["pieces"]}'
        f' pieces of {s["files"]} files ({s["shared_files"]} with bytes in another split);'
        f' top folders (share of the split, of the corpus): {folders}'
    )
  return lines
