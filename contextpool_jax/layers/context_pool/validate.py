"""ContextPool's field choices and the checks of its fields and inputs.

Every check runs at trace time, before XLA compiles anything, and raises a
:class:`~contextpool_jax.base.errors.ConfigError` (a ValueError) naming the field,
the value and what is allowed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from contextpool_jax.base import checks
from contextpool_jax.base.errors import ConfigError

Array = jax.Array

OWNER = 'ContextPool'

WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
MAPPINGS = ('cnn', 'mlp', 'attention')
SIZE_NORMS = ('softmax', 'sigmoid')
IMPLEMENTATIONS = ('auto', 'dense', 'blockwise')
# implementation='auto' uses 'blockwise' when the number of input positions n
# is larger than this: about where blockwise starts to need less compiled
# forward + backward memory than dense and stops being slower on CPU, so 32 x 32
# grids and shorter stay dense and the enwik8/text8 stages (2048-8192) are
# blockwise. Measured: docs/performance.md#contextpool-at-long-sequences, `python -m
# benchmarks.contextpool_memory`.
AUTO_BLOCKWISE_THRESHOLD = 1024
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    'relu': nn.relu,
    'gelu': nn.gelu,
    'silu': nn.silu,
    'tanh': jnp.tanh,
}


def check_fields(pool: Any) -> None:
  """Raises for any invalid field of the :class:`~.module.ContextPool` ``pool``."""
  checks.check_choice(OWNER, 'weights', pool.weights, WEIGHTS)
  checks.check_choice(OWNER, 'locality', pool.locality, LOCALITIES)
  checks.check_choice(OWNER, 'mapping', pool.mapping, MAPPINGS)
  checks.check_choice(OWNER, 'size_norm', pool.size_norm, SIZE_NORMS)
  checks.check_choice(OWNER, 'activation', pool.activation, tuple(ACTIVATIONS))
  checks.check_choice(OWNER, 'implementation', pool.implementation, IMPLEMENTATIONS)
  checks.check_positive(OWNER, 'block_size', pool.block_size, integer=True)
  checks.check_positive(OWNER, 'gaussian_skip_nats', pool.gaussian_skip_nats, allow_none=True)
  checks.check_positive(OWNER, 'ratio', pool.ratio, allow_none=True)
  checks.check_positive(OWNER, 'kernel_size', pool.kernel_size, integer=True)
  checks.check_positive(OWNER, 'hidden_features', pool.hidden_features, integer=True)
  checks.check_positive(OWNER, 'window', pool.window, integer=True)
  checks.check_positive(OWNER, 'window_softness', pool.window_softness)
  if pool.random_span is not None and not (
      isinstance(pool.random_span, int)
      and not isinstance(pool.random_span, bool)
      and pool.random_span >= pool.window
  ):
    raise ConfigError(
        f'{OWNER}.random_span={pool.random_span!r} is invalid; expected '
        f'an int >= window ({pool.window!r}), or None (4 * window).'
    )
  checks.check_positive(
      OWNER, 'nonlocal_features', pool.nonlocal_features, allow_none=True, integer=True
  )
  checks.check_probability(OWNER, 'dropout_rate', pool.dropout_rate)
  if not isinstance(pool.random_seed, int) or isinstance(pool.random_seed, bool):
    raise ConfigError(f'{OWNER}.random_seed={pool.random_seed!r} is invalid; ' 'expected an int.')
  checks.check_positive(OWNER, 'sigma_length', pool.sigma_length, allow_none=True, integer=True)
  checks.check_finite(OWNER, 'size_bias_init', pool.size_bias_init)
  checks.check_finite(OWNER, 'gate_init', pool.gate_init)
  for name in ('residual', 'gate', 'causal', 'decode'):
    if not isinstance(getattr(pool, name), bool):
      raise ConfigError(
          f'{OWNER}.{name}={getattr(pool, name)!r} is invalid; ' 'expected True or False.'
      )
  if pool.decode and not pool.causal:
    raise ConfigError(
        f'{OWNER}.decode=True needs causal=True (streaming reads x_<=t only); '
        f'got causal={pool.causal!r}.'
    )
  if pool.gate and pool.residual:
    raise ConfigError(
        f'{OWNER}.gate=True with residual=True: choose one way to combine x and '
        'pool(x) (gate: x + g * (pool(x) - x); residual: x + pool(x)).'
    )


def check_inputs(pool: Any, x: Array, mask: Optional[Array]) -> tuple[int, ...]:
  """Raises for invalid fields (:func:`check_fields`) or inputs of a whole-sequence
  call of ``pool``; returns the strides, one per spatial axis."""
  check_fields(pool)
  checks.check_rank(
      OWNER, 'x', x, (3, 4), '[batch, length, features] or [batch, height, width, features]'
  )
  ndim = x.ndim - 2
  strides = checks.as_tuple(OWNER, 'strides', pool.strides, ndim)
  if pool.window_shape is not None:
    checks.as_tuple(OWNER, 'window_shape', pool.window_shape, ndim)
  if pool.causal and ndim != 1:
    raise ConfigError(
        f'{OWNER}.causal=True needs a sequence [batch, length, '
        f'features]; got a grid of shape {x.shape}. Causal pooling '
        'is only defined for 1D sequences.'
    )
  if pool.sigma_length is not None and ndim != 1:
    raise ConfigError(
        f'{OWNER}.sigma_length={pool.sigma_length!r} is for sequences; got a grid of '
        f'shape {x.shape} (grids use sigma = r S (h + w) / 2). Allowed: None.'
    )
  if pool.causal and any(s != 1 for s in strides):
    raise ConfigError(
        f'{OWNER}.strides={pool.strides!r} is not allowed with ' 'causal=True; allowed: 1.'
    )
  if mask is not None and tuple(mask.shape) != tuple(x.shape[:-1]):
    raise ValueError(
        f'{OWNER}: mask has shape {tuple(mask.shape)}; expected '
        f'x.shape[:-1] = {tuple(x.shape[:-1])} (True = real token).'
    )
  return strides


def check_step(pool: Any, x: Array, deterministic: bool) -> None:
  """Raises unless ``x`` is one position ``[batch, 1, features]`` of an inference
  (no dropout) streaming step of ``pool``."""
  if x.shape[1] != 1:
    raise ValueError(
        f'{OWNER}: a decode=True step takes one position [batch, 1, features]; '
        f'got x of shape {x.shape}.'
    )
  if not deterministic and pool.dropout_rate > 0.0:
    raise ValueError(
        f'{OWNER}: decode=True steps are inference; got deterministic=False with '
        f'dropout_rate={pool.dropout_rate!r}.'
    )
