"""The default ``local_text`` corpus: a pinned snapshot of CPython's ``Lib/*.py``.

The default character-LM corpus used to be the running interpreter's standard
library, so its bytes changed with the Python (3.12 removed ``distutils``, 3.13
``lib2to3``; Debian strips ``test/``) and so did every number measured on it. The
snapshot is one fixed set of files that ships inside the package
(``corpora/<NAME>.tar.xz``, checked against :data:`SHA256` before it is read):

* **What it holds.** Whole ``*.py`` files of CPython 3.11.7's ``Lib`` (PSF
  licence, included as ``LICENSE.txt``, which is not part of the corpus), at most
  :data:`MAX_FILE_BYTES` each, drawn in a seeded hash order of their paths until
  :data:`TOTAL_BYTES` (:func:`select`). Files stay whole: a document is never cut, so
  a window of context only ever crosses from one whole file into another.
* **Where it is read.** Extracted once into ``$XDG_CACHE_HOME/contextpool_jax``
  (``~/.cache/contextpool_jax``; ``cache_dir`` to choose), in a directory named by
  the archive's checksum, atomically (a half-extracted directory is never used).
* **How it was made.** ``python -m contextpool_jax.data.corpus_snapshot --lib
  /path/to/python3.11.7/lib/python3.11 --out DIR`` writes the archive and prints its
  checksum; the archive in the package is that output for CPython 3.11.7.

``config.dataset.files=()`` means this snapshot; ``('<stdlib>',)`` the running
Python's own standard library, as before (``text_builders.resolve_files``).
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import tarfile
import tempfile
from typing import Mapping, Optional

NAME = 'cpython-3.11.7-lib'
SHA256 = 'db6f23cbf05c542bb9dd3c64630f36404cb511af99a7c6a3ae180bea648ce245'
MAX_FILE_BYTES = 2**16  # whole files only: a larger file is left out, never cut
TOTAL_BYTES = 4 * 2**20  # configs/default.py's max_bytes: the cap keeps all of it
LICENSE = 'LICENSE.txt'  # in the archive beside the sources; not a *.py file, so not text
_ARCHIVE = pathlib.Path(__file__).with_name('corpora') / f'{NAME}.tar.xz'


def archive_path() -> pathlib.Path:
  """The archive that ships in the package."""
  return _ARCHIVE


def _sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(2**20), b''):
      digest.update(block)
  return digest.hexdigest()


def default_cache_dir() -> pathlib.Path:
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return pathlib.Path(base) / 'contextpool_jax'


def path(cache_dir: Optional[os.PathLike | str] = None) -> str:
  """The directory holding the snapshot's files, extracted on first use.

  Raises OSError naming the archive when it is missing or its checksum is not
  :data:`SHA256` (a damaged install), before anything is extracted.
  """
  root = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
  target = root / 'corpora' / f'{NAME}-{SHA256[:12]}'
  if target.is_dir():
    return str(target)
  archive = archive_path()
  if not archive.is_file():
    raise OSError(f'the default corpus archive {archive} is missing: reinstall contextpool-jax.')
  found = _sha256(archive)
  if found != SHA256:
    raise OSError(
        f'the default corpus archive {archive} has sha256 {found}, expected {SHA256}:'
        ' reinstall contextpool-jax.'
    )
  target.parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f'.{NAME}-', dir=target.parent))
  with tarfile.open(archive, 'r:xz') as tar:
    tar.extractall(staging, filter='data')
  try:
    os.rename(staging, target)  # atomic: another process may have won the race
  except OSError:
    if not target.is_dir():
      raise
  return str(target)


def select(sizes: Mapping[str, int], seed: int = 0) -> list[str]:
  """The relative paths the snapshot keeps of ``{relative path: bytes}``: non-empty
  files of at most :data:`MAX_FILE_BYTES`, in the order of a seeded hash of their
  path, each taken while the total stays within :data:`TOTAL_BYTES`; sorted."""
  order = sorted(
      (p for p, n in sizes.items() if 0 < n <= MAX_FILE_BYTES),
      key=lambda p: hashlib.sha256(f'{seed}/snapshot/{p}'.encode()).digest(),
  )
  kept, total = [], 0
  for p in order:
    if total + sizes[p] <= TOTAL_BYTES:
      kept.append(p)
      total += sizes[p]
  return sorted(kept)


def build(lib: str, out: str) -> pathlib.Path:
  """Writes ``<out>/<NAME>.tar.xz`` from a CPython ``Lib`` directory (the
  :func:`select`-ed ``*.py`` files and ``LICENSE.txt``), reproducibly: sorted
  members, no times, owners or modes of this machine."""
  root = pathlib.Path(lib)
  sizes = {  # as local_text reads a library: no hidden or site-packages folders
      p.relative_to(root).as_posix(): p.stat().st_size
      for p in root.rglob('*.py')
      if p.is_file()
      and not any(
          part.startswith('.') or part in ('site-packages', 'dist-packages')
          for part in p.relative_to(root).parts
      )
  }
  members = select(sizes) + [LICENSE]
  target = pathlib.Path(out) / f'{NAME}.tar.xz'
  target.parent.mkdir(parents=True, exist_ok=True)
  with tarfile.open(target, 'w:xz', format=tarfile.PAX_FORMAT, preset=9) as tar:
    for rel in members:
      data = (root / rel).read_bytes()
      info = tarfile.TarInfo(rel)
      info.size, info.mode, info.mtime = len(data), 0o644, 0
      tar.addfile(info, io.BytesIO(data))
  return target


def main(argv=None) -> None:
  import argparse  # pylint: disable=g-import-not-at-top

  parser = argparse.ArgumentParser(description=(__doc__ or '').split('\n', 1)[0])
  parser.add_argument('--lib', required=True, help="a CPython 'Lib' directory (3.11.7's)")
  parser.add_argument('--out', required=True, help='directory to write the archive to')
  args = parser.parse_args(argv)
  target = build(args.lib, args.out)
  print(f'{target}: {len(tarfile.open(target).getnames()) - 1} files, sha256 {_sha256(target)}')


if __name__ == '__main__':
  main()
