"""The documentation: its links resolve, its pages are near the README, its words are for users,
and Sphinx builds it (pages and API reference) with every warning an error.

Links are checked as GitHub resolves them, which is stricter than the Sphinx build: a relative
link must name a file of the repository, and an anchor (``page.md#a-heading``) a heading of that
Markdown file, by GitHub's rule for heading anchors (lower case, punctuation but ``-`` and ``_``
dropped, spaces to ``-``, a repeated heading ``-1``, ``-2``, ...). The pages are ``PAGES`` (what
tests/repo/test_readme.py runs) and the recorded results, which the built site includes.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from conftest import PAGES
from conftest import REPO

RESULTS = sorted((REPO / 'benchmarks' / 'results').glob('*.md'))
LINKED = PAGES + RESULTS
# Where docstrings and comments may name a page.
SOURCES = sorted((REPO / 'contextpool_jax').rglob('*.py')) + sorted(
    p for d in ('configs', 'benchmarks') for p in (REPO / d).glob('*.py')
)
SOURCES.append(REPO / 'train.py')

LINK = re.compile(r'!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
SCHEME = re.compile(r'^[a-z][a-z0-9+.-]*:', re.I)
PAGE_PATH = re.compile(r'\bdocs/[\w/]+\.md(?:#[\w-]+)?')


def _rel(path: pathlib.Path) -> str:
  return path.relative_to(REPO).as_posix()


def prose(text: str) -> str:
  """The text outside fenced blocks, HTML comments and code spans (a link there is not one)."""
  text = re.sub(r'<!--.*?-->', '', text, flags=re.S)
  text = re.sub(r'^```.*?^```[^\n]*$', '', text, flags=re.S | re.M)
  return re.sub(r'(`+)(?!`).+?(?<!`)\1(?!`)', '', text, flags=re.S)


def links(text: str) -> list[str]:
  return LINK.findall(prose(text))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading's text."""
  text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link: its text
  text = text.replace('`', '').replace('*', '').strip().lower()
  return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def anchors(text: str) -> set[str]:
  """The anchors of a Markdown file's headings (not the lines of fenced blocks)."""
  text = re.sub(r'^```.*?^```[^\n]*$', '', text, flags=re.S | re.M)
  seen, out = {}, set()
  for heading in re.findall(r'^#{1,6}\s+(.+?)\s*#*\s*$', text, flags=re.M):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f'{base}-{n}')
  return out


def broken(page: pathlib.Path, target: str) -> str | None:
  """Why a link of ``page`` to ``target`` is broken, or None."""
  if SCHEME.match(target):
    return None  # a web address: not checked (no network in the tests)
  path, _, anchor = target.partition('#')
  file = (page.parent / path).resolve() if path else page
  if REPO.resolve() not in (file, *file.parents):
    return f'{target}: outside the repository'
  if not file.exists():
    return f'{target}: no such file'
  if anchor:
    if file.suffix != '.md':
      return f'{target}: an anchor into a file that is not Markdown'
    if anchor not in anchors(file.read_text()):
      return f'{target}: no heading of {_rel(file)} has the anchor #{anchor}'
  return None


@pytest.mark.parametrize('page', LINKED, ids=_rel)
def test_every_relative_link_resolves(page):
  found = links(page.read_text())
  problems = [p for p in (broken(page, t) for t in found) if p]
  assert not problems, f'{_rel(page)}: ' + '; '.join(problems)


def test_the_link_check_fails_on_broken_links():
  page = REPO / 'docs' / 'context_pool.md'
  assert broken(page, 'models.md') is None
  assert broken(page, 'performance.md#contextpool-at-long-sequences') is None
  assert broken(page, '../benchmarks/results/peers_cpu.md') is None
  assert broken(page, '#choices-the-paper-leaves-open') is None
  assert 'no such file' in broken(page, 'model.md')
  assert 'no heading' in broken(page, 'performance.md#contextpool-at-long-sequence')
  assert 'no heading' in broken(page, '#memory-')
  assert 'outside' in broken(page, '../../elsewhere.md')
  # Links in code spans, fenced blocks and comments are not links; titles and images are.
  text = '[a](x.md) `[b](y.md)` ![c](z.png "title")\n<!-- [d](w.md) -->\n```text\n[e](v.md)\n```\n'
  assert links(text) == ['x.md', 'z.png']
  assert slug('The `local_text` split: 90/5/5!') == 'the-local_text-split-9055'
  assert anchors('# A\n## B\n## B\n```text\n# not a heading\n```\n') == {'a', 'b', 'b-1'}


def test_every_page_is_at_most_two_clicks_from_the_readme():
  """Following the pages' links (README.md, then what it links, then theirs)."""
  pages = {p.resolve() for p in PAGES}
  reached, frontier = {PAGES[0].resolve()}, [PAGES[0]]
  for _ in range(2):
    step = []
    for page in frontier:
      for target in links(page.read_text()):
        path = target.partition('#')[0]
        file = (page.parent / path).resolve() if path and not SCHEME.match(target) else None
        if file in pages and file not in reached:
          reached.add(file)
          step.append(file)
    frontier = step
  assert not pages - reached, sorted(_rel(p) for p in pages - reached)


def test_docstrings_name_pages_that_exist():
  """A docstring or comment that says ``docs/<page>.md[#anchor]`` names a real page and heading."""
  named = 0
  for source in SOURCES:
    for target in PAGE_PATH.findall(source.read_text()):
      named += 1
      problem = broken(REPO / 'README.md', target)  # paths relative to the repository root
      assert problem is None, f'{_rel(source)}: {problem}'
  assert named >= 5, named  # the long docstrings point to their pages


@pytest.mark.parametrize('page', PAGES, ids=_rel)
def test_pages_speak_to_users(page):
  """No development history in a page: no issue numbers, no dated run logs (a measurement's date
  and machine stay beside its data, in benchmarks/results/)."""
  text = prose(page.read_text())
  for pattern in (
      r'\bissues? \d+',
      r'\b20\d\d-\d\d-\d\d\b',
      r'\bthis session\b',
      r'\ba wave ago\b',
  ):
    assert not re.search(pattern, text, re.I), f'{_rel(page)}: {re.search(pattern, text, re.I)}'


# ----------------------------------------------------------------------------
# The build.
# ----------------------------------------------------------------------------


def _build_command() -> list[str]:
  """CONTRIBUTING.md's build command (the README names the same one)."""
  text = (REPO / 'CONTRIBUTING.md').read_text()
  (command,) = [l for l in text.splitlines() if l.startswith('python -m sphinx ')]
  assert f'`{command}`' in (REPO / 'README.md').read_text(), command
  return shlex.split(command)


def _sphinx(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
  assert argv[:3] == ['python', '-m', 'sphinx'], argv
  return subprocess.run(
      [sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=900
  )


@pytest.mark.slow  # imports every documented module and renders every page (~15 s)
def test_the_docs_build_strictly(tmp_path):
  argv = _build_command()
  assert '-W' in argv and argv[-1] == 'docs/_build/html', argv
  out = _sphinx(argv[:-1] + [str(tmp_path / 'html')], REPO)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
  html = tmp_path / 'html'
  assert 'docs/index.html' in (html / 'index.html').read_text()  # the top opens the root page
  for page in PAGES + RESULTS:
    assert (html / _rel(page)).with_suffix('.html').is_file(), _rel(page)
  layers = (html / 'docs' / 'api' / 'layers.html').read_text()
  for name in ('ContextPool', 'AreaAttention', 'LambdaLayer', 'AugmentedConv2D', 'size_norm'):
    assert name in layers, name  # the API reference, from the docstrings


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
  """The same configuration on a two-page project whose page links to a missing heading."""
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'docs' / 'index.rst').write_text('Home\n====\n\n.. toctree::\n\n   page\n')
  page = tmp_path / 'docs' / 'page.md'
  page.write_text('# Page\n\n## A heading\n\n[ok](#a-heading), [broken](#no-heading)\n')
  argv = _build_command()
  argv[argv.index('-c') + 1] = str(REPO / 'docs')
  out = _sphinx(argv[:-1] + [str(tmp_path / 'html')], tmp_path)
  assert out.returncode != 0 and 'no-heading' in out.stderr, out.stderr[-3000:]
  page.write_text('# Page\n\n## A heading\n\n[ok](#a-heading)\n')
  out = _sphinx(argv[:-1] + [str(tmp_path / 'html2')], tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]


# A time in a results file: "12.5 ms", "(ms)", "steps/s", "steps per second".
TIMING = re.compile(r'\d\s?ms\b|steps/s|steps per second|\(ms\)|\bms\)')


def test_every_timing_file_says_the_load_it_was_measured_under():
  """Issue 72: a ratio measured under load is not the ratio users get, so every results
  file with timings says the load (the quiet-machine rule's numbers, or that none were
  recorded)."""
  files = sorted((REPO / 'benchmarks' / 'results').glob('*.md'))
  timed = [f for f in files if TIMING.search(f.read_text())]
  assert len(timed) >= 10  # the check sees the timing files
  silent = [f.name for f in timed if 'load' not in f.read_text().lower()]
  assert not silent, silent
