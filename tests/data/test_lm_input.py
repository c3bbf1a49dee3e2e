"""Byte-level LM data: TFDS builders (on small local files), grain pipelines."""

import os
import zipfile

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import lm_input
from contextpool_jax.data import corpus_snapshot
from contextpool_jax.data import text_builders as tb

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


def test_missing_dataset_says_where_to_put_the_file(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  manual = os.path.join(data_dir, 'downloads', 'manual')
  with pytest.raises(DatasetNotFoundError) as e:
    tb.prepare_text_dataset('text8', data_dir, download=False)
  message = str(e.value)
  assert os.path.join(manual, 'text8.zip') in message
  assert tb.TEXT8_URL in message
  assert 'incomplete' not in message
  # Through the pipeline config, with an explicit manual directory.
  config = _config(
      name='enwik8', data_dir=data_dir, download=False, manual_dir=str(tmp_path / 'elsewhere')
  )
  with pytest.raises(DatasetNotFoundError, match=str(tmp_path / 'elsewhere' / 'enwik8.zip')):
    lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=1)


def test_failed_download_says_where_to_put_the_file(tmp_path, monkeypatch):
  def offline(self, url):
    raise ConnectionError(f'no network for {url}')

  monkeypatch.setattr(tfds.download.DownloadManager, 'download', offline)
  with pytest.raises(DatasetNotFoundError, match='download failed') as e:
    tb.prepare_text_dataset('enwik8', str(tmp_path / 'tfds'))
  assert os.path.join(str(tmp_path / 'tfds'), 'downloads', 'manual', 'enwik8.zip') in str(e.value)


def _make_text_files(root, sizes, seed=0):
  rng = np.random.default_rng(seed)
  paths = []
  for i, size in enumerate(sizes):
    path = root / f'dir{i % 2}' / f'f{i}.txt'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rng.integers(32, 127, size, np.uint8).tobytes())
    paths.append(path)
  return paths


def _segments_bytes(config, split):
  """The bytes of ``split`` read straight from the files, as its pieces name them."""
  out = []
  for path, offset, length in config.segments(split):
    with open(path, 'rb') as f:
      f.seek(offset)
      out.append(f.read(length))
  return b''.join(out)


def test_local_text_files_order_independent_and_keyed_by_content(tmp_path):
  paths = _make_text_files(tmp_path / 'text', [7000, 300, 12_345, 5000])
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


# ---------------------------------------------------------------------------
# Pipelines.
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def corpus_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('lm')
  _make_text_files(root / 'text', [100_000, 120_000, 80_000], seed=5)
  return root


def _config(corpus_dir=None, **dataset):
  config = ml_collections.ConfigDict(
      {'seed': 7, 'batch_size': 8, 'dataset': lm_input.default_dataset_config()}
  )
  if corpus_dir is not None:
    config.dataset.update(
        name='local_text',
        data_dir=str(corpus_dir / 'tfds'),
        files=(str(corpus_dir / 'text'),),
        max_bytes=0,
    )
  config.dataset.update(seq_len=64, eval_context=256, eval_step=64, eval_batch_size=4)
  config.dataset.update(**dataset)
  return config


def _take(iterator, n):
  return [next(iterator) for _ in range(n)]


def test_train_batches_shape_dtype_and_content(corpus_dir):
  config = _config(corpus_dir)
  ds = lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=1)
  batches = _take(iter(ds), 3)
  corpus = lm_input.load_split(lm_input.resolve_spec(config), 'train')
  starts = lm_input.train_window_starts(lm_input.resolve_spec(config), len(corpus))
  for t, batch in enumerate(batches):
    assert batch['tokens'].shape == (8, 65)
    assert batch['tokens'].dtype == np.int32
    assert batch['weights'].shape == (8, 64)
    assert batch['weights'].dtype == np.float32
    assert np.all(batch['weights'] == 1)
    for i in range(8):
      s = starts[t * 8 + i]
      np.testing.assert_array_equal(batch['tokens'][i], corpus.read(s, s + 65))


def test_train_epochs_cover_windows_once_and_reshuffle(corpus_dir):
  config = _config(corpus_dir, seq_len=1000)
  num_bytes = len(lm_input.load_split(lm_input.resolve_spec(config), 'train'))
  n = num_bytes // 1000 - 1
  starts = lm_input.train_window_starts(lm_input.resolve_spec(config), num_bytes)
  epoch0 = np.array([starts[i] for i in range(n)])
  epoch1 = np.array([starts[i] for i in range(n, 2 * n)])
  for epoch in (epoch0, epoch1):
    phase = epoch.min()
    assert 0 <= phase < 1000
    np.testing.assert_array_equal(np.sort(epoch), phase + 1000 * np.arange(n))
    assert epoch.max() + 1001 <= num_bytes
  assert not np.array_equal(epoch0 - epoch0.min(), epoch1 - epoch1.min())
  other_seed = _config(corpus_dir, seq_len=1000)
  other_seed.seed = 8
  other = lm_input.train_window_starts(lm_input.resolve_spec(other_seed), num_bytes)
  assert [other[i] for i in range(n)] != list(epoch0)


def test_train_state_round_trip_and_determinism(corpus_dir):
  config = _config(corpus_dir)
  ds = lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=1)
  it = iter(ds)
  _take(it, 4)
  state = it.get_state()
  expected = _take(it, 5)
  resumed = iter(
      lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=1)
  )
  resumed.set_state(state)
  for a, b in zip(expected, _take(resumed, 5)):
    np.testing.assert_array_equal(a['tokens'], b['tokens'])
  fresh = _take(iter(ds), 9)
  for a, b in zip(expected, fresh[4:]):
    np.testing.assert_array_equal(a['tokens'], b['tokens'])


def test_train_process_shards_disjoint_and_match_global_stream(corpus_dir):
  config = _config(corpus_dir)
  whole = _take(
      iter(
          lm_input.make_train_dataset(
              lm_input.resolve_spec(config), process_index=0, process_count=1
          )
      ),
      6,
  )
  shards = [
      _take(
          iter(
              lm_input.make_train_dataset(
                  lm_input.resolve_spec(config), process_index=p, process_count=2
              )
          ),
          6,
      )
      for p in range(2)
  ]
  seen = set()
  for t in range(6):
    rows = [r.tobytes() for p in range(2) for r in shards[p][t]['tokens']]
    assert all(shards[p][t]['tokens'].shape == (4, 65) for p in range(2))
    assert sorted(rows) == sorted(r.tobytes() for r in whole[t]['tokens'])
    assert not seen & set(rows)
    seen.update(rows)
  assert len(seen) == 48


@pytest.mark.parametrize(
    'num_bytes,context,step',
    [(2, 8, 4), (9, 8, 4), (10, 8, 4), (11, 8, 3), (100, 8, 8), (101, 16, 5), (1000, 64, 1)],
)
def test_eval_windows_score_every_byte_once(num_bytes, context, step):
  starts, score_from, score_to = lm_input.eval_windows(num_bytes, context, step)
  count = np.zeros(num_bytes, int)
  for i, (s, a, b) in enumerate(zip(starts, score_from, score_to)):
    assert s >= 0 and (s + context <= num_bytes - 1 or len(starts) == 1)
    if i == 0:
      assert a == 0
    else:
      assert b - a <= step and a >= context - step
    count[s + 1 + a : s + 1 + b] += 1
  assert count[0] == 0 and np.all(count[1:] == 1)


@pytest.mark.parametrize('process_count', [1, 2])
def test_eval_batches_reproduce_split(corpus_dir, process_count):
  config = _config(corpus_dir, eval_context=256, eval_step=96, eval_batch_size=4)
  corpus = lm_input.load_split(lm_input.resolve_spec(config), 'validation')
  data = corpus.read(0, len(corpus))
  per_process = [
      lm_input.make_eval_batches(
          lm_input.resolve_spec(config), 'validation', process_index=p, process_count=process_count
      )
      for p in range(process_count)
  ]
  assert len({len(b) for b in per_process}) == 1
  starts = lm_input.eval_windows(len(data), 256, 96)[0]
  assert per_process[0].num_windows == len(starts)
  assert per_process[0].num_predicted_bytes == len(data) - 1
  predicted = np.full(len(data), -1)
  row = 0
  for batches in zip(*per_process):
    tokens = np.concatenate([b['tokens'] for b in batches])
    weights = np.concatenate([b['weights'] for b in batches])
    assert tokens.shape == (4, 257) and weights.shape == (4, 256)
    for i in range(4):
      if row >= len(starts):  # Padding row.
        assert not tokens[i].any() and not weights[i].any()
        continue
      s = starts[row]
      np.testing.assert_array_equal(tokens[i], data[s : s + 257])
      targets = s + 1 + np.flatnonzero(weights[i])
      assert np.all(predicted[targets] == -1)
      predicted[targets] = tokens[i, 1:][weights[i] == 1]
      row += 1
  assert row == len(starts)
  assert predicted[0] == -1
  np.testing.assert_array_equal(predicted[1:], data[1:])


def test_eval_max_bytes_and_short_split(corpus_dir):
  config = _config(corpus_dir, eval_max_bytes=1000)
  batches = lm_input.make_eval_batches(
      lm_input.resolve_spec(config), 'test', process_index=0, process_count=1
  )
  assert batches.num_predicted_bytes == 999
  assert sum(b['weights'].sum() for b in batches) == 999
  assert len(list(batches)) == len(batches)  # Re-iterable.
  config = _config(corpus_dir, eval_max_bytes=100)
  (batch,) = list(
      lm_input.make_eval_batches(
          lm_input.resolve_spec(config), 'test', process_index=0, process_count=1
      )
  )
  data = lm_input.load_split(lm_input.resolve_spec(config), 'test').read(0, 100)
  np.testing.assert_array_equal(batch['tokens'][0, :100], data)
  assert not batch['tokens'][0, 100:].any()
  assert batch['weights'][0].sum() == 99 and batch['weights'][1:].sum() == 0


@pytest.mark.parametrize(
    'field,value',
    [
        ('seq_len', 0),
        ('seq_len', 10**9),
        ('eval_step', 1000),
        ('eval_batch_size', 3),
        ('eval_max_bytes', -1),
        ('name', 'wiki'),
        ('max_bytes', -5),
        ('files', 3),
    ],
)
def test_bad_config_raises_value_error_naming_field(corpus_dir, field, value):
  values = _config(corpus_dir).to_dict()
  values['dataset'][field] = value
  config = ml_collections.ConfigDict(values)
  with pytest.raises(ValueError, match=field):
    if field.startswith('eval'):
      lm_input.make_eval_batches(
          lm_input.resolve_spec(config), 'validation', process_index=0, process_count=2
      )
    else:
      lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=1)


def test_bad_batch_size_and_process_arguments(corpus_dir):
  config = _config(corpus_dir)
  config.batch_size = 6
  with pytest.raises(ValueError, match='config.batch_size'):
    lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=0, process_count=4)
  with pytest.raises(ValueError, match='process_index'):
    lm_input.make_train_dataset(lm_input.resolve_spec(config), process_index=2, process_count=2)
  with pytest.raises(ValueError, match='split'):
    lm_input.make_eval_batches(
        lm_input.resolve_spec(config), 'valid', process_index=0, process_count=1
    )


def test_bits_per_byte():
  assert lm_input.bits_per_byte(np.log(2.0) * 10, 10) == pytest.approx(1.0)
