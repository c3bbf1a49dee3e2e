"""``train.py``'s config: a config file loaded and completed before the overrides
(:class:`ConfigFileParser`, :func:`load_config_file`), and one line for an override
that does not fit it.

:func:`check_overrides` explains an override of a key the config does not have in
one line (the key, the config file, the closest keys); :func:`model_name_error`
refuses a new ``model.name`` (the config's model fields are those of its own model).
"""

from __future__ import annotations

import difflib
import importlib.util
import pathlib
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

from absl import flags
import ml_collections

from contextpool_jax import config_fields
from contextpool_jax.errors import ConfigError
from contextpool_jax.layers.context_pool import CONTEXT_POOL_MODEL_FIELDS


def _not_offered(where: str, key: str) -> Optional[str]:
  """Why a model (or ContextPool) field is not a config entry, or None."""
  if where == 'config.model' and key in config_fields.NOT_OFFERED:
    return config_fields.NOT_OFFERED[key]
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
  is not an entry (:data:`~contextpool_jax.config_fields.NOT_OFFERED`,
  ``CONTEXT_POOL_MODEL_FIELDS``).
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


def load_config_file(config_file: str) -> ml_collections.ConfigDict:
  """The config ``FILE[:ARG]`` gives (its ``get_config(ARG)``), completed
  (:func:`~contextpool_jax.config_fields.complete`): what the command line's
  ``--config.<path>`` overrides apply to, so that they reach every field of the model.

  Raises:
    ConfigError: the file does not exist, has no ``get_config``, or its
      ``get_config`` raised a ValueError (a bad argument: its message says which).
  """
  path, has_argument, argument = config_file.partition(':')
  spec = importlib.util.spec_from_file_location('config_file', path)
  if spec is None or not pathlib.Path(path).is_file():
    raise ConfigError(f'config file {config_file}: {path} is not a Python file.')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, 'get_config', None)):
    raise ConfigError(f'config file {config_file}: {path} defines no get_config().')
  try:
    config = module.get_config(argument) if has_argument else module.get_config()
  except ConfigError:
    raise
  except ValueError as e:  # the file's own check of its argument
    raise ConfigError(str(e)) from e
  return config_fields.complete(config)


class ConfigFileParser(flags.ArgumentParser):
  """The parser of ``train.py``'s ``--config=FILE[:ARG]``: the file's config completed
  (:func:`load_config_file`) and locked, before ``config_flags`` applies the
  ``--config.<path>`` overrides. Set it on a ``config_flags.DEFINE_config_file`` flag:
  ``flag_values['config'].parser = ConfigFileParser()``."""

  def parse(self, argument: str) -> ml_collections.ConfigDict:
    config = load_config_file(argument)
    config.lock()
    return config

  def flag_type(self) -> str:
    return 'config file'


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

  :func:`load_config_file` filled ``config.model`` with the fields of its own model
  (its preset's values where the file sets none), before the overrides: a new name
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
