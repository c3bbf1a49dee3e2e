"""The default corpus (``data/corpus_snapshot.py``): pinned bytes, whole files, checked.

The shipped archive has the pinned checksum and a damaged one is refused before
anything is extracted; extraction is atomic and happens once; :func:`select`
against a direct reading of its rule; :func:`build` is reproducible; and the
default corpus's fingerprint (the bytes used, the rule, the seed) is one pinned
value, so CI, which runs this file on Python 3.11 and on 3.12, shows that every
interpreter reads the same corpus.
"""

import hashlib
import os
import shutil
import tarfile

import pytest

from configs import default as default_config
from contextpool_jax.data import corpus_snapshot as cs
from contextpool_jax.data import text_builders as tb

# The default config's prepared-data name for the snapshot: the sha256 of every piece
# used, split rule pieces-v3, seed 0. It changes only with the corpus, the rule or the
# config; a different value on another Python means the corpus is not pinned.
DEFAULT_CORPUS_NAME = 'snapshot_dadc80e667d6c590'


def test_the_shipped_archive_is_the_pinned_one():
  digest = hashlib.sha256(cs.archive_path().read_bytes()).hexdigest()
  assert digest == cs.SHA256
  with tarfile.open(cs.archive_path()) as tar:
    members = tar.getmembers()
  names = [m.name for m in members]
  assert names == sorted(n for n in names if n != cs.LICENSE) + [cs.LICENSE]
  sources = [m for m in members if m.name != cs.LICENSE]
  assert all(m.name.endswith('.py') and 0 < m.size <= cs.MAX_FILE_BYTES for m in sources)
  assert 0.95 * cs.TOTAL_BYTES < sum(m.size for m in sources) <= cs.TOTAL_BYTES
  assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in members)


def test_extracts_once_atomically_and_refuses_a_damaged_archive(tmp_path, monkeypatch):
  root = cs.path(tmp_path / 'cache')
  assert os.path.dirname(root) == str(tmp_path / 'cache' / 'corpora')
  assert os.listdir(tmp_path / 'cache' / 'corpora') == [os.path.basename(root)]  # no staging left
  with tarfile.open(cs.archive_path()) as tar:
    first = tar.getmembers()[0]
    assert (tmp_path / 'cache' / 'corpora' / root / first.name).read_bytes() == (
        tar.extractfile(first).read()
    )
  assert cs.path(tmp_path / 'cache') == root  # the extracted copy is reused
  damaged = tmp_path / 'damaged.tar.xz'
  data = bytearray(cs.archive_path().read_bytes())
  data[1000] ^= 1
  damaged.write_bytes(bytes(data))
  monkeypatch.setattr(cs, 'archive_path', lambda: damaged)
  with pytest.raises(OSError, match=f'{damaged} has sha256 [0-9a-f]{{64}}, expected {cs.SHA256}'):
    cs.path(tmp_path / 'other')
  assert not (tmp_path / 'other' / 'corpora').exists() or not os.listdir(
      tmp_path / 'other' / 'corpora'
  )
  monkeypatch.setattr(cs, 'archive_path', lambda: tmp_path / 'missing.tar.xz')
  with pytest.raises(OSError, match='missing.tar.xz is missing: reinstall'):
    cs.path(tmp_path / 'other')


def test_the_cache_follows_xdg_cache_home(tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert cs.default_cache_dir() == tmp_path / 'contextpool_jax'


def test_select_keeps_whole_small_files_in_a_seeded_order_up_to_the_total(monkeypatch):
  monkeypatch.setattr(cs, 'TOTAL_BYTES', 1000)
  monkeypatch.setattr(cs, 'MAX_FILE_BYTES', 300)
  sizes = {f'd{i % 3}/f{i:02d}.py': 40 + 29 * i for i in range(20)}  # 40 .. 591 bytes
  sizes['empty.py'] = 0
  kept = cs.select(sizes)
  # The rule read directly: hash order, skip what is too large or would pass the total.
  order = sorted(sizes, key=lambda p: hashlib.sha256(f'0/snapshot/{p}'.encode()).digest())
  expected, total = [], 0
  for p in order:
    if 0 < sizes[p] <= 300 and total + sizes[p] <= 1000:
      expected.append(p)
      total += sizes[p]
  assert kept == sorted(expected) and kept
  assert sum(sizes[p] for p in kept) <= 1000 and all(0 < sizes[p] <= 300 for p in kept)
  assert cs.select(sizes, seed=1) != kept


def test_build_is_reproducible(tmp_path, monkeypatch):
  monkeypatch.setattr(cs, 'TOTAL_BYTES', 5000)
  lib = tmp_path / 'Lib'
  for i in range(30):
    (lib / f'pkg{i % 4}').mkdir(parents=True, exist_ok=True)
    (lib / f'pkg{i % 4}' / f'm{i}.py').write_text(f'x = {i}\n' * (10 + 7 * i))
  (lib / 'README.txt').write_text('not python\n')
  (lib / cs.LICENSE).write_text('licence\n')
  one = cs.build(str(lib), str(tmp_path / 'one'))
  two = cs.build(str(lib), str(tmp_path / 'two'))
  assert one.read_bytes() == two.read_bytes()
  with tarfile.open(one) as tar:
    names = tar.getnames()
  sizes = {
      f'pkg{i % 4}/m{i}.py': (lib / f'pkg{i % 4}' / f'm{i}.py').stat().st_size for i in range(30)
  }
  assert names == cs.select(sizes) + [cs.LICENSE]


def test_the_default_corpus_is_the_same_bytes_on_every_python():
  dataset = default_config.get_config().dataset
  config = tb.make_local_text_config(
      dataset.files,
      max_bytes=dataset.max_bytes,
      split_block_bytes=dataset.split_block_bytes,
      split_seed=dataset.split_seed,
  )
  assert config.name == DEFAULT_CORPUS_NAME
  assert config.total_bytes == sum(
      m.size for m in tarfile.open(cs.archive_path()).getmembers() if m.name != cs.LICENSE
  )


def test_a_copied_cache_is_read_like_the_original(tmp_path):
  """The fingerprint holds paths relative to the corpus root: the snapshot extracted
  elsewhere (another user's cache) is the same prepared data."""
  here = cs.path(tmp_path / 'a')
  shutil.copytree(here, tmp_path / 'b')
  names = {tb.make_local_text_config((d,), max_bytes=0).name for d in (here, str(tmp_path / 'b'))}
  assert len(names) == 1
