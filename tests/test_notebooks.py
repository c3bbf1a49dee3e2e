"""The notebooks run headless, top to bottom (small-size switch on), and draw their figures."""

import base64
import os
import pathlib

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow  # executes the notebooks

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / 'notebooks'
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

# The figures each notebook draws with the small-size switch (one image/png output each).
EXPECTED_FIGURES = {
    # pool_text per ContextPool layer (2), Gaussian supports, sigma distribution.
    'quickstart.ipynb': 4,
    # pool_text per layer (2), supports, sizes per layer, CP-ViT grids (2 ContextPools) and
    # their sizes, area attention, costs.
    'contextpool_explained.ipynb': 9,
}


def _pngs(notebook) -> list[bytes]:
  return [
      base64.b64decode(output['data']['image/png'])
      for cell in notebook.cells
      if cell.cell_type == 'code'
      for output in cell.get('outputs', [])
      if 'image/png' in output.get('data', {})
  ]


def test_every_notebook_is_tested():
  assert sorted(p.name for p in NOTEBOOKS.glob('*.ipynb')) == sorted(EXPECTED_FIGURES)


@pytest.mark.parametrize('name', sorted(EXPECTED_FIGURES))
def test_notebook_runs_and_draws_its_figures(name, tmp_path, monkeypatch):
  monkeypatch.setenv('CONTEXTPOOL_NOTEBOOK_SMALL', '1')
  monkeypatch.setenv('CONTEXTPOOL_NOTEBOOK_WORKDIR', str(tmp_path / 'workdir'))
  monkeypatch.delenv('CONTEXTPOOL_WORKDIR', raising=False)
  notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
  assert not _pngs(notebook), f'{name} is committed with outputs; clear them'
  client = nbclient.NotebookClient(
      notebook, timeout=600, kernel_name='python3', resources={'metadata': {'path': str(NOTEBOOKS)}}
  )
  client.execute()  # raises CellExecutionError naming the cell if any cell fails
  pngs = _pngs(notebook)
  assert len(pngs) == EXPECTED_FIGURES[name]
  assert all(png.startswith(PNG_MAGIC) and len(png) > 5000 for png in pngs)
  setup = notebook.cells[1].outputs[0]['text']
  assert 'small run: True' in setup and str(NOTEBOOKS.parent) in setup  # ran from the checkout
