"""The compile command: a config's training and evaluation steps compiled for a TPU slice or
NVIDIA GPUs.

  contextpool-compile --config default --topology v5e:2x2
  python -m contextpool_jax.commands.compile --config default:baseline --topology v5litepod-16

What it builds, compiles and prints: :mod:`contextpool_jax.training.aot`.
"""

from __future__ import annotations

from absl import app
from absl import flags
from ml_collections import config_flags

from contextpool_jax.training import aot
from contextpool_jax.training import command_line

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags (defined when it runs, so that tests import this module
  beside the training command, which defines ``--config`` too)."""
  config_flags.DEFINE_config_file(
      'config',
      None,
      'A config of the package by name (default, enwik8:stage1) or a config file.',
      lock_config=True,
  )
  flags.DEFINE_string('topology', None, f'Where to compile for: {aot.ACCEPTED}.')
  flags.DEFINE_list('steps', list(aot.STEPS), f'The steps to compile, of {aot.STEPS}.')
  flags.DEFINE_bool(
      'unrolled_flops',
      True,
      "A scanned model's (scan_layers=True) FLOPs from its unrolled twin, compiled a second"
      ' time; --nounrolled_flops: one compile, the memory exact, FLOPs one layer of the loop.',
  )
  flags.mark_flags_as_required(['config', 'topology'])


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  from contextpool_jax.base.errors import ContextPoolJaxError  # pylint: disable=g-import-not-at-top

  try:
    topology = aot.parse_topology(FLAGS.topology)
  except ValueError as e:
    command_line.fail(str(e))
  unknown = sorted(set(FLAGS.steps) - set(aot.STEPS))
  if unknown or not FLAGS.steps:
    command_line.fail(f'--steps={",".join(FLAGS.steps)}: expected some of {",".join(aot.STEPS)}.')
  missing = aot.compiler_missing(topology)
  if missing:
    command_line.fail(missing)
  command_line.quiet_console()
  try:
    costs = aot.compile_config(FLAGS.config, topology, tuple(FLAGS.steps), FLAGS.unrolled_flops)
  except (ContextPoolJaxError, aot.DoesNotFit) as e:
    command_line.fail(str(e))
  except ModuleNotFoundError as e:  # the core install: the steps are the trainer's
    command_line.fail(command_line.missing_extra('contextpool-compile', 'train', e))
  print(aot.report(topology, costs, FLAGS.config.batch_size))


def command() -> None:
  """The console script ``contextpool-compile`` (and ``python -m contextpool_jax.commands.compile``)."""
  aot.compile_only()
  define_flags()
  app.run(main, flags_parser=command_line.parse_flags)


if __name__ == '__main__':
  command()
