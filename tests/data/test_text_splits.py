"""How local_text splits a corpus (``data/text_splits.py``): representative, seeded, stable.

The rule's properties on constructed trees (pieces tile every file, each
evaluation split gets its share of every folder's bytes, whole files with
``split_block_bytes=0``, the cap's sample drawn across the tree), the share of
bytes whose context crosses a seam against a byte-by-byte count, its independence
of the working directory and of where the corpus lies, a one-file corpus's
evaluation text taken from its beginning, middle and end, and, on the default
corpus (the pinned snapshot, corpus_snapshot), validation and test holding every
large folder near its share and no context crossing a seam inside a file.
"""

import collections
import json
import os

import numpy as np
import pytest

from configs import default as default_config
from contextpool_jax.data import corpus_snapshot
from contextpool_jax.data import text_builders as tb
from contextpool_jax.data import text_splits as ts


def _text(n, seed=0):
  return np.random.default_rng(seed).integers(32, 127, n, np.uint8).tobytes()


def _tree(root, layout, seed=0):
  """Writes ``{relative path: size}`` under ``root``; returns ``{relative path: bytes}``."""
  out = {}
  for i, (rel, size) in enumerate(sorted(layout.items())):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_text(size, seed + i))
    out[rel] = path.read_bytes()
  return out


def _layout(folders, files_per_folder, size_range, seed=0):
  rng = np.random.default_rng(seed)
  return {
      f'{folder}/sub{j % 3}/f{j:03d}.txt': int(rng.integers(*size_range))
      for folder in folders
      for j in range(files_per_folder)
  }


def _read(segments):
  out = []
  for path, offset, length in segments:
    with open(path, 'rb') as f:
      f.seek(offset)
      out.append(f.read(length))
  return b''.join(out)


# ---------------------------------------------------------------------------
# The rule on pieces.
# ---------------------------------------------------------------------------


def test_cut_tiles_every_file_and_keeps_small_files_whole():
  sizes = {'b/x.txt': 10_000, 'a.txt': 300, 'b/y.txt': 4096}
  pieces = ts.cut(sizes, 4096)
  assert pieces == sorted(pieces)  # tree order
  for path, size in sizes.items():
    own = [p for p in pieces if p.path == path]
    assert [p.offset for p in own] == list(np.cumsum([0] + [p.length for p in own[:-1]]))
    assert sum(p.length for p in own) == size and all(p.length <= 4096 for p in own)
  assert len([p for p in pieces if p.path == 'b/x.txt']) == 3
  assert len([p for p in pieces if p.path == 'b/y.txt']) == 1  # exactly one block: whole
  assert [p.length for p in ts.cut(sizes, 0)] == [300, 10_000, 4096]  # 0: files whole


def test_block_size_shrinks_for_a_small_corpus_only():
  tree = {f'f{i:04d}.py': 30 * 2**20 // 5000 for i in range(5000)}  # 5,000 files, 30 MiB
  assert ts.block_size(2**16, tree, 4 * 2**20) == 2**16  # 4 MiB kept: ~670 pieces
  big = {f'f{i:03d}.py': 30 * 2**20 // 500 for i in range(500)}  # 500 files of 61 KiB
  assert ts.block_size(2**16, big, 4 * 2**20) == 4 * 2**20 // ts.MIN_PIECES  # ~67 would be kept
  assert ts.block_size(2**16, {'a.txt': 100_000}, 100_000) == 100_000 // ts.MIN_PIECES
  assert ts.block_size(4096, {'a.txt': 10}, 10) == 1
  assert ts.block_size(0, {'a.txt': 100_000}, 100_000) == 0
  # Enough whole files: never cut, whatever their sizes.
  files = {f'f{i:03d}.py': 1000 + 50 * i for i in range(ts.MIN_PIECES)}
  assert ts.block_size(2**16, files, sum(files.values())) == 2**16
  # A 1,000-byte cap on a 30 MiB tree: blocks of tree / MAX_PIECES, not of 5 bytes.
  block = ts.block_size(4096, tree, 1000)
  assert block == sum(tree.values()) // ts.MAX_PIECES
  assert len(ts.cut(tree, block)) <= ts.MAX_PIECES + 5000


def _folder_share(splits, folder, split):
  return sum(p.length for p in splits[split] if ts.top_folder(p.path) == folder)


def test_assign_gives_each_evaluation_split_its_share_of_every_folder():
  rng = np.random.default_rng(0)
  sizes = {  # folders of small, mixed and large pieces
      **{f'small/f{i:03d}.txt': int(rng.integers(100, 400)) for i in range(300)},
      **{f'mixed/f{i:03d}.txt': int(rng.integers(100, 5000)) for i in range(200)},
      **{f'large/f{i:03d}.txt': int(rng.integers(2000, 8000)) for i in range(60)},
  }
  pieces = ts.cut(sizes, 0)
  splits = ts.assign(pieces, seed=3)
  assert sorted(p for s in splits.values() for p in s) == pieces  # a partition
  for folder in ('small', 'mixed', 'large'):
    share = ts.EVAL_SHARE * sum(n for p, n in sizes.items() if p.startswith(folder))
    biggest = max(n for p, n in sizes.items() if p.startswith(folder))
    for split in ts.EVAL_SPLITS:
      held = _folder_share(splits, folder, split)
      assert held <= (1 + ts.OVERSHOOT) * share, (folder, split)
      # Short of its share by less than a piece: the pass stops only when nothing fits.
      assert held > share - biggest, (folder, split)
  small = ts.EVAL_SHARE * sum(n for p, n in sizes.items() if p.startswith('small'))
  for split in ts.EVAL_SPLITS:  # small pieces: within a tenth of the share
    assert abs(_folder_share(splits, 'small', split) / small - 1) < 0.1
  # Stored order: train in tree order; evaluation splits in a seeded order.
  assert splits['train'] == sorted(splits['train'])
  assert splits['validation'] != sorted(splits['validation'])
  assert ts.assign(pieces, seed=3) == splits and ts.assign(pieces, seed=4) != splits


def test_assign_pools_the_small_folders():
  """Forty folders of 5 pieces: each alone is too small for a 5% share of it to be
  a whole piece; pooled, they give each evaluation split its 5% of their bytes."""
  sizes = {f'd{i:02d}/f{j}.txt': 100 + 10 * j for i in range(40) for j in range(5)}
  splits = ts.assign(ts.cut(sizes, 0), seed=0)
  total = sum(sizes.values())
  for split in ts.EVAL_SPLITS:
    held = sum(p.length for p in splits[split])
    assert ts.EVAL_SHARE * total - 140 < held <= (1 + ts.OVERSHOOT) * ts.EVAL_SHARE * total
    assert len({ts.top_folder(p.path) for p in splits[split]}) > 5  # from across the pool


def test_assign_gives_a_tiny_corpus_one_piece_per_split():
  pieces = ts.cut({'a.txt': 100, 'b.txt': 100, 'c.txt': 100}, 0)
  splits = ts.assign(pieces, seed=0)
  assert sorted(len(held) for held in splits.values()) == [1, 1, 1]
  two = ts.assign(pieces[:2], seed=0)  # train keeps one: only one evaluation split is served
  assert len(two['train']) == 1 and len(two['validation']) + len(two['test']) == 1


def _crossing_reference(stored, sizes, context):
  """Byte by byte: does the context of the byte at stream position i (the bytes
  [max(0, i - context), i)) hold two neighbours that are not consecutive bytes of
  one file; and is one such pair not the end of a file followed by a file start?"""
  owner = [(p.path, p.offset + k) for p in stored for k in range(p.length)]
  unrelated = seam = 0
  for i in range(len(owner)):
    pairs = [(owner[j - 1], owner[j]) for j in range(max(1, i - context + 1), i + 1)]
    cuts = [(a, b) for a, b in pairs if not (a[0] == b[0] and a[1] + 1 == b[1])]
    seam += bool(cuts)
    unrelated += any(a[1] + 1 != sizes[a[0]] or b[1] != 0 for a, b in cuts)
  return unrelated / len(owner), seam / len(owner)


@pytest.mark.parametrize('context', [1, 7, 40])
def test_crossing_share_is_the_byte_by_byte_count(context):
  sizes = {'a.txt': 30, 'b.txt': 25, 'c.txt': 12}
  stored = [  # a whole file, a block of a, a's next block, another file, a gap in c
      ts.Piece('b.txt', 0, 25),
      ts.Piece('a.txt', 10, 10),
      ts.Piece('a.txt', 20, 10),
      ts.Piece('c.txt', 0, 5),
      ts.Piece('c.txt', 8, 4),
      ts.Piece('a.txt', 0, 10),
  ]
  got = ts.crossing_share(stored, sizes, context)
  np.testing.assert_allclose(got, _crossing_reference(stored, sizes, context), rtol=0, atol=1e-12)
  whole = [ts.Piece('b.txt', 0, 25), ts.Piece('a.txt', 0, 30)]
  assert ts.crossing_share(whole, sizes, context)[0] == 0.0
  assert ts.crossing_share(whole, sizes, context)[1] == min(context, 30) / 55


def test_sample_keeps_max_bytes_drawn_across_the_tree():
  pieces = ts.cut({f'{d}/f{i}.txt': 1000 for d in 'abcdefghij' for i in range(50)}, 0)
  kept = ts.sample(pieces, 50_500, seed=0)
  assert sum(p.length for p in kept) == 50_500 and kept == sorted(kept)
  assert sorted(p.length for p in kept)[0] == 500  # the last one in part
  per_folder = collections.Counter(ts.top_folder(p.path) for p in kept)
  assert set(per_folder) == set('abcdefghij')  # not a prefix of the tree
  assert max(per_folder.values()) <= 12  # 5 expected per folder
  assert ts.sample(pieces, 0, seed=0) == pieces
  assert ts.sample(pieces, 10**9, seed=0) == pieces


def test_relative_paths_are_machine_independent(tmp_path):
  paths = [str(tmp_path / 'a' / 'x.txt'), str(tmp_path / 'a' / 'b' / 'y.txt')]
  assert ts.relative_paths(paths) == (str(tmp_path / 'a'), ['x.txt', 'b/y.txt'])
  assert ts.relative_paths([paths[1]]) == (str(tmp_path / 'a' / 'b'), ['y.txt'])


# ---------------------------------------------------------------------------
# The builder: prepared splits, fingerprints, summaries.
# ---------------------------------------------------------------------------


def test_prepared_splits_are_the_assigned_pieces_disjoint_and_covering(tmp_path):
  files = _tree(tmp_path / 'text', _layout('abc', 12, (500, 9000)))
  data_dir = str(tmp_path / 'tfds')
  sources = tb.prepare_text_dataset(
      'local_text', data_dir, files=(str(tmp_path / 'text'),), max_bytes=0, chunk_bytes=1000
  )
  config = tb.make_local_text_config((str(tmp_path / 'text'),), max_bytes=0, chunk_bytes=1000)
  covered = collections.defaultdict(list)
  for split in tb.SPLITS:
    split_bytes = tb.ByteSplit(sources[split])
    assert split_bytes.read(0, len(split_bytes)).tobytes() == _read(config.segments(split))
    for piece in config.splits[split]:
      covered[piece.path].append((piece.offset, piece.length, split))
  for rel, data in files.items():  # every byte of every file in exactly one split
    spans = sorted(covered[rel])
    assert spans[0][0] == 0 and sum(n for _, n, _ in spans) == len(data)
    assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))
  shares = {s: len(tb.ByteSplit(sources[s])) / sum(map(len, files.values())) for s in tb.SPLITS}
  assert 0.03 < shares['validation'] < 0.07 and 0.03 < shares['test'] < 0.07


def test_whole_files_each_go_to_one_split(tmp_path):
  files = _tree(tmp_path / 'text', _layout('abcd', 15, (200, 3000)))
  config = tb.make_local_text_config((str(tmp_path / 'text'),), max_bytes=0, split_block_bytes=0)
  owner = {}
  for split, pieces in config.splits.items():
    for piece in pieces:
      assert piece.offset == 0 and piece.length == len(files[piece.path])  # whole
      assert owner.setdefault(piece.path, split) == split  # in one split only
  assert set(owner) == set(files)
  for split in ts.EVAL_SPLITS:
    assert 0.03 < sum(p.length for p in config.splits[split]) / sum(map(len, files.values())) < 0.06


def test_the_split_size_check_uses_the_configured_seed(tmp_path):
  """Four whole files too large for a 5% share (16 bytes), one of them a single
  byte: whether a split gets under tb.MIN_SPLIT_BYTES depends on the seed, and the
  check sees the seed's own split."""
  _tree(tmp_path / 'text', {'a/x.txt': 1, 'b/x.txt': 5, 'c/x.txt': 5, 'd/x.txt': 5})
  make = lambda seed: tb.make_local_text_config(
      (str(tmp_path / 'text'),), max_bytes=0, split_block_bytes=0, split_seed=seed
  )
  pieces = [ts.Piece('a/x.txt', 0, 1)] + [ts.Piece(f'{c}/x.txt', 0, 5) for c in 'bcd']
  too_short = {
      seed: min(sum(p.length for p in held) for held in ts.assign(pieces, seed).values()) < 2
      for seed in range(12)
  }
  assert set(too_short.values()) == {True, False}  # both kinds of seed occur
  for seed, short in too_short.items():
    if short:
      with pytest.raises(ValueError, match='too few for a (validation|test) split'):
        make(seed)
    else:
      assert min(sum(p.length for p in held) for held in make(seed).splits.values()) >= 2


def test_the_same_split_from_another_working_directory_and_another_location(tmp_path, monkeypatch):
  _tree(tmp_path / 'one' / 'text', _layout('ab', 10, (500, 6000)))
  monkeypatch.chdir(tmp_path / 'one')
  here = tb.make_local_text_config(('text/a', 'text/b/sub1/*.txt', 'text/b'), max_bytes=20_000)
  monkeypatch.chdir(tmp_path / 'one' / 'text' / 'a')
  there = tb.make_local_text_config(('../b', '../a'), max_bytes=20_000)
  assert here.name == there.name and here.splits == there.splits
  # The same files elsewhere: the same pieces, the same split, the same data directory.
  os.rename(tmp_path / 'one', tmp_path / 'two')
  moved = tb.make_local_text_config((str(tmp_path / 'two' / 'text'),), max_bytes=20_000)
  assert moved.name == here.name and moved.splits == here.splits
  assert moved.root == str(tmp_path / 'two' / 'text')


def test_a_one_file_corpus_evaluates_on_its_beginning_middle_and_end(tmp_path):
  (tmp_path / 'book.txt').write_bytes(_text(300_000))
  config = tb.make_local_text_config((str(tmp_path / 'book.txt'),), max_bytes=0)
  for split in tb.SPLITS[1:]:
    pieces = config.splits[split]
    thirds = {3 * p.offset // 300_000 for p in pieces}
    assert thirds == {0, 1, 2}, (split, sorted(p.offset for p in pieces))
    assert 0.04 < sum(p.length for p in pieces) / 300_000 < 0.06


def test_split_settings_and_rule_change_the_fingerprint(tmp_path, monkeypatch):
  _tree(tmp_path / 'text', _layout('ab', 8, (500, 6000)))
  make = lambda **kw: tb.make_local_text_config((str(tmp_path / 'text'),), max_bytes=0, **kw)
  names = {
      make().name,
      make(split_seed=1).name,
      make(split_block_bytes=0).name,
      make(split_block_bytes=100).name,  # below this corpus // MIN_PIECES
  }
  assert len(names) == 4
  before = make().name
  monkeypatch.setattr(ts, 'RULE', 'pieces-v0')  # an old rule's directories are not reused
  assert make().name != before
  with pytest.raises(ValueError, match=r'split_block_bytes \(0 = files whole\) must be an int'):
    make(split_block_bytes=-1)


def test_what_each_split_holds_is_kept_beside_the_data_and_printed(tmp_path, capsys):
  _tree(tmp_path / 'text', _layout('ab', 10, (500, 6000)))
  sources = tb.prepare_text_dataset(
      'local_text', str(tmp_path / 'tfds'), files=(str(tmp_path / 'text'),), max_bytes=0
  )
  printed = capsys.readouterr().out
  builder = tb.get_builder('local_text', str(tmp_path / 'tfds'), files=(str(tmp_path / 'text'),))
  with open(os.path.join(builder.data_dir, tb.SPLITS_SUMMARY)) as f:
    summary = json.load(f)
  assert tb.split_summary(builder) == summary
  for split in tb.SPLITS:
    assert summary[split]['bytes'] == len(tb.ByteSplit(sources[split]))
    assert sum(summary[split]['folders'].values()) == summary[split]['bytes']
    assert f'  {split}: {summary[split]["bytes"]:,} bytes' in printed
  assert summary['corpus']['folders'].keys() == {'a', 'b'}
  # Printed at preparation only.
  tb.prepare_text_dataset(
      'local_text', str(tmp_path / 'tfds'), files=(str(tmp_path / 'text'),), max_bytes=0
  )
  assert 'What each split holds' not in capsys.readouterr().out


# ---------------------------------------------------------------------------
# The default corpus.
# ---------------------------------------------------------------------------


def _default_corpus_config():
  dataset = default_config.get_config().dataset
  return tb.make_local_text_config(
      dataset.files,
      max_bytes=dataset.max_bytes,
      split_block_bytes=dataset.split_block_bytes,
      split_seed=dataset.split_seed,
  )


def test_the_default_corpus_evaluates_on_text_from_across_the_library():
  """The default corpus is the pinned snapshot, kept whole; every top folder holding
  at least 5% of it holds 0.7-1.4x its share of validation and of test, each 4-6% of
  the corpus; no window of up to 2,048 bytes reads across a seam inside a file."""
  config = _default_corpus_config()
  assert config.name.startswith('snapshot_')
  assert os.path.basename(config.root).startswith(corpus_snapshot.NAME)
  summary = ts.summary(config.splits)
  corpus = summary['corpus']
  sizes = {p: os.path.getsize(os.path.join(config.root, p)) for p, _, _, _ in config.inputs}
  assert corpus['bytes'] == sum(sizes.values())  # every file of the snapshot, whole
  large = [f for f, n in corpus['folders'].items() if n >= 0.05 * corpus['bytes']]
  assert len(large) >= 2
  for folder in large:
    share = corpus['folders'][folder] / corpus['bytes']
    for split in tb.SPLITS[1:]:
      held = summary[split]['folders'].get(folder, 0) / summary[split]['bytes']
      assert 0.7 < held / share < 1.4, (split, folder, held, share)
  for split in tb.SPLITS[1:]:
    assert 0.04 < summary[split]['bytes'] / corpus['bytes'] < 0.06
    assert summary[split]['files'] > 20
  for split in tb.SPLITS:
    assert ts.crossing_share(config.splits[split], sizes, 2048)[0] == 0.0
