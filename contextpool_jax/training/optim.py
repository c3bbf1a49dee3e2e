"""Optimizers and learning-rate schedules from a config, all built from optax.

``config.optimizer`` fields:

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

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers import _validation as v

OPTIMIZERS = ('adam', 'adamw', 'sgd')
SCHEDULES = ('constant', 'inverse_sqrt', 'cosine', 'linear', 'warmup_constant', 'piecewise')
_OWNER = 'config.optimizer'


def make_schedule(cfg: ml_collections.ConfigDict, num_train_steps: int) -> optax.Schedule:
  """The learning-rate schedule of ``cfg`` (see the module docstring)."""
  v.check_choice(_OWNER, 'schedule', cfg.schedule, SCHEDULES)
  v.check_positive(_OWNER, 'learning_rate', cfg.learning_rate)
  v.check_positive(_OWNER, 'warmup_steps', cfg.warmup_steps, integer=True, allow_zero=True)
  peak, warmup = float(cfg.learning_rate), int(cfg.warmup_steps)
  end = float(cfg.get('end_learning_rate', 0.0))
  if cfg.schedule == 'constant':
    return optax.constant_schedule(peak)
  if cfg.schedule == 'inverse_sqrt':
    def schedule(step):
      step = jnp.maximum(jnp.asarray(step, jnp.float32), 1.0)
      w = max(warmup, 1)
      return peak * jnp.minimum(step / w, jnp.sqrt(w / step))
    return schedule
  if cfg.schedule == 'warmup_constant':
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, max(warmup, 1)), optax.constant_schedule(peak)],
        [max(warmup, 1)])
  if cfg.schedule == 'piecewise':
    boundaries = tuple(cfg.get('boundaries', ()))
    factor = float(cfg.get('decay_factor', 0.1))
    if not all(isinstance(b, int) and b > warmup for b in boundaries):
      raise ConfigError(f'{_OWNER}.boundaries={boundaries!r} must be steps > warmup_steps.')
    after = optax.piecewise_constant_schedule(peak, {b - warmup: factor for b in boundaries})
    if warmup == 0:
      return optax.piecewise_constant_schedule(peak, {b: factor for b in boundaries})
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])
  decay_steps = max(num_train_steps - warmup, 1)
  if cfg.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, max(warmup, 1),
                                              warmup + decay_steps, end)
  return optax.join_schedules(  # 'linear'
      [optax.linear_schedule(0.0, peak, max(warmup, 1)),
       optax.linear_schedule(peak, end, decay_steps)], [max(warmup, 1)])


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay: ``ndim >= 2`` (kernels, embeddings)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: ml_collections.ConfigDict, num_train_steps: int
                   ) -> tuple[optax.GradientTransformation, Callable[[Any], Any]]:
  """Returns ``(optimizer, schedule)`` for ``config.optimizer``."""
  v.check_choice(_OWNER, 'name', cfg.name, OPTIMIZERS)
  wd = float(cfg.get('weight_decay', 0.0))
  clip = float(cfg.get('grad_clip_norm', 0.0))
  if wd < 0 or clip < 0:
    raise ConfigError(f'{_OWNER}.weight_decay={wd!r} / grad_clip_norm={clip!r} must be >= 0.')
  schedule = make_schedule(cfg, num_train_steps)
  chain = []
  if clip > 0:
    chain.append(optax.clip_by_global_norm(clip))
  if cfg.name == 'adamw':
    chain.append(optax.adamw(schedule, b1=cfg.get('b1', 0.9), b2=cfg.get('b2', 0.999),
                             eps=cfg.get('eps', 1e-8), weight_decay=wd, mask=decay_mask))
  else:
    if wd > 0:  # coupled L2: added to the gradient before the update rule
      chain.append(optax.add_decayed_weights(wd, mask=decay_mask))
    if cfg.name == 'adam':
      chain.append(optax.adam(schedule, b1=cfg.get('b1', 0.9), b2=cfg.get('b2', 0.999),
                              eps=cfg.get('eps', 1e-8)))
    else:
      chain.append(optax.sgd(schedule, momentum=cfg.get('momentum', 0.9),
                             nesterov=cfg.get('nesterov', False)))
  return optax.chain(*chain), schedule
