"""Every field of the model a config builds, in ``config.model``, with its default.

Config files list only what differs from the modules' defaults; :func:`complete`
fills in the rest from the modules' own fields (the one source of truth). It is
called by every ``get_config`` (``configs/common.py``), so that the command line
reaches each field (``--config.model.<field>=...``,
``--config.model.context_pool.<field>=...``); by the trainer, so that the saved
``config.json`` records the values used even for a config built in code; and on
the saved config when a run resumes (a ``config.json`` written before a field
existed compares equal on the completed values).

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

:func:`check_overrides` explains an override of a key the config does not have in
one line (the key, the config file, the closest keys).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from absl import flags
import ml_collections
from ml_collections import config_dict
from ml_collections import config_flags

from contextpool_jax.errors import ConfigError
from contextpool_jax.layers.context_pool import CONTEXT_POOL_MODEL_FIELDS
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.models import registry

# Model fields a config does not offer, and why.
NOT_OFFERED = {
    'dtype': "set from the run's config.dtype",
    'remat': "set from the run's config.remat",
    'param_dtype': 'parameters stay float32 (config.dtype sets the compute dtype)',
    'bn_axis_name': 'names a pmap / shard_map axis; the trainer jits over sharded arrays',
}

_PLAIN_TYPES = {'bool': bool, 'int': int, 'float': float, 'str': str}


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
# Command-line overrides.
# ----------------------------------------------------------------------------


def _not_offered(where: str, key: str) -> Optional[str]:
  """Why a model (or ContextPool) field is not a config entry, or None."""
  if where == 'config.model' and key in NOT_OFFERED:
    return NOT_OFFERED[key]
  if where == 'config.model.context_pool' and key in CONTEXT_POOL_MODEL_FIELDS:
    return (
        'the model that inserts ContextPool sets it (a decoder causal=True and decode, a '
        "ResNet strides, the model's dtypes; window_shape goes with strides)"
    )
  return None


def check_overrides(config: Any, overrides: Iterable[str], config_file: str) -> None:
  """Raises ConfigError for the first override path that is not an entry of ``config``.

  ``overrides``: dotted paths below the config (``'model.context_pool.ratio'``
  for ``--config.model.context_pool.ratio=...``). The one-line message names the
  override, the config file and the closest keys at the level where the path
  leaves the config (all of its keys when none is close), or why a model field
  is not an entry (:data:`NOT_OFFERED`, ``CONTEXT_POOL_MODEL_FIELDS``).
  """
  for path in overrides:
    node, where = config, 'config'
    for key in path.split('.'):
      if node is None:
        raise ConfigError(
            f'config file {config_file}: override --config.{path}: {where} is None in this '
            f'config (off), so it has no fields to override; a whole mapping switches it on: '
            f'--{where}="{{...}}".'
        )
      if not isinstance(node, (ml_collections.ConfigDict, Mapping)):
        raise ConfigError(
            f'config file {config_file}: unknown override --config.{path}: {where} is '
            f'{node!r}, not a section with fields.'
        )
      if key not in node:
        reason = _not_offered(where, key)
        if reason:
          raise ConfigError(
              f'config file {config_file}: override --config.{path} is not offered: {reason}.'
          )
        keys = [str(k) for k in node.keys()]
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
        hint = (
            f'did you mean: {", ".join(close)}?'
            if close
            else f'{where} has: {", ".join(sorted(keys))}.'
        )
        raise ConfigError(f'config file {config_file}: unknown override --config.{path}; {hint}')
      node, where = node[key], f'{where}.{key}'


def command_line_config(
    argv: Sequence[str], flag: str = 'config'
) -> tuple[Optional[str], list[str]]:
  """``(config file, override paths)`` of a command line, as ``config_flags`` reads
  them: ``--config=FILE`` or ``--config FILE``, and ``--config.a.b=value`` ->
  ``'a.b'`` (flag files expanded)."""
  argv = list(flags.FLAGS.read_flags_from_files(list(argv), force_gnu=False))
  config_file, overrides = None, []
  for i, arg in enumerate(argv):
    match = re.match(rf'^--?{flag}(=(.*))?$', arg)
    if match:
      config_file = (
          match.group(2) if match.group(1) else (argv[i + 1] if i + 1 < len(argv) else None)
      )
    match = re.match(rf'^--?(no)?{flag}\.([^=]+)', arg)
    if match and match.group(2) not in overrides:
      overrides.append(match.group(2))
  return config_file, overrides


def load_config_file(config_file: str) -> Any:
  """The config ``FILE[:ARG]`` gives (``get_config(ARG)``), loaded by ``config_flags``
  (on flags of its own, without overrides)."""
  argv = ['load_config_file', f'--config={config_file}']
  flag_values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file(
      'config', flag_values=flag_values, lock_config=False, sys_argv=argv
  )
  flag_values(argv)
  return holder.value


def override_error(argv: Sequence[str], flag: str = 'config') -> Optional[str]:
  """Why the command line's ``--config.<path>`` overrides do not fit its config file,
  in one line (:func:`check_overrides`), or None if they all name entries of it
  (or the file cannot be loaded: its own error says why)."""
  config_file, overrides = command_line_config(argv, flag)
  if config_file is None or not overrides:
    return None
  try:
    config = load_config_file(config_file)
  except Exception:  # pylint: disable=broad-except  # the flag's own error tells
    return None
  try:
    check_overrides(config, overrides, config_file)
  except ConfigError as e:
    return str(e)
  return None


def model_name_error(argv: Sequence[str], override_values: Mapping[str, Any]) -> Optional[str]:
  """One line if the command line changes ``model.name``, else None.

  ``get_config`` filled ``config.model`` with the fields of its own model (its
  preset's values where the file sets none), before the overrides: a new name
  would silently keep the old preset's sizes. The config file's argument
  chooses the model instead (e.g. ``configs/wmt14.py:en-de,big,cp``).
  """
  if 'model.name' not in override_values:
    return None
  config_file, _ = command_line_config(argv)
  filled = load_config_file(config_file).model.name
  name = override_values['model.name']
  if name == filled:
    return None
  return (
      f'config file {config_file}: override --config.model.name={name} is not allowed: '
      f'config.model holds the fields of {filled!r} (its preset where the file sets none); '
      "choose the model with the config file's argument (FILE:ARG) or another config file."
  )
