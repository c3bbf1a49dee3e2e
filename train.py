r"""Trains and evaluates any experiment of the papers from a config.

  python train.py --config configs/default.py --workdir /tmp/cp
  python train.py --config configs/enwik8.py:stage1 --workdir /tmp/enwik8 \
      --config.dataset.data_dir=/data/tfds

The config is locked: ``--config.<key>=<value>`` overrides a field and an
unknown key is an error. Re-running with the same ``--workdir`` resumes from
its latest checkpoint. On a multi-host TPU pod or GPU cluster pass
``--jax_distributed`` on every host (``jax.distributed.initialize()``).
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and logs.')
_DISTRIBUTED = flags.DEFINE_bool('jax_distributed', False,
                                 'Call jax.distributed.initialize() (multi-host).')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.WARNING)  # orbax/grain INFO logs drown the progress bar
  import jax  # pylint: disable=g-import-not-at-top
  if _DISTRIBUTED.value:
    jax.distributed.initialize()
  from contextpool_jax.data import DatasetNotFoundError  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top
  try:
    result = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except (DatasetNotFoundError, trainer.NonFiniteLossError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  evals = {k: val for k, val in result.items() if k.startswith('eval_')}
  print(f'Finished at step {result["step"]}: ' + '; '.join(
      f'{k}: ' + ', '.join(f'{m}={x:.4f}' for m, x in val.items()) for k, val in evals.items()))


if __name__ == '__main__':
  app.run(main)
