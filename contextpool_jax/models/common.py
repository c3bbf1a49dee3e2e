"""Pieces shared by the model files: config fields, ContextPool insertion, small helpers."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers.context_pool import ContextPool

Dtype = Any

# ContextPool fields that the model inserting it sets (make_context_pool's
# ``defaults``: a decoder's ``causal`` and ``decode``, a ResNet's ``strides``; the
# model's ``dtype`` and ``param_dtype``), and ``window_shape``, which only places
# the centres of a strided pool. A config does not offer them
# (contextpool_jax.training.config_fields); every other field is a config entry.
CONTEXT_POOL_MODEL_FIELDS = ('causal', 'decode', 'strides', 'window_shape', 'dtype', 'param_dtype')


def module_fields(config_cls: type) -> type[nn.Module]:
  """An ``nn.Module`` base class whose fields are those of the dataclass ``config_cls``.

  Each model family declares its fields once, in a frozen config dataclass
  (e.g. ``TransformerConfig``) that is passed down its module tree, as flax's
  wmt example does. Its top modules subclass ``module_fields(Config)``, so the
  same fields are also theirs (same names, types, defaults and order; a
  subclass may redeclare one to change its default): ``Model(num_layers=2)``,
  ``model.num_layers`` and registry overrides (``create(name, num_layers=2)``)
  keep working. ``model.config`` bundles the module's field values into one
  ``config_cls``.
  """
  fields = dataclasses.fields(config_cls)
  taken = [
      f.name
      for f in fields
      if hasattr(nn.Module, f.name) or f.name in ('parent', 'name', 'scope', 'config')
  ]
  if taken:
    raise TypeError(
        f'{config_cls.__name__}: field name(s) {taken} are nn.Module ' "attributes (or 'config')."
    )
  if any(f.default_factory is not dataclasses.MISSING for f in fields):
    raise TypeError(f'{config_cls.__name__}: module_fields does not support default_factory.')
  name = f'{config_cls.__name__}Fields'
  namespace = {
      '__module__': config_cls.__module__,
      '__qualname__': name,
      '__doc__': f'The fields of :class:`{config_cls.__name__}` as module fields.',
      '__annotations__': {f.name: f.type for f in fields},
      **{f.name: f.default for f in fields if f.default is not dataclasses.MISSING},
      'config': property(
          lambda self: config_cls(**{f.name: getattr(self, f.name) for f in fields}),
          doc=f"This module's fields as one frozen :class:`{config_cls.__name__}`.",
      ),
  }
  return type(name, (nn.Module,), namespace)


def make_context_pool(
    context_pool: Optional[Mapping[str, Any]],
    *,
    dtype: Optional[Dtype],
    param_dtype: Dtype,
    name: Optional[str] = None,
    **defaults: Any,
) -> Optional[ContextPool]:
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
    raise ConfigError(
        f'context_pool has unknown field(s) {unknown}; ContextPool fields: '
        f'{", ".join(sorted(fields))}.'
    )
  for key, value in defaults.items():
    if key in overrides and overrides[key] != value:
      raise ConfigError(
          f'context_pool.{key}={overrides[key]!r} conflicts with this model, '
          f'which needs {key}={value!r}.'
      )
  kwargs = {**defaults, **overrides}
  kwargs.setdefault('dtype', dtype)
  kwargs.setdefault('param_dtype', param_dtype)
  return ContextPool(name=name, **kwargs)


def count_params(params: Any) -> int:
  """Number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` output)."""
  return int(sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))
