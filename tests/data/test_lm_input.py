"""Byte-level LM data (``data/lm_input.py``): the grain pipelines over the prepared corpora
(the TFDS builders: tests/data/test_text_builders.py)."""

import os

import ml_collections
import numpy as np
import pytest

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import lm_input
from contextpool_jax.data import text_builders as tb
from helpers import make_text_files

# ---------------------------------------------------------------------------
# Pipelines.
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def corpus_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('lm')
  make_text_files(root / 'text', [100_000, 120_000, 80_000], seed=5)
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
