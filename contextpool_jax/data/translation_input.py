"""WMT translation input pipeline: TFDS ``data_source`` (array_record) + grain, no TensorFlow.

Implements the translation part of the contract in ``contextpool_jax/data/__init__.py``:

* :func:`get_vocab` -- a joint source+target SentencePiece model, trained once
  on a capped random sample of the training split and stored in the workdir.
* :func:`make_train_dataset` -- an infinite ``grain.IterDataset`` of length-bucketed
  per-process batches ``{'inputs': int32 [B, L], 'targets': int32 [B, L']}``.
* :func:`make_eval_batches` -- a finite, re-iterable :class:`EvalBatches` of
  fixed-shape per-process batches with ``'mask'`` and ``'index'`` (to look up
  the untokenised reference text for BLEU).

Token ids (fixed, the model depends on them): ``0`` = padding (also the
decoder's BOS), ``1`` = EOS (appended to every source and target), ``2`` = unknown;
no BOS piece (``bos_id=-1``).

Config fields (``config.dataset.<field>``, default in brackets):

* ``name`` ['wmt14_translate/de-en'], ``data_dir`` [None = TFDS default],
  ``source_lang`` ['en'], ``target_lang`` ['de'] (keys of the TFDS feature dict;
  EN->DE reads the 'de-en' config with source 'en'), ``train_split`` ['train'].
* ``vocab_size`` [32000], ``vocab_type`` ['unigram' | 'bpe'], ``vocab_max_chars``
  [10**7: characters of training text sampled to train SentencePiece],
  ``vocab_path`` [None = ``<workdir>/<auto name>.model``],
  ``vocab_wait_seconds`` [3600: how long processes > 0 wait for process 0's file].
* ``max_source_len`` / ``max_target_len`` [256 / 256, tokens incl. EOS],
  ``truncate`` [False: training pairs that are too long are dropped (when none
  fits, a ValueError after two epochs of drops, not a hang); True: truncated,
  keeping the EOS].
* ``bucket_boundaries`` [None = 8, 16, 24, 32, 48, 64, 96, 128, 192, ... up to
  max(max_source_len, max_target_len)].
* ``max_eval_source_len`` / ``max_eval_target_len`` [= the training maxima],
  ``eval_sort_by_length`` [True], ``eval_batch_size`` [= ``config.batch_size``;
  global, examples].

Top-level: ``config.batch_size`` (global, examples), ``config.seed``,
``config.workdir`` (optional: where the vocabulary lives when neither
``vocab_path`` nor a ``workdir``/``vocab`` argument is given).

Batching (a decision): the contract fixes the number of *examples* per batch
(``config.batch_size // process_count``), so batches have a fixed number of
examples, not a fixed number of tokens (tensor2tensor's token batching). Each
pair goes to the first bucket whose boundary ``b`` holds both its source and
its target; a bucket's batch is emitted when it holds ``B`` pairs, padded to
``[B, min(b, max_source_len)]`` and ``[B, min(b, max_target_len)]``. So there
is one batch shape per bucket (about 10 compiles of the train step with the
defaults; ``bucket_boundaries=[max_len]`` gives one shape).

Order and state: each process reads a fixed stride of the training split
(record ``process_index::process_count``), shuffled globally with ``config.seed``
and reshuffled every epoch (grain index shuffle, no buffer), repeated forever.
The bucketing iterator's state is its parent's grain state plus, per bucket,
the stream positions of the pairs it holds (a fixed ``[num_buckets, B]`` list
of ints, -1 = empty, JSON-serialisable); ``set_state`` re-reads those pairs by
position, so a restored iterator yields exactly the batches the original would.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import time
import uuid
from typing import Any, Iterator, Optional, Sequence

import grain
import jax
import numpy as np
import sentencepiece as spm
from etils import epath

from contextpool_jax.io import config_readers
from contextpool_jax.data import tfds_splits
from contextpool_jax.base.errors import ConfigError, DataError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2

_DEFAULTS = dict(
    name='wmt14_translate/de-en',
    data_dir=None,
    source_lang='en',
    target_lang='de',
    train_split='train',
    vocab_size=32000,
    vocab_type='unigram',
    vocab_max_chars=10**7,
    vocab_path=None,
    vocab_wait_seconds=3600,
    max_source_len=256,
    max_target_len=256,
    truncate=False,
    bucket_boundaries=None,
    max_eval_source_len=None,
    max_eval_target_len=None,
    eval_sort_by_length=True,
    eval_batch_size=None,
)


@dataclasses.dataclass(frozen=True)
class TranslationDataSpec:
  """``config.dataset`` of a translation config, read and checked once (defaults:
  ``_DEFAULTS``); plus ``config.seed``, ``config.workdir`` and ``config.batch_size``
  when present. Every function of this module receives it, never the config."""

  name: str
  data_dir: Optional[str]
  source_lang: str
  target_lang: str
  train_split: str
  vocab_size: int
  vocab_type: str
  vocab_max_chars: int
  vocab_path: Optional[str]
  vocab_wait_seconds: float
  max_source_len: int
  max_target_len: int
  truncate: bool
  bucket_boundaries: Optional[tuple[int, ...]]
  max_eval_source_len: Optional[int]
  max_eval_target_len: Optional[int]
  eval_sort_by_length: bool
  eval_batch_size: Optional[int]
  seed: int
  workdir: Optional[str]
  batch_size: Any = None  # config.batch_size: global training examples


def resolve_spec(config) -> TranslationDataSpec:
  """Reads and checks ``config.dataset``; ConfigError names a bad entry."""
  d = lambda entry: f'dataset.{entry}'
  opt_int = lambda entry: (
      None
      if config_readers.lookup(config, d(entry), None) is None
      else config_readers.read_int(config, d(entry), minimum=1)
  )
  boundaries = config_readers.lookup(config, d('bucket_boundaries'), None)
  return TranslationDataSpec(
      name=config_readers.read_str(config, d('name'), default=_DEFAULTS['name']),
      data_dir=config_readers.read_dir(config, d('data_dir')),
      source_lang=config_readers.read_str(
          config, d('source_lang'), default=_DEFAULTS['source_lang']
      ),
      target_lang=config_readers.read_str(
          config, d('target_lang'), default=_DEFAULTS['target_lang']
      ),
      train_split=config_readers.read_str(
          config, d('train_split'), default=_DEFAULTS['train_split']
      ),
      vocab_size=config_readers.read_int(
          config, d('vocab_size'), minimum=4, default=_DEFAULTS['vocab_size']
      ),
      vocab_type=config_readers.read_choice(
          config, d('vocab_type'), ('unigram', 'bpe'), default=_DEFAULTS['vocab_type']
      ),
      vocab_max_chars=config_readers.read_int(
          config, d('vocab_max_chars'), minimum=1, default=_DEFAULTS['vocab_max_chars']
      ),
      vocab_path=config_readers.lookup(config, d('vocab_path'), None) or None,
      vocab_wait_seconds=config_readers.read_float(
          config, d('vocab_wait_seconds'), lo=0, default=_DEFAULTS['vocab_wait_seconds']
      ),
      max_source_len=config_readers.read_int(
          config, d('max_source_len'), minimum=2, default=_DEFAULTS['max_source_len']
      ),
      max_target_len=config_readers.read_int(
          config, d('max_target_len'), minimum=2, default=_DEFAULTS['max_target_len']
      ),
      truncate=config_readers.read_bool(config, d('truncate'), default=_DEFAULTS['truncate']),
      bucket_boundaries=None if boundaries is None else tuple(boundaries),
      max_eval_source_len=opt_int('max_eval_source_len'),
      max_eval_target_len=opt_int('max_eval_target_len'),
      eval_sort_by_length=config_readers.read_bool(
          config, d('eval_sort_by_length'), default=_DEFAULTS['eval_sort_by_length']
      ),
      eval_batch_size=opt_int('eval_batch_size'),
      seed=config_readers.read_int(config, 'seed', minimum=-(2**63), default=0),
      workdir=config_readers.lookup(config, 'workdir', None),
      batch_size=config_readers.lookup(config, 'batch_size', None),
  )


# ----------------------------------------------------------------------------
# Vocabulary.
# ----------------------------------------------------------------------------


class SentencePieceVocab:
  """A SentencePiece model with the fixed ids (pad 0, EOS 1, unk 2, no BOS).

  ``encode(text) -> list[int]`` (no EOS appended), ``decode(ids) -> str``
  (stops at the first EOS, drops padding). Pickles as its serialised model, so
  it can live inside grain transforms run in worker processes.
  """

  pad_id = PAD_ID
  eos_id = EOS_ID
  unk_id = UNK_ID

  def __init__(self, model_proto: bytes, path: Optional[str] = None):
    self._proto = bytes(model_proto)
    self.path = path
    self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    got = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if got != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise ValueError(
          f'SentencePiece model {path or ""} has (pad, eos, unk, bos) ids {got}; '
          f'expected ({PAD_ID}, {EOS_ID}, {UNK_ID}, -1).'
      )

  @classmethod
  def load(cls, path) -> 'SentencePieceVocab':
    path = epath.Path(path)
    return cls(path.read_bytes(), str(path))

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def model_proto(self) -> bytes:
    return self._proto

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids) -> str:
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i != PAD_ID])

  def __getstate__(self):
    return {'proto': self._proto, 'path': self.path}

  def __setstate__(self, state):
    self.__init__(state['proto'], state['path'])


def vocab_filename(spec: TranslationDataSpec) -> str:
  """The file name ``get_vocab`` uses inside the workdir (when ``vocab_path`` is unset)."""
  name = str(spec.name).replace('/', '-')
  return (
      f'spm_{name}_{spec.source_lang}-{spec.target_lang}_'
      f'{spec.vocab_type}{int(spec.vocab_size)}.model'
  )


def _vocab_path(spec: TranslationDataSpec, workdir) -> epath.Path:
  explicit = spec.vocab_path
  if explicit:
    return epath.Path(explicit)
  workdir = workdir or spec.workdir
  if not workdir:
    raise ConfigError(
        'translation_input: no place for the SentencePiece model; set '
        'config.dataset.vocab_path or config.workdir, or pass workdir=/vocab=.'
    )
  return epath.Path(workdir) / vocab_filename(spec)


def get_vocab(
    spec: TranslationDataSpec,
    workdir=None,
    *,
    process_index: Optional[int] = None,
    poll_seconds: float = 5.0,
) -> SentencePieceVocab:
  """Loads the SentencePiece model from the workdir, training it first if absent.

  The model (``config.dataset.vocab_type`` 'unigram' or 'bpe',
  ``vocab_size`` pieces, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
  character_coverage=1.0, nmt_nfkc normalisation) is trained on source and
  target sentences of a random sample (``config.seed``) of the training split
  capped at ``vocab_max_chars`` characters, and written to
  ``config.dataset.vocab_path`` or ``<workdir>/<vocab_filename(spec)>``
  (via a temporary name and a rename, so nobody reads a half-written file).
  An existing file is re-used as is.

  Multi-host: only process 0 (``process_index``, default
  ``jax.process_index()``) trains; the others poll every ``poll_seconds`` until
  the file appears, up to ``config.dataset.vocab_wait_seconds`` (then
  ``TimeoutError``). This needs the workdir on storage all hosts see (as
  checkpoints do); a host-local workdir on several hosts would wait forever.
  """
  path = _vocab_path(spec, workdir)
  if not path.exists():
    if process_index is None:
      process_index = jax.process_index()
    if process_index == 0:
      proto = train_sentencepiece(
          _sample_training_text(spec),
          vocab_size=int(spec.vocab_size),
          model_type=str(spec.vocab_type),
      )
      path.parent.mkdir(parents=True, exist_ok=True)
      tmp = path.parent / f'{path.name}.tmp-{uuid.uuid4().hex}'
      tmp.write_bytes(proto)
      tmp.rename(path)
    else:
      deadline = time.monotonic() + float(spec.vocab_wait_seconds)
      while not path.exists():
        if time.monotonic() > deadline:
          raise TimeoutError(
              f'process {process_index}: {path} did not appear; process 0 trains '
              'it (is the workdir shared by all hosts?).'
          )
        time.sleep(poll_seconds)
  vocab = SentencePieceVocab.load(path)
  if vocab.vocab_size > int(spec.vocab_size):
    raise ConfigError(
        f'{path} has {vocab.vocab_size} pieces, more than '
        f'config.dataset.vocab_size={spec.vocab_size}.'
    )
  return vocab


def train_sentencepiece(
    sentences, *, vocab_size: int, model_type: str = 'unigram', num_threads: Optional[int] = None
) -> bytes:
  """Trains SentencePiece on an iterable of sentences; returns the serialised model."""
  if model_type not in ('unigram', 'bpe'):
    raise ConfigError(f"vocab_type={model_type!r}; expected 'unigram' or 'bpe'.")
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=out,
      vocab_size=vocab_size,
      model_type=model_type,
      pad_id=PAD_ID,
      eos_id=EOS_ID,
      unk_id=UNK_ID,
      bos_id=-1,
      character_coverage=1.0,
      normalization_rule_name='nmt_nfkc',
      num_threads=num_threads or os.cpu_count() or 1,
      minloglevel=2,
  )
  return out.getvalue()


def _sample_training_text(spec: TranslationDataSpec) -> list[str]:
  """Source and target sentences of random training pairs, up to ``vocab_max_chars``."""
  source = _train_split(spec)
  src, tgt = spec.source_lang, spec.target_lang
  budget = int(spec.vocab_max_chars)
  order = np.random.default_rng(spec.seed).permutation(len(source))
  lines, chars = [], 0
  for i in order:
    record = source[int(i)]
    for lang in (src, tgt):
      text = _text(record, lang).strip()
      if text:
        lines.append(text)
        chars += len(text)
    if chars >= budget:
      break
  return lines


# ----------------------------------------------------------------------------
# TFDS source.
# ----------------------------------------------------------------------------


def _how_to_prepare(name: str, data_dir: Optional[str], split: str) -> str:
  where = data_dir or '~/tensorflow_datasets (the TFDS default; or $TFDS_DATA_DIR)'
  return (
      f"TFDS dataset '{name}' (split '{split}') is not prepared in array_record format "
      f'under data_dir={where}. Prepare it once on a machine with internet access: '
      f'`tfds build {name} --file_format=array_record --data_dir=DIR` (or in Python '
      f"`tfds.builder('{name}', data_dir=DIR, file_format='array_record')"
      '.download_and_prepare()`; an existing tfrecord copy converts with '
      '`tfds convert_format --out_file_format=array_record`), then set '
      'config.dataset.data_dir=DIR.'
  )


def _open_split(spec: TranslationDataSpec, split: str, setting: Optional[str] = None):
  """``tfds.data_source`` for one split; a clear error if it cannot be read.

  DatasetNotFoundError (saying how to prepare it) if the dataset is not
  prepared; ValueError naming ``setting`` (default ``split=...``) if the split
  is not one of the prepared ones or selects no example (see ``tfds_splits``).
  """
  name, data_dir = str(spec.name), spec.data_dir or None
  # Builders whose module imports TensorFlow at registration time are not
  # registered without TF; import the WMT builder module directly (it does not
  # need TF) so its code and metadata are known. Prepared data loads without it.
  family = name.split('/')[0]
  if family.endswith('_translate'):
    try:
      importlib.import_module(f'tensorflow_datasets.translate.{family[:-len("_translate")]}')
    except ImportError:
      pass
  source = tfds_splits.open_split(
      name,
      split,
      data_dir,
      setting=setting or f'split={split!r}',
      how_to_prepare=lambda: _how_to_prepare(name, data_dir, split),
  )
  keys = set(source[0])
  for lang in (spec.source_lang, spec.target_lang):
    if lang not in keys:
      raise DataError(
          f"'{name}' has features {sorted(keys)}; config.dataset "
          f'source_lang/target_lang {lang!r} is not one of them.'
      )
  return source


def _train_split(spec: TranslationDataSpec):
  split = spec.train_split
  return _open_split(spec, split, f'config.dataset.train_split={split!r}')


def _text(record, lang: str) -> str:
  value = record[lang]
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode('utf-8') if isinstance(value, (bytes, np.bytes_)) else str(value)


def _encode(vocab, text: str, max_len: Optional[int]) -> np.ndarray:
  ids = vocab.encode(text)
  if max_len is not None:
    ids = ids[: max_len - 1]
  return np.asarray(ids + [EOS_ID], np.int32)


@dataclasses.dataclass(frozen=True)
class _TokenizePair:
  """Record -> ``{'inputs', 'targets', 'index'}`` (with EOS); ``{'index'}`` when too long.

  A dropped pair still yields its index, so the bucketing iterator can tell a
  stream in which nothing fits (an error) from one that is merely slow.
  """

  vocab: SentencePieceVocab
  source_lang: str
  target_lang: str
  max_source_len: int
  max_target_len: int
  truncate: bool

  def __call__(self, index: int, record) -> dict[str, Any]:
    cut = self.truncate
    inputs = _encode(
        self.vocab, _text(record, self.source_lang), self.max_source_len if cut else None
    )
    targets = _encode(
        self.vocab, _text(record, self.target_lang), self.max_target_len if cut else None
    )
    if len(inputs) > self.max_source_len or len(targets) > self.max_target_len:
      return {'index': index}
    return {'inputs': inputs, 'targets': targets, 'index': index}


# ----------------------------------------------------------------------------
# Training: length-bucketed batches with a restorable state.
# ----------------------------------------------------------------------------


def bucket_boundaries(spec: TranslationDataSpec) -> list[int]:
  """Sorted bucket lengths; the last is ``max(max_source_len, max_target_len)``."""
  longest = max(int(spec.max_source_len), int(spec.max_target_len))
  given = spec.bucket_boundaries
  if given is None:
    # 8, 16, 24, then 2^k and 1.5 * 2^k: 32, 48, 64, 96, 128, 192, 256, ...
    given, p = [8, 16, 24], 32
    while p < longest:
      given += [p, p * 3 // 2]
      p *= 2
    given = [b for b in given if b < longest]
  if any(int(b) <= 0 for b in given):
    raise ConfigError(f'bucket_boundaries={list(given)} must be positive.')
  return sorted({min(int(b), longest) for b in given} | {longest})


def _pad_stack(arrays: Sequence[np.ndarray], length: int, rows: Optional[int] = None) -> np.ndarray:
  out = np.zeros((rows or len(arrays), length), np.int32)
  for i, a in enumerate(arrays):
    out[i, : len(a)] = a
  return out


class _BucketIterator(grain.DatasetIterator):
  """Groups examples by length into per-bucket buffers; emits a batch when one is full."""

  def __init__(
      self,
      parent,
      examples: grain.MapDataset,
      boundaries: list[int],
      batch_size: int,
      max_source_len: int,
      max_target_len: int,
      max_dropped: Optional[int] = None,
  ):
    super().__init__(parent)
    self._max_dropped = max_dropped
    self._dropped = 0  # consecutive
    self._examples = examples
    self._boundaries = boundaries
    self._batch_size = batch_size
    self._max_source_len = max_source_len
    self._max_target_len = max_target_len
    self._buffers: list[list[dict]] = [[] for _ in boundaries]

  def _bucket(self, example) -> int:
    longest = max(len(example['inputs']), len(example['targets']))
    for i, b in enumerate(self._boundaries):
      if longest <= b:
        return i
    raise AssertionError(f'example of length {longest} exceeds every bucket')

  def _count_dropped(self, example) -> bool:
    """True for a dropped (too long) pair; raises when too many come in a row."""
    if 'inputs' in example:
      self._dropped = 0
      return False
    self._dropped += 1
    if self._max_dropped is not None and self._dropped >= self._max_dropped:
      raise DataError(
          f'{self._dropped} training pairs in a row are longer than config.dataset.'
          f'max_source_len={self._max_source_len} or max_target_len={self._max_target_len}'
          ' tokens (with EOS) and were dropped: none fits. Raise them, or set'
          ' config.dataset.truncate=True.'
      )
    return True

  def __next__(self) -> dict[str, np.ndarray]:
    while True:
      example = next(self._parent)
      if self._count_dropped(example):
        continue
      i = self._bucket(example)
      self._buffers[i].append(example)
      if len(self._buffers[i]) == self._batch_size:
        full, self._buffers[i] = self._buffers[i], []
        b = self._boundaries[i]
        return {
            'inputs': _pad_stack([e['inputs'] for e in full], min(b, self._max_source_len)),
            'targets': _pad_stack([e['targets'] for e in full], min(b, self._max_target_len)),
        }

  def get_state(self) -> dict[str, Any]:
    held = [
        [int(e['index']) for e in buf] + [-1] * (self._batch_size - len(buf))
        for buf in self._buffers
    ]
    return {'parent': self._parent.get_state(), 'buckets': held}

  def set_state(self, state: dict[str, Any]) -> None:
    if len(state['buckets']) != len(self._boundaries):
      raise ValueError(
          f"iterator state has {len(state['buckets'])} buckets; this pipeline has "
          f'{len(self._boundaries)} (bucket_boundaries changed?).'
      )
    self._parent.set_state(state['parent'])
    self._buffers = [
        [self._example(int(j)) for j in row if int(j) >= 0] for row in state['buckets']
    ]

  def _example(self, index: int) -> dict:
    example = self._examples[index]
    assert example is not None  # a map, no filter: every index has its example
    return example


class BucketBatchDataset(grain.IterDataset):
  """``IterDataset`` of length-bucketed batches over a (random-access) MapDataset.

  ``examples[i]`` must be ``{'inputs', 'targets', 'index': i}``, or ``{'index': i}``
  for a dropped pair (skipped); the index lets ``set_state`` re-read the pairs
  held in buckets. ``max_dropped`` consecutive dropped pairs raise ValueError
  (None = never): ``make_train_dataset`` sets two epochs of its shard, which
  always hold a whole epoch, so the error means that no pair fits.
  """

  def __init__(
      self,
      examples: grain.MapDataset,
      *,
      boundaries: Sequence[int],
      batch_size: int,
      max_source_len: int,
      max_target_len: int,
      read_options: Optional[grain.ReadOptions] = None,
      max_dropped: Optional[int] = None,
  ):
    super().__init__(examples.to_iter_dataset(read_options))
    self._examples = examples
    self._boundaries = list(boundaries)
    self._batch_size = batch_size
    self._max_source_len = max_source_len
    self._max_target_len = max_target_len
    self._max_dropped = max_dropped

  def __iter__(self) -> _BucketIterator:
    return _BucketIterator(
        self._parent.__iter__(),
        self._examples,
        self._boundaries,
        self._batch_size,
        self._max_source_len,
        self._max_target_len,
        self._max_dropped,
    )

  def __str__(self) -> str:
    return f'BucketBatchDataset(boundaries={self._boundaries}, batch_size={self._batch_size})'


def make_train_dataset(
    spec: TranslationDataSpec,
    *,
    process_index: int,
    process_count: int,
    vocab: Optional[SentencePieceVocab] = None,
    workdir=None,
    read_options: Optional[grain.ReadOptions] = None,
) -> grain.IterDataset:
  """Infinite per-process batches ``{'inputs': int32 [B, Ls], 'targets': int32 [B, Lt]}``.

  ``B = config.batch_size // process_count``; ``Ls, Lt`` are the bucket length
  capped at ``max_source_len``/``max_target_len`` (see the module docstring).
  The vocabulary is ``vocab`` or ``get_vocab(spec, workdir)``. Deterministic
  from ``config.seed``; ``iter(ds).get_state()/set_state()`` round-trip.
  """
  batch = config_readers.share(spec.batch_size, process_count, 'batch_size')
  vocab = vocab or get_vocab(spec, workdir, process_index=process_index)
  max_src, max_tgt = int(spec.max_source_len), int(spec.max_target_len)
  shard = grain.MapDataset.source(_train_split(spec))[process_index::process_count]
  if not len(shard):
    raise ConfigError(
        f'config.dataset.train_split={spec.train_split!r} has no '
        f'examples for process {process_index} of {process_count}.'
    )
  examples = (
      shard.shuffle(seed=int(spec.seed))
      .repeat()
      .map_with_index(
          _TokenizePair(
              vocab, spec.source_lang, spec.target_lang, max_src, max_tgt, bool(spec.truncate)
          )
      )
  )
  return BucketBatchDataset(
      examples,
      boundaries=bucket_boundaries(spec),
      batch_size=batch,
      max_source_len=max_src,
      max_target_len=max_tgt,
      read_options=read_options,
      max_dropped=2 * len(shard),
  )


# ----------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------


class EvalBatches:
  """Finite, re-iterable per-process eval batches of one fixed shape.

  Each batch: ``inputs`` int32 ``[B, max_eval_source_len]``, ``targets`` int32
  ``[B, max_eval_target_len]`` (EOS-terminated, truncated if longer -- no
  example is dropped), ``mask`` bool ``[B]`` (False = padding example) and
  ``index`` int32 ``[B]`` (position in the split, -1 for padding).
  Padding examples have all-zero targets (so loss weights ``targets != 0`` are
  0) and inputs ``[EOS, 0, ...]`` (no attention row is fully masked).
  ``references[i]`` is the untokenised target text of split example ``i``
  (the whole split, for BLEU after gathering all processes' hypotheses).

  Every process gets the same number of batches (a contiguous block of
  ``ceil(N / process_count)`` examples each, padded; at least one batch, so a
  split smaller than one batch is one mostly-padding batch), so collective
  eval steps stay in lockstep. With ``eval_sort_by_length`` the block is ordered by
  source length (longest first), so a decoding batch finishes together.
  """

  def __init__(
      self,
      source,
      vocab: SentencePieceVocab,
      *,
      source_lang: str,
      target_lang: str,
      batch_size: int,
      max_source_len: int,
      max_target_len: int,
      process_index: int,
      process_count: int,
      sort_by_length: bool = True,
  ):
    self._source = source
    self._vocab = vocab
    self._source_lang, self._target_lang = source_lang, target_lang
    self.batch_size = batch_size
    self.max_source_len, self.max_target_len = max_source_len, max_target_len
    n = len(source)
    per = -(-n // process_count)
    self._indices = list(range(min(n, process_index * per), min(n, (process_index + 1) * per)))
    self._num_batches = max(1, -(-per // batch_size))
    self._sort = sort_by_length
    self._examples: Optional[list[tuple[int, np.ndarray, np.ndarray]]] = None
    self._references: Optional[list[str]] = None

  def __len__(self) -> int:
    return self._num_batches

  def _tokenized(self):
    if self._examples is None:
      examples = []
      for i in self._indices:
        record = self._source[i]
        examples.append(
            (
                i,
                _encode(self._vocab, _text(record, self._source_lang), self.max_source_len),
                _encode(self._vocab, _text(record, self._target_lang), self.max_target_len),
            )
        )
      if self._sort:
        examples.sort(key=lambda e: (-len(e[1]), e[0]))
      self._examples = examples
    return self._examples

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    examples, b = self._tokenized(), self.batch_size
    for start in range(0, self._num_batches * b, b):
      chunk = examples[start : start + b]
      pad = b - len(chunk)
      inputs = _pad_stack([e[1] for e in chunk] + [np.array([EOS_ID])] * pad, self.max_source_len)
      yield {
          'inputs': inputs,
          'targets': _pad_stack([e[2] for e in chunk], self.max_target_len, rows=b),
          'mask': np.arange(b) < len(chunk),
          'index': np.array([e[0] for e in chunk] + [-1] * pad, np.int32),
      }

  @property
  def references(self) -> list[str]:
    if self._references is None:
      self._references = [
          _text(self._source[i], self._target_lang) for i in range(len(self._source))
      ]
    return self._references


def make_eval_batches(
    spec: TranslationDataSpec,
    split: str,
    *,
    process_index: int,
    process_count: int,
    vocab: Optional[SentencePieceVocab] = None,
    workdir=None,
) -> EvalBatches:
  """Per-process eval batches of split ``split`` (e.g. 'validation' = newstest2013,
  'test' = newstest2014 for wmt14); see :class:`EvalBatches`.

  ``B = config.dataset.eval_batch_size (default config.batch_size) // process_count``.
  """
  batch = (
      config_readers.share(spec.eval_batch_size, process_count, 'dataset.eval_batch_size')
      if spec.eval_batch_size
      else config_readers.share(spec.batch_size, process_count, 'batch_size')
  )
  vocab = vocab or get_vocab(spec, workdir, process_index=process_index)
  max_src = int(spec.max_eval_source_len or spec.max_source_len)
  max_tgt = int(spec.max_eval_target_len or spec.max_target_len)
  source = _open_split(spec, split, f'the evaluation split {split!r} (config.eval_splits)')
  return EvalBatches(
      source,
      vocab,
      source_lang=spec.source_lang,
      target_lang=spec.target_lang,
      batch_size=batch,
      max_source_len=max_src,
      max_target_len=max_tgt,
      process_index=process_index,
      process_count=process_count,
      sort_by_length=bool(spec.eval_sort_by_length),
  )
