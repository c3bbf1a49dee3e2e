"""The figures command: ContextPool's figures of a language-model workdir, as PNG files.

  contextpool-viz --workdir /tmp/cp --text "def main():" --out /tmp/figs
  python -m contextpool_jax.commands.viz --workdir /tmp/cp --text "def main():" --out /tmp/figs

The figures are :func:`contextpool_jax.tools.viz.workdir_figures`'s.
"""

from __future__ import annotations

import sys

from contextpool_jax.base.errors import ContextPoolJaxError
from contextpool_jax.tools import viz


def main(argv):
  from absl import app, flags, logging  # pylint: disable=g-import-not-at-top  # with ml_collections

  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.ERROR)
  f = flags.FLAGS
  try:
    figures = viz.workdir_figures(f.workdir, f.text, step=f.step, centres=f.centres)
    paths = viz.write_figures(figures, f.out, dpi=f.dpi)
  except (ContextPoolJaxError, ImportError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  print('\n'.join(paths))


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top  # with ml_collections

  flags.DEFINE_string('workdir', None, 'A language-model training workdir (or an export).')
  flags.DEFINE_string('text', None, 'The passage to run the model on.')
  flags.DEFINE_string('out', None, 'Directory for the PNG files.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_multi_integer(
      'centres',
      [],
      'Positions whose Gaussian support is drawn ' '(default: three spread over the text).',
  )
  flags.DEFINE_integer('dpi', 100, 'PNG resolution.')
  flags.mark_flags_as_required(['workdir', 'text', 'out'])


def command() -> None:
  """The console script ``contextpool-viz`` (and ``python -m contextpool_jax.commands.viz``)."""
  from absl import app  # pylint: disable=g-import-not-at-top  # with ml_collections

  _define_flags()
  app.run(main)


if __name__ == '__main__':
  command()
