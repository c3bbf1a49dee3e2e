"""Bad data (issue 12): each fault gives a clear error naming the setting, or is handled exactly.

Byte-level LM (local_text, enwik8/text8): patterns naming nothing, empty and binary
files, corpora too small for the splits or for one training window, evaluation splits
too short, files edited under a prepared data_dir. Evaluation splits smaller than one
batch (LM, images, translation) give exact metrics (padding has zero weight). Images and
translation read real prepared TFDS datasets (array_record, written here offline by a
stand-in builder under the real dataset name) to check missing and empty splits. The
trainer surfaces data errors before compiling.
"""

import importlib
import io
import math
import os
import re
import threading
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath
from PIL import Image

from configs import cifar10_resnet
from configs import default as default_config
from configs import wmt14
from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import image_input
from contextpool_jax.data import lm_input
from contextpool_jax.data import text_builders as tb
from contextpool_jax.data import translation_input
from contextpool_jax.training import spec, tasks
from contextpool_jax.training import trainer
from helpers import tiny_config


def _task(config, workdir):
  """The trainer's task of ``config`` (its specs read as the trainer reads them)."""
  specs = spec.read(config)
  return tasks.make_task(specs.task, specs.model, specs.data, str(workdir))


def _text(n, seed=0):
  return np.random.default_rng(seed).integers(32, 127, n, np.uint8).tobytes()


def _lm_config(tmp_path, files, **dataset):
  config = ml_collections.ConfigDict(
      {'seed': 0, 'batch_size': 4, 'dataset': lm_input.default_dataset_config()}
  )
  config.dataset.update(
      name='local_text',
      data_dir=str(tmp_path / 'tfds'),
      files=files,
      max_bytes=0,
      seq_len=16,
      eval_context=32,
      eval_step=16,
      eval_batch_size=4,
  )
  config.dataset.update(**dataset)
  return config


def _train(config):
  return lm_input.make_train_dataset(
      lm_input.resolve_spec(config), process_index=0, process_count=1
  )


def _prepared(tmp_path):
  """The local_text configurations prepared under the test's data_dir."""
  root = tmp_path / 'tfds' / 'local_text'
  return sorted(p.name for p in root.iterdir()) if root.exists() else []


def _split_bytes(config, split):
  corpus = lm_input.load_split(lm_input.resolve_spec(config), split)
  return corpus.read(0, len(corpus)).tobytes()


def _corpus(config):
  """``{relative path: bytes}`` put back together from the prepared splits."""
  pieces = tb.make_local_text_config(**lm_input.resolve_spec(config).builder_kwargs).splits
  files = {}
  for split in tb.SPLITS:
    data, pos = _split_bytes(config, split), 0
    for piece in pieces[split]:
      files.setdefault(piece.path, {})[piece.offset] = data[pos : pos + piece.length]
      pos += piece.length
  return {path: b''.join(parts[o] for o in sorted(parts)) for path, parts in files.items()}


# ---------------------------------------------------------------------------
# local_text inputs.
# ---------------------------------------------------------------------------


def test_files_default_is_the_snapshot_stdlib_is_named_and_an_empty_pattern_is_an_error(tmp_path):
  assert tb.make_local_text_config((), max_bytes=2**16).name.startswith('snapshot_')
  assert tb.make_local_text_config(None, max_bytes=2**16).name.startswith('snapshot_')
  stdlib = tb.make_local_text_config((tb.STDLIB,), max_bytes=2**16)
  assert stdlib.name.startswith('stdlib_') and stdlib.root == tb.stdlib_source_dir()
  with pytest.raises(ValueError) as e:  # `--config.dataset.files=` gives ('',)
    _train(_lm_config(tmp_path, ('',)))
  assert "config.dataset.files=('',) has an empty pattern" in str(e.value)
  assert "files=() reads the default corpus (cpython-3.11.7-lib), '<stdlib>'" in str(e.value)
  assert _prepared(tmp_path) == []


@pytest.mark.parametrize(
    'pattern,why',
    [
        ('text/*.md', 'a glob pattern that matches no file'),
        ('text/**/*.rst', 'a glob pattern that matches no file'),
        ('empty_dir', 'a directory without non-hidden files'),
        ('hidden_only', 'a directory without non-hidden files'),
        ('text/missing.txt', 'no such file or directory'),
    ],
)
def test_a_pattern_naming_no_file_is_dataset_not_found_naming_it(tmp_path, pattern, why):
  (tmp_path / 'text').mkdir()
  (tmp_path / 'text' / 'a.txt').write_bytes(_text(5000))
  (tmp_path / 'empty_dir').mkdir()
  (tmp_path / 'hidden_only').mkdir()
  (tmp_path / 'hidden_only' / '.notes.txt').write_bytes(_text(5000))
  files = (str(tmp_path / 'text' / 'a.txt'), str(tmp_path / pattern))
  with pytest.raises(DatasetNotFoundError) as e:
    _train(_lm_config(tmp_path, files))
  message = str(e.value)
  assert f'config.dataset.files={files!r}' in message
  assert f'{str(tmp_path / pattern)!r} names no file ({why})' in message
  assert _prepared(tmp_path) == []


def test_empty_files_are_skipped_with_a_warning_naming_them(tmp_path):
  (tmp_path / 'a.txt').write_bytes(_text(3000))
  (tmp_path / 'b.txt').write_bytes(b'')
  config = _lm_config(tmp_path, (str(tmp_path / '*.txt'),))
  with pytest.warns(UserWarning, match=r'skipping 1 empty file\(s\): .*b\.txt'):
    data = _corpus(config)
  assert data == {'a.txt': (tmp_path / 'a.txt').read_bytes()}
  # Only empty files: no data.
  with pytest.raises(DatasetNotFoundError, match=r'names only empty files \(.*b\.txt\)'):
    _train(_lm_config(tmp_path, (str(tmp_path / 'b.txt'),)))
  # The standard library has empty __init__.py files by design: no warning for it.
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    tb.make_local_text_config((tb.STDLIB,), max_bytes=0)
    tb.make_local_text_config((), max_bytes=0)


def test_a_binary_file_is_an_error_naming_it_unless_allowed(tmp_path):
  (tmp_path / 'a.txt').write_bytes(_text(3000))
  binary = b'\x89PNG\x01\x00\x00\x00' + _text(100)
  (tmp_path / 'b.png').write_bytes(binary)
  files = (str(tmp_path / '*'),)
  with pytest.raises(ValueError) as e:
    _train(_lm_config(tmp_path, files))
  message = str(e.value)
  assert f'config.dataset.files={files!r}' in message
  assert f'{tmp_path / "b.png"} (first NUL at byte 5)' in message
  assert 'config.dataset.allow_binary=True' in message
  assert _prepared(tmp_path) == []
  allowed = _lm_config(tmp_path, files, allow_binary=True)
  assert _corpus(allowed) == {'a.txt': (tmp_path / 'a.txt').read_bytes(), 'b.png': binary}
  # Only the bytes used are checked: a NUL in a piece the cap's sample leaves out is
  # never read (a split seed whose sample of 2,000 bytes has the NUL, one whose has not).
  kept = lambda seed: any(
      p == 'b.png' and o <= 5 < o + n
      for p, o, n, _ in tb.make_local_text_config(
          files, max_bytes=2000, allow_binary=True, split_seed=seed
      ).inputs
  )
  with_nul, without = [next(s for s in range(100) if kept(s) == k) for k in (True, False)]
  with pytest.raises(ValueError, match='first NUL at byte 5'):
    tb.make_local_text_config(files, max_bytes=2000, split_seed=with_nul)
  tb.make_local_text_config(files, max_bytes=2000, split_seed=without)


# ---------------------------------------------------------------------------
# Too little data.
# ---------------------------------------------------------------------------


def test_a_corpus_too_small_for_three_splits_fails_before_preparing(tmp_path):
  (tmp_path / 'a.txt').write_bytes(_text(1000))
  files = (str(tmp_path / 'a.txt'),)
  with pytest.raises(ValueError) as e:
    _train(_lm_config(tmp_path, files, max_bytes=19))
  assert str(e.value).startswith(
      f'local_text: config.dataset.files={files!r} gives 19 piece(s) of 19 bytes'
      ' (config.dataset.max_bytes=19, 0 = no cap; config.dataset.split_block_bytes=65536,'
      ' 0 = files whole), too few for a validation split of at least 2 bytes'
  )
  # Whole files: one file cannot make three splits; the message says what would.
  with pytest.raises(ValueError, match='set split_block_bytes > 0 to cut files into blocks'):
    _train(_lm_config(tmp_path, files, split_block_bytes=0))
  assert _prepared(tmp_path) == []


def test_a_train_split_shorter_than_two_windows_is_an_error_naming_seq_len(tmp_path):
  (tmp_path / 'a.txt').write_bytes(_text(1000))  # train: 900 bytes
  files = (str(tmp_path / 'a.txt'),)
  config = _lm_config(tmp_path, files, seq_len=451)
  for make in (
      _train,
      lambda c: lm_input.make_eval_batches(
          lm_input.resolve_spec(c), 'validation', process_index=0, process_count=1
      ),
  ):
    with pytest.raises(ValueError) as e:
      make(config)
    message = str(e.value)
    assert message.startswith(
        'config.dataset.seq_len=451 is too large for the train split of'
        f' config.dataset.files={files!r} (config.dataset.max_bytes=0):'
        ' it has 900 bytes'
    )
    assert 'at least 2 * seq_len = 902' in message
  # Exactly 2 * seq_len bytes: one window per epoch, at phase 0..seq_len-1.
  fits = _lm_config(tmp_path, files, seq_len=450)
  batch = next(iter(_train(fits)))
  assert batch['tokens'].shape == (4, 451)
  train = _split_bytes(fits, 'train')
  for row in batch['tokens']:
    assert row.astype(np.uint8).tobytes() in train


def test_an_evaluation_split_shorter_than_two_bytes_is_an_error(tmp_path):
  (tmp_path / 'a.txt').write_bytes(_text(20))  # 20 one-byte pieces, one group: validation 1 byte
  files = (str(tmp_path / 'a.txt'),)
  with pytest.raises(ValueError) as e:
    _train(_lm_config(tmp_path, files, seq_len=8))  # checked before preparing
  assert 'too few for a validation split of at least 2 bytes' in str(e.value)
  assert _prepared(tmp_path) == []
  (tmp_path / 'a.txt').write_bytes(_text(40))  # two groups: validation 2 bytes, test 2 bytes
  (batch,) = lm_input.make_eval_batches(
      lm_input.resolve_spec(_lm_config(tmp_path, files, seq_len=8)),
      'validation',
      process_index=0,
      process_count=1,
  )
  assert batch['weights'].sum() == 1
  with pytest.raises(ValueError, match=r'config.dataset.eval_max_bytes=1 must be 0'):
    _train(_lm_config(tmp_path, files, seq_len=8, eval_max_bytes=1))


def test_enwik8_split_sizes_too_small_name_split_bytes(tmp_path):
  manual = tmp_path / 'tfds' / 'downloads' / 'manual'
  manual.mkdir(parents=True)
  (manual / 'enwik8').write_bytes(_text(1000))
  config = _lm_config(
      tmp_path, (), name='enwik8', download=False, split_bytes=(998, 1, 1), seq_len=8
  )
  with pytest.raises(
      ValueError,
      match=r'^The validation split of config.dataset.name='
      r"'enwik8' with config.dataset.split_bytes=\(998, 1, 1\) has 1 byte",
  ):
    _train(config)


# ---------------------------------------------------------------------------
# Evaluation splits smaller than one batch: exact metrics.
# ---------------------------------------------------------------------------


def _bigram_logits(tokens, table):
  return jnp.asarray(table)[tokens[:, :-1]]


@pytest.mark.sweep
@pytest.mark.parametrize('process_count', [1, 2])
@pytest.mark.parametrize('context,step', [(32, 16), (256, 128)])
def test_bpc_is_exact_on_an_eval_split_smaller_than_one_batch(
    tmp_path, process_count, context, step
):
  (tmp_path / 'a.txt').write_bytes(_text(2000, seed=1))  # validation: 100 bytes
  config = default_config.get_config()
  config.dataset.update(
      data_dir=str(tmp_path / 'tfds'),
      files=(str(tmp_path / 'a.txt'),),
      max_bytes=0,
      seq_len=16,
      eval_context=context,
      eval_step=step,
      eval_batch_size=16,
      eval_max_bytes=0,
  )
  task = _task(config, tmp_path).objective
  table = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
  shards = [
      lm_input.make_eval_batches(
          lm_input.resolve_spec(config), 'validation', process_index=p, process_count=process_count
      )
      for p in range(process_count)
  ]
  assert shards[0].num_windows < 16 and all(len(s) == 1 for s in shards)
  sums = {}
  for shard in shards:
    (batch,) = list(shard)
    padding = batch['weights'].sum(1) == 0
    assert padding.any() and not batch['tokens'][padding].any()
    for k, v in task.eval_sums(_bigram_logits(batch['tokens'], table), batch).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  data = np.frombuffer(_split_bytes(config, 'validation'), np.uint8)
  assert len(data) == 100 and sums['weight'] == 99
  log_p = jax.nn.log_softmax(table[data[:-1]], axis=-1)
  direct_bpc = -float(np.take_along_axis(np.asarray(log_p), data[1:, None], 1).sum()) / (
      99 * math.log(2.0)
  )
  np.testing.assert_allclose(task.finalize(sums)['bpc'], direct_bpc, rtol=1e-6)


# ---------------------------------------------------------------------------
# Files edited under a prepared data_dir.
# ---------------------------------------------------------------------------


def test_edited_files_are_prepared_again_never_read_stale(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_bytes(_text(4000, seed=1))
  config = _lm_config(tmp_path, (str(path),))
  before = _split_bytes(config, 'train')
  assert _corpus(config) == {'a.txt': path.read_bytes()}
  # Same size, same mtime (what (path, size, mtime) keys would miss): prepared again.
  st = os.stat(path)
  path.write_bytes(_text(4000, seed=2))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert os.stat(path).st_mtime_ns == st.st_mtime_ns
  assert _corpus(config) == {'a.txt': path.read_bytes()}
  assert _split_bytes(config, 'train') != before
  assert len(_prepared(tmp_path)) == 2  # the old directory stays until deleted
  # Touching a file (same bytes) reuses the prepared data.
  name = tb.make_local_text_config((str(path),), max_bytes=0).name
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  assert tb.make_local_text_config((str(path),), max_bytes=0).name == name
  assert len(_prepared(tmp_path)) == 2
  # A builder made before an edit refuses to prepare.
  stale = tb.LocalText(files=(str(path),), max_bytes=0, data_dir=str(tmp_path / 'other'))
  path.write_bytes(_text(4000, seed=3))
  with pytest.raises(ValueError, match='input files changed since the builder was made'):
    stale.download_and_prepare(file_format='array_record')


# ---------------------------------------------------------------------------
# Images and translation: real prepared TFDS datasets (written offline).
# ---------------------------------------------------------------------------


def _prepare_tfds(data_dir, full_name, splits):
  """Prepares ``splits`` ({split: [example]}) as array_record under the real TFDS name.

  A stand-in builder with the real builder's name, config, version and features,
  so ``tfds.data_source(full_name, data_dir=...)`` reads it like the real one.
  """
  real = tfds.builder(full_name, data_dir=str(data_dir / 'unused'))
  dataset_name = real.name
  configs = [real.builder_config] if real.builder_config else []

  class StandIn(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    name = dataset_name
    VERSION = real.version
    BUILDER_CONFIGS = configs

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):  # As in text_builders (no importlib_resources needed).
      return epath.Path(__file__)

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=real.info.features, disable_shuffling=True
      )

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(examples) for split, examples in splits.items()}

    def _generate_examples(self, examples):
      yield from enumerate(examples)

  StandIn(data_dir=str(data_dir), config=configs[0].name if configs else None).download_and_prepare(
      file_format='array_record'
  )


def _png(value):
  buffer = io.BytesIO()
  Image.fromarray(np.full((32, 32, 3), value, np.uint8)).save(buffer, format='PNG')
  buffer.seek(0)
  return buffer


@pytest.fixture(scope='module')
def cifar_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('cifar')
  example = lambda i: {'id': f'x{i}', 'image': _png(20 * i), 'label': i % 10}
  _prepare_tfds(
      data_dir,
      'cifar10',
      {'train': [example(i) for i in range(6)], 'test': [example(i) for i in range(3)]},
  )
  return data_dir


def _cifar_config(data_dir, **dataset):
  config = cifar10_resnet.get_config('resnet20')
  config.dataset.update(data_dir=str(data_dir), eval_batch_size=8, **dataset)
  return config


@pytest.mark.parametrize('process_count', [1, 2])
def test_image_eval_split_smaller_than_one_batch_gives_exact_metrics(
    cifar_dir, tmp_path, process_count
):
  config = _cifar_config(cifar_dir)
  task = _task(config, tmp_path).objective
  weights = np.random.default_rng(0).normal(size=(3, 10)).astype(np.float32)
  logits_of = lambda images: jnp.asarray(images.mean(axis=(1, 2)) @ weights)
  sums, labels = {}, []
  for p in range(process_count):
    (batch,) = list(
        image_input.make_eval_batches(
            image_input.resolve_spec(config), process_index=p, process_count=process_count
        )
    )
    assert batch['mask'].shape == (8 // process_count,) and not batch['mask'].all()
    assert not batch['image'][~batch['mask']].any()
    labels += batch['label'][batch['mask']].tolist()
    for k, v in task.eval_sums(logits_of(batch['image']), batch).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  assert sorted(labels) == [0, 1, 2] and sums['weight'] == 3
  spec = image_input.resolve_spec(config)
  source = tfds.data_source('cifar10', split='test', data_dir=str(cifar_dir))
  examples = [image_input.eval_example(source[i], spec) for i in range(3)]
  logits = np.asarray(logits_of(np.stack([e['image'] for e in examples])))
  truth = np.array([e['label'] for e in examples])
  nll = -np.asarray(jax.nn.log_softmax(logits))[np.arange(3), truth]
  metrics = task.finalize(sums)
  np.testing.assert_allclose(metrics['loss'], nll.mean(), rtol=1e-6)
  assert metrics['top1'] == np.mean(logits.argmax(1) == truth)


def test_image_missing_or_empty_split_names_the_setting(cifar_dir, tmp_path):
  available = 'Prepared splits: train (6 examples), test (3 examples)'
  cases = [
      (dict(split='valid'), "the evaluation split 'valid' (config.eval_splits)"),
      (dict(dataset=dict(eval_split='validation')), "config.dataset.eval_split='validation'"),
      (dict(split='test[3:]'), "the evaluation split 'test[3:]' (config.eval_splits)"),
      (
          dict(dataset=dict(train_split='train[:0]'), train=True),
          "config.dataset.train_split='train[:0]'",
      ),
  ]
  for case, setting in cases:
    config = _cifar_config(cifar_dir, **case.get('dataset', {}))
    with pytest.raises(ValueError) as e:
      if case.get('train'):
        image_input.make_train_dataset(
            image_input.resolve_spec(config), process_index=0, process_count=1
        )
      else:
        image_input.make_eval_batches(
            image_input.resolve_spec(config), case.get('split'), process_index=0, process_count=1
        )
    assert str(e.value).startswith(f"{setting} cannot be read from 'cifar10'")
    assert available in str(e.value)
  with pytest.raises(
      ValueError,
      match=r"^the evaluation split 'test' \(config.eval_splits\) selects "
      r"no example of 'cifar10'",
  ):
    image_input.make_eval_batches(
        image_input.resolve_spec(_cifar_config(cifar_dir)),
        'test',
        process_index=0,
        process_count=1,
        source=[],
    )
  # Not prepared at all: DatasetNotFoundError saying how to prepare it.
  with pytest.raises(DatasetNotFoundError, match='tfds build cifar10'):
    image_input.make_eval_batches(
        image_input.resolve_spec(_cifar_config(tmp_path)), process_index=0, process_count=1
    )


EN = 'the a house cat dog is small big green red sees runs and old new'.split()
DE = 'das ein haus katze hund ist klein gross gruen rot sieht laeuft und alt neu'.split()


def _pairs(n, seed):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    w = rng.integers(0, len(EN), int(rng.integers(2, 10)))
    out.append(
        {'en': ' '.join(EN[j] for j in w) + f' {i}', 'de': ' '.join(DE[j] for j in w) + f' {i}'}
    )
  return out


@pytest.fixture(scope='module')
def wmt_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp('wmt')
  importlib.import_module('tensorflow_datasets.translate.wmt14')  # registers it without TF
  _prepare_tfds(
      data_dir, 'wmt14_translate/de-en', {'train': _pairs(48, 0), 'validation': _pairs(3, 1)}
  )  # no 'test'
  return data_dir


def _wmt_config(data_dir, workdir, **dataset):
  config = wmt14.get_config('en-de,tiny,standard')
  config.dataset.update(
      data_dir=str(data_dir),
      vocab_size=40,
      max_source_len=32,
      max_target_len=32,
      eval_batch_size=8,
      vocab_path=str(workdir / 'v.model'),
  )
  config.dataset.update(**dataset)
  return config


@pytest.mark.parametrize('process_count', [1, 2])
def test_translation_eval_split_smaller_than_one_batch_gives_exact_loss(
    wmt_dir, tmp_path, process_count
):
  config = _wmt_config(wmt_dir, tmp_path)
  full = _task(config, tmp_path)
  task, vocab = full.objective, full.data.vocab
  table = np.random.default_rng(0).normal(size=(vocab.vocab_size, 32, vocab.vocab_size))
  logits_of = lambda inputs: jnp.asarray(table[inputs[:, 0]], jnp.float32)
  sums, seen = {}, []
  for p in range(process_count):
    (batch,) = list(
        translation_input.make_eval_batches(
            translation_input.resolve_spec(config),
            'validation',
            process_index=p,
            process_count=process_count,
            vocab=vocab,
        )
    )
    assert batch['mask'].shape == (8 // process_count,) and not batch['mask'].all()
    assert not batch['targets'][~batch['mask']].any()
    seen += batch['index'][batch['mask']].tolist()
    for k, v in task.eval_sums(logits_of(batch['inputs']), batch).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  assert sorted(seen) == [0, 1, 2]
  nll, count = 0.0, 0
  for pair in _pairs(3, 1):
    source = vocab.encode(pair['en'])[:31] + [1]  # truncated to 32 with EOS, as the
    target = vocab.encode(pair['de'])[:31] + [1]  # evaluation pipeline does
    log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(table[source[0]], jnp.float32)))
    nll -= sum(log_p[t, y] for t, y in enumerate(target))
    count += len(target)
  assert sums['weight'] == count
  np.testing.assert_allclose(task.finalize(sums)['loss'], nll / count, rtol=1e-5)


def _raised(fn):
  try:
    fn()
  except Exception as e:  # pylint: disable=broad-except
    return e
  return None


def test_translation_missing_or_empty_split_names_the_setting(wmt_dir, tmp_path):
  config = _wmt_config(wmt_dir, tmp_path)
  vocab = translation_input.get_vocab(translation_input.resolve_spec(config), process_index=0)
  with pytest.raises(ValueError) as e:
    translation_input.make_eval_batches(
        translation_input.resolve_spec(config),
        'test',
        process_index=0,
        process_count=1,
        vocab=vocab,
    )
  assert str(e.value).startswith(
      "the evaluation split 'test' (config.eval_splits) cannot be read from"
      " 'wmt14_translate/de-en'"
  )
  assert 'Prepared splits: train (48 examples), validation (3 examples)' in str(e.value)
  with pytest.raises(ValueError, match=r"^config.dataset.train_split='train\[:0\]' cannot be"):
    translation_input.make_train_dataset(
        translation_input.resolve_spec(_wmt_config(wmt_dir, tmp_path, train_split='train[:0]')),
        process_index=0,
        process_count=1,
        vocab=vocab,
    )
  one = _wmt_config(wmt_dir, tmp_path, train_split='train[:1]', bucket_boundaries=[32])
  with pytest.raises(
      ValueError, match=r"train_split='train\[:1\]' has no examples for " 'process 1 of 2'
  ):
    translation_input.make_train_dataset(
        translation_input.resolve_spec(one), process_index=1, process_count=2, vocab=vocab
    )
  # Every pair too long (and truncate=False): an error after two epochs, not a hang.
  too_short = _wmt_config(wmt_dir, tmp_path, max_source_len=2, max_target_len=2)
  it = iter(
      translation_input.make_train_dataset(
          translation_input.resolve_spec(too_short), process_index=0, process_count=1, vocab=vocab
      )
  )
  raised = []
  puller = threading.Thread(target=lambda: raised.append(_raised(lambda: next(it))), daemon=True)
  puller.start()
  puller.join(timeout=120)  # a regression hangs: fail instead of waiting forever
  assert raised and isinstance(raised[0], ValueError), raised
  assert re.match(
      r'96 training pairs in a row are longer than config.dataset.max_source_len=2'
      r' or max_target_len=2 .* none fits',
      str(raised[0]),
  )
  with pytest.raises(DatasetNotFoundError, match='tfds build wmt14_translate/de-en'):
    translation_input.make_train_dataset(
        translation_input.resolve_spec(_wmt_config(tmp_path / 'none', tmp_path)),
        process_index=0,
        process_count=1,
        vocab=vocab,
    )


# ---------------------------------------------------------------------------
# Through the trainer: errors before compiling; exact BPC with padding rows.
# ---------------------------------------------------------------------------


def _no_compiling(monkeypatch):
  """``jax.jit``'s functions fail when they run on arrays (which compiles them); traced
  (``jax.eval_shape``, the checks before any data work) they work as before."""
  real_jit = jax.jit

  def jit(*args, **kwargs):
    jitted = real_jit(*args, **kwargs)

    def run(*a, **k):
      if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((a, k))):
        raise AssertionError('a jitted function ran: the data error came after compiling started')
      return jitted(*a, **k)

    return run

  monkeypatch.setattr(jax, 'jit', jit)


@pytest.mark.parametrize(
    'fault,error,expected',
    [
        ('glob_matches_nothing', DatasetNotFoundError, 'names no file (a glob pattern'),
        ('binary_file', ValueError, 'first NUL at byte'),
        ('shorter_than_seq_len', ValueError, 'config.dataset.seq_len=32 is too large'),
        ('validation_too_short', ValueError, 'too few for a validation split'),
    ],
)
def test_trainer_stops_on_bad_data_before_compiling(tmp_path, monkeypatch, fault, error, expected):
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  sizes = {'shorter_than_seq_len': 60, 'validation_too_short': 20}
  (corpus / 'a.txt').write_bytes(_text(sizes.get(fault, 5000)))
  if fault == 'binary_file':
    (corpus / 'b.txt').write_bytes(b'text\x00')
  config = tiny_config(corpus, tmp_path / 'data')
  if fault == 'glob_matches_nothing':
    config.dataset.files = (str(corpus / '*.md'),)
  if fault == 'validation_too_short':
    config.dataset.seq_len = 8
  _no_compiling(monkeypatch)
  with pytest.raises(error) as e:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert expected in str(e.value) and 'config.dataset.' in str(e.value)
  saved = tmp_path / 'run' / 'checkpoints'
  assert not saved.exists() or not any(p.name.isdigit() for p in saved.iterdir())


@pytest.mark.slow
def test_trainer_bpc_is_exact_on_a_validation_split_smaller_than_one_batch(tmp_path):
  from contextpool_jax.runs.workdirs import load

  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'a.txt').write_bytes(_text(600, seed=4))  # validation: 30 bytes, one window
  config = tiny_config(
      corpus,
      tmp_path / 'data',
      num_train_steps=2,
      log_every_steps=2,
      eval_every_steps=2,
      checkpoint_every_steps=2,
  )
  result = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  model, variables, _ = load(str(tmp_path / 'run'))
  data = np.frombuffer(_split_bytes(config, 'validation'), np.uint8)
  assert len(data) == 30
  window = np.zeros((1, config.dataset.eval_context + 1), np.int32)
  window[0, :30] = data
  logits = model.apply(variables, jnp.asarray(window[:, :-1]))
  log_p = np.asarray(jax.nn.log_softmax(logits[0, :29].astype(jnp.float32)))
  direct_bpc = -log_p[np.arange(29), data[1:]].sum() / (29 * math.log(2.0))
  np.testing.assert_allclose(result['eval_validation']['bpc'], direct_bpc, rtol=1e-5)
