"""The package's import graph: rooms, imports only downward, no cycle.

``docs/architecture.md`` (section *Rooms*) is the one statement of the rooms and what each may
import: a table, bottom room first, each row naming the rooms it may import, all of them above
it. This test reads that table and checks every import of ``contextpool_jax/`` against it:

* every module belongs to exactly one room;
* a room may import only rooms listed before it in the table (so the declared rooms have no
  cycle), and every import (at the top of a file or inside a function) goes to its own room or
  to one its row names;
* no module imports itself through others (no cycle between modules, packages' ``__init__``
  included);
* config files (``configs/``) import only the standard library, ``ml_collections`` and each
  other (relatively: ``from . import common``).

These can fail: the tests at the end run the checks on small graphs that break them.
"""

import ast
import collections
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / 'contextpool_jax'
ARCHITECTURE = REPO / 'docs' / 'architecture.md'
ROOT = 'contextpool_jax'


# ----------------------------------------------------------------------------
# The rooms, from the architecture page.
# ----------------------------------------------------------------------------


def read_rooms(page: str) -> dict[str, tuple[list[str], list[str]]]:
  """``{room: (module entries, rooms it may import)}`` in the table's order, from the
  first table after ``## Rooms``: entries are the backticked names of its second column
  outside parentheses (``errors``, ``layers/``, ``__init__``), rooms the words of its
  third (``-``: none)."""
  section = re.split(r'^## Rooms\n', page, maxsplit=1, flags=re.M)[1]
  section = re.split(r'^## ', section, maxsplit=1, flags=re.M)[0]
  rows = [line for line in section.splitlines() if line.startswith('|')][2:]  # no header
  rooms = {}
  for row in rows:
    room, modules, allowed = [cell.strip() for cell in row.strip('|').split('|')]
    entries = re.findall(r'`([^`]+)`', re.sub(r'\([^)]*\)', '', modules))
    allowed = [] if allowed == '-' else [a.strip() for a in allowed.split(',')]
    rooms[room] = (entries, allowed)
  return rooms


def room_of(module: str, rooms: dict) -> list[str]:
  """The rooms whose entries hold ``module`` (``contextpool_jax.layers.pool`` is in the
  room of ``layers/``; ``contextpool_jax`` itself in the room of ``__init__``)."""
  name = module[len(ROOT) + 1 :] if module != ROOT else '__init__'
  out = []
  for room, (entries, _) in rooms.items():
    for entry in entries:
      package = entry.rstrip('/')
      if name == entry or (
          entry.endswith('/') and (name == package or name.startswith(package + '.'))
      ):
        out.append(room)
  return out


def undeclared_rooms(rooms: dict) -> list[str]:
  """Rows that may import a room which is not listed before them."""
  seen, bad = set(), []
  for room, (_, allowed) in rooms.items():
    bad += [f'{room} -> {a}' for a in allowed if a not in seen]
    seen.add(room)
  return bad


# ----------------------------------------------------------------------------
# The imports of the package.
# ----------------------------------------------------------------------------


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix('').parts)
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def package_modules() -> dict[str, pathlib.Path]:
  return {module_name(p): p for p in sorted(PACKAGE.rglob('*.py'))}


def imports(source: str, modules) -> set[str]:
  """The package modules ``source`` imports, anywhere in it: ``from a.b import c`` is
  ``a.b.c`` if that is a module, else ``a.b`` (or its nearest enclosing module)."""

  def enclosing(name: str) -> str:
    while name and name not in modules:
      name = name.rpartition('.')[0]
    return name

  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found |= {enclosing(a.name) for a in node.names if a.name.split('.')[0] == ROOT}
    elif isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == ROOT:
      for a in node.names:
        full = f'{node.module}.{a.name}'
        found.add(full if full in modules else enclosing(node.module))
  return found


def import_graph() -> dict[str, set[str]]:
  modules = package_modules()
  return {m: imports(p.read_text(), modules) - {m} for m, p in modules.items()}


def undeclared_imports(graph: dict[str, set[str]], rooms: dict) -> list[str]:
  """``'a -> b (room x -> room y)'`` for every import outside its room's row."""
  bad = []
  for module, targets in graph.items():
    (room,) = room_of(module, rooms)
    for target in sorted(targets):
      (other,) = room_of(target, rooms)
      if other != room and other not in rooms[room][1]:
        bad.append(f'{module} -> {target} (room {room} -> room {other})')
  return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan's algorithm)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph.get(node, ())):
      if nxt not in index:
        visit(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      component = []
      while True:
        top = stack.pop()
        on_stack.discard(top)
        component.append(top)
        if top == node:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return out


# ----------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------

ROOMS = read_rooms(ARCHITECTURE.read_text())
GRAPH = import_graph()


def test_the_page_declares_rooms_and_the_package_has_modules():
  assert len(ROOMS) >= 8 and 'training' in ROOMS and 'layers' in ROOMS
  assert len(GRAPH) > 60 and sum(len(t) for t in GRAPH.values()) > 100


def test_every_entry_of_the_table_is_a_module_or_package():
  modules = set(GRAPH)
  for room, (entries, _) in ROOMS.items():
    for entry in entries:
      name = ROOT if entry == '__init__' else f'{ROOT}.{entry.rstrip("/").replace("/", ".")}'
      assert name in modules, f'room {room}: {entry} is not a module of contextpool_jax/'


def test_a_room_imports_only_rooms_above_it_in_the_table():
  assert not undeclared_rooms(ROOMS)


@pytest.mark.parametrize('module', sorted(GRAPH))
def test_every_module_is_in_one_room(module):
  assert len(room_of(module, ROOMS)) == 1, (module, room_of(module, ROOMS))


def test_every_import_is_declared():
  bad = undeclared_imports(GRAPH, ROOMS)
  assert not bad, 'imports the Rooms table of docs/architecture.md does not allow:\n' + '\n'.join(
      bad
  )


def test_no_module_imports_itself_through_others():
  assert not cycles(GRAPH)


def test_rooms_of_packages_have_no_cycle():
  """The packages and top-level modules (``layers``, ``training``, ``workdirs``, ...)."""
  top = lambda m: '.'.join(m.split('.')[:2])
  graph = collections.defaultdict(set)
  for module, targets in GRAPH.items():
    graph[top(module)] |= {top(t) for t in targets if top(t) != top(module) and t != ROOT}
  assert not cycles(graph)


@pytest.mark.parametrize('path', sorted((REPO / 'configs').glob('*.py')), ids=lambda p: p.name)
def test_config_files_import_only_ml_collections_and_configs(path):
  allowed = {'ml_collections', *sys.stdlib_module_names}
  for node in ast.walk(ast.parse(path.read_text())):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      # Each other only relatively (`from . import common`): configs/ is the package `configs`
      # in a checkout and `contextpool_jax.configs` installed.
      names = [] if node.level else [node.module]
    for name in names:
      assert name.split('.')[0] in allowed, f'{path.name} imports {name}'


def test_the_checks_can_fail():
  page = (
      '## Rooms\n\n| Room | Modules | May import |\n| --- | --- | --- |\n'
      '| low | `base/`, `layers/` (the layers) | - |\n'
      '| high | `training/` | low |\n'
      '| odd | `viz` | later |\n| later | `sample` | - |\n\n## Next\n'
  )
  rooms = read_rooms(page)
  assert rooms['low'] == (['base/', 'layers/'], [])
  assert undeclared_rooms(rooms) == ['odd -> later']
  assert room_of('contextpool_jax.layers.context_pool.pool', rooms) == ['low']
  assert room_of('contextpool_jax.layer_norm', rooms) == []
  graph = {
      'contextpool_jax.layers.a': {'contextpool_jax.training.b'},  # upward
      'contextpool_jax.training.b': {'contextpool_jax.base.errors'},
      'contextpool_jax.base.errors': set(),
  }
  assert undeclared_imports(graph, rooms) == [
      'contextpool_jax.layers.a -> contextpool_jax.training.b (room low -> room high)'
  ]
  graph['contextpool_jax.base.errors'] = {'contextpool_jax.layers.a'}
  assert cycles(graph) == [
      ['contextpool_jax.base.errors', 'contextpool_jax.layers.a', 'contextpool_jax.training.b']
  ]
  modules = {'contextpool_jax', 'contextpool_jax.data', 'contextpool_jax.data.lm_input'}
  source = (
      'from contextpool_jax.data import lm_input, DataError\n'
      'def f():\n  import contextpool_jax.data.lm_input.x\n'
  )
  assert imports(source, modules) == {'contextpool_jax.data.lm_input', 'contextpool_jax.data'}
