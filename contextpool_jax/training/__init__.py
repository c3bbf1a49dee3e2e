"""Training: the train loop, the task registry, optimizers, sharding, checkpoints and
evaluation. Loading a trained workdir back is :mod:`contextpool_jax.runs.workdirs`."""
