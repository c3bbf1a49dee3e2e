"""``config.model``: every field of the model a config names, with its default
(:func:`complete`), and the model those fields build (:func:`build_model`).

Config files list only what differs from the modules' defaults; :func:`complete`
fills in the rest from the modules' own fields (the one source of truth). The
trainer completes the run's config once, as it starts, so that the saved
``config.json`` records the values used even for a config built in code; the
command line (``train.py``) completes the config file's config before it applies
the overrides, so that they reach each field (``--config.model.<field>=...``,
``--config.model.context_pool.<field>=...``). A ``config.json`` written before a
field existed is compared on resume with that field at its default
(:func:`complete_model`).

What is filled in:

* ``config.model``: every field of the module the registry name builds, with the
  value of its preset (``models.create(name)``), except :data:`NOT_OFFERED`.
* ``config.model.context_pool`` when it is a mapping (ContextPool on): every
  ContextPool field with its default, except those the model sets
  (:data:`~contextpool_jax.layers.context_pool.CONTEXT_POOL_MODEL_FIELDS`: ``causal``,
  ``decode``, ``strides``, ``window_shape``, ``dtype``, ``param_dtype``). None
  (ContextPool off, e.g. a baseline) stays None: its fields do not appear.
* Only fields whose default is a plain value (None, bool, int, float, str, a
  tuple of them, a mapping): initialisers and dtypes are not config values.

An entry whose field is ``bool``, ``int``, ``float`` or ``str`` keeps that type (the
command line parses ``--config.model.num_layers=4`` as an int); any other field
(``Optional[float]``, ``int | Sequence[int]``, a sequence) takes a Python literal:
``--config.model.context_pool.ratio=0.025``, ``...ratio=None``,
``--config.model.stage_sizes='(1, 1, 1, 1)'``; a word that is not a literal is a
string (``--config.model.stage_pattern=C,A,A,A``). The module's own check rejects
a bad value with a message naming the field.

:func:`build_model` is how a run's model is built (``training.spec.read``) and how a
workdir is loaded back (:mod:`contextpool_jax.runs.workdirs`): the class of
``config.model.name`` (``models.registry.MODELS``) given the other fields, ``dtype``
and ``remat``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Iterable, Mapping, Optional

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict

from contextpool_jax.io import config_readers
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.context_pool import CONTEXT_POOL_MODEL_FIELDS
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.models import common as model_common
from contextpool_jax.models import registry

# Model fields a config does not offer, and why.
NOT_OFFERED = {
    'dtype': "set from the run's config.dtype",
    'remat': "set from the run's config.remat",
    'param_dtype': 'parameters stay float32 (config.dtype sets the compute dtype)',
    'bn_axis_name': 'names a pmap / shard_map axis; the trainer jits over sharded arrays',
}

_PLAIN_TYPES = {'bool': bool, 'int': int, 'float': float, 'str': str}
# config.dtype -> the models' compute dtype (float16: with a dynamic loss scale in the
# train state, training.steps.uses_loss_scaling).
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


def _is_plain(value: Any) -> bool:
  if value is None or isinstance(value, (bool, int, float, str)):
    return True
  if isinstance(value, (tuple, list)):
    return all(_is_plain(v) for v in value)
  if isinstance(value, Mapping):
    return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
  return False


@dataclasses.dataclass(frozen=True)
class Field:
  """A config entry of a module field: its default and its plain type (or None)."""

  default: Any
  plain_type: Optional[type]


def _fields(module: Any, skip: Iterable[str]) -> dict[str, Field]:
  skip = set(skip) | {'parent', 'name'}
  out = {}
  for f in dataclasses.fields(module):
    value = getattr(module, f.name)
    if f.name in skip or not _is_plain(value):
      continue
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, '__name__', '')
    out[f.name] = Field(value, _PLAIN_TYPES.get(annotation))
  return out


@functools.cache
def model_fields(name: str) -> dict[str, Field]:
  """The fields of the model ``name`` a config offers, with its preset's values.

  Raises:
    ConfigError: ``name`` is not registered (naming close matches).
  """
  return _fields(registry.create(name), NOT_OFFERED)


@functools.cache
def context_pool_fields() -> dict[str, Field]:
  """The ContextPool fields a config offers, with their defaults."""
  return _fields(ContextPool(), CONTEXT_POOL_MODEL_FIELDS)


def _fill(given: Mapping[str, Any], fields: Mapping[str, Field]) -> dict[str, Any]:
  """``given`` with every field of ``fields`` (declaration order), keys that are
  not fields last (the module rejects them, naming them)."""
  out = {k: given[k] if k in given else f.default for k, f in fields.items()}
  out.update({k: v for k, v in given.items() if k not in out})
  return out


def complete_model(model: Mapping[str, Any]) -> dict[str, Any]:
  """``config.model`` as a plain dict (e.g. a saved ``config.json``'s) with every
  offered field; values the mapping has are kept."""
  model = dict(model)
  if not isinstance(model.get('name'), str):
    return model  # the run's checks name a missing model.name
  out = {'name': model['name'], **_fill(model, model_fields(model['name']))}
  if isinstance(out.get('context_pool'), Mapping):
    out['context_pool'] = _fill(out['context_pool'], context_pool_fields())
  return out


def _entry(value: Any, field: Optional[Field]) -> Any:
  """A ConfigDict value: plain-typed fields as values (an int given for a float
  field becomes a float), others as a reference of type ``object`` (any literal)."""
  if field is None:
    return value
  if field.plain_type is not None:
    if field.plain_type is float and isinstance(value, int) and not isinstance(value, bool):
      return float(value)
    return value
  if isinstance(value, Mapping):
    return value
  return config_dict.FieldReference(value, field_type=object)


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` whose ``model`` has every offered field (module docstring).

  Idempotent; values the config sets are kept, and so is its lock. A config
  without ``model.name`` is returned as a copy (the run's checks name what is
  missing).

  Raises:
    ConfigError: ``config.model.name`` is not registered.
  """
  config = copy.deepcopy(config)
  model = config.get('model')
  if not isinstance(model, ml_collections.ConfigDict) or not isinstance(model.get('name'), str):
    return config
  values = complete_model(model.to_dict())
  fields = model_fields(values['name'])
  new = ml_collections.ConfigDict()
  for k, v in values.items():
    if k == 'context_pool' and isinstance(v, Mapping):
      pool_fields = context_pool_fields()
      v = ml_collections.ConfigDict({pk: _entry(pv, pool_fields.get(pk)) for pk, pv in v.items()})
    else:
      v = _entry(v, fields.get(k))
    setattr(new, k, v)
  with config.unlocked():
    config.model = new
  return config


# ----------------------------------------------------------------------------
# The model.
# ----------------------------------------------------------------------------


def model_settings(config: ml_collections.ConfigDict) -> tuple[Any, str]:
  """``(compute dtype, remat policy)``: the run-level fields the model is built with.

  ``config.remat`` is a policy name of ``models.common.REMAT_POLICIES``; the bool
  of configs and ``config.json`` files written before the policies is read as
  ``'none'`` / ``'full'`` (:func:`~contextpool_jax.models.common.remat_policy`, the
  one place that decides it). A ConfigError names any other value and the choices.
  """
  dtype = DTYPES[config_readers.read_choice(config, 'dtype', DTYPES)]
  return dtype, model_common.remat_policy('config', config_readers.lookup(config, 'remat'))


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """The model class of ``config.model.name`` (``models.registry.MODELS``, with its
  preset) given the section's other fields, ``dtype`` and ``remat``: the section goes
  straight to the module, whose own checks name a bad field."""
  dtype, remat = model_settings(config)
  fields = config_readers.lookup(config, 'model').to_dict()
  name = fields.pop('name', None)
  model = registry.factory(config_readers.read_str(config, 'model.name'))
  try:
    built = model(**fields, dtype=dtype, remat=remat)
  except TypeError as e:  # a key that is not a field of the model
    raise ConfigError(
        f'config.model (model {name!r}): invalid field(s) {sorted(fields)}: {e}'
    ) from e
  # The model's own field checks (each family's check_fields, which the model also runs
  # when traced) run now, before the run takes its workdir.
  check_fields = getattr(built, 'check_fields', None)
  if check_fields is not None:
    check_fields()
  return built
