"""Models by name: :data:`MODELS`, ``create(name, **overrides)`` and ``available()``.

Each model file defines ``MODELS: dict[str, Callable[..., nn.Module]]`` mapping
a registry name to a factory (usually ``functools.partial`` of a module class
with the paper's preset); :data:`MODELS` is their union, and ``create`` calls the
factory with the overrides, so any module field can be changed from a config
(``create('cp_transformer_lm', num_layers=2)``).
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

import flax.linen as nn

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.models import resnet
from contextpool_jax.models import transformer
from contextpool_jax.models import vit


def _union(*tables: dict[str, Callable[..., nn.Module]]) -> dict[str, Callable[..., nn.Module]]:
  union: dict[str, Callable[..., nn.Module]] = {}
  for table in tables:
    for name, factory in table.items():
      if name in union:
        raise RuntimeError(f'model name {name!r} is registered twice.')
      union[name] = factory
  return union


# Every model by name: the model files' tables.
MODELS: dict[str, Callable[..., nn.Module]] = _union(transformer.MODELS, vit.MODELS, resnet.MODELS)


def available() -> list[str]:
  """All registered model names, sorted."""
  return sorted(MODELS)


def factory(name: str) -> Callable[..., nn.Module]:
  """``MODELS[name]``: the model class with the preset of ``name``.

  Raises:
    ConfigError: (a ValueError) an unknown name, listing close matches and all names.
  """
  if name not in MODELS:
    close = difflib.get_close_matches(name, MODELS, n=3)
    hint = f' Did you mean {", ".join(map(repr, close))}?' if close else ''
    raise ConfigError(
        f'model={name!r} is not registered.{hint} Available: {", ".join(sorted(MODELS))}.'
    )
  return MODELS[name]


def create(name: str, **overrides: Any) -> nn.Module:
  """Builds the model ``name`` with its preset, fields overridden by ``overrides``.

  Raises:
    ValueError: for an unknown name (listing close matches and all names) or an
      override that is not a field of the model.
  """
  make = factory(name)
  try:
    return make(**overrides)
  except TypeError as e:
    raise ConfigError(f'model={name!r}: invalid override(s) {sorted(overrides)}: {e}') from e
