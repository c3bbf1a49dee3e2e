"""A page's fenced blocks and the readme-test markers before them (tests/repo/test_readme.py
describes the markers): read by the README test, which runs the blocks, and by the packaging test,
which runs the cleaning command docs/install.md gives."""

from __future__ import annotations

import dataclasses
import re

LANGUAGES = ('python', 'bash', 'text')
DIRECTIVES = ('skip', 'shrink', 'check')


class MarkupError(ValueError):
  """A page's marker or fence the test cannot read."""


@dataclasses.dataclass
class Marker:
  directive: str
  text: str
  line: int  # of the text's first line


@dataclasses.dataclass
class Block:
  """A fenced block (or a docstring command): what runs, and where it came from."""

  file: str
  line: int  # of the code's first line
  lang: str  # 'python' | 'bash' | 'text' | 'doctest'
  code: str
  markers: dict = dataclasses.field(default_factory=dict)

  @property
  def where(self) -> str:
    return f'{self.file}:{self.line}'

  @property
  def first_line(self) -> str:
    return self.code.splitlines()[0] if self.code else ''

  def marker(self, directive: str) -> str | None:
    m = self.markers.get(directive)
    return None if m is None else m.text


MARKER = re.compile(r'<!--\s*readme-test:\s*(\w+)(.*?)-->', re.S)


def markdown_blocks(text: str, file: str = 'README.md') -> list[Block]:
  """The fenced blocks of a markdown text, each with the markers right before it."""
  lines = text.splitlines()
  blocks, pending, i = [], {}, 0
  while i < len(lines):
    line = lines[i]
    if line.startswith('```'):
      lang = line[3:].strip()
      end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith('```')), None)
      if end is None:
        raise MarkupError(f'{file}:{i + 1}: a fenced block that is never closed')
      if lang not in LANGUAGES:
        raise MarkupError(
            f'{file}:{i + 1}: a fenced block labelled {lang!r}; label it one of {LANGUAGES} '
            '(text: not code)'
        )
      blocks.append(Block(file, i + 2, lang, '\n'.join(lines[i + 1 : end]), pending))
      pending, i = {}, end + 1
      continue
    if line.startswith('<!--') and 'readme-test' in line:  # a marker (prose may name one)
      start, comment = i, line
      while '-->' not in comment and i + 1 < len(lines):
        i += 1
        comment += '\n' + lines[i]
      m = MARKER.fullmatch(comment.strip())
      if not m:
        raise MarkupError(f'{file}:{start + 1}: not a marker: {comment!r}')
      directive, raw = m.group(1), m.group(2)
      arg = raw.strip()
      # The line the marker's text starts on (check code may start on the next one).
      text_line = start + 1 + raw[: len(raw) - len(raw.lstrip())].count('\n')
      if directive == 'given':
        raise MarkupError(
            f'{file}:{start + 1}: no hidden set-up (given): a block defines what it uses, '
            'as a reader copies it'
        )
      if directive not in DIRECTIVES:
        raise MarkupError(
            f'{file}:{start + 1}: unknown directive {directive!r}; expected one of {DIRECTIVES}'
        )
      if directive in pending:
        raise MarkupError(f'{file}:{start + 1}: a second {directive!r} marker for one block')
      if (directive == 'shrink') != (not arg):
        raise MarkupError(
            f'{file}:{start + 1}: {directive!r} '
            + ('takes nothing' if directive == 'shrink' else 'needs a reason or code')
        )
      pending[directive] = Marker(directive, arg, text_line)
    elif line.strip() and pending:
      raise MarkupError(
          f'{file}:{min(m.line for m in pending.values())}: a readme-test marker must come '
          'right before a fenced block'
      )
    i += 1
  if pending:
    raise MarkupError(f'{file}: a readme-test marker after the last fenced block')
  for block in blocks:
    if block.lang == 'text' and block.markers:
      raise MarkupError(f'{block.where}: a text block takes no marker')
    if block.lang == 'bash' and 'check' in block.markers:
      raise MarkupError(f'{block.where}: check is for Python blocks')
  return blocks
