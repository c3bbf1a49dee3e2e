"""The package's shape: no long functions, and one owner of the task-kind decisions.

* No function or method of ``contextpool_jax/`` or ``train.py`` is longer than
  :data:`MAX_LINES` lines (``end_lineno - lineno + 1`` of its ``def``, decorators
  excluded): a longer one does several things; split it into functions named for
  what each does.
* A config's task is read in one module only, the task registry
  ``contextpool_jax/training/tasks.py``, in every Python file of the repository (the
  package, ``train.py``, ``benchmarks/``, ``configs/``, ``tests/``, ...): no other
  file compares ``config.task`` (or any ``<x>.task``), reads ``<x>.get('task', ...)``
  or ``<x>['task']``, reads the entry ``'task'`` with a config reader, or looks
  something up by it (``TABLE[config.task]``). Every decision that depends on the
  kind of experiment (data, objective, evaluators, hooks, init batch) belongs to its
  entry there; code below the registry (inference, a loaded workdir) asks the model
  what it is instead.

These can fail: the tests at the end run the checks on small sources that break them.
"""

import ast
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / 'contextpool_jax'
REGISTRY = PACKAGE / 'training' / 'tasks.py'
MAX_LINES = 80


def _sources() -> list[pathlib.Path]:
  return sorted(PACKAGE.rglob('*.py')) + [REPO / 'train.py']


def _repository_sources(root: pathlib.Path = REPO) -> list[pathlib.Path]:
  """Every Python file of the repository as git lists it: tracked, or new and not ignored.
  Never what git ignores: build outputs (``build/lib/`` of a ``pip install .``, the docs'
  build), virtualenvs, caches."""
  listed = subprocess.run(
      ['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard', '--', '*.py'],
      cwd=root,
      capture_output=True,
      text=True,
  )
  assert listed.returncode == 0, f'this test reads a git checkout: {listed.stderr}'
  return sorted(p for p in (root / n for n in listed.stdout.split('\0') if n) if p.is_file())


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int, int]]:
  """``[(name, first line, length)]`` of the functions longer than ``limit`` lines."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = node.end_lineno - node.lineno + 1
      if length > limit:
        out.append((node.name, node.lineno, length))
  return out


def _is_task(node: ast.AST) -> bool:
  """``<x>.task``, ``<x>.get('task', ...)`` or ``<x>['task']``."""
  if isinstance(node, ast.Attribute):
    return node.attr == 'task'
  if isinstance(node, ast.Subscript):
    return isinstance(node.slice, ast.Constant) and node.slice.value == 'task'
  return _is_get_task(node)


def _is_get_task(node: ast.AST) -> bool:
  """``<x>.get('task', ...)``."""
  return (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == 'get'
      and bool(node.args)
      and isinstance(node.args[0], ast.Constant)
      and node.args[0].value == 'task'
  )


def _reads_task_entry(node: ast.AST) -> bool:
  """A config reader given the entry ``'task'``: ``read_choice(config, 'task', ...)``,
  ``lookup(config, 'task')``, ``config_readers.read_str(config, 'task')``."""
  if not isinstance(node, ast.Call) or len(node.args) < 2:
    return False
  func = node.func
  name = func.attr if isinstance(func, ast.Attribute) else getattr(func, 'id', '')
  entry = node.args[1]
  return (
      (name == 'lookup' or name.startswith('read_'))
      and isinstance(entry, ast.Constant)
      and entry.value == 'task'
  )


def task_comparisons(source: str) -> list[int]:
  """The lines that decide by a config's task: compare it (``==``, ``!=``, ``in``,
  ``not in``), look something up by it, ``.get('task', ...)`` it, or read the entry
  ``'task'`` with a config reader."""
  lines = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare) and any(
        _is_task(side) for side in [node.left, *node.comparators]
    ):
      lines.add(node.lineno)
    elif isinstance(node, ast.Subscript) and _is_task(node.slice):
      lines.add(node.lineno)
    elif _is_get_task(node) or _reads_task_entry(node):
      lines.add(node.lineno)
  return sorted(lines)


def test_the_repository_scan_skips_what_git_ignores(tmp_path):
  """What a non-editable ``pip install .`` leaves in a checkout (``build/lib/``,
  ``*.egg-info/``), ignored by this repository's .gitignore, is not scanned; a new file
  not yet added to git is."""
  (tmp_path / '.gitignore').write_text((REPO / '.gitignore').read_text())
  for name in ('a.py', 'new.py', 'build/lib/contextpool_jax/tasks.py', 'x.egg-info/b.py'):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text('x = 1\n')
  git = lambda *argv: subprocess.run(['git', *argv], cwd=tmp_path, check=True, capture_output=True)
  git('init', '-q')
  git('add', 'a.py', '.gitignore')
  assert [p.name for p in _repository_sources(tmp_path)] == ['a.py', 'new.py']


def test_the_checks_see_the_package():
  sources = _sources()
  assert REGISTRY in sources and REPO / 'train.py' in sources and len(sources) > 30
  everything = _repository_sources()
  for part in ('benchmarks', 'configs', 'tests'):
    assert any(p.relative_to(REPO).parts[0] == part for p in everything), part


@pytest.mark.parametrize('path', _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_is_longer_than_the_limit(path):
  found = long_functions(path.read_text())
  assert not found, f'{path.relative_to(REPO)}: functions over {MAX_LINES} lines: {found}'


@pytest.mark.parametrize(
    'path',
    [p for p in _repository_sources() if p != REGISTRY],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_only_the_registry_compares_the_task(path):
  found = task_comparisons(path.read_text())
  assert not found, (
      f'{path.relative_to(REPO)}: lines {found} compare config.task; the decision belongs '
      'to the task kind in contextpool_jax/training/tasks.py'
  )


def test_the_checks_can_fail():
  body = ''.join(f'  x = {i}\n' for i in range(MAX_LINES))
  assert long_functions(f'def f():\n{body}') == [('f', 1, MAX_LINES + 1)]
  assert long_functions(f'def f():\n{body[: -len("  x = 79")- 1]}') == []
  chain = (
      "if config.task == 'lm':\n  pass\n"
      "elif 'translation' != cfg.task:\n  pass\n"
      "ok = config.get('task', 'lm') in ('lm',)\n"
      'fine = config.task\n'
      "task = config.get('task', 'lm')\n"
      'run = RUNNERS[config.task]\n'
      "kind = config_readers.read_choice(config, 'task', KINDS)\n"
      "if config['task'] in ('lm',):\n  pass\n"
      'also_fine = setup.task.model\n'
  )
  assert task_comparisons(chain) == [1, 3, 5, 7, 8, 9, 10]


# Modules without a test file of their own, and why (CONTRIBUTING.md, "The tests mirror the
# package"). The layer packages have one file for the package (LAYER_PACKAGES).
WITHOUT_TEST_FILE = {
    'runs/layout.py': 'file names only',
    'commands/viz.py': "tests/commands/test_sample.py (the tools' file is test_viz.py)",
}
LAYER_PACKAGES = {
    'layers/context_pool': 'tests/layers/test_context_pool.py',
    'layers/area_attention': 'tests/layers/test_area_attention.py',
}


def test_every_module_has_its_test_file():
  """``contextpool_jax/<room>/<module>.py`` is tested in ``tests/<room>/test_<module>.py``."""
  package = REPO / 'contextpool_jax'
  missing = []
  for path in sorted(package.rglob('*.py')):
    rel = path.relative_to(package)
    if path.name == '__init__.py' or rel.as_posix() in WITHOUT_TEST_FILE:
      continue
    owner = LAYER_PACKAGES.get(rel.parent.as_posix())
    expected = owner or f'tests/{rel.parts[0]}/test_{path.stem}.py'
    if not (REPO / expected).is_file():
      missing.append(f'{rel} -> {expected}')
  assert not missing, missing
  assert all((package / m).is_file() for m in WITHOUT_TEST_FILE)  # the list stays current
