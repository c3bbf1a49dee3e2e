"""Pieces shared by the model files: ContextPool insertion and small helpers."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import jax

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers.context_pool import ContextPool

Dtype = Any


def make_context_pool(context_pool: Optional[Mapping[str, Any]], *,
                      dtype: Optional[Dtype], param_dtype: Dtype,
                      name: Optional[str] = None, **defaults: Any) -> Optional[ContextPool]:
  """A ContextPool built from a model's ``context_pool`` field, or None.

  Convention used by every model: ``context_pool=None`` means no ContextPool;
  a mapping (possibly empty) means "insert ContextPool" with those field
  overrides on top of ``defaults`` (e.g. ``causal=True`` set by a decoder; a
  user override of a default the model needs, like ``causal``, raises).

  Raises:
    ValueError: for an unknown ContextPool field or a conflicting override.
  """
  if context_pool is None:
    return None
  overrides = dict(context_pool)
  fields = set(ContextPool.__dataclass_fields__) - {'parent', 'name'}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ConfigError(f'context_pool has unknown field(s) {unknown}; ContextPool fields: '
                     f'{", ".join(sorted(fields))}.')
  for key, value in defaults.items():
    if key in overrides and overrides[key] != value:
      raise ConfigError(f'context_pool.{key}={overrides[key]!r} conflicts with this model, '
                       f'which needs {key}={value!r}.')
  kwargs = {**defaults, **overrides}
  kwargs.setdefault('dtype', dtype)
  kwargs.setdefault('param_dtype', param_dtype)
  return ContextPool(name=name, **kwargs)


def count_params(params: Any) -> int:
  """Number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` output)."""
  return int(sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))
