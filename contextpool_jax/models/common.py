"""Pieces shared by the model files: their fields (one config dataclass per family) and
small helpers. A model inserts ContextPool from its ``context_pool`` field with
:func:`~contextpool_jax.layers.context_pool.make_context_pool`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax


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


def count_params(params: Any) -> int:
  """Number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` output)."""
  return int(sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))
