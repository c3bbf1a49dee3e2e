"""Training: the train loop, tasks, optimizers, sharding, checkpoints and evaluation.

Loading a trained workdir back: :func:`load` ``(workdir, step=None) -> (model,
variables, config)`` and :func:`export_params` (module
``contextpool_jax.training.load``; the function ``load`` shadows the module's name
as an attribute of this package, so import the module's other names with
``from contextpool_jax.training.load import ...``).
"""

from contextpool_jax.training.load import WorkdirError
from contextpool_jax.training.load import export_params
from contextpool_jax.training.load import load

__all__ = ['WorkdirError', 'export_params', 'load']
