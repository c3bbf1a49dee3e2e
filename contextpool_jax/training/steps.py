"""The pure step functions the loop jits: init, train (with gradient accumulation), eval.

Everything here is a pure function of its arguments, built from a model, an
:class:`~contextpool_jax.training.objectives.Objective` and an optax optimizer,
so the trainer, the benchmarks and users' own loops run the same steps.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training import dynamic_scale as dynamic_scale_lib

from contextpool_jax.training import objectives

Array = jax.Array


@struct.dataclass
class TrainState:
  """Everything a checkpoint holds besides the data iterator."""

  step: Array
  params: Any
  opt_state: Any
  model_state: Any  # non-parameter collections, e.g. {'batch_stats': ...}
  bad_step: Array  # -1, or the first step whose loss/gradient was not finite


@struct.dataclass
class ScaledTrainState(TrainState):
  """The train state of a float16 run: a :class:`TrainState` and its loss scale
  (flax's DynamicScale, :func:`new_dynamic_scale`), saved and resumed with the
  rest. A separate class, not an optional field: every other run's state, and
  so its checkpoints, stay exactly as before (orbax records even a None field)."""

  dynamic_scale: dynamic_scale_lib.DynamicScale


def _split_variables(variables: dict) -> tuple[Any, dict]:
  variables = dict(variables)
  params = variables.pop('params')
  variables.pop('intermediates', None)
  return params, variables


# Dynamic loss scaling of float16 runs: flax's DynamicScale with PyTorch's
# GradScaler defaults (start at 2^16, halve on an overflow, double after 2000
# finite steps), and a floor of 1 (as DeepSpeed's and Megatron's min_loss_scale):
# an overflow at scale 1 is not one that scaling can avoid.
LOSS_SCALE_INIT = 2.0**16
LOSS_SCALE_GROWTH_INTERVAL = 2000
LOSS_SCALE_MIN = 1.0


def uses_loss_scaling(dtype: Any) -> bool:
  """Whether a run computing in ``dtype`` has a dynamic loss scale: float16 only
  (bfloat16 has float32's exponent range, its gradients do not underflow)."""
  return jnp.dtype(dtype) == jnp.float16


def new_dynamic_scale() -> dynamic_scale_lib.DynamicScale:
  """A fresh loss scale (call inside the jitted init: its fields are arrays)."""
  fin_steps, scale = jnp.zeros((), jnp.int32), jnp.full((), LOSS_SCALE_INIT, jnp.float32)
  return dynamic_scale_lib.DynamicScale(
      growth_interval=LOSS_SCALE_GROWTH_INTERVAL,
      fin_steps=fin_steps,  # pyright: ignore[reportArgumentType]  # flax annotates an int
      scale=scale,  # pyright: ignore[reportArgumentType]  # flax annotates a float
      minimum_scale=LOSS_SCALE_MIN,
  )


def make_init_fn(
    model,
    objective: objectives.Objective,
    init_batch: dict,
    tx: optax.GradientTransformation,
    loss_scaling: bool = False,
) -> Callable[[Array], TrainState]:
  """``rng -> TrainState`` (parameters from ``model.init`` on ``init_batch``;
  with ``loss_scaling``, a :class:`ScaledTrainState`)."""

  def init_fn(rng: Array) -> TrainState:
    variables = model.init(
        {'params': rng, 'dropout': rng}, *objective.model_args(init_batch), train=False
    )
    params, model_state = _split_variables(variables)
    fields: dict[str, Any] = dict(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        model_state=model_state,
        bad_step=jnp.full((), -1, jnp.int32),
    )
    if loss_scaling:
      return ScaledTrainState(**fields, dynamic_scale=new_dynamic_scale())
    return TrainState(**fields)

  return init_fn


def _add(a: Any, b: Any) -> Any:
  return jax.tree.map(jnp.add, a, b)


def accumulate_gradient(
    grad_fn: Callable, params: Any, model_state: Any, batch: dict, rng: Array, accum_steps: int
):
  """``grad_fn`` over ``accum_steps`` micro-batches, summed (big_vision's pattern).

  ``grad_fn(params, model_state, batch, rng) -> ((loss, (sums, model_state)),
  grads)``; the batch is cut along its leading axis, the model state (e.g.
  BatchNorm statistics) is threaded from one micro-batch to the next, and the
  losses, metric sums and gradients are added. With every micro-batch loss
  divided by the whole batch's weight, the sum is exactly the whole batch's
  gradient.
  """
  if accum_steps == 1:
    return grad_fn(params, model_state, batch, rng)
  micro = jax.tree.map(
      lambda x: x.reshape(accum_steps, x.shape[0] // accum_steps, *x.shape[1:]), batch
  )

  def one(i, state):
    return grad_fn(params, state, jax.tree.map(lambda x: x[i], micro), jax.random.fold_in(rng, i))

  def body(i, acc):
    (loss, (sums, state)), grads = acc
    (loss_i, (sums_i, state)), grads_i = one(i, state)
    return (loss + loss_i, (_add(sums, sums_i), state)), _add(grads, grads_i)

  return jax.lax.fori_loop(1, accum_steps, body, one(0, model_state))


def scaled_gradient(
    scale: dynamic_scale_lib.DynamicScale,
    fn: Callable,
    params: Any,
    model_state: Any,
    batch: dict,
    rng: Array,
    accum_steps: int,
):
  """:func:`accumulate_gradient` of ``fn`` under flax's DynamicScale.

  ``fn(params, model_state, batch, rng) -> (loss, (sums, model_state))``. Each
  micro-batch's gradient is ``scale.value_and_grad(fn)``'s: of the loss times
  the scale, unscaled in float32 (an overflow is inf/NaN there, and so in the
  sum). Returns ``((loss, (sums, model_state)), grads, new_scale, finite)``:
  ``finite`` is False if any micro-batch's gradient was not, and ``new_scale``
  is flax's update for that (each micro-batch's update is flax's rule applied
  to the same ``scale``, so an overflowing micro-batch's update is the step's;
  the carry picks it).
  """
  vg = scale.value_and_grad(fn, has_aux=True)

  def grad_fn(p, carry, b, r):
    model_state, new_scale, overflowed = carry
    out = vg(p, model_state, b, r)
    loss, (sums, model_state) = out.aux
    take = ~out.finite | ~overflowed
    new_scale = jax.tree.map(lambda x, y: jnp.where(take, x, y), out.dynamic_scale, new_scale)
    return (loss, (sums, (model_state, new_scale, overflowed | ~out.finite))), out.grad

  carry = (model_state, scale, jnp.zeros((), bool))
  (loss, (sums, (model_state, new_scale, overflowed))), grads = accumulate_gradient(
      grad_fn, params, carry, batch, rng, accum_steps
  )
  return (loss, (sums, model_state)), grads, new_scale, ~overflowed


def _make_loss_fn(model, objective: objectives.Objective):
  """``(params, model_state, batch, rng, total_weight) -> (mean loss, (metric
  sums, new model state))`` of one (micro-)batch in training mode."""

  def loss_fn(params, model_state, batch, rng, total_weight):
    mix_rng, dropout_rng = jax.random.split(rng)
    batch = objective.prepare_train_batch(batch, mix_rng)
    mutable = list(model_state)
    out = model.apply(
        {'params': params, **model_state},
        *objective.model_args(batch),
        train=True,
        rngs={'dropout': dropout_rng},
        mutable=mutable or False,
    )
    logits, new_model_state = out if mutable else (out, model_state)
    loss_sum, sums = objective.loss(logits, batch)
    return loss_sum / total_weight, (sums, dict(new_model_state))

  return loss_fn


def _gradient(scale, fn, state, batch, rng, grad_accum_steps: int):
  """``((loss, aux), grads, new scale, grads finite)`` of ``fn`` over the
  micro-batches: plain, or through the loss scale ``scale`` (None: no scale;
  then the last two are None)."""
  if scale is None:
    value, grads = accumulate_gradient(
        jax.value_and_grad(fn, has_aux=True),
        state.params,
        state.model_state,
        batch,
        rng,
        grad_accum_steps,
    )
    return value, grads, None, None
  return scaled_gradient(scale, fn, state.params, state.model_state, batch, rng, grad_accum_steps)


def make_train_step(
    model,
    objective: objectives.Objective,
    tx: optax.GradientTransformation,
    schedule: Callable,
    base_rng: Array,
    grad_accum_steps: int = 1,
):
  """``(state, batch) -> (state, metric sums)``: forward, backward, optax update.

  A step whose loss or gradient norm is not finite leaves the parameters,
  optimizer and model state unchanged and records its index in
  ``state.bad_step`` (the loop stops at its next check).

  With a loss scale (a :class:`ScaledTrainState`, float16 runs) the gradient is
  that of the scaled loss, unscaled in float32 (:func:`scaled_gradient`). A step
  whose loss is finite but whose gradient overflowed is *skipped*: parameters,
  optimizer and model state unchanged, the scale halved, the metric
  ``skipped_steps`` counts it, and it is not a bad step. A non-finite loss (in
  float32, unscaled) is a bad step as without scaling, and so is an overflow
  at the minimum scale (``LOSS_SCALE_MIN``), which scaling cannot avoid.
  """

  loss_fn = _make_loss_fn(model, objective)

  def train_step(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(base_rng, state.step)
    total_weight = jnp.maximum(objective.weight(batch), 1e-9)
    fn = lambda p, m, b, r: loss_fn(p, m, b, r, total_weight)
    scale = getattr(state, 'dynamic_scale', None)
    (loss, (sums, model_state)), grads, new_scale, grads_finite = _gradient(
        scale, fn, state, batch, rng, grad_accum_steps
    )
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if scale is not None:
      assert grads_finite is not None  # _gradient's, with a loss scale
      skipped = jnp.isfinite(loss) & ~grads_finite & (scale.scale > LOSS_SCALE_MIN)
      ok &= grads_finite
      bad = ~ok & ~skipped
    else:
      bad = ~ok

    def update(state):
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      return state.replace(params=params, opt_state=opt_state, model_state=model_state)

    # A conditional, not a select of new and old values: the update then writes
    # the (donated) parameters and optimizer state in place; a select keeps both
    # (the memory it saves: benchmarks/results/train_step_guard.md).
    new_state = jax.lax.cond(ok, update, lambda state: state, state)
    new_state = new_state.replace(
        step=state.step + 1,
        bad_step=jnp.where((state.bad_step < 0) & bad, state.step, state.bad_step),
    )
    metrics = dict(
        sums,
        grad_norm=grad_norm,
        learning_rate=schedule(state.step),
        steps=jnp.ones((), jnp.float32),
    )
    if scale is not None:
      new_state = new_state.replace(dynamic_scale=new_scale)
      metrics.update(
          grad_norm=jnp.where(skipped, 0.0, grad_norm),  # the logged mean is over applied steps
          skipped_steps=skipped.astype(jnp.float32),
          loss_scale=scale.scale,  # the scale this step used
      )
    return new_state, metrics

  return train_step


def make_eval_step(model, objective: objectives.Objective):
  """``(state, batch) -> metric sums`` of one evaluation batch."""

  def eval_step(state: TrainState, batch: dict) -> dict:
    variables = {'params': state.params, **state.model_state}
    logits = model.apply(variables, *objective.model_args(batch), train=False)
    return objective.eval_sums(logits, batch)

  return eval_step


def summing(step: Callable) -> Callable:
  """``step(state, batch) -> metrics`` (or ``-> (state, metrics)``) as
  ``(state, batch, sums) -> sums + metrics`` (or ``-> (state, sums + metrics)``).

  The running sums stay on the devices, inside the same jitted program as the
  step: reading them once per log interval costs one host read, and no extra
  program runs per step. Pass ``step`` wrapped in ``jax.jit``: the program that
  calls it then reuses the trace :func:`zero_sums` made of it (JAX inlines the
  inner jit), so the model is traced once per step, not twice.
  """

  def summed(state, batch, sums):
    out = step(state, batch)
    if isinstance(out, tuple):
      new_state, metrics = out
      return new_state, _add(sums, metrics)
    return _add(sums, out)

  return summed


def abstract_sums(step: Callable, state, batch, sharding) -> dict:
  """The metric sums of ``step(state, batch)`` as ``ShapeDtypeStruct`` s placed with
  ``sharding`` (``state`` and ``batch`` may be abstract too: the compile command's)."""
  out = jax.eval_shape(step, state, batch)
  metrics = out[1] if isinstance(out, tuple) else out
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), metrics)


def zero_sums(step: Callable, state, batch, sharding) -> dict:
  """Zeros shaped like the metric sums of ``step(state, batch)``, placed with ``sharding``.

  ``step`` jitted (the one :func:`summing` wraps) is traced once for both: its trace
  is cached for the arguments' shapes, dtypes and shardings."""
  return jax.tree.map(
      lambda s: jax.device_put(np.zeros(s.shape, s.dtype), s.sharding),
      abstract_sums(step, state, batch, sharding),
  )
