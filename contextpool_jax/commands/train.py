r"""The training command: trains and evaluates any experiment of the papers from a config.

  contextpool-train --config default --workdir /tmp/cp
  python train.py --config configs/default.py --workdir /tmp/cp
  python train.py --config configs/enwik8.py:stage1 --workdir /tmp/enwik8 \
      --config.dataset.data_dir=/data/tfds

``contextpool-train`` (installed with the package), ``python train.py`` (a checkout) and
``python -m contextpool_jax.commands.train`` are this command. ``--config`` takes a config of
the package by name (``default``, ``enwik8:stage1``: ``contextpool_jax.configs``, whose source
is the checkout's ``configs/``) or a config file's path (``configs/default.py:baseline``, or
your own file).

The config is locked: ``--config.<key>=<value>`` overrides a field and an
unknown key is a one-line error naming the closest keys, before anything is
prepared or compiled. Every field of the model (and of its ContextPool) is a
key: the command line fills them in with the modules' defaults before it applies the
overrides (``contextpool_jax/runs/config_fields.py``), e.g.
``--config.model.context_pool.ratio=0.025``.
Re-running with the same ``--workdir`` resumes from its latest checkpoint.

Several processes (docs/distributed.md#multi-host): on a Cloud TPU pod, SLURM, Open MPI or
Kubernetes pass ``--jax_distributed`` on every host (JAX finds the cluster);
elsewhere pass ``--coordinator_address=HOST:PORT --num_processes=N
--process_id=I`` (I = 0..N-1) on every process. Every process gets the same
config and ``--workdir`` (a directory they share). To try it on one machine:
``python -m contextpool_jax.commands.launch --num_processes 2
--devices_per_process 2 -- --config configs/default.py --workdir W``.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

# Importing the package touches no JAX backend: that waits for main, after JAX's
# distributed runtime is up.
from contextpool_jax.training import command_line

_CONFIG = config_flags.DEFINE_config_file(
    'config',
    None,
    'A config of the package by name (default, enwik8:stage1) or a config file '
    '(configs/default.py, configs/default.py:baseline).',
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and logs.')
_DISTRIBUTED = flags.DEFINE_bool(
    'jax_distributed',
    False,
    'Call jax.distributed.initialize() with auto-detection (Cloud TPU, SLURM, Open MPI, '
    'Kubernetes). Implied by --coordinator_address/--num_processes/--process_id.',
)
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0, reachable by every process.'
)
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process: 0..num_processes-1.')
flags.mark_flags_as_required(['config', 'workdir'])

PREEMPTED_EXIT_CODE = 143


def initialize_distributed() -> None:
  """``jax.distributed.initialize`` from the flags; nothing for a single process."""
  explicit = {
      'coordinator_address': _COORDINATOR.value,
      'num_processes': _NUM_PROCESSES.value,
      'process_id': _PROCESS_ID.value,
  }
  if not _DISTRIBUTED.value and all(v is None for v in explicit.values()):
    return
  n, i = explicit['num_processes'], explicit['process_id']
  if n is not None and n < 1:
    raise app.UsageError(f'--num_processes={n} must be >= 1.')
  if i is not None and not 0 <= i < (n if n is not None else i + 1):
    raise app.UsageError(f'--process_id={i} must be in [0, --num_processes={n}).')
  import jax  # pylint: disable=g-import-not-at-top  # only when running several processes
  # CPU processes need a collectives implementation (gloo ships with jaxlib);
  # GPU and TPU backends ignore this setting.
  if 'JAX_CPU_COLLECTIVES_IMPLEMENTATION' not in os.environ:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(**{k: v for k, v in explicit.items() if v is not None})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  command_line.quiet_console()
  initialize_distributed()
  # After jax.distributed.initialize: importing the trainer (orbax, grain, the data
  # modules) must not touch a JAX backend first.
  # pylint: disable=g-import-not-at-top
  from contextpool_jax.base.errors import ContextPoolJaxError

  try:
    from contextpool_jax.training import trainer
  except ModuleNotFoundError as e:  # the core install: no [train] extra
    command_line.fail(command_line.missing_extra('contextpool-train', 'train', e))
  workdir = _WORKDIR.value
  assert workdir is not None  # a required flag
  # The project's own messages (about the config, the data, the checkpoints, the
  # workdir's lock, a file that cannot be written: contextpool_jax/base/errors.py) are
  # complete in one line; anything else (a bug in a module you edited) keeps its
  # traceback.
  try:
    result = trainer.train_and_evaluate(_CONFIG.value, workdir)
  except ContextPoolJaxError as e:
    command_line.fail(str(e))
  if result.get('preempted'):
    # The checkpoint is saved; end like a process stopped by SIGTERM (128 + 15), so
    # `train.py ... && next-stage` does not go on with an unfinished run.
    sys.exit(PREEMPTED_EXIT_CODE)
  evals = {k: val for k, val in result.items() if k.startswith('eval_')}
  print(
      f'Finished at step {result["step"]}: '
      + '; '.join(
          f'{k}: ' + ', '.join(f'{m}={x:.4f}' for m, x in val.items()) for k, val in evals.items()
      )
  )


def command() -> None:
  """The console script ``contextpool-train`` (and ``python train.py``)."""
  app.run(main, flags_parser=command_line.parse_flags)


if __name__ == '__main__':
  command()
