"""Models by name: ``create(name, **overrides)`` and ``available()``.

Each model file defines ``MODELS: dict[str, Callable[..., nn.Module]]`` mapping
a registry name to a factory (usually ``functools.partial`` of a module class
with the paper's preset); ``create`` calls the factory with the overrides, so
any module field can be changed from a config
(``create('cp_transformer_lm', num_layers=2)``).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable

import flax.linen as nn

from contextpool_jax.errors import ConfigError

# The model files that contribute names; imported on first use.
_MODEL_MODULES = (
    'contextpool_jax.models.transformer',
    'contextpool_jax.models.vit',
    'contextpool_jax.models.resnet',
)


def _table() -> dict[str, Callable[..., nn.Module]]:
  table: dict[str, Callable[..., nn.Module]] = {}
  for module_name in _MODEL_MODULES:
    for name, factory in importlib.import_module(module_name).MODELS.items():
      if name in table:
        raise RuntimeError(f'model name {name!r} is registered twice ({module_name}).')
      table[name] = factory
  return table


def available() -> list[str]:
  """All registered model names, sorted."""
  return sorted(_table())


def create(name: str, **overrides: Any) -> nn.Module:
  """Builds the model ``name`` with its preset, fields overridden by ``overrides``.

  Raises:
    ValueError: for an unknown name (listing close matches and all names) or an
      override that is not a field of the model.
  """
  table = _table()
  if name not in table:
    close = difflib.get_close_matches(name, table, n=3)
    hint = f' Did you mean {", ".join(map(repr, close))}?' if close else ''
    raise ConfigError(
        f'model={name!r} is not registered.{hint} Available: {", ".join(sorted(table))}.'
    )
  factory = table[name]
  try:
    return factory(**overrides)
  except TypeError as e:
    raise ConfigError(f'model={name!r}: invalid override(s) {sorted(overrides)}: {e}') from e
