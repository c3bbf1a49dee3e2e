"""Optimizers and learning-rate schedules from a config, all built from optax.

``config.optimizer`` fields (``configs/common.py`` sets every one but the
piecewise schedule's; :func:`resolve_spec` reads and checks them once):

* ``name``: ``'adam'`` | ``'adamw'`` | ``'sgd'`` (momentum, optionally Nesterov).
* ``learning_rate``: the peak learning rate.
* ``schedule``: ``'constant'`` | ``'inverse_sqrt'`` (Vaswani et al. 2017, Eq. 3:
  linear warm-up, then ``lr * sqrt(warmup / step)``) | ``'cosine'`` (linear
  warm-up, cosine decay to ``end_learning_rate`` at ``num_train_steps``) |
  ``'linear'`` (linear warm-up, linear decay to ``end_learning_rate``) |
  ``'warmup_constant'`` (linear warm-up, then constant) | ``'piecewise'``
  (linear warm-up, then the rate times ``decay_factor`` at each step in
  ``boundaries``: He et al.'s ResNet schedule).
* ``warmup_steps``, ``end_learning_rate``.
* ``b1``, ``b2``, ``eps`` (Adam/AdamW), ``momentum``, ``nesterov`` (SGD).
* ``weight_decay``: decoupled (AdamW) or L2 added to the gradient (SGD/Adam);
  applied only to parameters with ``ndim >= 2`` (kernels and embeddings), never
  to biases or normalisation scales.
* ``grad_clip_norm``: clip by global norm (0 = off).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from contextpool_jax.io import config_readers
from contextpool_jax.base.errors import ConfigError

OPTIMIZERS = ('adam', 'adamw', 'sgd')
SCHEDULES = ('constant', 'inverse_sqrt', 'cosine', 'linear', 'warmup_constant', 'piecewise')


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
  """``config.optimizer``, read and checked (see the module docstring)."""

  name: str
  learning_rate: float
  schedule: str
  warmup_steps: int
  end_learning_rate: float
  b1: float
  b2: float
  eps: float
  weight_decay: float
  grad_clip_norm: float
  momentum: float
  nesterov: bool
  boundaries: tuple[int, ...] = ()
  decay_factor: float = 0.1


def resolve_spec(cfg: ml_collections.ConfigDict) -> OptimizerSpec:
  """Reads and checks ``config.optimizer`` (``cfg``); ConfigError names a bad entry."""
  root = {'optimizer': cfg}
  number = lambda field, **kw: config_readers.read_float(root, f'optimizer.{field}', **kw)
  schedule = config_readers.read_choice(root, 'optimizer.schedule', SCHEDULES)
  warmup = config_readers.read_int(root, 'optimizer.warmup_steps')
  boundaries, factor = (), 0.1
  if schedule == 'piecewise':
    boundaries = tuple(config_readers.lookup(root, 'optimizer.boundaries'))
    factor = number('decay_factor', lo=0.0)
    if not all(isinstance(b, int) and b > warmup for b in boundaries):
      raise ConfigError(
          f'config.optimizer.boundaries={boundaries!r} must be steps > warmup_steps={warmup}.'
      )
  return OptimizerSpec(
      name=config_readers.read_choice(root, 'optimizer.name', OPTIMIZERS),
      learning_rate=number('learning_rate', lo=0.0, lo_open=True),
      schedule=schedule,
      warmup_steps=warmup,
      end_learning_rate=number('end_learning_rate', lo=0.0),
      b1=number('b1', lo=0.0, hi=1.0),
      b2=number('b2', lo=0.0, hi=1.0),
      eps=number('eps', lo=0.0),
      weight_decay=number('weight_decay', lo=0.0),
      grad_clip_norm=number('grad_clip_norm', lo=0.0),
      momentum=number('momentum', lo=0.0, hi=1.0),
      nesterov=config_readers.read_bool(root, 'optimizer.nesterov'),
      boundaries=boundaries,
      decay_factor=factor,
  )


def make_schedule(spec: OptimizerSpec, num_train_steps: int) -> optax.Schedule:
  """The learning-rate schedule of ``spec`` (see the module docstring)."""
  peak, warmup, end = spec.learning_rate, spec.warmup_steps, spec.end_learning_rate
  if spec.schedule == 'constant':
    return optax.constant_schedule(peak)
  if spec.schedule == 'inverse_sqrt':

    def schedule(step):
      step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
      w = max(warmup, 1)
      return peak * jnp.minimum(step / w, jnp.sqrt(w / step))

    return schedule
  if spec.schedule == 'warmup_constant':
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak)],
        [max(warmup, 1)],
    )
  if spec.schedule == 'piecewise':
    factor = spec.decay_factor
    if warmup == 0:
      return optax.piecewise_constant_schedule(peak, {b: factor for b in spec.boundaries})
    after = optax.piecewise_constant_schedule(peak, {b - warmup: factor for b in spec.boundaries})
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
  decay_steps = max(num_train_steps - warmup, 1)
  if spec.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup, 1), warmup + decay_steps, end)
  return optax.join_schedules(  # 'linear'
      [
          optax.linear_schedule(0.0, peak, max(warmup, 1)),
          optax.linear_schedule(peak, end, decay_steps),
      ],
      [max(warmup, 1)],
  )


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay: ``ndim >= 2`` (kernels, embeddings)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(
    spec: OptimizerSpec, num_train_steps: int
) -> tuple[optax.GradientTransformation, Callable[[Any], Any]]:
  """Returns ``(optimizer, schedule)`` for ``spec`` (:func:`resolve_spec` of ``config.optimizer``)."""
  schedule = make_schedule(spec, num_train_steps)
  chain = []
  if spec.grad_clip_norm > 0:
    chain.append(optax.clip_by_global_norm(spec.grad_clip_norm))
  if spec.name == 'adamw':
    chain.append(
        optax.adamw(
            schedule,
            b1=spec.b1,
            b2=spec.b2,
            eps=spec.eps,
            weight_decay=spec.weight_decay,
            mask=decay_mask,
        )
    )
  else:
    if spec.weight_decay > 0:  # coupled L2: added to the gradient before the update rule
      chain.append(optax.add_decayed_weights(spec.weight_decay, mask=decay_mask))
    if spec.name == 'adam':
      chain.append(optax.adam(schedule, b1=spec.b1, b2=spec.b2, eps=spec.eps))
    else:
      chain.append(optax.sgd(schedule, momentum=spec.momentum, nesterov=spec.nesterov))
  return optax.chain(*chain), schedule
