"""The jitted programs a run executes, built in one place for the trainer and the compile command.

:func:`abstract_state` is the train state's shapes and dtypes (an abstract init:
every module's checks run, nothing is computed), and :func:`make_programs` the
train and evaluation steps jitted with the run's shardings. The trainer runs
them on the devices it has (``trainer.py``); ``aot.py`` lowers and compiles the
very same programs for devices it does not have (an abstract TPU slice), on
abstract arrays (:func:`abstract_batches`), so what it reports is what a run
would execute.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from contextpool_jax.training import sharding
from contextpool_jax.training import spec as spec_lib
from contextpool_jax.training import steps, tasks


def make_init_fn(task: tasks.Task, tx: Any, run: spec_lib.RunSpec) -> Callable:
  """``rng -> train state``, jitted (the sharded init reuses this trace)."""
  return jax.jit(
      steps.make_init_fn(
          task.model, task.objective, task.data.init_batch(), tx, steps.uses_loss_scaling(run.dtype)
      )
  )


def abstract_state(init_fn: Callable, rng: jax.Array) -> Any:
  """The train state as ``ShapeDtypeStruct``s (an abstract init: every module's checks run)."""
  return jax.eval_shape(init_fn, rng)


def with_shardings(abstract: Any, shardings: Any) -> Any:
  """``abstract`` (``ShapeDtypeStruct``s) placed with ``shardings``."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )


def abstract_batches(task: tasks.Task, run: spec_lib.RunSpec, data_sharding) -> tuple[dict, dict]:
  """``(train batch, evaluation batch)``: global batches as ``ShapeDtypeStruct``s,
  split over ``data_sharding`` (``task.data.batch_shapes``)."""
  train, evaluation = task.data.batch_shapes(run.batch_size)
  as_abstract = lambda shapes: {
      k: jax.ShapeDtypeStruct(shape, dtype, sharding=data_sharding)
      for k, (shape, dtype) in shapes.items()
  }
  return as_abstract(train), as_abstract(evaluation)


def under_mesh(step: Callable, mesh) -> Callable:
  """``step`` traced under ``mesh`` (as an abstract mesh): what the model sees through
  ``jax.sharding.get_abstract_mesh()``, so that a kernel XLA cannot partition (the Pallas
  TPU attention: ``layers/tpu_attention.py``) runs per device on its rows. The shardings
  stay the jitted step's own (``Auto`` axes)."""

  @functools.wraps(step)  # the step's own name in traces and profiles
  def traced(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return step(*args)

  return traced


@dataclasses.dataclass(frozen=True)
class Programs:
  """The steps of a run. ``train_step_fn`` and ``eval_step_fn`` are ``(state,
  batch) -> (state, sums)`` and ``(state, batch) -> sums``; ``train_step`` and
  ``eval_step`` add the running sums (``steps.summing``) and carry the shardings:
  ``(state, batch, sums)``, the state donated to the train step."""

  train_step_fn: Callable
  train_step: Callable
  eval_step_fn: Callable
  eval_step: Callable


def make_programs(
    task: tasks.Task,
    run: spec_lib.RunSpec,
    tx: Any,
    schedule: Any,
    train_rng: jax.Array,
    state_shardings: Any,
    mesh,
) -> Programs:
  """The run's train and evaluation steps with their shardings on ``mesh``."""
  data, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  train_step_fn = jax.jit(
      under_mesh(
          steps.make_train_step(
              task.model, task.objective, tx, schedule, train_rng, run.grad_accum_steps
          ),
          mesh,
      )
  )
  eval_step_fn = jax.jit(under_mesh(steps.make_eval_step(task.model, task.objective), mesh))
  in_shardings = (state_shardings, data, replicated)
  return Programs(
      train_step_fn=train_step_fn,
      train_step=jax.jit(
          steps.summing(train_step_fn),
          in_shardings=in_shardings,
          out_shardings=(state_shardings, replicated),
          donate_argnums=(0,),
      ),
      eval_step_fn=eval_step_fn,
      eval_step=jax.jit(
          steps.summing(eval_step_fn), in_shardings=in_shardings, out_shardings=replicated
      ),
  )
