"""Translation data (SentencePiece, bucketed grain pipeline), decoding (greedy, beam) and BLEU.

The pipeline reads ``tfds.data_source('wmt14_translate/de-en')`` under
``tfds.testing.mock_data`` (MockPolicy.USE_CODE: the wmt14 builder code gives
the feature dict ``{'de': Text, 'en': Text}`` offline). Tests that need known
sentences pass ``as_data_source_fn``, so the same ``tfds.data_source`` call
returns an in-memory list of ``{'en': str, 'de': str}`` records.
"""

import contextlib
import functools
import itertools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import translation_input as ti
from contextpool_jax.inference import decoding
from contextpool_jax.models import transformer as T
from contextpool_jax.training import bleu
from init_keys import init_key, init_variables

EN = 'the a house cat dog is small big green red sees runs and old new'.split()
DE = 'das ein haus katze hund ist klein gross gruen rot sieht laeuft und alt neu'.split()


def _corpus(n=64, seed=0, max_words=14):
  """Pairs ``{'en', 'de'}``; sentence i ends with the number i, so it is identifiable."""
  rng = np.random.default_rng(seed)
  records = []
  for i in range(n):
    k = int(rng.integers(1, max_words + 1))
    w = rng.integers(0, len(EN), k)
    records.append(
        {'en': ' '.join(EN[j] for j in w) + f' {i}', 'de': ' '.join(DE[j] for j in w) + f' {i}'}
    )
  return records


@contextlib.contextmanager
def _wmt(records_by_split):
  """``tfds.data_source('wmt14_translate/de-en', split=s)`` returns ``records_by_split[s]``."""

  def as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
    del self, decoders, deserialize_method, kwargs
    return records_by_split[split]

  with tfds.testing.mock_data(
      policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=as_data_source
  ):
    yield


def _config(workdir, batch_size=4, **dataset):
  ds = dict(
      name='wmt14_translate/de-en',
      source_lang='en',
      target_lang='de',
      vocab_size=48,
      max_source_len=96,
      max_target_len=96,
  )
  ds.update(dataset)
  return ml_collections.ConfigDict(
      {'seed': 0, 'batch_size': batch_size, 'workdir': str(workdir), 'dataset': ds}
  )


CORPUS = _corpus()


@pytest.fixture(scope='module')
def vocab(tmp_path_factory):
  with _wmt({'train': CORPUS}):
    return ti.get_vocab(ti.resolve_spec(_config(tmp_path_factory.mktemp('vocab'))), process_index=0)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _sentence_ids(vocab, batch, key='inputs'):
  return [int(vocab.decode(row).split()[-1]) for row in batch[key]]


# ----------------------------------------------------------------------------
# SentencePiece.
# ----------------------------------------------------------------------------


def test_sentencepiece_is_trained_stored_and_reused(tmp_path, monkeypatch):
  config = _config(tmp_path)
  with _wmt({'train': CORPUS}):
    vocab = ti.get_vocab(ti.resolve_spec(config), process_index=0)
  path = tmp_path / ti.vocab_filename(ti.resolve_spec(config))
  assert path.exists() and vocab.path == str(path)
  assert vocab.vocab_size == 48
  sp = vocab._sp  # pylint: disable=protected-access
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  text = CORPUS[5]['de']
  ids = vocab.encode(text)
  assert ids and min(ids) >= 3  # no pad/EOS/unk for in-corpus text
  assert vocab.decode(ids) == text
  assert vocab.decode(ids + [1, 7, 7, 0, 0]) == text  # stops at EOS, drops padding
  # Reused from the workdir: no data, no training.
  monkeypatch.setattr(ti, 'train_sentencepiece', lambda *a, **k: pytest.fail('retrained'))
  monkeypatch.setattr(ti, '_open_split', lambda *a, **k: pytest.fail('read data'))
  again = ti.get_vocab(ti.resolve_spec(config), process_index=0)
  assert again.encode(text) == ids
  # Processes > 0 never train: they load the file, or time out waiting for it.
  assert ti.get_vocab(ti.resolve_spec(config), process_index=1).encode(text) == ids
  other = _config(tmp_path, vocab_size=40, vocab_wait_seconds=0.05)
  with pytest.raises(TimeoutError, match='process 0'):
    ti.get_vocab(ti.resolve_spec(other), process_index=1, poll_seconds=0.01)
  # Pickles (grain workers) as its model.
  import pickle

  assert pickle.loads(pickle.dumps(vocab)).encode(text) == ids


def test_sentencepiece_bpe_and_explicit_path(tmp_path):
  path = tmp_path / 'sub' / 'my.model'
  config = _config(tmp_path / 'unused', vocab_type='bpe', vocab_path=str(path))
  with _wmt({'train': CORPUS}):
    vocab = ti.get_vocab(ti.resolve_spec(config), process_index=0)
  assert path.exists() and not (tmp_path / 'unused').exists()
  assert vocab.decode(vocab.encode(CORPUS[3]['en'])) == CORPUS[3]['en']
  with pytest.raises(ValueError, match='vocab_type'):
    ti.train_sentencepiece(['a b'], vocab_size=8, model_type='word')


def test_missing_dataset_raises_one_clear_error(tmp_path):
  config = _config(tmp_path, data_dir=str(tmp_path / 'tfds'))
  with pytest.raises(DatasetNotFoundError) as e:
    ti.make_train_dataset(ti.resolve_spec(config), process_index=0, process_count=1, vocab=object())
  message = str(e.value)
  assert 'wmt14_translate/de-en' in message and '--file_format=array_record' in message
  assert str(tmp_path / 'tfds') in message and 'data_dir' in message


# ----------------------------------------------------------------------------
# Training pipeline.
# ----------------------------------------------------------------------------


def test_pipeline_on_mock_wmt14_shapes_buckets_and_padding(tmp_path):
  """Random mock records of the real wmt14 feature dict, through tfds.data_source."""
  config = _config(tmp_path, vocab_size=30, max_source_len=24, max_target_len=20)
  with tfds.testing.mock_data(num_examples=40, policy=tfds.testing.MockPolicy.USE_CODE):
    ds = ti.make_train_dataset(ti.resolve_spec(config), process_index=0, process_count=1)
    batches = _take(iter(ds), 12)
  bounds = ti.bucket_boundaries(ti.resolve_spec(config))
  assert bounds == [8, 16, 24]
  shapes = set()
  for batch in batches:
    assert set(batch) == {'inputs', 'targets'}
    inputs, targets = batch['inputs'], batch['targets']
    assert inputs.dtype == targets.dtype == np.int32
    assert inputs.shape[0] == targets.shape[0] == 4
    b = bounds.index(inputs.shape[1])
    assert targets.shape[1] == min(bounds[b], 20)
    shapes.add(inputs.shape)
    for x in (inputs, targets):
      lengths = (x != 0).sum(1)
      assert np.all(x[np.arange(4), lengths - 1] == 1)  # ends with EOS ...
      assert np.all((x == 1).sum(1) == 1)  # ... exactly once
      assert np.all(np.cumsum(x == 0, 1)[x != 0] == 0)  # padding only at the end
    longest = np.maximum((inputs != 0).sum(1), (targets != 0).sum(1))
    assert np.all(longest <= bounds[b])
    assert np.all(longest > (bounds[b - 1] if b else 0))  # smallest bucket that fits
  assert len(shapes) >= 2


def test_every_example_once_per_epoch_disjoint_process_shards_and_seeded(tmp_path, vocab):
  config = _config(tmp_path, bucket_boundaries=[96])  # one bucket: no example is held back
  with _wmt({'train': CORPUS}):
    seen = []
    for p in range(2):
      it = iter(
          ti.make_train_dataset(
              ti.resolve_spec(config), process_index=p, process_count=2, vocab=vocab
          )
      )
      assert next(
          iter(
              ti.make_train_dataset(
                  ti.resolve_spec(config), process_index=p, process_count=2, vocab=vocab
              )
          )
      )['inputs'].shape == (2, 96)
      first = [i for b in _take(it, 16) for i in _sentence_ids(vocab, b)]  # 32 = one epoch
      second = [i for b in _take(it, 16) for i in _sentence_ids(vocab, b)]
      assert sorted(first) == sorted(second) == list(range(p, 64, 2))
      assert first != second  # reshuffled every epoch
      seen.append(first)
    again = iter(
        ti.make_train_dataset(
            ti.resolve_spec(config), process_index=0, process_count=2, vocab=vocab
        )
    )
    assert [i for b in _take(again, 16) for i in _sentence_ids(vocab, b)] == seen[0]
    config.seed = 1
    other = iter(
        ti.make_train_dataset(
            ti.resolve_spec(config), process_index=0, process_count=2, vocab=vocab
        )
    )
    assert [i for b in _take(other, 16) for i in _sentence_ids(vocab, b)] != seen[0]
  # Targets are the translations of the inputs (same pair).
  b = next(iter(again))
  assert _sentence_ids(vocab, b, 'targets') == _sentence_ids(vocab, b)


def test_too_long_pairs_are_dropped_or_truncated(tmp_path, vocab):
  lengths = [len(vocab.encode(r['en'])) + 1 for r in CORPUS]
  cap = int(np.median(lengths))
  long_ids = {i for i, n in enumerate(lengths) if n > cap}
  assert long_ids
  with _wmt({'train': CORPUS}):
    config = _config(tmp_path, max_source_len=cap, max_target_len=96, bucket_boundaries=[96])
    it = iter(
        ti.make_train_dataset(
            ti.resolve_spec(config), process_index=0, process_count=1, vocab=vocab
        )
    )
    got = [i for b in _take(it, 20) for i in _sentence_ids(vocab, b)]
    assert not long_ids & set(got) and set(got) == set(range(64)) - long_ids
    config.dataset.truncate = True
    it = iter(
        ti.make_train_dataset(
            ti.resolve_spec(config), process_index=0, process_count=1, vocab=vocab
        )
    )
    batches = _take(it, 20)
    assert all(b['inputs'].shape[1] == cap for b in batches)
    rows = np.concatenate([b['inputs'] for b in batches])
    full = rows[(rows != 0).sum(1) == cap]
    assert len(full) and np.all(full[:, -1] == 1)  # truncated rows still end in EOS


def test_iterator_state_round_trips_with_examples_held_in_buckets(tmp_path, vocab):
  config = _config(tmp_path, bucket_boundaries=[12, 20, 32], max_source_len=32, max_target_len=32)
  with _wmt({'train': CORPUS}):
    ds = ti.make_train_dataset(
        ti.resolve_spec(config), process_index=0, process_count=1, vocab=vocab
    )
    it = iter(ds)
    _take(it, 7)
    state = it.get_state()
    held = np.array(state['buckets'])
    assert held.shape == (3, 4) and (held >= 0).any()  # fixed shape, some pairs held
    state = json.loads(json.dumps(state))  # checkpointable as JSON
    want = _take(it, 25)
    restored = iter(
        ti.make_train_dataset(
            ti.resolve_spec(config), process_index=0, process_count=1, vocab=vocab
        )
    )
    restored.set_state(state)
    got = _take(restored, 25)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(w['inputs'], g['inputs'])
    np.testing.assert_array_equal(w['targets'], g['targets'])


def test_eval_batches_fixed_shape_mask_index_and_process_split(tmp_path, vocab):
  records = CORPUS[:23]
  config = _config(
      tmp_path, batch_size=8, max_eval_source_len=20, max_eval_target_len=24, eval_batch_size=6
  )
  with _wmt({'test': records}):
    shards = [
        ti.make_eval_batches(
            ti.resolve_spec(config), 'test', process_index=p, process_count=2, vocab=vocab
        )
        for p in range(2)
    ]
    batches = [list(s) for s in shards]
    assert list(shards[0]) and len(shards[0]) == len(shards[1]) == len(batches[0]) == 4
  indices = []
  for shard in batches:
    for b in shard:
      assert b['inputs'].shape == (3, 20) and b['targets'].shape == (3, 24)
      assert b['mask'].dtype == bool and b['index'].dtype == np.int32
      np.testing.assert_array_equal(b['mask'], b['index'] >= 0)
      pad = ~b['mask']
      assert np.all(b['targets'][pad] == 0) and np.all(b['inputs'][pad, 0] == 1)
      assert np.all(b['inputs'][pad, 1:] == 0)
      for row, i, m in zip(b['inputs'], b['index'], b['mask']):
        if m:
          expect = vocab.encode(records[i]['en'])[:19] + [1]
          np.testing.assert_array_equal(row[: len(expect)], expect)
      indices += [int(i) for i in b['index'][b['mask']]]
  assert sorted(indices) == list(range(23))  # every example once, none dropped
  assert shards[0].references == [r['de'] for r in records]
  first = batches[0][0]['inputs']  # sorted by source length, longest first
  assert (first != 0).sum(1)[0] >= (batches[0][-1]['inputs'] != 0).sum(1).max()


# ----------------------------------------------------------------------------
# Decoding with toy models of known next-token distributions.
# ----------------------------------------------------------------------------


class BigramToy(nn.Module):
  """log p(next | previous token), one table per example (picked by ``inputs[:, 0]``)."""

  def encode(self, inputs):
    return inputs[:, 0]

  def decode(self, encoded, inputs, decoder_inputs, decode=False):
    # A bigram needs no cache: a decode=True step reads the same table.
    del decode
    return self.variables['params']['table'][encoded[:, None], decoder_inputs]


def _bigram(rows):
  """Tables ``{prev: {next: prob}}`` -> (model, params); unspecified probabilities ~0."""
  vocab = 1 + max(max(max(r), max(max(d) for d in r.values())) for r in rows)
  p = np.full((len(rows), vocab, vocab), 1e-9)
  for n, r in enumerate(rows):
    for prev, dist in r.items():
      for nxt, q in dist.items():
        p[n, prev, nxt] = q
  return BigramToy(), {'params': {'table': jnp.asarray(np.log(p), jnp.float32)}}


# ids: 0 BOS/pad, 1 EOS, 2 A, 3 B, 4 C
TRAP = {
    0: {2: 0.5, 3: 0.4, 4: 0.1},
    2: {4: 0.3, 3: 0.25, 2: 0.2, 1: 0.25},
    3: {1: 0.9, 4: 0.1},
    4: {1: 1.0},
}


def test_beam_search_finds_a_better_sequence_than_greedy():
  model, params = _bigram([TRAP])
  inputs = jnp.zeros((1, 3), jnp.int32)
  greedy = decoding.greedy_decode(model, params, inputs, max_len=6)
  np.testing.assert_array_equal(greedy, [[2, 4, 1, 0, 0, 0]])  # A C EOS, p = 0.15
  beam = decoding.beam_search(model, params, inputs, beam_size=2, alpha=0.0, max_len=6)
  np.testing.assert_array_equal(beam, [[3, 1, 0, 0, 0, 0]])  # B EOS, p = 0.36
  seqs, scores = decoding.beam_search_all(model, params, inputs, beam_size=2, alpha=0.0, max_len=6)
  # A EOS (.125) ranks 3rd of the 2k candidates at step 1, so it never finishes;
  # A C EOS (.15, greedy's answer) is the second hypothesis.
  np.testing.assert_allclose(scores[0], [math.log(0.36), math.log(0.5 * 0.3)], rtol=1e-5)
  np.testing.assert_array_equal(seqs[0, 1], [2, 4, 1, 0, 0, 0])


def test_length_penalty_prefers_longer_hypotheses_as_alpha_grows():
  # [EOS] has p = .55 (length 1); [A, B, EOS] has p = .45 (length 3).
  model, params = _bigram([{0: {1: 0.55, 2: 0.45}, 2: {3: 1.0}, 3: {1: 1.0}}])
  inputs = jnp.zeros((1, 2), jnp.int32)
  run = functools.partial(decoding.beam_search_all, model, params, inputs, beam_size=2, max_len=5)
  for alpha, want in [(0.0, [1, 0, 0, 0, 0]), (0.6, [1, 0, 0, 0, 0]), (2.0, [2, 3, 1, 0, 0])]:
    seqs, scores = run(alpha=alpha)
    np.testing.assert_array_equal(seqs[0, 0], want)
    best = {(1,): math.log(0.55) / 1.0, (2, 3, 1): math.log(0.45) / ((5 + 3) / 6) ** alpha}
    np.testing.assert_allclose(
        sorted(np.asarray(scores[0]).tolist(), reverse=True),
        sorted(best.values(), reverse=True),
        rtol=1e-5,
    )
  assert float(decoding.length_penalty(1, 0.6)) == 1.0


@pytest.mark.parametrize('alpha', [0.0, 0.6, 2.0])
def test_a_beam_as_wide_as_the_search_space_finds_the_best_scored_sequence(alpha):
  """Exhaustive check of the scores: every sequence of <= 3 tokens over {EOS, 2, 3}."""
  rows = _random_tables(1, 4, seed=11)  # best: [EOS] at alpha 0, [2, 3, EOS] above
  model, params = _bigram(rows)
  logp = np.asarray(params['params']['table'][0], np.float64)
  best, best_seq = -np.inf, None
  for length in (1, 2, 3):
    for seq in itertools.product((1, 2, 3), repeat=length):
      if 1 in seq[:-1] or (length < 3 and seq[-1] != 1):
        continue  # EOS only last; shorter than max_len only if ended by EOS
      score = sum(logp[p, n] for p, n in zip((0,) + seq[:-1], seq))
      score /= ((5 + length) / 6) ** alpha
      if score > best:
        best, best_seq = score, seq
  seqs, scores = decoding.beam_search_all(
      model, params, jnp.zeros((1, 1), jnp.int32), beam_size=64, alpha=alpha, max_len=3
  )
  np.testing.assert_array_equal(seqs[0, 0], list(best_seq) + [0] * (3 - len(best_seq)))
  assert float(scores[0, 0]) == pytest.approx(best, rel=1e-5)


def _random_tables(n, vocab, seed):
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    p = rng.dirichlet(np.full(vocab - 1, 0.3), size=vocab)  # never the pad id 0
    rows.append({prev: dict(enumerate(p[prev], start=1)) for prev in range(vocab)})
  return rows


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_beam_size_one_is_greedy_and_output_is_zero_padded(alpha):
  model, params = _bigram(_random_tables(6, 7, seed=3))
  inputs = jnp.arange(6, dtype=jnp.int32)[:, None]
  greedy = jax.jit(functools.partial(decoding.greedy_decode, model, max_len=9, min_segment=2))
  beam1 = jax.jit(
      functools.partial(
          decoding.beam_search, model, beam_size=1, alpha=alpha, max_len=9, min_segment=4
      )
  )
  g = np.asarray(greedy(params, inputs))
  np.testing.assert_array_equal(g, beam1(params, inputs))
  np.testing.assert_array_equal(
      g, decoding.greedy_decode(model, params, inputs, max_len=9, min_segment=None)
  )
  assert g.shape == (6, 9) and g.dtype == np.int32
  for row in g:
    if 1 in row.tolist():
      e = row.tolist().index(1)
      assert np.all(row[e + 1 :] == 0) and np.all(row[:e] > 1)
  assert (g == 1).any()
  beam4 = decoding.beam_search(model, params, inputs, beam_size=4, alpha=alpha, max_len=9)
  assert beam4.shape == (6, 9)


def _python_greedy(model, params, inputs, max_len):
  """Reference: runs the decoder on exactly the prefix [BOS, y_1 .. y_t] at every step."""
  enc = model.apply(params, inputs, method=model.encode)
  decode = jax.jit(lambda p, e, x, d: model.apply(p, e, x, d, method=model.decode))
  prefix = np.zeros((inputs.shape[0], 1), np.int32)
  for _ in range(max_len):
    tok = np.asarray(jnp.argmax(decode(params, enc, inputs, prefix)[:, -1], -1), np.int32)
    prefix = np.concatenate([prefix, tok[:, None]], 1)
  out = prefix[:, 1:]
  for row in out:  # 0 after the first EOS
    if 1 in row.tolist():
      row[row.tolist().index(1) + 1 :] = 0
  return out


@pytest.mark.slow
def test_transformer_greedy_matches_step_by_step_reference():
  """The static-width buffer and segments give what exact prefixes give (causal decoder,
  including ContextPool after each layer)."""
  model = T.Transformer(
      vocab_size=12,
      num_layers=1,
      emb_dim=16,
      mlp_dim=32,
      num_heads=2,
      dropout_rate=0.0,
      context_pool={},
  )
  inputs = jnp.array([[3, 4, 5, 1, 0], [6, 1, 0, 0, 0]], jnp.int32)
  params = init_variables(model, init_key(6), inputs, jnp.ones((2, 4), jnp.int32))
  # Larger kernels, so the untrained model does not just repeat its BOS (id 0).
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: 5 * x if 'kernel' in jax.tree_util.keystr(path) else x, params
  )
  want = _python_greedy(model, params, inputs, max_len=7)
  assert len(set(want.ravel().tolist()) - {0, 1}) >= 3
  got = jax.jit(functools.partial(decoding.greedy_decode, model, max_len=7, min_segment=2))(
      params, inputs
  )
  np.testing.assert_array_equal(got, want)
  beam1 = jax.jit(
      functools.partial(decoding.beam_search, model, beam_size=1, max_len=7, min_segment=2)
  )(params, inputs)
  np.testing.assert_array_equal(beam1, want)


# ----------------------------------------------------------------------------
# BLEU.
# ----------------------------------------------------------------------------


class CopyToy(nn.Module):
  """Emits the source tokens (up to and including its EOS): output t = inputs[:, t]."""

  vocab: int

  def encode(self, inputs):
    return inputs

  @nn.compact
  def decode(self, encoded, inputs, decoder_inputs, decode=False):
    start = 0
    if decode:  # a cached step (decoding.init_cache) reads the source at its position
      initialized = self.has_variable('cache', 'index')
      index = self.variable('cache', 'index', lambda: jnp.array(0, jnp.int32))
      if initialized:
        start, index.value = index.value, index.value + 1
    positions = start + jnp.arange(decoder_inputs.shape[1])
    src = jnp.take(inputs, positions, axis=1, mode='fill', fill_value=0)
    return 10.0 * jax.nn.one_hot(jnp.where(src == 0, 1, src), self.vocab)


@pytest.mark.parametrize('beam_size', [None, 3])
def test_decode_and_score_on_eval_batches(tmp_path, vocab, beam_size):
  copy = [{'en': r['en'], 'de': r['en']} for r in CORPUS[:11]]  # "translation" = copy
  config = _config(tmp_path, batch_size=4)
  with _wmt({'validation': copy}):
    batches = ti.make_eval_batches(
        ti.resolve_spec(config), 'validation', process_index=0, process_count=1, vocab=vocab
    )
    scored = bleu.decode_and_score(
        CopyToy(vocab.vocab_size), {}, batches, vocab, beam_size=beam_size
    )
  assert scored.bleu == pytest.approx(100.0) and dict(scored) == {'bleu': scored.bleu}
  assert scored.hypotheses == scored.references == [r['en'] for r in copy]
  # max_batches; a bare parameter tree is accepted too (wrapped as {'params': ...}).
  part = bleu.decode_and_score(
      CopyToy(vocab.vocab_size), {}, batches, vocab, beam_size=None, max_batches=2
  )
  assert len(part.hypotheses) == 8 and part.bleu == pytest.approx(100.0)
  # References from the detokenised targets, and a partly wrong system.
  wrong = list(batches)
  wrong[0] = dict(wrong[0], inputs=np.where(wrong[0]['inputs'] > 2, 3, wrong[0]['inputs']))
  scored = bleu.decode_and_score(CopyToy(vocab.vocab_size), {}, wrong, vocab, beam_size=None)
  assert 0 < scored.bleu < 100
  assert scored.bleu == pytest.approx(bleu.corpus_bleu(scored.hypotheses, scored.references))
