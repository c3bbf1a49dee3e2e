"""Regenerates the stored notebooks executed at their real size, in place.

  python notebooks/execute.py                      # every notebooks/*.ipynb
  python notebooks/execute.py quickstart.ipynb     # the ones named

Each notebook runs top to bottom in a fresh ``python3`` kernel (nbclient) with
``notebooks/`` as its working directory, as a reader's Jupyter or Colab would
run it: ``CONTEXTPOOL_NOTEBOOK_SMALL`` and ``CONTEXTPOOL_WORKDIR`` unset (the
real run, training its own LM), ``CONTEXTPOOL_NOTEBOOK_WORKDIR`` a fixed
directory ``/tmp/contextpool-notebooks/<name>`` (emptied before and removed
after, so the paths the trainer prints are the same on every rerun) and
``JAX_PLATFORMS=cpu`` (no TPU probe when libtpu is installed). The stored
file gets the outputs (printed text, figures) and no volatile metadata: no
execution timestamps, so a rerun diffs only where results changed. A cell that
fails stops the script with the cell's error and leaves the stored notebook as
it was. tests/repo/test_notebooks.py checks the stored outputs and executes the
notebooks smoke-sized from copies without outputs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

import nbclient
import nbformat

NOTEBOOKS = pathlib.Path(__file__).resolve().parent
# What the notebooks read from the environment; the real run has none of them but the workdir.
UNSET = ('CONTEXTPOOL_NOTEBOOK_SMALL', 'CONTEXTPOOL_WORKDIR')


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
  """Drops what differs between two runs of the same code and is no result (the
  cells' execution timestamps)."""
  for cell in notebook.cells:
    cell.metadata.pop('execution', None)
  return notebook


def clear_outputs(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
  """The notebook without outputs and execution counts (what the tests execute)."""
  for cell in notebook.cells:
    if cell.cell_type == 'code':
      cell.outputs = []
      cell.execution_count = None
  return strip_volatile(notebook)


def workdir_for(path: pathlib.Path) -> pathlib.Path:
  """The fixed workdir of one notebook's run: the same path on every rerun and machine
  (``/tmp``, whatever ``TMPDIR`` says, where there is one)."""
  tmp = '/tmp' if os.name == 'posix' else tempfile.gettempdir()
  return pathlib.Path(tmp) / 'contextpool-notebooks' / path.stem


def execute(path: pathlib.Path, timeout: int) -> float:
  """Runs ``path`` at its real size and stores it with its outputs; returns the seconds taken."""
  notebook = clear_outputs(nbformat.read(path, as_version=4))
  workdir = workdir_for(path)
  shutil.rmtree(workdir, ignore_errors=True)
  env = {k: v for k, v in os.environ.items() if k not in UNSET}
  env['CONTEXTPOOL_NOTEBOOK_WORKDIR'] = str(workdir)
  # On the CPU, as the stored outputs show: with the developers' libtpu installed, JAX's probe
  # for a TPU at start would log libtpu's lines into the first cell's output (a reader's
  # install has no libtpu).
  env['JAX_PLATFORMS'] = 'cpu'
  client = nbclient.NotebookClient(
      notebook,
      timeout=timeout,
      kernel_name='python3',
      record_timing=False,  # no per-cell timestamps in the stored file
      resources={'metadata': {'path': str(path.parent)}},
  )
  start = time.monotonic()
  try:
    client.execute(env=env)
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  seconds = time.monotonic() - start
  strip_volatile(notebook)
  partial = path.with_suffix('.ipynb.partial')
  nbformat.write(notebook, partial)
  partial.replace(path)  # the stored notebook changes only once the run succeeded
  return seconds


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
      'names', nargs='*', help='notebooks in notebooks/ (default: every *.ipynb there)'
  )
  parser.add_argument(
      '--timeout', type=int, default=3600, help='seconds one cell may take (default 3600)'
  )
  args = parser.parse_args(argv)
  known = sorted(p.name for p in NOTEBOOKS.glob('*.ipynb'))
  unknown = [n for n in args.names if n not in known]
  if unknown:
    parser.error(f'not a notebook in {NOTEBOOKS.name}/: {", ".join(unknown)}; allowed: {known}')
  for name in args.names or known:
    print(f'executing notebooks/{name} (real size) ...', flush=True)
    seconds = execute(NOTEBOOKS / name, args.timeout)
    print(f'notebooks/{name}: stored executed ({seconds / 60:.1f} min)', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
