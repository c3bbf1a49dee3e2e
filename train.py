"""``python train.py --config configs/default.py --workdir DIR``: the training command of a
checkout, ``contextpool-train`` once installed (``contextpool_jax/training/cli.py`` has its
flags and what it does)."""

from contextpool_jax.training import cli

if __name__ == '__main__':
  cli.command()
