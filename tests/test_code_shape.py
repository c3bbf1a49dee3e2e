"""The package's shape: no long functions, and one owner of the task-kind decisions.

* No function or method of ``contextpool_jax/`` or ``train.py`` is longer than
  :data:`MAX_LINES` lines (``end_lineno - lineno + 1`` of its ``def``, decorators
  excluded): a longer one does several things; split it into functions named for
  what each does.
* ``config.task`` (or any ``<x>.task``, or ``<x>.get('task', ...)``) is compared in
  one module only, the task registry ``contextpool_jax/training/tasks.py``: every
  decision that depends on the kind of experiment (data, objective, evaluators,
  hooks, init batch) belongs to its entry there.

These can fail: the tests at the end run the checks on small sources that break them.
"""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / 'contextpool_jax'
REGISTRY = PACKAGE / 'training' / 'tasks.py'
MAX_LINES = 80


def _sources() -> list[pathlib.Path]:
  return sorted(PACKAGE.rglob('*.py')) + [REPO / 'train.py']


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
  """``<x>.task`` or ``<x>.get('task', ...)``."""
  if isinstance(node, ast.Attribute):
    return node.attr == 'task'
  return (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == 'get'
      and bool(node.args)
      and isinstance(node.args[0], ast.Constant)
      and node.args[0].value == 'task'
  )


def task_comparisons(source: str) -> list[int]:
  """The lines that compare a config's task (``==``, ``!=``, ``in``, ``not in``)."""
  lines = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare) and any(
        _is_task(side) for side in [node.left, *node.comparators]
    ):
      lines.append(node.lineno)
  return sorted(lines)


def test_the_checks_see_the_package():
  sources = _sources()
  assert REGISTRY in sources and REPO / 'train.py' in sources and len(sources) > 30


@pytest.mark.parametrize('path', _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_is_longer_than_the_limit(path):
  found = long_functions(path.read_text())
  assert not found, f'{path.relative_to(REPO)}: functions over {MAX_LINES} lines: {found}'


@pytest.mark.parametrize(
    'path', [p for p in _sources() if p != REGISTRY], ids=lambda p: str(p.relative_to(REPO))
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
  )
  assert task_comparisons(chain) == [1, 3, 5]
