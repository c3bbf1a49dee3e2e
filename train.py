"""``python train.py --config configs/default.py --workdir DIR``: the training command of a
checkout, ``contextpool-train`` once installed (``contextpool_jax/commands/train.py`` has its
flags and what it does)."""

from contextpool_jax.commands import train

if __name__ == '__main__':
  train.command()
