"""TFDS builders for byte-level language-modelling corpora (no TensorFlow).

Three builders, all with a vocabulary of 256 (one token per byte):

* :class:`Enwik8` -- the first 10^8 bytes of an English Wikipedia XML dump
  (http://mattmahoney.net/dc/enwik8.zip), split into the first 90M / next 5M /
  last 5M bytes as train / validation / test (the split of Transformer-XL,
  Longformer and the ContextPool paper).
* :class:`Text8` -- 10^8 characters of cleaned lowercase Wikipedia text (a-z and
  space; http://mattmahoney.net/dc/text8.zip), with the same 90M/5M/5M split.
  Tokens are still raw bytes (vocabulary 256): bits per byte equals bits per
  character for text8.
* :class:`LocalText` -- any local text files (by default a pinned snapshot of
  CPython 3.11.7's ``Lib/*.py``, :mod:`.corpus_snapshot`; ``'<stdlib>'``: the
  running Python's standard library), cut into pieces (whole files, and
  blocks of large files) that go to train / validation / test by a seeded,
  machine-independent rule spread over the whole tree (:mod:`.text_splits`).
  Files are checked when the builder is made (patterns naming nothing, binary
  files, a corpus too small to split are errors naming the setting; empty
  files are skipped with a warning), and the prepared data is keyed by the
  content of the bytes used and by the rule, so edited files are never read
  stale. What each split holds is printed once at preparation and kept beside
  the data (``splits.json``).

Storage (all builders): each split is a sequence of records
``{'offset': int64, 'bytes': uint8[n]}``, one per ``chunk_bytes`` (64 KiB by
default) contiguous chunk of the split, in order (``disable_shuffling``):
record ``i`` holds bytes ``[i * chunk_bytes, i * chunk_bytes + n)`` of the split
(``offset`` is relative to the split start; only the last record is shorter).
The pipeline reads any window by fetching just the one or few records that
overlap it (:class:`ByteSplit`), so no split is ever loaded whole. Datasets are
prepared in the ``array_record`` format and read with
``builder.as_data_source()`` (random access, no TensorFlow).

Use :func:`prepare_text_dataset` (which prepares on first use and returns the
per-split data sources) rather than the builders directly. On a multi-host job,
prepare once before training (e.g. from one process)::

  python -c "from contextpool_jax.data import text_builders as t; \\
             t.prepare_text_dataset('enwik8', '/path/to/tfds')"

Without network access put ``enwik8.zip`` (or the extracted ``enwik8``) in the
manual directory ``<data_dir>/downloads/manual/`` (or pass ``manual_dir=``);
likewise ``text8.zip`` / ``text8`` for text8.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import json
import os
import sysconfig
import warnings
from typing import IO, Any, BinaryIO, Iterator, Mapping, Sequence, cast
import zipfile

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import utils as tfds_utils

from contextpool_jax.io import console
from contextpool_jax.data import DatasetNotFoundError, builder_code_path
from contextpool_jax.data import corpus_snapshot
from contextpool_jax.data import text_splits
from contextpool_jax.base.errors import DataError

VOCAB_SIZE = 256
SPLITS = text_splits.SPLITS
CHUNK_BYTES = 64 * 1024
# Standard enwik8/text8 split, in bytes of the full 10^8-byte corpus.
STANDARD_SPLIT_BYTES = {
    'train': 90_000_000,
    'validation': 5_000_000,
    'test': 5_000_000,
}
DEFAULT_MAX_BYTES = 16 * 2**20
ENWIK8_URL = 'http://mattmahoney.net/dc/enwik8.zip'
TEXT8_URL = 'http://mattmahoney.net/dc/text8.zip'

_GLOB_CHARS = frozenset('*?[')


def _features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict(
      {
          'offset': tfds.features.Scalar(np.int64),
          'bytes': tfds.features.Tensor(shape=(None,), dtype=np.uint8),
      }
  )


# ---------------------------------------------------------------------------
# Byte sources used during preparation.
# ---------------------------------------------------------------------------


class _FileSource:
  """One plain file."""

  def __init__(self, path: str):
    self.path = path
    self.size = os.path.getsize(path)

  @contextlib.contextmanager
  def open(self) -> Iterator[BinaryIO]:
    with open(self.path, 'rb') as f:
      yield f


class _ZipMemberSource:
  """One member of a zip archive, read without extracting it to disk."""

  def __init__(self, zip_path: str, member: str):
    self.path = zip_path
    self.member = member
    with zipfile.ZipFile(zip_path) as zf:
      try:
        self.size = zf.getinfo(member).file_size
      except KeyError:
        raise DataError(
            f'{zip_path} has no member {member!r} (it has {zf.namelist()[:5]}).'
        ) from None

  @contextlib.contextmanager
  def open(self) -> Iterator[IO[bytes]]:
    with zipfile.ZipFile(self.path) as zf, zf.open(self.member) as f:
      yield f  # ZipExtFile is seekable (forward seeks decompress through).


class _SegmentsReader:
  """Minimal seek/read over the concatenation of file segments ``(path, offset, length)``."""

  def __init__(self, segments: Sequence[tuple[str, int, int]]):
    self._segments = list(segments)
    self._starts = np.concatenate([[0], np.cumsum([n for _, _, n in segments])]).astype(np.int64)
    self._pos = 0

  def seek(self, pos: int) -> None:
    self._pos = pos

  def read(self, n: int) -> bytes:
    n = max(0, min(n, int(self._starts[-1]) - self._pos))
    out = []
    while n > 0:
      i = int(np.searchsorted(self._starts, self._pos, side='right')) - 1
      path, offset, length = self._segments[i]
      within = self._pos - int(self._starts[i])
      with open(path, 'rb') as f:
        f.seek(offset + within)
        piece = f.read(min(n, length - within))
      if not piece:
        raise ValueError(f'{path} is shorter than when listed.')
      out.append(piece)
      self._pos += len(piece)
      n -= len(piece)
    return b''.join(out)


class _SegmentsSource:
  """File segments ``(path, offset, length)`` concatenated without separators."""

  def __init__(self, segments: Sequence[tuple[str, int, int]]):
    self.segments = list(segments)
    self.size = sum(n for _, _, n in self.segments)

  @contextlib.contextmanager
  def open(self) -> Iterator[_SegmentsReader]:
    yield _SegmentsReader(self.segments)


# ---------------------------------------------------------------------------
# Builders.
# ---------------------------------------------------------------------------


class _ByteCorpusBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared logic: split ranges -> chunk records."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release: 64 KiB chunk records.'}
  _HOMEPAGE = None
  _DESCRIPTION = ''

  code_path = tfds_utils.classproperty(
      classmethod(builder_code_path)  # pyright: ignore[reportArgumentType]  # tfds: narrow stub
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self._DESCRIPTION,
        features=_features(),
        homepage=self._HOMEPAGE,
        disable_shuffling=True,  # Records must stay in offset order.
    )

  def _split_sources(self, dl_manager) -> dict[str, tuple[Any, int, int]]:
    """``{split: (source, start, stop)}``: each split is bytes [start, stop) of a
    source (an object with ``size`` and ``open()`` giving ``seek``/``read``)."""
    raise NotImplementedError

  def _split_generators(self, dl_manager):
    return {
        split: self._generate_examples(source, start, stop)
        for split, (source, start, stop) in self._split_sources(dl_manager).items()
    }

  def _generate_examples(self, source, start: int, stop: int):
    assert self.builder_config is not None  # these builders have configs (BUILDER_CONFIGS)
    chunk = self.builder_config.chunk_bytes
    with source.open() as f:
      f.seek(start)
      for i, offset in enumerate(range(0, stop - start, chunk)):
        n = min(chunk, stop - start - offset)
        data = f.read(n)
        if len(data) != n:
          raise ValueError(f'Source ended early at byte {start + offset}.')
        yield i, {'offset': offset, 'bytes': np.frombuffer(data, np.uint8)}


@dataclasses.dataclass(eq=False)
class ByteSplitConfig(tfds.core.BuilderConfig):
  """Split sizes (bytes, contiguous: train, then validation, then test).

  The corpus must have exactly ``train_bytes + validation_bytes + test_bytes``
  bytes (10^8 for enwik8/text8); a different size means a wrong or truncated
  file and fails preparation.
  """

  train_bytes: int = STANDARD_SPLIT_BYTES['train']
  validation_bytes: int = STANDARD_SPLIT_BYTES['validation']
  test_bytes: int = STANDARD_SPLIT_BYTES['test']
  chunk_bytes: int = CHUNK_BYTES


_STANDARD_CONFIG_NAME = 'standard'


def _byte_split_config(
    train_bytes: int | None,
    validation_bytes: int | None,
    test_bytes: int | None,
    chunk_bytes: int | None,
) -> ByteSplitConfig:
  """A config named after its values ('standard' for the standard split)."""
  values: dict[str, Any] = dict(
      train_bytes=STANDARD_SPLIT_BYTES['train'] if train_bytes is None else train_bytes,
      validation_bytes=STANDARD_SPLIT_BYTES['validation']
      if validation_bytes is None
      else validation_bytes,
      test_bytes=STANDARD_SPLIT_BYTES['test'] if test_bytes is None else test_bytes,
      chunk_bytes=CHUNK_BYTES if chunk_bytes is None else chunk_bytes,
  )
  for key, value in values.items():
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{key} must be a positive int, got {value!r}.')
  standard = dict(STANDARD_SPLIT_BYTES.items())
  is_standard = values['chunk_bytes'] == CHUNK_BYTES and all(
      values[f'{s}_bytes'] == standard[s] for s in SPLITS
  )
  name = (
      _STANDARD_CONFIG_NAME
      if is_standard
      else (
          'split_{train_bytes}_{validation_bytes}_{test_bytes}'
          '_chunk_{chunk_bytes}'.format(**values)
      )
  )
  return ByteSplitConfig(
      name=name,
      description=(
          'Contiguous byte ranges: train / validation / test = '
          '{train_bytes} / {validation_bytes} / {test_bytes} bytes; '
          'records of {chunk_bytes} bytes.'.format(**values)
      ),
      **values,
  )


class _StandardCorpusBuilder(_ByteCorpusBuilder, skip_registration=True):
  """A single-file 10^8-byte corpus distributed as ``<name>.zip``."""

  URL: str = ''
  FILE_NAME: str = ''
  BUILDER_CONFIGS = [_byte_split_config(None, None, None, None)]

  def __init__(
      self,
      *,
      train_bytes: int | None = None,
      validation_bytes: int | None = None,
      test_bytes: int | None = None,
      chunk_bytes: int | None = None,
      allow_download: bool = True,
      config: Any = None,
      **kwargs,
  ):
    """Builder; split sizes default to the standard 90M / 5M / 5M bytes.

    Args:
      train_bytes: bytes of the train split (first), default 90_000_000.
      validation_bytes: bytes of the validation split (next), default 5M.
      test_bytes: bytes of the test split (last), default 5_000_000.
      chunk_bytes: bytes per stored record, default 64 KiB.
      allow_download: if False, never download: preparation needs the file in
        the manual directory.
      config: a ByteSplitConfig or config name (exclusive with the sizes).
      **kwargs: for ``tfds.core.DatasetBuilder`` (``data_dir``, ...).
    """
    sizes = (train_bytes, validation_bytes, test_bytes, chunk_bytes)
    if any(v is not None for v in sizes):
      if config is not None:
        raise ValueError('Pass either config or split sizes, not both.')
      config = _byte_split_config(*sizes)
      if config.name == _STANDARD_CONFIG_NAME:
        config = self.BUILDER_CONFIGS[0]
    self.allow_download = allow_download
    super().__init__(config=config, **kwargs)

  @property
  def default_manual_dir(self) -> str:
    return os.path.join(os.fspath(self.data_dir_root), 'downloads', 'manual')

  @property
  def final_data_dir(self) -> str:
    # (`self.data_dir` points to a temporary directory during preparation.)
    assert self.builder_config is not None  # these builders have configs (BUILDER_CONFIGS)
    return os.path.join(
        os.fspath(self.data_dir_root), self.name, self.builder_config.name, str(self.version)
    )

  def _split_sources(self, dl_manager):
    source = self._open_source(dl_manager)
    size = source.size
    cfg = self.builder_config
    assert isinstance(cfg, ByteSplitConfig)  # every config of BUILDER_CONFIGS and __init__'s
    expected = cfg.train_bytes + cfg.validation_bytes + cfg.test_bytes
    if size != expected:
      raise DataError(
          f'{self.name}: the source has {size} bytes but the split sizes'
          f' ({cfg.train_bytes} + {cfg.validation_bytes} + {cfg.test_bytes})'
          f' sum to {expected}; the file is wrong or truncated.'
      )
    a = cfg.train_bytes
    b = a + cfg.validation_bytes
    return {'train': (source, 0, a), 'validation': (source, a, b), 'test': (source, b, expected)}

  def _find_manual_file(self, manual_dir) -> Any:
    if manual_dir is None or not os.path.isdir(manual_dir):
      return None
    raw = os.path.join(manual_dir, self.FILE_NAME)
    if os.path.isfile(raw):
      return _FileSource(raw)
    archive = raw + '.zip'
    if os.path.isfile(archive):
      return _ZipMemberSource(archive, self.FILE_NAME)
    return None

  def _open_source(self, dl_manager):
    try:
      source = self._find_manual_file(os.fspath(dl_manager.manual_dir))
    except AssertionError:  # The manual directory is missing or empty.
      source = None
    if source is not None:
      return source
    manual_dir = getattr(dl_manager, '_manual_dir', None)
    where = os.path.join(os.fspath(manual_dir or self.default_manual_dir), self.FILE_NAME)
    if not self.allow_download:
      raise DatasetNotFoundError(
          _missing_message(
              self.name, self.final_data_dir, self.URL, where, 'downloading is disabled'
          )
      )
    try:
      archive = dl_manager.download(self.URL)
    except Exception as e:  # pylint: disable=broad-except
      raise DatasetNotFoundError(
          _missing_message(
              self.name,
              self.final_data_dir,
              self.URL,
              where,
              f'the download failed ({type(e).__name__}: {e})',
          )
      ) from e
    return _ZipMemberSource(os.fspath(archive), self.FILE_NAME)


def _missing_message(name, data_dir, url, where, reason) -> str:
  return (
      f'{name} is not prepared in {data_dir} and {reason}. Download {url} and'
      f' put it at {where}.zip (or the extracted file at {where}), then run'
      ' again; or pass manual_dir=<directory holding it> to'
      ' prepare_text_dataset (config.dataset.manual_dir).'
  )


class Enwik8(_StandardCorpusBuilder):
  """enwik8: 10^8 bytes of English Wikipedia XML; 90M / 5M / 5M bytes."""

  name = 'enwik8'
  URL = ENWIK8_URL
  FILE_NAME = 'enwik8'
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f'Download {ENWIK8_URL} and put it (or the extracted file enwik8) in the'
      ' manual directory, by default <data_dir>/downloads/manual/.'
  )
  _HOMEPAGE = 'http://mattmahoney.net/dc/textdata.html'
  _DESCRIPTION = (
      'First 10^8 bytes of the English Wikipedia XML dump of Mar. 3, 2006'
      ' (Hutter Prize). Byte-level (vocabulary 256); contiguous split of the'
      ' first 90M / next 5M / last 5M bytes.'
  )


class Text8(_StandardCorpusBuilder):
  """text8: 10^8 characters of lowercase a-z and space; 90M / 5M / 5M."""

  name = 'text8'
  URL = TEXT8_URL
  FILE_NAME = 'text8'
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f'Download {TEXT8_URL} and put it (or the extracted file text8) in the'
      ' manual directory, by default <data_dir>/downloads/manual/.'
  )
  _HOMEPAGE = 'http://mattmahoney.net/dc/textdata.html'
  _DESCRIPTION = (
      'enwik8 cleaned to 27 characters (a-z, space). Byte-level tokens'
      ' (vocabulary 256); contiguous split of the first 90M / next 5M / last'
      ' 5M characters.'
  )


# ---------------------------------------------------------------------------
# LocalText.
# ---------------------------------------------------------------------------


# The config.dataset.files entry that names the running Python's standard-library *.py
# sources (files=() is the pinned snapshot instead: corpus_snapshot).
STDLIB = '<stdlib>'


def stdlib_source_dir() -> str:
  return sysconfig.get_paths()['stdlib']


def _walk_files(root: str, suffix: str = '') -> list[str]:
  """Regular files under root (no hidden or site/dist-packages dirs)."""
  found, folders = [], [root]
  while folders:
    try:
      entries = list(os.scandir(folders.pop()))  # file types without a stat call each
    except OSError:  # as os.walk: an unreadable folder is passed over
      continue
    for entry in entries:
      if entry.name.startswith('.'):
        continue
      if entry.is_dir(follow_symlinks=False):  # as os.walk: links to folders not followed
        if entry.name not in ('site-packages', 'dist-packages'):
          folders.append(entry.path)
      elif entry.name.endswith(suffix) and entry.is_file():
        found.append(entry.path)
  return found


def files_setting(patterns: Sequence[str]) -> str:
  """How messages name the input setting, e.g. ``config.dataset.files=('a/*.txt',)``."""
  if not patterns:
    return f"config.dataset.files=() (the default corpus, {corpus_snapshot.NAME}'s *.py)"
  return f'config.dataset.files={tuple(patterns)!r}'


_EXPECTED_FILES = (
    'expected existing files, directories (every non-hidden file under them)'
    " or glob patterns ('**' recursive); files=() reads the default corpus"
    f" ({corpus_snapshot.NAME}), {STDLIB!r} the running Python's standard library"
)


def _match(pattern: str) -> tuple[list[str], str]:
  """The regular files one pattern names, and why there are none (if so)."""
  expanded = os.path.expanduser(pattern)
  if os.path.isdir(expanded):
    return _walk_files(expanded), 'a directory without non-hidden files'
  if _GLOB_CHARS & set(expanded):
    matched = glob.glob(expanded, recursive=True)
    return ([p for p in matched if os.path.isfile(p)], 'a glob pattern that matches no file')
  return ([expanded] if os.path.isfile(expanded) else [], 'no such file or directory')


def resolve_files(patterns: Sequence[str]) -> list[str]:
  """Sorted, de-duplicated absolute paths named by files/dirs/glob patterns.

  An empty ``patterns`` (the default ``files=()``) means the pinned snapshot of
  CPython 3.11.7's ``Lib/*.py`` (:mod:`.corpus_snapshot`: the same bytes on every
  machine); the entry :data:`STDLIB` (``'<stdlib>'``) means the running Python's
  standard-library ``*.py`` sources. A directory means every (non-hidden) file
  under it, recursively; ``**`` in a glob is recursive. A pattern naming no file
  (a missing path, a glob matching nothing, a directory without files) raises
  DatasetNotFoundError naming it; an empty pattern (``''``, e.g. from
  ``--config.dataset.files=`` with nothing after it) raises ValueError: it is
  never read as "the default".
  """
  if not patterns:
    return sorted(os.path.abspath(p) for p in _walk_files(corpus_snapshot.path(), '.py'))
  setting = files_setting(patterns)
  paths = set()
  for pattern in patterns:
    if not pattern.strip():
      raise DataError(f'local_text: {setting} has an empty pattern; {_EXPECTED_FILES}.')
    if pattern == STDLIB:
      matched, why = _walk_files(stdlib_source_dir(), '.py'), f'no *.py under {stdlib_source_dir()}'
    else:
      matched, why = _match(pattern)
    if not matched:
      raise DatasetNotFoundError(
          f'local_text: {setting}: {pattern!r} names no file ({why}); {_EXPECTED_FILES}.'
      )
    paths.update(os.path.abspath(p) for p in matched)
  return sorted(paths)


@dataclasses.dataclass(eq=False)
class LocalTextConfig(tfds.core.BuilderConfig):
  """Resolved input of LocalText; the name embeds a fingerprint of it.

  ``inputs`` lists ``(path, offset, length, sha256 of those bytes)`` of every
  piece the corpus keeps, in tree order, with ``path`` relative to ``root``
  ('/'-separated); :attr:`splits` assigns them (:mod:`.text_splits`). The
  fingerprint (hence the config name and the prepared-data directory) covers
  ``inputs`` (relative paths: the same corpus elsewhere is the same data), the
  split rule, ``split_seed``, the block length used and ``chunk_bytes``: a
  changed used byte, file set, cap, seed or rule gives a new directory, while
  touching a file or changing unused bytes keeps it.
  """

  patterns: tuple[str, ...] = ()
  max_bytes: int = DEFAULT_MAX_BYTES
  chunk_bytes: int = CHUNK_BYTES
  split_block_bytes: int = text_splits.DEFAULT_BLOCK_BYTES
  split_seed: int = 0
  root: str = ''
  inputs: tuple[tuple[str, int, int, str], ...] = dataclasses.field(default=(), repr=False)
  total_bytes: int = 0

  @functools.cached_property
  def splits(self) -> dict[str, list[text_splits.Piece]]:
    """``{split: pieces in storage order}``."""
    pieces = [text_splits.Piece(path, offset, length) for path, offset, length, _ in self.inputs]
    return text_splits.assign(pieces, self.split_seed)

  def segments(self, split: str) -> list[tuple[str, int, int]]:
    """``(absolute path, offset, length)`` of each piece of ``split``, in storage order."""
    return [(os.path.join(self.root, p.path), p.offset, p.length) for p in self.splits[split]]


_SCAN_BLOCK = 2**20


@functools.lru_cache(maxsize=8192)
def _scan(path: str, ranges: tuple[tuple[int, int], ...], version: tuple[int, ...]):
  """Per ``(offset, length)`` of ``path``: (sha256 of those bytes, file offset of
  their first NUL or -1).

  Cached per file ``version`` (size, mtime, ctime, inode): any write changes
  ctime, which ``os.utime`` cannot set back, so a changed file is read again.
  """
  del version  # Only the cache key.
  out = []
  with open(path, 'rb') as f:
    for offset, length in ranges:
      f.seek(offset)
      digest, nul, pos = hashlib.sha256(), -1, 0
      while pos < length:
        block = f.read(min(_SCAN_BLOCK, length - pos))
        if not block:
          raise DataError(f'local_text: {path} got shorter while being read.')
        if nul < 0 and b'\0' in block:
          nul = offset + pos + block.index(b'\0')
        digest.update(block)
        pos += len(block)
      out.append((digest.hexdigest(), nul))
  return tuple(out)


def _by_file(pieces: Sequence[Any]) -> dict[str, list[Any]]:
  """Pieces (or ``inputs`` tuples: path, offset, length first) grouped by their
  relative path, in order."""
  out = {}
  for piece in pieces:
    out.setdefault(piece[0], []).append(piece)
  return out


def _scan_pieces(root: str, rel: str, pieces: Sequence[Any]):
  """:func:`_scan` of the pieces (or ``inputs`` tuples) of the file ``root/rel``."""
  path = os.path.join(root, rel)
  st = os.stat(path)
  ranges = tuple((p[1], p[2]) for p in pieces)
  return _scan(path, ranges, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))


@dataclasses.dataclass(frozen=True)
class _Inputs:
  """What a corpus reads: ``inputs`` as in :class:`LocalTextConfig`; ``binary``:
  ``(path, offset of its first used NUL)`` per file with one; ``empty``: the empty
  files skipped; ``block``: the block length used (0: files whole)."""

  root: str
  inputs: tuple[tuple[str, int, int, str], ...]
  binary: tuple[tuple[str, int], ...]
  empty: tuple[str, ...]
  block: int


def _local_inputs(paths: Sequence[str], max_bytes: int, block_bytes: int, seed: int) -> _Inputs:
  """The pieces of ``paths`` the corpus keeps (:mod:`.text_splits`, steps 1-2),
  hashed and checked for NUL bytes (only the bytes used are read)."""
  stats = {path: os.stat(path) for path in paths}
  empty = tuple(path for path in paths if stats[path].st_size == 0)
  full = [path for path in paths if stats[path].st_size > 0]
  if not full:
    return _Inputs('', (), (), empty, 0)
  root, relative = text_splits.relative_paths(full)
  sizes = {rel: stats[path].st_size for rel, path in zip(relative, full)}
  total = sum(sizes.values())
  block = text_splits.block_size(block_bytes, sizes, min(total, max_bytes) if max_bytes else total)
  pieces = text_splits.kept_pieces(tuple(sorted(sizes.items())), block, max_bytes, seed)
  inputs, binary = [], []
  for rel, file_pieces in _by_file(pieces).items():
    scanned = _scan_pieces(root, rel, file_pieces)
    nuls = [nul for _, nul in scanned if nul >= 0]
    if nuls:
      binary.append((os.path.join(root, rel), min(nuls)))
    inputs += [(p.path, p.offset, p.length, digest) for p, (digest, _) in zip(file_pieces, scanned)]
  return _Inputs(root, tuple(inputs), tuple(binary), empty, block)


def _some(items: Sequence[str], limit: int = 5) -> str:
  more = f' and {len(items) - limit} more' if len(items) > limit else ''
  return ', '.join(items[:limit]) + more


def _binary_error(setting: str, binary) -> DataError:
  where = [f'{p} (first NUL at byte {n})' for p, n in binary]
  return DataError(
      f'local_text: {setting} includes {len(binary)} file(s) with NUL bytes,'
      f' which text does not contain: {_some(where)}. Text globs that match'
      ' binary files (compiled code, images, archives, UTF-16 text) are'
      ' almost always a mistake: narrow config.dataset.files (e.g.'
      " 'dir/**/*.txt'), or set config.dataset.allow_binary=True to train"
      ' on their raw bytes.'
  )


# Every split must hold this many bytes: an evaluation needs one of context and one to predict.
MIN_SPLIT_BYTES = 2


def _check_local_corpus(
    files, max_bytes, block_bytes, seed: int, found: _Inputs, allow_binary
) -> None:
  """Raises for a corpus LocalText cannot store; warns about empty files.

  Choices: empty files add no bytes, so they are skipped (with a warning
  naming them when the files were named explicitly: the standard library has
  empty ``__init__.py`` files by design); no bytes at all is a missing
  dataset; a NUL byte means a binary file, an error unless ``allow_binary``;
  every split must get at least :data:`MIN_SPLIT_BYTES`.
  """
  setting = files_setting(files)
  if not found.inputs:
    raise DatasetNotFoundError(
        f'local_text: {setting} names only empty files ({_some(found.empty)});'
        ' name files that hold text.'
    )
  if found.empty and set(files) - {STDLIB}:
    warnings.warn(
        f'local_text: {setting}: skipping {len(found.empty)} empty'
        f' file(s): {_some(found.empty)}.',
        stacklevel=3,
    )
  if found.binary and not allow_binary:
    raise _binary_error(setting, found.binary)
  pieces = [text_splits.Piece(*i[:3]) for i in found.inputs]
  for split, held in text_splits.assign(pieces, seed).items():
    if sum(p.length for p in held) < MIN_SPLIT_BYTES:
      raise DataError(
          f'local_text: {setting} gives {len(pieces)} piece(s) of'
          f' {sum(p.length for p in pieces)} bytes (config.dataset.max_bytes={max_bytes},'
          f' 0 = no cap; config.dataset.split_block_bytes={block_bytes}, 0 = files whole),'
          f' too few for a {split} split of at least {MIN_SPLIT_BYTES} bytes: name more text'
          + (' or set split_block_bytes > 0 to cut files into blocks.' if not found.block else '.')
      )


def _check_int(name: str, value: Any, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}.')


def make_local_text_config(
    files: str | Sequence[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
    allow_binary: bool = False,
    split_block_bytes: int = text_splits.DEFAULT_BLOCK_BYTES,
    split_seed: int = 0,
) -> LocalTextConfig:
  """Resolves ``files``, checks and fingerprints them into a LocalTextConfig.

  Reads the used bytes of every contributing file once per process and file
  version (to hash them and look for NUL bytes); see
  :func:`_check_local_corpus` for what is rejected.
  """
  if files is None:
    files = ()
  elif isinstance(files, (str, os.PathLike)):
    files = (os.fspath(files),)
  files = tuple(os.fspath(f) for f in files)
  _check_int('max_bytes (0 = no cap)', max_bytes, 0)
  _check_int('chunk_bytes', chunk_bytes, 1)
  _check_int('split_block_bytes (0 = files whole)', split_block_bytes, 0)
  _check_int('split_seed', split_seed, 0)
  found = _local_inputs(resolve_files(files), max_bytes, split_block_bytes, split_seed)
  _check_local_corpus(files, max_bytes, split_block_bytes, split_seed, found, allow_binary)
  total = sum(length for _, _, length, _ in found.inputs)
  fingerprint = hashlib.sha256(
      json.dumps(
          {
              'rule': text_splits.RULE,
              'seed': split_seed,
              'block': found.block,
              'inputs': found.inputs,
              'chunk_bytes': chunk_bytes,
          },
          sort_keys=True,
      ).encode()
  ).hexdigest()[:16]
  kind = 'files' if set(files) - {STDLIB} else 'stdlib' if files else 'snapshot'
  return LocalTextConfig(
      name=f'{kind}_{fingerprint}',
      description=(
          f'{len(found.inputs)} pieces ({total} bytes) of'
          f' {list(files) if files else corpus_snapshot.NAME + " (*.py)"} under {found.root};'
          ' blocks of'
          f' {found.block or "whole files"} bytes; split rule {text_splits.RULE}, seed'
          f' {split_seed} (90/5/5%).'
      ),
      patterns=files,
      max_bytes=max_bytes,
      chunk_bytes=chunk_bytes,
      split_block_bytes=split_block_bytes,
      split_seed=split_seed,
      root=found.root,
      inputs=found.inputs,
      total_bytes=total,
  )


SPLITS_SUMMARY = 'splits.json'


class LocalText(_ByteCorpusBuilder):
  """Local text files as a byte corpus (default: the pinned ``corpus_snapshot``).

  The files (named by files, directories or glob patterns; duplicates removed)
  are cut into pieces that go to train / validation / test by the seeded rule
  of :mod:`.text_splits`, a function of their paths relative to the corpus root,
  so the splits are the same on every machine and from any working directory,
  and spread over the whole tree. Each split is its pieces concatenated without
  separators; no byte is in two splits. Preparation writes what each split
  holds to ``splits.json`` beside the data (:func:`prepare_text_dataset` prints it).

  Bad input fails when the builder is made, before anything is prepared:
  a pattern naming no file, or only empty files (DatasetNotFoundError); an
  empty pattern, a file with a NUL byte in its used part (unless
  ``allow_binary``), a corpus too small for three splits (ValueError). Empty
  files are skipped with a warning. The prepared data is keyed by the content
  of the used bytes and by the rule (see :class:`LocalTextConfig`), so edited
  files are prepared again (into a new directory; the old one stays until
  deleted) and never silently read stale.
  """

  name = 'local_text'

  def __init__(
      self,
      *,
      files: str | Sequence[str] | None = None,
      max_bytes: int = DEFAULT_MAX_BYTES,
      chunk_bytes: int = CHUNK_BYTES,
      allow_binary: bool = False,
      split_block_bytes: int = text_splits.DEFAULT_BLOCK_BYTES,
      split_seed: int = 0,
      config: LocalTextConfig | None = None,
      **kwargs,
  ):
    """Builder for ``files`` (files, directories or glob patterns).

    Args:
      files: what to read; None/empty = the pinned snapshot of CPython
        3.11.7's ``Lib/*.py`` (:mod:`.corpus_snapshot`); an entry ``'<stdlib>'``
        (:data:`STDLIB`) = the running Python's standard-library ``*.py``
        sources (``sysconfig.get_paths()['stdlib']``, without site-packages).
      max_bytes: cap on the corpus (0 = no cap), default 16 MiB: a seeded
        sample of the pieces across the tree.
      chunk_bytes: bytes per stored record, default 64 KiB.
      allow_binary: accept files with NUL bytes (default: ValueError).
      split_block_bytes: files larger than this are cut into blocks of this
        many bytes before the split (0: every file whole); default 64 KiB.
      split_seed: seeds the cap's sample and the split (not the training order).
      config: a ready LocalTextConfig (then the arguments above are unused).
      **kwargs: for ``tfds.core.DatasetBuilder`` (``data_dir``, ...).
    """
    if config is None:
      config = make_local_text_config(
          files, max_bytes, chunk_bytes, allow_binary, split_block_bytes, split_seed
      )
    elif not isinstance(config, LocalTextConfig):
      raise ValueError('LocalText needs a LocalTextConfig (or files=...).')
    super().__init__(config=config, **kwargs)

  def _split_sources(self, dl_manager):
    del dl_manager
    cfg = self.builder_config
    assert isinstance(cfg, LocalTextConfig)  # __init__ takes no other
    try:
      unchanged = all(
          [digest for digest, _ in _scan_pieces(cfg.root, path, pieces)] == [i[3] for i in pieces]
          for path, pieces in _by_file(cfg.inputs).items()
      )
    except OSError as e:
      raise DatasetNotFoundError(f'local_text: {e}') from e
    except DataError:  # a file got shorter
      unchanged = False
    if not unchanged:
      raise DataError(
          'local_text: input files changed since the builder was made;'
          ' make a new builder (its config name will change).'
      )
    summary = text_splits.summary(cfg.splits)
    os.makedirs(self.data_dir, exist_ok=True)
    with open(os.path.join(self.data_dir, SPLITS_SUMMARY), 'w') as f:
      json.dump(summary, f, indent=1)
    sources = {split: _SegmentsSource(cfg.segments(split)) for split in SPLITS}
    return {split: (source, 0, source.size) for split, source in sources.items()}


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------


class ByteSplit:
  """Random access to the bytes of one prepared split (a chunk data source).

  ``read(start, stop)`` returns ``uint8[stop - start]`` fetching only the
  records that overlap the range; record offsets are checked on every read.
  Picklable (for grain worker processes) if the data source is.
  """

  def __init__(self, source: Any):
    self.source = source
    n = len(source)
    if n == 0:
      raise ValueError('Empty split.')
    first = source[0]
    self.chunk_bytes = len(first['bytes'])
    last = first if n == 1 else source[n - 1]
    self.num_bytes = (n - 1) * self.chunk_bytes + len(last['bytes'])
    if int(last['offset']) != (n - 1) * self.chunk_bytes:
      raise ValueError('Records are not contiguous chunks in offset order.')

  def __len__(self) -> int:
    return self.num_bytes

  def read(self, start: int, stop: int) -> np.ndarray:
    if not 0 <= start <= stop <= self.num_bytes:
      raise IndexError(f'[{start}, {stop}) outside [0, {self.num_bytes}).')
    if start == stop:
      return np.zeros((0,), np.uint8)
    c = self.chunk_bytes
    first, last = start // c, (stop - 1) // c
    indices = list(range(first, last + 1))
    # One __getitem__ per record: (array_record's __getitems__ is slower for
    # the one or two records a window usually needs.)
    records = [self.source[i] for i in indices]
    for i, record in zip(indices, records):
      if int(record['offset']) != i * c:
        raise ValueError(
            f'Record {i} has offset {record["offset"]}, expected'
            f' {i * c}: the split is not stored in order.'
        )
    data = np.concatenate([np.asarray(r['bytes'], np.uint8) for r in records])
    return data[start - first * c : stop - first * c]


_BUILDERS = {'enwik8': Enwik8, 'text8': Text8, 'local_text': LocalText}


def get_builder(
    name: str, data_dir: str | None = None, **builder_kwargs
) -> tfds.core.DatasetBuilder:
  """The builder ``name`` ('enwik8' | 'text8' | 'local_text')."""
  if name not in _BUILDERS:
    raise ValueError(f'Unknown text dataset {name!r}; expected one of {sorted(_BUILDERS)}.')
  return _BUILDERS[name](data_dir=data_dir, **builder_kwargs)


def prepare_text_dataset(
    name: str,
    data_dir: str | None = None,
    *,
    manual_dir: str | None = None,
    download: bool = True,
    **builder_kwargs,
) -> Mapping[str, Any]:
  """Prepares ``name`` if needed; returns ``{split: data_source}``.

  Args:
    name: 'enwik8' | 'text8' | 'local_text'.
    data_dir: TFDS data directory (None = TFDS default,
      ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``).
    manual_dir: directory holding ``enwik8.zip``/``enwik8`` (or ``text8.zip``/
      ``text8``); default ``<data_dir>/downloads/manual``. Ignored by
      local_text.
    download: enwik8/text8 only: may download when no manual file is found.
    **builder_kwargs: for the builder: ``train_bytes``, ``validation_bytes``,
      ``test_bytes``, ``chunk_bytes`` (enwik8/text8); ``files``, ``max_bytes``,
      ``chunk_bytes``, ``allow_binary``, ``split_block_bytes``, ``split_seed``
      (local_text).

  Returns:
    ``{'train': ..., 'validation': ..., 'test': ...}`` random-access data
    sources of chunk records (wrap one in :class:`ByteSplit` to read bytes).

  Raises:
    DatasetNotFoundError: not prepared and cannot be (no network and no
      manual file; local_text patterns naming no file or only empty files);
      the message says what to do.
    ValueError: local_text files that are binary or too small to split, or a
      corpus of the wrong size (enwik8/text8); the message names the setting.
  """
  if name in ('enwik8', 'text8'):
    builder_kwargs['allow_download'] = download
  builder = get_builder(name, data_dir, **builder_kwargs)
  if not builder.is_prepared():
    console.event(f'Preparing {name} (once; later runs reuse it): {builder.data_dir}')
    download_config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    with console.library_output():
      builder.download_and_prepare(file_format='array_record', download_config=download_config)
    summary = split_summary(builder)
    if summary:
      console.event('What each split holds (%s):' % os.path.join(builder.data_dir, SPLITS_SUMMARY))
      for line in text_splits.summary_lines(summary):
        console.event(line)
  # With no split, TFDS gives every split: {split: data source}.
  return cast(Mapping[str, Any], builder.as_data_source())


def split_summary(builder: tfds.core.DatasetBuilder) -> dict | None:
  """A prepared ``local_text`` corpus's ``splits.json`` (:func:`.text_splits.summary`);
  None for the other corpora (contiguous ranges of one file)."""
  path = os.path.join(builder.data_dir, SPLITS_SUMMARY)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)
