"""Byte-level language-modelling input pipelines (grain, no TensorFlow).

Implements the contract of :mod:`contextpool_jax.data` for the corpora of
:mod:`contextpool_jax.data.text_builders` (enwik8, text8, local text files);
batches are ``{'tokens': int32 [b, n + 1], 'weights': float32 [b, n]}`` with
byte values 0..255 as tokens (vocabulary :data:`VOCAB_SIZE` = 256).

Config (``ml_collections.ConfigDict``; :func:`default_dataset_config` returns
``config.dataset`` with these defaults), read and checked once by
:func:`resolve_spec` into an :class:`LMDataSpec`, which every pipeline function
receives (never the config):

* ``config.seed`` (int): seeds the training order (shuffle and window phase).
* ``config.batch_size`` (int): global training batch size; each of the
  ``process_count`` processes yields ``batch_size // process_count`` rows.
* ``config.dataset.name`` (``'enwik8'``): ``'enwik8'`` | ``'text8'`` |
  ``'local_text'``.
* ``config.dataset.data_dir`` (``None``): TFDS data directory (None = TFDS
  default: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
* ``config.dataset.manual_dir`` (``None``): directory holding ``enwik8.zip`` /
  ``text8.zip`` (or the extracted file) for offline preparation; None =
  ``<data_dir>/downloads/manual``.
* ``config.dataset.files`` (``()``): local_text only: files, directories or glob
  patterns (``**`` recursive); ``()`` (or None) = the pinned snapshot of
  CPython 3.11.7's ``Lib/*.py`` (``corpus_snapshot``); ``'<stdlib>'`` = the
  running Python's standard-library ``*.py`` sources. An empty pattern (``''``)
  is an error, not the default.
* ``config.dataset.allow_binary`` (``False``): local_text only: accept files
  containing NUL bytes (default: a ValueError naming them).
* ``config.dataset.max_bytes`` (``16 * 2**20``): local_text only: cap on the
  corpus in bytes (a seeded sample across the tree), 0 = no cap.
* ``config.dataset.split_block_bytes`` (``65536``) and ``config.dataset.split_seed``
  (``0``): local_text only: files larger than this are cut into blocks of this
  many bytes before the seeded split (0: files whole); the seed of the split and
  of the cap's sample (not of the training order). See ``text_splits``.
* ``config.dataset.seq_len`` (``1024``): training window: ``seq_len`` inputs
  predicting ``seq_len`` targets (``tokens`` has ``seq_len + 1`` bytes).
* ``config.dataset.eval_context`` (``32768``): evaluation window length (model
  inputs per row; ``tokens`` has ``eval_context + 1`` bytes).
* ``config.dataset.eval_step`` (``512``): bytes scored per evaluation window
  (after the first one), 1 <= eval_step <= eval_context.
* ``config.dataset.eval_batch_size`` (``8``): global evaluation batch size
  (rows), divisible by ``process_count``.
* ``config.dataset.eval_max_bytes`` (``0``): evaluate on only the first this
  many bytes of the split (quick evaluation during training); 0 = all. A
  local_text evaluation split is stored in a seeded order of its pieces, so its
  first bytes are a sample of the whole split.
* ``config.dataset.split_bytes`` (unset): enwik8/text8 only: (train, validation,
  test) sizes in bytes; unset = the standard 90M/5M/5M.
* ``config.dataset.download`` (``True``): enwik8/text8: may download when not
  prepared and no manual file is found (else DatasetNotFoundError).
* ``config.dataset.read_threads`` (``2``) and ``config.dataset.prefetch``
  (``4``): optional; grain reader threads and batches prefetched per process.

Training order (:func:`make_train_dataset`): each epoch cuts the train split
into ``N = len(train) // seq_len - 1`` non-overlapping windows of
``seq_len + 1`` bytes (consecutive windows share one byte, so every target is
predicted once per epoch) at a random phase ``0 <= phase < seq_len`` drawn per
epoch, and visits them in an order shuffled per epoch (grain's index shuffle,
reseeded each epoch). Everything is a pure function of ``config.seed`` and the
position in the stream, so the iterator state is just a position and restores
exactly. Sharding: the global stream is the same for any ``process_count``;
process ``p`` takes its elements ``p, p + P, p + 2P, ...``, so the processes'
shards are disjoint and, stacked in process order, each global batch holds
stream elements ``[t * batch_size, (t + 1) * batch_size)`` (up to row order).

Evaluation (:func:`make_eval_batches`) follows the BPC protocol of
Transformer-XL / Longformer / ContextPool (Sec. 4.1: windows of 32k, step 512):
overlapping windows of ``eval_context`` inputs; the first window scores all its
targets (bytes ``1..eval_context``), every later window is shifted so that it
ends ``eval_step`` bytes later and scores only those last ``eval_step``
targets; the final window is aligned to end at the last byte and scores only
the bytes not yet scored. So every byte of the split except the first (which
has no context) is predicted exactly once, always with at least
``eval_context - eval_step`` bytes of context (except in the first window).
Windows are never padded inside (a split shorter than the window gives one
zero-padded row); rows past the last window are all-zero padding with zero
weights. BPC = sum of weighted NLL (nats) / (sum of weights * ln 2).

Bad data fails in :func:`load_split` (which the trainer's ``prepare`` calls
before compiling), naming the setting, the value and what is needed: patterns
naming no file or only empty files (DatasetNotFoundError), binary files, a
corpus too small for three splits (see ``text_builders.LocalText``), a
train split shorter than ``2 * seq_len`` bytes, a validation or test split
shorter than 2 bytes, and bad ``eval_*`` values (ValueError). Every split is
checked whichever one is asked for. An evaluation split smaller than one
evaluation batch (or one window) is fine: padding rows have zero weight.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterator, Mapping, Optional

import grain
import ml_collections
import numpy as np

from contextpool_jax.base import checks
from contextpool_jax.io import config_readers
from contextpool_jax.data import text_builders
from contextpool_jax.data import text_splits
from contextpool_jax.base.errors import ConfigError, DataError

VOCAB_SIZE = text_builders.VOCAB_SIZE
DATASET_NAMES = ('enwik8', 'text8', 'local_text')
EVAL_SPLITS = ('train', 'validation', 'test')


# Entries resolve_spec fills in when absent (the others are required).
OPTIONAL_DEFAULTS = {
    'data_dir': None,
    'manual_dir': None,
    'files': (),
    'max_bytes': text_builders.DEFAULT_MAX_BYTES,
    'split_block_bytes': text_splits.DEFAULT_BLOCK_BYTES,
    'split_seed': 0,
    'split_bytes': (),
    'eval_max_bytes': 0,
    'allow_binary': False,
    'download': True,
    'read_threads': 2,
    'prefetch': 4,
}


def default_dataset_config() -> ml_collections.ConfigDict:
  """A complete ``config.dataset`` (see the module docstring): enwik8 at the
  paper's evaluation protocol, and every optional entry at its default."""
  return ml_collections.ConfigDict(
      {
          'name': 'enwik8',
          'seq_len': 1024,
          'eval_context': 32768,
          'eval_step': 512,
          'eval_batch_size': 8,
          **OPTIONAL_DEFAULTS,
      }
  )


def bits_per_byte(nll_sum_nats, count):
  """Bits per byte (= bits per character for enwik8/text8)."""
  return nll_sum_nats / (count * math.log(2.0))


# ---------------------------------------------------------------------------
# Config: read and checked once.
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LMDataSpec:
  """``config.dataset`` (and ``config.seed``, ``config.batch_size``), validated
  (``batch_size`` is checked against the process count where it is divided)."""

  name: str
  data_dir: Optional[str]
  manual_dir: Optional[str]
  files: tuple[str, ...]
  allow_binary: bool
  max_bytes: int
  split_block_bytes: int
  split_seed: int
  split_bytes: tuple[int, ...]
  download: bool
  seq_len: int
  eval_context: int
  eval_step: int
  eval_batch_size: int
  eval_max_bytes: int
  read_threads: int
  prefetch: int
  seed: int  # config.seed as 64 bits
  batch_size: Any = None  # config.batch_size: global training rows

  @property
  def builder_kwargs(self) -> dict[str, Any]:
    if self.name == 'local_text':
      return dict(
          files=self.files,
          allow_binary=self.allow_binary,
          max_bytes=self.max_bytes,
          split_block_bytes=self.split_block_bytes,
          split_seed=self.split_seed,
      )
    return dict(zip(('train_bytes', 'validation_bytes', 'test_bytes'), self.split_bytes))

  @property
  def setting(self) -> str:
    """The settings that chose the data, for messages."""
    if self.name == 'local_text':
      return (
          f'{text_builders.files_setting(self.files)}'
          f' (config.dataset.max_bytes={self.max_bytes})'
      )
    sizes = f' with config.dataset.split_bytes={self.split_bytes}' if self.split_bytes else ''
    return f'config.dataset.name={self.name!r}{sizes}'

  @property
  def read_options(self) -> grain.ReadOptions:
    return grain.ReadOptions(num_threads=self.read_threads, prefetch_buffer_size=self.prefetch)


def _files(config) -> tuple[str, ...]:
  files = config_readers.lookup(config, 'dataset.files', _opt('files'))
  if isinstance(files, str):
    files = (files,)  # '' stays an (invalid) empty pattern, not the default.
  if not isinstance(files, (tuple, list)) or not all(isinstance(f, str) for f in files):
    raise ConfigError(
        'config.dataset.files must be a str or a tuple of str'
        f' (files, directories, glob patterns), got {files!r}.'
    )
  return tuple(files)


def _split_bytes(config) -> tuple[int, ...]:
  """enwik8/text8 with non-standard split sizes (tests on small files); () = standard."""
  split_bytes = config_readers.lookup(config, 'dataset.split_bytes', _opt('split_bytes'))
  if not split_bytes:
    return ()
  split_bytes = tuple(split_bytes)
  if len(split_bytes) != 3 or not all(isinstance(b, int) and b > 0 for b in split_bytes):
    raise ConfigError(
        'config.dataset.split_bytes must be 3 positive ints (train, '
        f'validation, test bytes), got {split_bytes!r}.'
    )
  return split_bytes


def _opt(entry: str) -> Any:
  return OPTIONAL_DEFAULTS[entry]


def resolve_spec(config) -> LMDataSpec:
  """Reads and checks every LM data setting; ConfigError names a bad one."""
  context = config_readers.read_int(config, 'dataset.eval_context', minimum=1)
  step = config_readers.read_int(config, 'dataset.eval_step', minimum=1)
  if step > context:
    raise ConfigError(
        f'config.dataset.eval_step={step} must be <= config.dataset.eval_context={context}.'
    )
  eval_max_bytes = config_readers.read_int(
      config, 'dataset.eval_max_bytes', default=_opt('eval_max_bytes')
  )
  if eval_max_bytes == 1:
    raise ConfigError(
        'config.dataset.eval_max_bytes=1 must be 0 (the whole'
        ' split) or >= 2 (a single byte is only context).'
    )
  return LMDataSpec(
      name=config_readers.read_choice(config, 'dataset.name', DATASET_NAMES),
      data_dir=config_readers.read_dir(config, 'dataset.data_dir'),
      manual_dir=config_readers.read_dir(config, 'dataset.manual_dir'),
      files=_files(config),
      allow_binary=config_readers.read_bool(
          config, 'dataset.allow_binary', default=_opt('allow_binary')
      ),
      max_bytes=config_readers.read_int(config, 'dataset.max_bytes', default=_opt('max_bytes')),
      split_block_bytes=config_readers.read_int(
          config, 'dataset.split_block_bytes', default=_opt('split_block_bytes')
      ),
      split_seed=config_readers.read_int(config, 'dataset.split_seed', default=_opt('split_seed')),
      split_bytes=_split_bytes(config),
      download=config_readers.read_bool(config, 'dataset.download', default=_opt('download')),
      seq_len=config_readers.read_int(config, 'dataset.seq_len', minimum=1),
      eval_context=context,
      eval_step=step,
      eval_batch_size=config_readers.read_int(config, 'dataset.eval_batch_size', minimum=1),
      eval_max_bytes=eval_max_bytes,
      read_threads=config_readers.read_int(
          config, 'dataset.read_threads', default=_opt('read_threads')
      ),
      prefetch=config_readers.read_int(config, 'dataset.prefetch', default=_opt('prefetch')),
      seed=config_readers.read_int(config, 'seed', minimum=-(2**63)) % 2**64,
      batch_size=config_readers.lookup(config, 'batch_size', None),
  )


def _prepare(spec: LMDataSpec) -> Mapping[str, Any]:
  return text_builders.prepare_text_dataset(
      spec.name,
      spec.data_dir,
      manual_dir=spec.manual_dir,
      download=spec.download,
      **spec.builder_kwargs,
  )


def _check_train_bytes(spec: LMDataSpec, num_bytes: int) -> None:
  if num_bytes // spec.seq_len - 1 < 1:
    raise ConfigError(
        f'config.dataset.seq_len={spec.seq_len} is too large for the train split'
        f' of {spec.setting}: it has {num_bytes} bytes, and windows'
        f' of seq_len + 1 bytes at a random phase need at least 2 * seq_len ='
        f' {2 * spec.seq_len}. Lower seq_len or use more data.'
    )


def _check_splits(spec: LMDataSpec, sizes: Mapping[str, int]) -> None:
  """Raises unless every split can be used with ``spec``."""
  _check_train_bytes(spec, sizes['train'])
  for split in EVAL_SPLITS[1:]:
    if sizes[split] < 2:
      raise DataError(
          f'The {split} split of {spec.setting} has {sizes[split]}'
          ' byte(s); evaluation needs at least 2 (the first byte is only'
          ' context). Use more data.'
      )


def load_split(spec: LMDataSpec, split: str) -> text_builders.ByteSplit:
  """Prepares the dataset of ``spec`` if needed; returns one split's bytes.

  Checks every split first (:func:`_check_splits`), so bad data or settings
  fail here, whichever split is asked for.
  """
  if split not in EVAL_SPLITS:
    raise ValueError(f'split must be one of {EVAL_SPLITS}, got {split!r}.')
  sources = _prepare(spec)
  splits = {s: text_builders.ByteSplit(sources[s]) for s in EVAL_SPLITS}
  _check_splits(spec, {s: len(b) for s, b in splits.items()})
  return splits[split]


# ---------------------------------------------------------------------------
# Training.
# ---------------------------------------------------------------------------


def _with_index(index: int, window: int) -> tuple[int, int]:
  return index, int(window)


@functools.lru_cache(maxsize=64)
def _epoch_phase(seed: int, epoch: int, seq_len: int) -> int:
  return int(np.random.default_rng([seed, 1, epoch]).integers(seq_len))


class _TrainWindow:
  """(stream index, window id) -> example; a pure function (picklable)."""

  def __init__(self, corpus, seq_len: int, num_windows: int, seed: int):
    self.corpus = corpus
    self.seq_len = seq_len
    self.num_windows = num_windows
    self.seed = seed

  def start(self, index: int, window: int) -> int:
    phase = _epoch_phase(self.seed, index // self.num_windows, self.seq_len)
    return phase + int(window) * self.seq_len

  def start_of(self, index_and_window: tuple[int, int]) -> int:
    return self.start(*index_and_window)

  def __call__(self, index_and_window: tuple[int, int]) -> dict[str, np.ndarray]:
    start = self.start(*index_and_window)
    tokens = self.corpus.read(start, start + self.seq_len + 1)
    return {
        'tokens': tokens.astype(np.int32),
        'weights': np.ones((self.seq_len,), np.float32),
    }


def train_window_starts(
    spec: LMDataSpec, num_bytes: int, *, process_index: int = 0, process_count: int = 1
) -> grain.MapDataset:
  """The start offsets of this process's training windows, in order.

  A (lazy, infinite) view of the exact order :func:`make_train_dataset` reads,
  for inspection and tests.
  """
  process_index, process_count = checks.check_process(process_index, process_count)
  ds, fn = _train_index_dataset(spec, num_bytes, None, process_index, process_count)
  return ds.map(fn.start_of)


def _train_index_dataset(spec: LMDataSpec, num_bytes, corpus, process_index, process_count):
  _check_train_bytes(spec, num_bytes)
  seq_len = spec.seq_len
  num_windows = num_bytes // seq_len - 1
  seed = spec.seed
  shuffle_seed = int(np.random.SeedSequence([seed, 0]).generate_state(1, np.uint32)[0])
  window = _TrainWindow(corpus, seq_len, num_windows, seed)
  ds = grain.MapDataset.range(num_windows).shuffle(seed=shuffle_seed)
  ds = ds.repeat()  # Passes the raw position on: a new shuffle each epoch.
  ds = ds.map_with_index(_with_index)  # Global position.
  ds = ds[process_index::process_count]
  return ds, window


def make_train_dataset(
    spec: LMDataSpec, *, process_index: int, process_count: int
) -> grain.IterDataset:
  """Infinite per-process training batches (see the module docstring).

  Returns:
    A ``grain.IterDataset`` of ``{'tokens': int32 [b, seq_len + 1],
    'weights': float32 [b, seq_len] (all ones)}`` with
    ``b = spec.batch_size // process_count``; its iterator's
    ``get_state()``/``set_state()`` restore the exact position.
  """
  process_index, process_count = checks.check_process(process_index, process_count)
  rows = config_readers.share(spec.batch_size, process_count, 'batch_size')
  corpus = load_split(spec, 'train')
  ds, window = _train_index_dataset(spec, len(corpus), corpus, process_index, process_count)
  ds = ds.map(window)
  ds = ds.batch(rows, drop_remainder=True)
  return ds.to_iter_dataset(spec.read_options)


# ---------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------


def eval_windows(
    num_bytes: int, context: int, step: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The BPC windows of a ``num_bytes`` split (see the module docstring).

  Returns:
    ``(starts, score_from, score_to)``, int64 [num_windows]: window ``i`` has
    tokens ``x[starts[i] : starts[i] + context + 1]`` (zero-padded past the
    end) and scores target positions ``score_from[i] <= j < score_to[i]``,
    i.e. bytes ``starts[i] + 1 + j``.
  """
  if num_bytes < 2:
    raise DataError(f'Need at least 2 bytes to evaluate, got {num_bytes}.')
  if context < 1 or not 1 <= step <= context:
    raise ValueError(f'Need 1 <= step <= context, got {step} and {context}.')
  last = num_bytes - 1  # Last target position (byte index).
  if last <= context:
    return (np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, last, np.int64))
  # Window k >= 1 would end at context + k * step; the last one ends at `last`.
  num_later = -(-(last - context) // step)
  ends = np.minimum(context + step * np.arange(1, num_later + 1), last)
  starts = np.concatenate([[0], ends - context]).astype(np.int64)
  previous_ends = np.concatenate([[context], ends[:-1]])
  first_target = np.concatenate([[1], previous_ends + 1])
  score_from = (first_target - starts - 1).astype(np.int64)
  score_to = np.full(len(starts), context, np.int64)
  return starts, score_from, score_to


class _EvalBatch:
  """batch index -> this process's rows of that global batch (picklable)."""

  def __init__(
      self, corpus, num_bytes, context, windows, global_batch, process_index, process_rows
  ):
    self.corpus = corpus
    self.num_bytes = num_bytes
    self.context = context
    self.starts, self.score_from, self.score_to = windows
    self.global_batch = global_batch
    self.process_index = process_index
    self.process_rows = process_rows

  def __call__(self, t: int) -> dict[str, np.ndarray]:
    b, c = self.process_rows, self.context
    rows = t * self.global_batch + self.process_index * b + np.arange(b)
    rows = rows[rows < len(self.starts)]
    tokens = np.zeros((b, c + 1), np.int32)
    weights = np.zeros((b, c), np.float32)
    if len(rows):
      lo = int(self.starts[rows[0]])
      hi = min(int(self.starts[rows[-1]]) + c + 1, self.num_bytes)
      span = self.corpus.read(lo, hi)
      for i, r in enumerate(rows):
        s = int(self.starts[r]) - lo
        piece = span[s : s + c + 1]
        tokens[i, : len(piece)] = piece
        weights[i, self.score_from[r] : self.score_to[r]] = 1.0
    return {'tokens': tokens, 'weights': weights}


class EvalBatches:
  """A finite, re-iterable sequence of per-process evaluation batches.

  Attributes:
    num_windows: windows in the whole split (all processes).
    num_predicted_bytes: bytes scored over all processes (split length - 1).
  """

  def __init__(self, batches: grain.MapDataset, read_options, num_windows, num_bytes):
    self._batches = batches
    self._read_options = read_options
    self.num_windows = num_windows
    self.num_predicted_bytes = num_bytes - 1

  def __len__(self) -> int:
    return len(self._batches)

  def __getitem__(self, t: int) -> dict[str, np.ndarray]:
    batch = self._batches[t]
    assert batch is not None  # a map over a range: grain filtered nothing out
    return batch

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return iter(self._batches.to_iter_dataset(self._read_options))


def make_eval_batches(
    spec: LMDataSpec, split: str, *, process_index: int, process_count: int
) -> EvalBatches:
  """Per-process BPC evaluation batches of ``split`` (module docstring).

  Every process yields the same number of batches, each
  ``{'tokens': int32 [b, eval_context + 1], 'weights': float32
  [b, eval_context]}`` with ``b = eval_batch_size // process_count``; process
  ``p`` holds rows ``[p * b, (p + 1) * b)`` of each global batch.
  """
  process_index, process_count = checks.check_process(process_index, process_count)
  config_readers.share(spec.eval_batch_size, process_count, 'dataset.eval_batch_size')
  corpus = load_split(spec, split)
  return corpus_eval_batches(
      spec, corpus, evaluated_bytes(len(corpus), spec.eval_max_bytes), process_index, process_count
  )


def evaluated_bytes(split_bytes: int, eval_max_bytes: int) -> int:
  """How many bytes of a split of ``split_bytes`` an evaluation reads: its first
  ``eval_max_bytes`` (``config.dataset.eval_max_bytes``), or all of it at ``0``."""
  return split_bytes if not eval_max_bytes else min(split_bytes, eval_max_bytes)


def corpus_eval_batches(
    spec: LMDataSpec, corpus, num_bytes: int, process_index: int = 0, process_count: int = 1
) -> EvalBatches:
  """:func:`make_eval_batches` of the first ``num_bytes`` of ``corpus`` (anything with
  ``read(start, stop)``, e.g. a :class:`~.text_builders.ByteSplit` or a slice of one)."""
  rows = spec.eval_batch_size // process_count
  windows = eval_windows(num_bytes, spec.eval_context, spec.eval_step)
  num_batches = -(-len(windows[0]) // spec.eval_batch_size)
  fn = _EvalBatch(
      corpus, num_bytes, spec.eval_context, windows, spec.eval_batch_size, process_index, rows
  )
  batches = grain.MapDataset.range(num_batches).map(fn)
  return EvalBatches(batches, spec.read_options, len(windows[0]), num_bytes)
