"""The notebooks: stored with the outputs of a real run (``python notebooks/execute.py``), and
they run headless, top to bottom, smoke-sized (``CONTEXTPOOL_NOTEBOOK_SMALL=1``), drawing their
figures.

The checks of the stored outputs are fast (they read the files); executing is ``slow``.
"""

import base64
import importlib.metadata
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import types

import nbclient
import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / 'notebooks'
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

# The figures each notebook draws, at either size (one image/png output each).
EXPECTED_FIGURES = {
    # pool_text per ContextPool layer (2), Gaussian supports, sigma distribution.
    'quickstart.ipynb': 4,
    # pool_text per layer (2), supports, sizes per layer, CP-ViT grids (2 ContextPools) and
    # their sizes, area attention, costs.
    'contextpool_explained.ipynb': 9,
}


def _first_code_cell(name: str) -> str:
  """The notebook's first code cell (its setup cell), read without validating the notebook."""
  cells = json.loads((NOTEBOOKS / name).read_text())['cells']
  source = next(c for c in cells if c['cell_type'] == 'code')['source']
  return source if isinstance(source, str) else ''.join(source)


# Each distinct first code cell and the notebooks that share it: the Colab install test runs once
# per distinct cell (its case id names those notebooks), not once per notebook with the same text.
SETUP_CELLS: dict[str, list[str]] = {}
for _name in sorted(EXPECTED_FIGURES):
  SETUP_CELLS.setdefault(_first_code_cell(_name), []).append(_name)


def _execute_script():
  """notebooks/execute.py as a module (it is a script, not part of the package)."""
  spec = importlib.util.spec_from_file_location('notebooks_execute', NOTEBOOKS / 'execute.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _pngs(notebook) -> list[bytes]:
  return [
      base64.b64decode(output['data']['image/png'])
      for cell in notebook.cells
      if cell.cell_type == 'code'
      for output in cell.get('outputs', [])
      if 'image/png' in output.get('data', {})
  ]


def _texts(notebook) -> list[str]:
  """Every printed or displayed text of the notebook's outputs."""
  out = []
  for cell in notebook.cells:
    for output in cell.get('outputs', []):
      if 'text' in output:
        out.append(output['text'])
      out.extend(v for k, v in output.get('data', {}).items() if k.startswith('text/'))
  return out


def test_every_notebook_is_tested():
  assert sorted(p.name for p in NOTEBOOKS.glob('*.ipynb')) == sorted(EXPECTED_FIGURES)


@pytest.mark.parametrize('name', sorted(EXPECTED_FIGURES))
def test_the_stored_notebook_shows_a_real_run(name):
  """What GitHub and Colab show before anything runs: every code cell's outputs from one
  real-size run of the checkout, in order, without errors, with its figures."""
  notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
  code = [c for c in notebook.cells if c.cell_type == 'code']
  assert [c.execution_count for c in code] == list(
      range(1, len(code) + 1)
  ), f'{name}: not stored executed top to bottom; run python notebooks/execute.py'
  setup = ''.join(o['text'] for o in code[0].outputs if o.get('name') == 'stdout')
  assert 'repository: .. | small run: False' in setup, setup  # the real size, from a checkout
  errors = [o for c in code for o in c.outputs if o.output_type == 'error']
  assert not errors, [(e['ename'], e['evalue']) for e in errors]
  pngs = _pngs(notebook)
  assert len(pngs) == EXPECTED_FIGURES[name]
  assert all(png.startswith(PNG_MAGIC) and len(png) > 5000 for png in pngs)
  assert not [c.metadata['execution'] for c in notebook.cells if 'execution' in c.metadata]
  # Paths: relative to the checkout, or the run's fixed workdir (the same on every rerun);
  # none of the machine that ran it (quoted ones are Python text, e.g. sampled).
  absolute = re.compile(r'(?<![\w./:\'"])/[\w.-]+/[\w.-]+\S*')
  paths = {p for text in _texts(notebook) for p in absolute.findall(text)}
  stem = pathlib.Path(name).stem
  assert all(p.startswith(f'/tmp/contextpool-notebooks/{stem}') for p in paths), paths


@pytest.mark.parametrize('name', sorted(EXPECTED_FIGURES))
def test_the_smoke_run_starts_from_a_copy_without_outputs(name):
  stored = (NOTEBOOKS / name).read_bytes()
  notebook = _execute_script().clear_outputs(nbformat.reads(stored, as_version=4))
  assert not _pngs(notebook) and not _texts(notebook)
  assert all(c.execution_count is None for c in notebook.cells if c.cell_type == 'code')
  assert (NOTEBOOKS / name).read_bytes() == stored


def test_the_regenerating_script_names_an_unknown_notebook(capsys):
  with pytest.raises(SystemExit) as exit_:
    _execute_script().main(['quickstrat.ipynb'])
  assert exit_.value.code == 2
  assert (
      'not a notebook in notebooks/: quickstrat.ipynb; allowed: '
      "['contextpool_explained.ipynb', 'quickstart.ipynb']"
  ) in capsys.readouterr().err


@pytest.mark.slow  # executes the notebooks
@pytest.mark.parametrize('name', sorted(EXPECTED_FIGURES))
def test_notebook_runs_smoke_sized_and_draws_its_figures(name, tmp_path, monkeypatch):
  """Slow (up to a minute each): a Jupyter kernel executes the whole notebook as a Colab user
  would, smoke-sized (a few training steps), including its compiles and figures."""
  monkeypatch.setenv('CONTEXTPOOL_NOTEBOOK_SMALL', '1')
  monkeypatch.setenv('CONTEXTPOOL_NOTEBOOK_WORKDIR', str(tmp_path / 'workdir'))
  monkeypatch.delenv('CONTEXTPOOL_WORKDIR', raising=False)
  stored = (NOTEBOOKS / name).read_bytes()
  notebook = _execute_script().clear_outputs(nbformat.reads(stored, as_version=4))
  client = nbclient.NotebookClient(
      notebook,
      timeout=600,
      kernel_name='python3',
      resources={'metadata': {'path': str(NOTEBOOKS)}},
  )
  client.execute()  # raises CellExecutionError naming the cell if any cell fails
  pngs = _pngs(notebook)
  assert len(pngs) == EXPECTED_FIGURES[name]
  assert all(png.startswith(PNG_MAGIC) and len(png) > 5000 for png in pngs)
  setup = notebook.cells[1].outputs[0]['text']
  assert 'repository: .. | small run: True' in setup  # ran from the checkout, smoke-sized
  assert (NOTEBOOKS / name).read_bytes() == stored  # the committed file is untouched


@pytest.mark.slow
@pytest.mark.parametrize(
    'source',
    [pytest.param(source, id='+'.join(names)) for source, names in SETUP_CELLS.items()],
)
def test_the_colab_install_keeps_the_runtimes_jax(source, tmp_path, monkeypatch):
  """The first cell as Colab runs it (no checkout, REPO_URL set): it clones, then installs
  with the runtime's jax pinned as a constraint. Run here with pip's --dry-run against this
  environment: the keep-file holds the installed jax and jaxlib, and pip resolves the package
  without installing another jax; a runtime jax outside the tested range makes pip fail.
  One case per distinct first cell (the notebooks sharing it name the case): the test reads
  nothing else of the notebook."""
  names = '+'.join(SETUP_CELLS[source])
  source = source.replace(
      "REPO_URL = ''", "REPO_URL = 'https://example.invalid/contextpool-jax.git'"
  )
  monkeypatch.chdir(tmp_path)
  commands = []

  def run(argv, check):
    commands.append(argv)
    if argv[:2] == ['git', 'clone']:
      (tmp_path / 'contextpool-jax').symlink_to(REPO)
      return None
    dry = [*argv[:4], '--dry-run', '--report', str(tmp_path / 'report.json'), *argv[4:]]
    return subprocess.run(dry, check=check, capture_output=True, text=True)

  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
      importlib.util,
      'find_spec',
      lambda n, *a: None if n == 'contextpool_jax' else find_spec(n, *a),
  )
  fake_subprocess = types.SimpleNamespace(run=run)
  monkeypatch.setitem(sys.modules, 'subprocess', fake_subprocess)
  try:
    exec(compile(source, names, 'exec'), {'__name__': '__main__'})  # pylint: disable=exec-used
  finally:
    monkeypatch.setitem(sys.modules, 'subprocess', subprocess)
  keep = (tmp_path / 'keep-runtime-jax.txt').read_text().split()
  for dist in ('jax', 'jaxlib'):
    assert f'{dist}=={importlib.metadata.version(dist)}' in keep
  assert commands[1][-4:] == ['-c', 'keep-runtime-jax.txt', '-e', './contextpool-jax[notebook]']
  report = json.loads((tmp_path / 'report.json').read_text())
  installing = {i['metadata']['name'] for i in report['install']}
  assert 'jax' not in installing and 'jaxlib' not in installing, installing
  (tmp_path / 'keep-runtime-jax.txt').write_text('jax==0.9.0\n')  # an older runtime
  failed = subprocess.run(
      [
          sys.executable,
          '-m',
          'pip',
          'install',
          '--dry-run',
          '-q',
          '-c',
          'keep-runtime-jax.txt',
          '-e',
          './contextpool-jax[notebook]',
      ],
      capture_output=True,
      text=True,
  )
  assert failed.returncode != 0 and 'ResolutionImpossible' in failed.stderr
