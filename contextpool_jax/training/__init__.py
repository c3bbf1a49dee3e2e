"""Training: the train loop, the task registry, optimizers, sharding, checkpoints and
evaluation.

Loading a trained workdir back: :func:`load` ``(workdir, step=None) -> (model,
variables, config)`` and :func:`export_params` (:mod:`.workdirs`). ``load`` is
the module ``contextpool_jax.training.load``, which is callable, so the
function and the module of that name are one object.
"""

from contextpool_jax.training import load
from contextpool_jax.training.workdirs import WorkdirError
from contextpool_jax.training.workdirs import export_params

__all__ = ['WorkdirError', 'export_params', 'load']
