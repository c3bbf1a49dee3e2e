"""How ``local_text`` cuts a corpus of files into train / validation / test.

The rule, a pure function of the files' paths relative to the corpus root, their
sizes and ``seed`` (no absolute path, no working directory, no file system order):

1. **Pieces.** A file of at most ``block_bytes`` goes whole; a larger file is cut
   into blocks of ``block_bytes`` (the last one shorter). ``block_bytes=0`` keeps
   every file whole. A small corpus gets smaller blocks, so that it still has
   about :data:`MIN_PIECES` pieces, but a corpus is never cut into more than
   about :data:`MAX_PIECES` (a small cap on a large tree; :func:`block_size`).
2. **Cap.** If the pieces hold more than ``max_bytes``, a seeded sample of them is
   kept: pieces in the order of a hash of ``(seed, path, offset)`` until the cap
   (the last one in part), so the sample is drawn from the whole tree.
3. **Splits.** The kept pieces, in tree order (path, then offset), form
   consecutive groups of about :data:`GROUP` pieces; in each group the piece
   ranked first by another seeded hash goes to validation, the second to test,
   the rest to train. Every stretch of the tree so gives 1 in 20 of its pieces to
   each evaluation split (5% / 5% / 90%).
4. **Order.** Train is stored in tree order; validation and test in hash order,
   so any prefix of them (``eval_max_bytes``) is a sample of the whole split.

Why blocks by default (docs/data.md#local_text-splits): with a 4 MiB cap, whole files put
only a dozen files in a 5% validation split and one folder could hold several
times its share of it; 4 KiB blocks keep every folder near its share. The cost is
that a large file's blocks can sit in different splits.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import os
from typing import Iterable, Mapping, NamedTuple, Sequence

SPLITS = ('train', 'validation', 'test')
EVAL_SPLITS = SPLITS[1:]
GROUP = 20  # pieces per group: one to validation, one to test
MIN_PIECES = 200  # blocks shrink (never below 1 byte) so that a small corpus has this many
MAX_PIECES = 2**16  # ... but not below (tree bytes) / this: hashing every piece stays cheap
DEFAULT_BLOCK_BYTES = 4096
RULE = 'pieces-v2'  # in the prepared data's fingerprint: a new rule, new directories


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


def block_size(block_bytes: int, kept_bytes: int, tree_bytes: int) -> int:
  """The block length used: ``block_bytes`` (0: files whole), but at most
  ``kept_bytes // MIN_PIECES`` (the bytes under the cap), so a small corpus still
  splits, and at least ``tree_bytes // MAX_PIECES`` (all the files' bytes) and 1 byte,
  so a small cap on a large tree is not a sample of millions of tiny pieces."""
  if not block_bytes:
    return 0
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
  n = len(pieces)
  groups = max(1, round(n / GROUP))
  out = {split: [] for split in SPLITS}
  for g in range(groups):
    group = pieces[g * n // groups : (g + 1) * n // groups]
    ranked = sorted(group, key=lambda p: _rank(seed, 'split', p))
    chosen = dict(zip(ranked, EVAL_SPLITS))
    for piece in group:
      out[chosen.get(piece, 'train')].append(piece)
  for split in EVAL_SPLITS:
    out[split].sort(key=lambda p: _rank(seed, 'order', p))
  return out


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
