"""Every command and snippet users copy runs as written: the pages (README.md, CONTRIBUTING.md,
docs/**/*.md), the notebooks' prose and the package's docstrings.

What is collected
-----------------
* The pages (``PAGES``): every fenced block. Its info string is ``python`` or ``bash`` (code: it
  runs unless marked ``skip``) or ``text`` (a diagram or a listing: not code); any other, or none,
  fails. (Their links are checked in tests/repo/test_docs.py.)
* Docstrings (``contextpool_jax/**/*.py`` and ``train.py``): ``>>>`` examples, run by doctest;
  indented command lines (``python ...``, ``\\`` continuations), run like the pages'. A
  docstring cannot hold a marker, so the commands it cannot run are listed in
  ``DOCSTRING_SKIPS`` below, with their reasons. Decision: Python in a docstring is written as
  ``>>>`` examples (doctest form: a result shown is a result checked), so docstrings hold no
  other Python code to extract.
* Inline commands: code spans of the pages' prose, of the notebooks' markdown cells and of docstrings
  (````...````) that start with a program of ``PROGRAMS``. They are checked, not run (they are
  fragments of prose: placeholders such as ``W``, ``DIR``, ``<file>``, or hours of benchmarks),
  except the TensorBoard viewer, which is started on a free port and asked for the curves. (The
  notebooks' code cells run in tests/repo/test_notebooks.py.)

Every command (run, skipped or inline) is also checked statically, cheaply: its program is
installed next to this Python (what ``requirements.txt`` installs); a ``python`` script or module
exists and defines each ``--flag`` the command passes; ``--config FILE[:ARG]`` builds and each
``--config.<key>`` names a field of it; ``python -c`` code compiles and its imports resolve.

Markers (in a page: an HTML comment right before a fenced block; several may precede one block)
----------------------------------------------------------------------------------------------
``<!-- readme-test: skip REASON -->``
    The block is not run. ``SKIPPED`` below lists every skipped block with its reason, and the
    pages must agree with it exactly: a new block that cannot run fails until it is marked, and a
    skip cannot creep in silently. Each is a test that checks its commands statically (programs,
    modules, flags, configs; see ``check_command``) and does not run them.
``<!-- readme-test: shrink -->``
    The block's training commands (``train.py``, directly or through the launcher) run at toy
    size: ``TINY_TRAIN`` is appended (a few steps, a tiny model, 64 KiB of the corpus, the TFDS
    data in the temporary directory). Nothing else in a command is changed.
There is no hidden set-up: a block runs as a reader copies it, its inputs defined in it (a
``given`` marker, which ran hidden lines before a block, is an error).
``<!-- readme-test: check CODE -->``
    Python run after a Python block, in its namespace: calls what the block defines and checks
    what its comments promise (shapes, counts).

How it runs
-----------
* ``/tmp/...`` and ``/path/to/...`` become paths in the test's temporary directory.
* ``/tmp/wmt`` (a translation workdir, which needs the downloaded WMT data to train) is the small
  translation workdir of ``tests/helpers.py`` (``translation_workdir``).
* Shell commands run without a shell, from the repository root, ``python`` and the tools found
  next to this Python first on ``PATH``; one that needs a shell (``&&``, ``|``, ``$VAR``) fails,
  asking for a skip marker. A docstring command a page runs too (same words) runs once.
* Python blocks run in this process, each in a fresh namespace, compiled with the page's file
  name and line numbers, so a traceback points at the page's line.
* Everything that shares a ``/tmp/`` path with something else (the trained ``/tmp/cp``, its
  export, ``/tmp/wmt``) runs in order in one test (``test_readme_session``): the pages' blocks
  (README.md first, so its default run trains the ``/tmp/cp`` the others read),
  then the docstrings' commands, the inline TensorBoard command and the doctests;
  a shrunk ``train.py`` command there runs 2 steps, then again to 4 steps, which must resume
  ("Re-running with the same --workdir resumes"). Everything else runs in its own test.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import functools
import importlib
import importlib.util
import json
import os
import pathlib
import pkgutil
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request

import pytest

from conftest import PAGES
from conftest import REPO
from helpers import TINY_TRAIN
from helpers import translation_workdir  # pylint: disable=unused-import  # a fixture
from pages import Block
from pages import markdown_blocks
from pages import MarkupError

pytestmark = pytest.mark.slow  # runs the pages' commands

NOTEBOOKS = sorted((REPO / 'notebooks').glob('*.ipynb'))
DOCSTRING_FILES = sorted((REPO / 'contextpool_jax').rglob('*.py')) + [REPO / 'train.py']
BIN = pathlib.Path(sys.executable).parent

# Blocks skipped by design: the reason their marker gives -> how the block's first line starts.
SKIPPED = {
    'a fresh virtualenv and install: CI (.ci/run) runs exactly this '
    '(test_install_line_is_what_ci_runs)': 'python3.12 -m venv .venv',
    'installs an accelerator build of JAX: needs an NVIDIA GPU or a Cloud TPU VM': (
        'pip install -U "jax[cuda12]'
    ),
    "Colab only (IPython ! and a git clone of REPO_URL); the notebooks' first cell does this, "
    'and tests/repo/test_notebooks.py runs it from the checkout': "REPO_URL = ''",
    'the test suite itself (CI runs it: .ci/run)': 'pip install -r requirements-dev.txt',
    'the documentation build itself: tests/repo/test_docs.py runs this command '
    '(test_the_docs_build_strictly)': 'python -m sphinx -W',
    'needs a Cloud TPU pod or a GPU cluster': '# Cloud TPU pod',
    'needs the Hugging Face Hub (the network); tests/runs/test_hub.py loads an export '
    'from an offline Hub cache': 'from huggingface_hub import upload_folder',
    'minutes of benchmarks (the full tables are for a GPU/TPU); tests/benchmarks/test_benchmarks.py runs '
    'the harness on tiny tables': 'python -m benchmarks --quick',
    "removes an earlier build's leftovers from the checkout: tests/repo/test_packaging.py runs it "
    'on a copy with leftovers (test_an_earlier_builds_leftovers_ship_unless_cleaned_as_the_docs_say)': (
        'rm -rf build'
    ),
    'rewrites the stored notebooks from real-size runs (minutes each); tests/repo/test_notebooks.py '
    'checks the stored outputs and executes copies smoke-sized': 'python notebooks/execute.py',
    'compiles the 12-layer LM at 32k twice (20 s on a 2-core CPU); '
    'tests/training/test_aot.py::test_the_paper_lm_evaluates_32k_bytes_on_one_v5e_chip_with_the_kernel '
    'compiles the same': 'contextpool-compile --config enwik8:stage1',
    'the default LM compiled for 8 GPUs; '
    'tests/training/test_aot.py::test_tasks_compile_for_eight_gpus compiles the same '
    'config': 'contextpool-compile --config default --topology h100:8',
}

# Docstring commands skipped by design: (file, the command's first words) -> reason.
DOCSTRING_SKIPS = {
    (
        'contextpool_jax/commands/train.py',
        'python train.py --config configs/enwik8.py:stage1',
    ): 'downloads enwik8',
    ('contextpool_jax/data/text_builders.py', 'python -c'): 'downloads enwik8',
}

# Appended to the training commands of blocks marked `shrink`: helpers.TINY_TRAIN.
TINY_STEPS = 4  # a shrunk train.py command in the session first runs half of them, then resumes

# The package's console scripts (pyproject.toml): program -> the module whose flags it takes.
# Checked statically (they are installed by `pip install .`, not by requirements.txt).
SCRIPTS = {
    program: entry.split(':')[0]
    for program, entry in tomllib.loads((REPO / 'pyproject.toml').read_text())['project'][
        'scripts'
    ].items()
}
# A code span that starts with one of these is a command.
PROGRAMS = ('python', 'python3', 'pip', 'tensorboard', 'tfds', 'pyink', 'pytest', *SCRIPTS)
ABSL_FLAGS = {
    'help',
    'helpfull',
    'helpshort',
    'flagfile',
    'logtostderr',
    'alsologtostderr',
    'v',
    'verbosity',
}
# Paths a command names that stand for the user's own: /tmp/... and /path/to/... .
USER_PATH = re.compile(r'(?<![\w.])/(?:tmp|path/to)/')
# Paths made for the session, not by a command: the pages' path -> fixture.
PREPARED = {'/tmp/wmt': 'translation_workdir'}


# ----------------------------------------------------------------------------
# Extraction.
# ----------------------------------------------------------------------------


def shell_commands(code: str) -> list[str]:
  """A shell block's commands: blank and comment lines dropped, continuations joined (a trailing
  backslash, or a quote still open at the end of the line)."""
  commands, current = [], ''
  for line in code.splitlines():
    if not current and (not line.strip() or line.lstrip().startswith('#')):
      continue
    current = f'{current}\n{line}' if current else line
    if current.endswith('\\'):
      continue
    try:
      shlex.split(current.replace('\\\n', ' '), comments=True)
    except ValueError:  # an open quote
      continue
    commands.append(current.replace('\\\n', ' '))
    current = ''
  if current:
    raise MarkupError(f'an unfinished command: {current!r}')
  return commands


def words(command: str) -> list[str]:
  """A command's words as a POSIX shell splits them (comments dropped); ``&&``, ``||``, ``;``
  and ``|`` are words of their own."""
  lexer = shlex.shlex(command, posix=True, punctuation_chars='&;|')
  lexer.whitespace_split = True
  return list(lexer)


def split_operators(argv: list[str]) -> list[list[str]]:
  """``a && b; c | d`` -> [a, b, c, d]."""
  out = [[]]
  for token in argv:
    if token in ('&&', '||', ';', '|'):
      out.append([])
    else:
      out[-1].append(token)
  return [a for a in out if a]


def inline_commands(text: str, delimiter: str = '`') -> list[str]:
  """Code spans that start with a program of PROGRAMS, whitespace normalised."""
  d = re.escape(delimiter)
  spans = re.findall(rf'(?<!`){d}(?!`)(.+?)(?<!`){d}(?!`)', text, re.S)
  out = []
  for span in spans:
    span = ' '.join(span.split())
    if span.split(' ', 1)[0] in PROGRAMS:
      out.append(span)
  return out


def markdown_prose(text: str) -> str:
  """The text outside fenced blocks and HTML comments."""
  text = re.sub(r'<!--.*?-->', '', text, flags=re.S)
  return re.sub(r'^```.*?^```[^\n]*$', '', text, flags=re.S | re.M)


def _docstrings(path: pathlib.Path):
  tree = ast.parse(path.read_text())
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc:
        # The docstring's first line in the file (the string node's line, plus the opening
        # quotes' line).
        yield node.body[0].lineno, doc


def docstring_commands(path: pathlib.Path) -> list[Block]:
  """Indented ``python ...`` lines of a file's docstrings (with ``\\`` continuations)."""
  rel = path.relative_to(REPO).as_posix()
  out = []
  for first, doc in _docstrings(path):
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
      stripped = lines[i].lstrip()
      if lines[i][:1] == ' ' and stripped.split(' ', 1)[0] in ('python', 'python3'):
        start, command = i, stripped
        while command.endswith('\\') and i + 1 < len(lines):
          i += 1
          command = command[:-1].rstrip() + ' ' + lines[i].strip()
        out.append(Block(rel, first + start, 'bash', command))
      i += 1
  return out


def docstring_inline_commands(path: pathlib.Path) -> list[str]:
  return [c for _, doc in _docstrings(path) for c in inline_commands(doc, '``')]


def notebook_inline_commands(path: pathlib.Path) -> list[str]:
  cells = json.loads(path.read_text())['cells']
  return [
      c
      for cell in cells
      if cell['cell_type'] == 'markdown'
      for c in inline_commands(markdown_prose(''.join(cell['source'])))
  ]


def skipped_by_design(blocks: list[Block]) -> list[tuple[str, str]]:
  """(reason, first line) of each block marked skip."""
  return [(b.marker('skip'), b.first_line) for b in blocks if b.marker('skip') is not None]


def skips_agree(found: list[tuple[str, str]]) -> bool:
  """The skipped blocks are exactly SKIPPED's: the same reasons, each once, on its block."""
  return sorted(r for r, _ in found) == sorted(SKIPPED) and all(
      line.startswith(SKIPPED[reason]) for reason, line in found
  )


def _rel(page: pathlib.Path) -> str:
  return page.relative_to(REPO).as_posix()


def page_blocks() -> list[Block]:
  """Every page's fenced blocks, page by page in ``PAGES`` order."""
  return [b for page in PAGES for b in markdown_blocks(page.read_text(), _rel(page))]


def doc_blocks() -> list[Block]:
  return [b for path in DOCSTRING_FILES for b in docstring_commands(path)]


def docstring_skip(block: Block) -> str | None:
  for (file, prefix), reason in DOCSTRING_SKIPS.items():
    if block.file == file and block.code.startswith(prefix):
      return reason
  return None


# ----------------------------------------------------------------------------
# Static checks: programs, modules, flags, configs.
# ----------------------------------------------------------------------------


def _defined_flags(path: pathlib.Path) -> set[str]:
  if path == REPO / 'train.py':  # the checkout's entry point of the training command
    path = REPO / 'contextpool_jax' / 'commands' / 'train.py'
  source = path.read_text()
  absl = re.findall(r'DEFINE_\w+\(\s*[\'"](\w+)[\'"]', source)
  argparse = re.findall(r'add_argument\(\s*[\'"]--([\w-]+)[\'"]', source)
  return set(absl) | set(argparse)


def _project_file(module: str) -> pathlib.Path | None:
  """The file ``python -m module`` runs, if the module is this repository's."""
  if module.split('.')[0] not in ('contextpool_jax', 'benchmarks', 'configs'):
    return None
  base = REPO / module.replace('.', '/')
  for candidate in (base.with_suffix('.py'), base / '__main__.py'):
    if candidate.is_file():
      return candidate
  raise AssertionError(f'python -m {module}: no such module in the repository')


def _check_config(value: str, overrides: list[str]) -> None:
  """``--config configs/x.py[:arg]`` builds; each ``--config.<key>`` is one of its fields."""
  if re.search(r'[<\[$]', value):  # a placeholder
    return
  path, _, arg = value.partition(':')
  if re.fullmatch(r'\w+', path):  # a config of the package by name: its source in configs/
    path = f'configs/{path}.py'
  assert (REPO / path).is_file(), f'--config {value}: no file {path}'
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  # What train.py starts from.
  config = command_line.load_config_file(str(REPO / path) + (f':{arg}' if ':' in value else ''))
  for key in overrides:
    node = config
    for part in key.split('.'):
      assert hasattr(node, 'keys') and part in node, f'--config.{key}: no such field in {value}'
      node = node[part]


def _check_flags(argv: list[str], file: pathlib.Path, command: str) -> None:
  defined = _defined_flags(file)
  config_value, overrides = None, []
  for i, token in enumerate(argv):
    if not token.startswith('--') or '<' in token:
      continue
    name, eq, value = token[2:].partition('=')
    if name.startswith('config.'):
      overrides.append(name[len('config.') :])
      name = 'config'
    elif name == 'config':
      config_value = value if eq else (argv[i + 1] if i + 1 < len(argv) else '')
    ok = name in defined | ABSL_FLAGS or (name.startswith('no') and name[2:] in defined)
    assert ok, f'{command!r}: --{name} is not a flag of {file.relative_to(REPO)}'
  if config_value is not None:
    _check_config(config_value, overrides)
  else:
    assert not overrides, f'{command!r}: --config.<key> without --config'


def _check_python_c(code: str, command: str) -> None:
  tree = compile(code, '<python -c>', 'exec', ast.PyCF_ONLY_AST)
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      module = importlib.import_module(node.module)
      for a in node.names:
        try:  # a submodule
          aliases[a.asname or a.name] = importlib.import_module(f'{node.module}.{a.name}')
        except ImportError:
          assert hasattr(module, a.name), f'{command!r}: no {a.name} in {node.module}'
          aliases[a.asname or a.name] = getattr(module, a.name)
    elif isinstance(node, ast.Import):
      for a in node.names:
        aliases[a.asname or a.name] = importlib.import_module(a.name)
  for node in ast.walk(tree):
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
    ):
      assert hasattr(
          aliases[node.value.id], node.attr
      ), f'{command!r}: {node.value.id}.{node.attr} does not exist'


def check_command(command: str) -> None:
  """The static check of one command (see the module docstring); raises AssertionError."""
  for argv in split_operators(words(command)):
    program = argv[0]
    if program not in PROGRAMS:
      continue  # a shell builtin or another machine's tool: only in skipped blocks
    if program in SCRIPTS:
      _check_flags(argv[1:], _project_file(SCRIPTS[program]), command)
      continue
    found = shutil.which(program, path=f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}')
    assert found, f'{command!r}: {program} is not installed (requirements.txt should install it)'
    if program not in ('python', 'python3') or len(argv) < 2:
      continue
    if argv[1] == '-c':
      _check_python_c(argv[2], command)
      continue
    if argv[1] == '-m':
      module, args = argv[2], argv[3:]
      assert importlib.util.find_spec(module.split('.')[0]), f'{command!r}: no module {module}'
      file = _project_file(module)
      if file is None:
        assert importlib.util.find_spec(module), f'{command!r}: no module {module}'
        continue
    else:
      file, args = REPO / argv[1], argv[2:]
      assert file.is_file(), f'{command!r}: no script {argv[1]}'
    if file.name == 'launch.py' and '--' in args:  # the launcher passes the rest to train.py
      split = args.index('--')
      _check_flags(args[:split], file, command)
      _check_flags(args[split + 1 :], REPO / 'train.py', command)
    else:
      _check_flags(args, file, command)


# ----------------------------------------------------------------------------
# Running.
# ----------------------------------------------------------------------------


def user_paths(text: str, tmp: pathlib.Path) -> str:
  """/tmp/x and /path/to/x -> <tmp>/tmp/x and <tmp>/path/to/x."""
  return USER_PATH.sub(lambda m: f'{tmp}{m.group(0)}', text)


def tmp_paths(text: str) -> set[str]:
  return set(re.findall(r'(?<![\w.])/tmp/[\w.-]+', text))


def is_training(argv: list[str]) -> bool:
  return len(argv) > 1 and (
      argv[1] == 'train.py' or argv[1:3] == ['-m', 'contextpool_jax.commands.launch']
  )


def tiny_flags(tmp: pathlib.Path, steps: int) -> list[str]:
  flags = {'num_train_steps': steps, **TINY_TRAIN}
  return [f'--config.{k}={str(v).format(tmp=tmp)}' for k, v in flags.items()]


def run_argv(argv: list[str], where: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PATH=f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}')
  out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, (
      f'{where}: {shlex.join(argv)} exited with {out.returncode}\n'
      f'{out.stdout[-3000:]}\n{out.stderr[-5000:]}'
  )
  return out


def run_shell_block(block: Block, tmp: pathlib.Path, session: bool = False) -> list[str]:
  """Runs a bash block's commands; returns what each printed."""
  shrink = block.marker('shrink') is not None
  shrunk, outputs = False, []
  for command in shell_commands(block.code):
    check_command(command)
    argv = words(user_paths(command, tmp))
    if len(split_operators(argv)) > 1 or any('$' in a for a in argv):
      raise AssertionError(f'{block.where}: {command!r} needs a shell; mark the block skip')
    if shrink and is_training(argv):
      shrunk = True
      if session and argv[1] == 'train.py':  # train, then re-run: it must resume
        run_argv(argv + tiny_flags(tmp, TINY_STEPS // 2), block.where)
        out = run_argv(argv + tiny_flags(tmp, TINY_STEPS), block.where)
        assert (
            f'at step {TINY_STEPS // 2}.' in out.stdout and 'Resumed from' in out.stdout
        ), f'{block.where}: the re-run did not resume:\n{out.stdout[-2000:]}'
      else:
        out = run_argv(argv + tiny_flags(tmp, TINY_STEPS), block.where)
    else:
      out = run_argv(argv, block.where)
    outputs.append(out.stdout)
  if shrink and not shrunk:
    raise MarkupError(f'{block.where}: marked shrink, but it runs no training command')
  return outputs


def run_python_block(block: Block, tmp: pathlib.Path) -> dict:
  """Runs a Python block (then its check) in a fresh namespace, as a reader who copies it
  runs it; returns the namespace."""
  namespace = {'__name__': '__readme__'}
  parts = [(None, block.code), (block.markers.get('check'), None)]
  for marker, code in parts:
    if marker is None and code is None:
      continue
    line = marker.line if marker else block.line
    source = user_paths(marker.text if marker else code, tmp)
    exec(compile('\n' * (line - 1) + source, block.file, 'exec'), namespace)  # pylint: disable=exec-used
  return namespace


def run_block(block: Block, tmp: pathlib.Path, session: bool = False):
  if block.lang == 'python':
    return run_python_block(block, tmp)
  if block.lang == 'bash':
    return run_shell_block(block, tmp, session)
  raise AssertionError(f'{block.where}: nothing to run in a {block.lang} block')


@functools.cache
def doctests() -> dict[str, doctest.DocTest]:
  """The ``>>>`` examples of every contextpool_jax module, by name."""
  import contextpool_jax  # pylint: disable=g-import-not-at-top

  finder = doctest.DocTestFinder(exclude_empty=True)
  tests = {}
  for info in pkgutil.walk_packages(contextpool_jax.__path__, 'contextpool_jax.'):
    spec = importlib.util.find_spec(info.name)
    if '>>>' not in pathlib.Path(spec.origin).read_text():
      continue  # imported only if it has examples (importing launch.py defines absl flags)
    module = importlib.import_module(info.name)
    for t in finder.find(module):
      if t.examples and t.name.startswith(info.name):
        tests[t.name] = t
  return dict(sorted(tests.items()))


def run_doctest(test: doctest.DocTest, tmp: pathlib.Path) -> None:
  """Runs a doctest with its paths moved into ``tmp`` (in the sources and the results)."""
  examples = [
      doctest.Example(
          user_paths(e.source, tmp),
          user_paths(e.want, tmp),
          e.exc_msg,
          e.lineno,
          e.indent,
          e.options,
      )
      for e in test.examples
  ]
  test = doctest.DocTest(
      examples, dict(test.globs), test.name, test.filename, test.lineno, test.docstring
  )
  report = []
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  runner.run(test, out=report.append)
  assert not runner.failures, ''.join(report)


def tensorboard_serves(command: str, tmp: pathlib.Path, logdir_tag: str = 'train/loss') -> None:
  """Starts the viewer as written, on a free port of 127.0.0.1; the scalars it lists must include
  the training loss. Stops it."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  argv = words(user_paths(command, tmp)) + ['--host', '127.0.0.1', '--port', str(port)]
  argv[0] = str(BIN / argv[0]) if (BIN / argv[0]).exists() else shutil.which(argv[0])
  process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    url = f'http://127.0.0.1:{port}/data/plugin/scalars/tags'
    tags, deadline = '', time.monotonic() + 120  # a guard against a hang, not a timing
    while logdir_tag not in tags and process.poll() is None and time.monotonic() < deadline:
      try:
        tags = urllib.request.urlopen(url, timeout=10).read().decode()
      except OSError:
        time.sleep(0.5)
    assert logdir_tag in tags, f'{command!r} served no {logdir_tag!r}: {tags[:500]}'
    page = urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=10).read().decode()
    assert '<tf-tensorboard' in page or 'TensorBoard' in page
  finally:
    process.terminate()
    output = process.communicate(timeout=60)[0]
  assert 'TensorBoard' in output, output


# ----------------------------------------------------------------------------
# What is run where.
# ----------------------------------------------------------------------------


def _pages_inline() -> list[tuple[pathlib.Path, str]]:
  """(page, command) of every inline command of the pages' prose."""
  return [(page, c) for page in PAGES for c in inline_commands(markdown_prose(page.read_text()))]


def plan():
  """(session, alone, skipped): the session's runnables in order, the others, the skipped."""
  pages = page_blocks()
  runnable = [b for b in pages if b.lang != 'text' and b.marker('skip') is None]
  skipped = [b for b in pages if b.marker('skip') is not None]
  seen = {tuple(words(c)) for b in runnable if b.lang == 'bash' for c in shell_commands(b.code)}
  for b in doc_blocks():
    if docstring_skip(b) is not None:
      skipped.append(b)
    elif tuple(words(b.code)) not in seen:  # a page runs it already
      seen.add(tuple(words(b.code)))
      runnable.append(b)
  viewer = [
      Block(_rel(page), page.read_text().split(c)[0].count('\n') + 1, 'tensorboard', c)
      for page, c in _pages_inline()
      if c.startswith('tensorboard ')
  ]
  docs = [Block(t.filename, t.lineno or 0, 'doctest', name) for name, t in doctests().items()]
  everything = runnable + viewer + docs

  def paths(b):
    if b.lang == 'doctest':
      return tmp_paths(''.join(e.source for e in doctests()[b.code].examples))
    text = b.code + ''.join(m.text for m in b.markers.values())
    return tmp_paths(text)

  counts = {}
  for b in everything:
    for p in paths(b):
      counts[p] = counts.get(p, 0) + 1
  shared = {p for p, n in counts.items() if n > 1} | set(PREPARED)
  session = [b for b in everything if paths(b) & shared]
  alone = [b for b in everything if not paths(b) & shared]
  return session, alone, skipped


def _id(b: Block) -> str:
  return f'{pathlib.Path(b.file).name}:{b.line}:{b.lang}'


SESSION, ALONE, SKIPPED_BLOCKS = plan()


# ----------------------------------------------------------------------------
# Tests.
# ----------------------------------------------------------------------------


def test_skipped_by_design_are_exactly_the_listed_ones():
  found = skipped_by_design(page_blocks())
  assert skips_agree(found), f'the pages skip {found}; SKIPPED lists {SKIPPED}'
  # Each docstring skip matches exactly one command.
  for (file, prefix), reason in DOCSTRING_SKIPS.items():
    matches = [b for b in doc_blocks() if b.file == file and b.code.startswith(prefix)]
    assert len(matches) == 1, (file, prefix, reason, matches)


@pytest.mark.parametrize('block', SKIPPED_BLOCKS, ids=_id)
def test_skipped_by_design(block):
  """Not run (the reason is the skip's, listed in SKIPPED): its commands are checked statically."""
  assert block.marker('skip') or docstring_skip(block), f'{block.where}: a skip without a reason'
  if block.lang == 'bash':
    for command in shell_commands(block.code):
      check_command(command)


@pytest.mark.parametrize('block', ALONE, ids=_id)
def test_runs_on_its_own(block, tmp_path):
  run_block(block, tmp_path)


def test_readme_session(tmp_path, translation_workdir):
  """The blocks, commands and doctests that share /tmp/ workdirs, in order (module docstring)."""
  for path, fixture in PREPARED.items():
    target = pathlib.Path(user_paths(path, tmp_path))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to({'translation_workdir': translation_workdir}[fixture])
  for block in SESSION:
    if block.lang == 'tensorboard':
      tensorboard_serves(block.code, tmp_path)
    elif block.lang == 'doctest':
      run_doctest(doctests()[block.code], tmp_path)
    else:
      run_block(block, tmp_path, session=True)


def test_every_inline_command_checks():
  """The pages' prose, the notebooks' markdown and docstrings: programs, modules, flags, configs."""
  commands = [c for _, c in _pages_inline()]
  for notebook in NOTEBOOKS:
    found = notebook_inline_commands(notebook)
    assert found, f'{notebook.name}: no command in its markdown cells (the extractor is broken?)'
    commands += found
  for path in DOCSTRING_FILES:
    commands += docstring_inline_commands(path)
  assert any(c.startswith('tensorboard --logdir') for c in commands)  # the viewer: run above
  assert len(commands) > 20, commands
  for command in commands:
    check_command(command)


def test_install_line_is_what_ci_runs():
  """The README's install block (skipped by design) is the users' install; CI installs the
  developers' file, which takes the users' file in (by uv, and pip, the README's installer,
  must find nothing to add), then the package as the README does; the README's test block
  installs that developers' file and runs what CI runs."""
  (install,) = [b for b in page_blocks() if b.first_line.startswith('python3.12 -m venv')]
  assert install.file == 'README.md'
  ci = (REPO / '.ci' / 'run').read_text()
  assert 'NEWEST_PYTHON="$(find_python 3.12 3.13)"' in ci
  assert 'make_venv "$NEWEST_PYTHON" requirements-dev.txt "$NEWEST"' in ci
  assert '-r requirements.txt' in (REPO / 'requirements-dev.txt').read_text().splitlines()
  assert 'uv pip install -q --compile-bytecode --python "$3/bin/python" -r "$2"' in ci
  pip = {
      '-r requirements.txt': 'pip install --dry-run -r "$2"',
      '--no-deps -e .': 'pip install -q --no-deps -e .',
  }
  for step in install.code.split('&&'):
    step = step.strip()
    if step.startswith('pip install'):
      assert pip[' '.join(step.split()[2:])] in ci, step
  (tests,) = [
      b for b in page_blocks() if b.first_line.startswith('pip install -r requirements-dev')
  ]
  assert tests.file == 'README.md'
  assert tests.code.split('&&')[1].strip() in ci  # python -m pytest -q -n auto


def test_doctests_are_found():
  names = set(doctests())
  assert 'contextpool_jax.runs.workdirs' in names, names
  assert all(any(b.lang == 'doctest' and b.code == n for b in SESSION + ALONE) for n in names)


# ----------------------------------------------------------------------------
# The checks can fail: the extractor and the runners on modified copies.
# ----------------------------------------------------------------------------


def test_markers_are_read_and_misplaced_ones_fail():
  text = (
      'x\n<!-- readme-test: skip needs a TPU -->\n```bash\ngcloud x\n```\n'
      '<!-- readme-test: check\nassert y == 2\n-->\n'
      '```python\nx = 1\ny = x + 1\n```\n```text\ndiagram\n```\n'
  )
  skip, python, diagram = markdown_blocks(text)
  assert skip.marker('skip') == 'needs a TPU' and skip.code == 'gcloud x' and skip.line == 4
  assert python.marker('check') == 'assert y == 2' and python.markers['check'].line == 7
  assert run_python_block(python, pathlib.Path('/unused'))['y'] == 2
  python.markers['check'] = dataclasses.replace(python.markers['check'], text='assert y == 3')
  with pytest.raises(AssertionError):
    run_python_block(python, pathlib.Path('/unused'))
  assert diagram.lang == 'text'
  for bad, message in [
      ('<!-- readme-test: skip why -->\nprose\n```bash\nx\n```\n', 'right before'),
      ('<!-- readme-test: skipp why -->\n```bash\nx\n```\n', 'unknown directive'),
      ('<!-- readme-test: given x = 1 -->\n```python\ny = x\n```\n', 'no hidden set-up'),
      ('<!-- readme-test: skip -->\n```bash\nx\n```\n', 'needs a reason'),
      ('```\nx\n```\n', "labelled ''"),
      ('```sh\nx\n```\n', "labelled 'sh'"),
      ('```bash\nx\n', 'never closed'),
      ('text\n<!-- readme-test: shrink -->\n', 'after the last'),
  ]:
    with pytest.raises(MarkupError, match=message):
      markdown_blocks(bad)


def test_shell_commands_split_like_a_shell():
  code = (
      '# a comment\npython a.py --x 1   # trailing\n'
      "python b.py --text 'one\n  two # not a comment\n' --y 2\n"
      'python c.py \\\n  --z 3\n'
  )
  commands = [words(c) for c in shell_commands(code)]
  assert commands == [
      ['python', 'a.py', '--x', '1'],
      ['python', 'b.py', '--text', 'one\n  two # not a comment\n', '--y', '2'],
      ['python', 'c.py', '--z', '3'],
  ]
  assert split_operators(words('a && b x; c|d')) == [['a'], ['b', 'x'], ['c'], ['d']]


def test_a_broken_snippet_fails(tmp_path):
  """The ContextPool page's block with a misspelt field, and a moved /tmp/ path, fail."""
  (block,) = [b for b in page_blocks() if 'pool = ContextPool(causal=True)' in b.code]
  assert block in ALONE  # as written, it runs there
  broken = dataclasses.replace(block, code=block.code.replace('causal=True', 'casual=True'))
  with pytest.raises(TypeError, match='casual') as info:
    run_python_block(broken, tmp_path)
  # The traceback names the page's line.
  assert block.file == 'docs/context_pool.md'
  assert any(f.filename == block.file for f in __import__('traceback').extract_tb(info.tb))
  assert user_paths("load('/tmp/cp')", tmp_path) == f"load('{tmp_path}/tmp/cp')"


def test_a_broken_command_fails():
  check_command('python -m contextpool_jax.commands.sample --workdir W --prompt "def " --seed 0')
  check_command('contextpool-train --config default:baseline --workdir W --config.seed=1')
  for command, message in [
      (
          'python -m contextpool_jax.commands.sample --workdir W --promt "def "',
          '--promt is not a flag',
      ),
      ('python -m contextpool_jax.samples --workdir W', 'no such module'),
      ('python train.py --config configs/default.py --workdir W --config.model.nme=x', 'nme'),
      ('python train.py --config configs/defaults.py --workdir W', 'no file'),
      ('python trains.py --config configs/default.py', 'no script'),
      ('contextpool-train --config default --workdir W --config.model.nme=x', 'nme'),
      ('contextpool-train --config defaults --workdir W', 'no file configs/defaults.py'),
      ('contextpool-sample --workdir W --promt "def "', '--promt is not a flag'),
      ('tensorboards --logdir W', None),  # not a program we know: not a command at all
      ('pip3 install x', None),
      (
          'python -c "from contextpool_jax.data import text_builders as t; t.prepare(\'x\')"',
          't.prepare does not exist',
      ),
  ]:
    if message is None:
      check_command(command)  # ignored
      assert not inline_commands(f'`{command}`')
      continue
    with pytest.raises((AssertionError, ModuleNotFoundError), match=message):
      check_command(command)
  # An unmarked block that cannot run here fails, naming why.
  (cluster,) = markdown_blocks('```bash\ngcloud compute tpus tpu-vm ssh tpu --worker=all\n```\n')
  with pytest.raises((FileNotFoundError, AssertionError), match='gcloud'):  # missing, or it fails
    run_shell_block(cluster, pathlib.Path('/unused'))
  (shelly,) = markdown_blocks('```bash\npython -m pytest --version && echo hi\n```\n')
  with pytest.raises(AssertionError, match='needs a shell'):
    run_shell_block(shelly, pathlib.Path('/unused'))


def test_a_new_unmarked_skip_or_a_dropped_marker_fails():
  readme = REPO / 'README.md'
  others = [b for b in page_blocks() if b.file != 'README.md']

  def skips(readme_text):  # every page's skips, README.md's read from readme_text
    return skipped_by_design(markdown_blocks(readme_text) + others)

  text = readme.read_text()
  assert skips_agree(skips(text))
  # A new skip that the list does not hold.
  extra = text + '\n<!-- readme-test: skip because -->\n```bash\npython x.py\n```\n'
  assert not skips_agree(skips(extra))
  # A listed reason on another block.
  reason = 'the test suite itself (CI runs it: .ci/run)'
  moved = extra.replace('skip because', f'skip {reason}')
  assert not skips_agree(skips(moved))
  # A marker removed: that block is no longer skipped (and would run: the suite, recursively).
  dropped = text.replace(f'<!-- readme-test: skip {reason} -->\n', '')
  assert dropped != text and not skips_agree(skips(dropped))


def test_every_page_is_read():
  """README.md first (its default run trains what the other pages load), then docs/, then
  CONTRIBUTING.md; and blocks come from all of them."""
  names = [_rel(p) for p in PAGES]
  assert names[0] == 'README.md' and names[-1] == 'CONTRIBUTING.md', names
  assert {'docs/context_pool.md', 'docs/training.md', 'docs/inference.md'} <= set(names)
  assert {b.file for b in page_blocks()} >= {'README.md', 'CONTRIBUTING.md', 'docs/install.md'}
