"""The byte-level corpora as TFDS builders (``data/text_builders.py``): enwik8 and text8 (the
standard 90M/5M/5M split, from a manual or downloaded file, a missing or wrong file named with
where it goes) and local text files (order-independent, keyed by content; the pinned snapshot by
default), on small local files."""

import os
import zipfile

import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import corpus_snapshot
from contextpool_jax.data import text_builders as tb
from helpers import make_text_files

_SMALL = dict(train_bytes=180_000, validation_bytes=10_000, test_bytes=10_000, chunk_bytes=4096)


def _read_all(sources):
  out = {}
  for split in tb.SPLITS:
    corpus = tb.ByteSplit(sources[split])
    out[split] = corpus.read(0, len(corpus)).tobytes()
  return out


def _write_zip(path, member, data):
  path.parent.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as zf:
    zf.writestr(member, data)


# ---------------------------------------------------------------------------
# Builders.
# ---------------------------------------------------------------------------


def test_standard_split_is_90m_5m_5m():
  for cls, url in (
      (tb.Enwik8, 'http://mattmahoney.net/dc/enwik8.zip'),
      (tb.Text8, 'http://mattmahoney.net/dc/text8.zip'),
  ):
    assert cls.URL == url
    (config,) = cls.BUILDER_CONFIGS
    assert config.name == 'standard'
    assert (config.train_bytes, config.validation_bytes, config.test_bytes) == (
        90_000_000,
        5_000_000,
        5_000_000,
    )
    assert config.chunk_bytes == 64 * 1024
  assert tb.Enwik8(data_dir='/nonexistent').builder_config.name == 'standard'
  assert (
      tb.Enwik8(data_dir='/nonexistent', train_bytes=90_000_000).builder_config.name == 'standard'
  )
  assert tb.Enwik8(data_dir='/nonexistent', **_SMALL).builder_config.name != 'standard'
  assert tb.VOCAB_SIZE == 256


def test_enwik8_from_manual_zip(tmp_path):
  data = np.random.default_rng(0).integers(0, 256, 200_000, np.uint8).tobytes()
  _write_zip(tmp_path / 'manual' / 'enwik8.zip', 'enwik8', data)
  sources = tb.prepare_text_dataset(
      'enwik8',
      str(tmp_path / 'tfds'),
      manual_dir=str(tmp_path / 'manual'),
      download=False,
      **_SMALL,
  )
  splits = _read_all(sources)
  assert splits['train'] == data[:180_000]
  assert splits['validation'] == data[180_000:190_000]
  assert splits['test'] == data[190_000:]
  # Fixed-size records with their split-relative offsets, in order.
  validation = sources['validation']
  records = [validation[i] for i in range(len(validation))]
  assert [r['offset'] for r in records] == [0, 4096, 8192]
  assert [len(r['bytes']) for r in records] == [4096, 4096, 10_000 - 8192]
  # Prepared data is reused: no manual file needed any more.
  os.remove(tmp_path / 'manual' / 'enwik8.zip')
  again = tb.prepare_text_dataset('enwik8', str(tmp_path / 'tfds'), download=False, **_SMALL)
  assert _read_all(again) == splits


def test_text8_from_extracted_file_in_default_manual_dir(tmp_path):
  rng = np.random.default_rng(1)
  alphabet = np.frombuffer(b'abcdefghijklmnopqrstuvwxyz ', np.uint8)
  data = rng.choice(alphabet, 200_000).tobytes()
  manual = tmp_path / 'tfds' / 'downloads' / 'manual'
  manual.mkdir(parents=True)
  (manual / 'text8').write_bytes(data)
  splits = _read_all(
      tb.prepare_text_dataset('text8', str(tmp_path / 'tfds'), download=False, **_SMALL)
  )
  assert b''.join(splits[s] for s in tb.SPLITS) == data
  assert [len(splits[s]) for s in tb.SPLITS] == [180_000, 10_000, 10_000]


def test_wrong_corpus_size_fails(tmp_path):
  _write_zip(tmp_path / 'm' / 'enwik8.zip', 'enwik8', b'x' * 1000)
  with pytest.raises(ValueError, match='truncated'):
    tb.prepare_text_dataset(
        'enwik8', str(tmp_path / 'tfds'), manual_dir=str(tmp_path / 'm'), **_SMALL
    )


def test_failed_download_says_where_to_put_the_file(tmp_path, monkeypatch):
  def offline(self, url):
    raise ConnectionError(f'no network for {url}')

  monkeypatch.setattr(tfds.download.DownloadManager, 'download', offline)
  with pytest.raises(DatasetNotFoundError, match='download failed') as e:
    tb.prepare_text_dataset('enwik8', str(tmp_path / 'tfds'))
  assert os.path.join(str(tmp_path / 'tfds'), 'downloads', 'manual', 'enwik8.zip') in str(e.value)


def _segments_bytes(config, split):
  """The bytes of ``split`` read straight from the files, as its pieces name them."""
  out = []
  for path, offset, length in config.segments(split):
    with open(path, 'rb') as f:
      f.seek(offset)
      out.append(f.read(length))
  return b''.join(out)


def test_local_text_files_order_independent_and_keyed_by_content(tmp_path):
  paths = make_text_files(tmp_path / 'text', [7000, 300, 12_345, 5000])
  patterns = [
      str(tmp_path / 'text' / 'dir0'),  # a directory
      str(tmp_path / 'text' / 'dir1' / '*.txt'),  # a glob
      str(paths[1]),
  ]  # a file, again
  a = tb.LocalText(files=patterns, max_bytes=0, chunk_bytes=1000, data_dir=str(tmp_path / 'tfds'))
  b = tb.LocalText(
      files=patterns[::-1], max_bytes=0, chunk_bytes=1000, data_dir=str(tmp_path / 'tfds')
  )
  assert a.builder_config.name == b.builder_config.name  # Same inputs.
  splits = _read_all(
      tb.prepare_text_dataset(
          'local_text', str(tmp_path / 'tfds'), files=patterns[::-1], max_bytes=0, chunk_bytes=1000
      )
  )
  for split in tb.SPLITS:
    assert splits[split] == _segments_bytes(a.builder_config, split)
  assert sum(map(len, splits.values())) == sum(p.stat().st_size for p in paths)
  # A cap, or a changed file, changes the config (and the data directory).
  capped = tb.LocalText(files=patterns, max_bytes=10_000, chunk_bytes=1000)
  assert capped.builder_config.name != a.builder_config.name
  assert capped.builder_config.total_bytes == 10_000
  stale = tb.LocalText(
      files=patterns, max_bytes=0, chunk_bytes=1000, data_dir=str(tmp_path / 'tfds2')
  )
  paths[0].write_bytes(b'changed')
  changed = tb.LocalText(files=patterns, max_bytes=0, chunk_bytes=1000)
  assert changed.builder_config.name != a.builder_config.name
  with pytest.raises(ValueError, match='changed'):  # Not silently reused.
    stale.download_and_prepare(file_format='array_record')
  with pytest.raises(DatasetNotFoundError, match='names no file'):
    tb.LocalText(files=[str(tmp_path / 'nothing' / '*.txt')])


def test_local_text_default_is_the_snapshot_and_stdlib_the_running_library(tmp_path):
  stdlib = tb.LocalText(files=(tb.STDLIB,), max_bytes=100_000).builder_config
  assert stdlib.name.startswith('stdlib_') and stdlib.root == tb.stdlib_source_dir()
  builder = tb.LocalText(max_bytes=100_000, data_dir=str(tmp_path))
  config = builder.builder_config
  assert config.name.startswith('snapshot_') and config.root == corpus_snapshot.path()
  assert config.name == tb.LocalText(max_bytes=100_000).builder_config.name
  paths = [p for p, _, _, _ in config.inputs]
  assert paths == sorted(paths) and all(p.endswith('.py') for p in paths)
  assert not any('site-packages' in p for p in paths)
  splits = _read_all(tb.prepare_text_dataset('local_text', str(tmp_path), max_bytes=100_000))
  for split in tb.SPLITS:
    assert splits[split] == _segments_bytes(config, split)
  assert sum(map(len, splits.values())) == 100_000
