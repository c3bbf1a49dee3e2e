"""Sphinx: the pages (MyST Markdown) and the API reference (autodoc + napoleon).

The source directory is the repository root, so that README.md, CONTRIBUTING.md and the
recorded results in benchmarks/results/ are pages too and every relative link between them
works as it does on GitHub. Build (CONTRIBUTING.md, "The documentation"):

  python -m sphinx -W --keep-going -c docs . docs/_build/html
"""

import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package (and configs/), not an installed one
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import contextpool_jax  # pylint: disable=g-import-not-at-top,wrong-import-position

project = 'contextpool-jax'
author = 'the contextpool-jax authors'
copyright = 'the contextpool-jax authors; Apache License 2.0'  # pylint: disable=redefined-builtin
release = version = contextpool_jax.__version__

extensions = ['myst_parser', 'sphinx.ext.autodoc', 'sphinx.ext.napoleon']
root_doc = 'docs/index'
source_suffix = {'.rst': 'restructuredtext', '.md': 'markdown'}
include_patterns = [
    'README.md',
    'CONTRIBUTING.md',
    'docs/**',
    'benchmarks/results/*.md',
    'benchmarks/results/archive_contiguous_split/*.md',
    'benchmarks/results/archive_stdlib_corpus/*.md',
]
exclude_patterns = ['docs/_build/**']

# Headings get GitHub's anchors, so `page.md#a-heading` works on GitHub and here.
myst_heading_anchors = 3
suppress_warnings = [
    # The recorded results' reports start at `##` (they are written by the benchmarks).
    'myst.header',
    # Colab's `!command` lines in a Python block (docs/install.md) only lose their colours.
    'misc.highlighting_failure',
]

autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # `Attributes:` as a field list: no second entry for a dataclass field

html_theme = 'alabaster'
html_title = 'contextpool-jax'
html_theme_options = {
    'description': 'Adaptive-context attention in JAX/Flax',
    'fixed_sidebar': True,
    'page_width': '1200px',
}
html_sidebars = {'**': ['about.html', 'navigation.html', 'relations.html', 'searchbox.html']}
html_show_sourcelink = False


def _redirect_to_root_doc(app, exception):
  """``index.html`` at the top of the output opens the root page (``docs/index.html``)."""
  if exception is None and app.builder.format == 'html':
    target = 'docs/index.html'
    page = f'<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={target}">'
    pathlib.Path(app.outdir, 'index.html').write_text(f'{page}<a href="{target}">{target}</a>\n')


# A docstring names its page as a path (it reads well in the source and in help());
# tests/repo/test_docs.py checks that the page and anchor exist.
_PAGE = re.compile(r'(?<![`/\w])docs/([\w/]+)\.md(#[\w-]+)?')


def _link_pages(app, what, name, obj, options, lines):
  """In the API reference (docs/api/), ``docs/<page>.md[#anchor]`` becomes a link to the page."""
  del app, what, name, obj, options
  for i, line in enumerate(lines):
    lines[i] = _PAGE.sub(lambda m: f'`{m[0]} <../{m[1]}.html{m[2] or ""}>`__', line)


def setup(app):
  app.connect('autodoc-process-docstring', _link_pages)
  app.connect('build-finished', _redirect_to_root_doc)
