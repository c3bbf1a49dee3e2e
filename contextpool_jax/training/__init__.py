"""Training: the train loop, tasks, optimizers, sharding, checkpoints and evaluation."""
