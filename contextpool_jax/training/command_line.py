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
import sys
import types
from typing import Any, Iterable, Mapping, NoReturn, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from contextpool_jax.runs import config_fields
from contextpool_jax.base.errors import ConfigError
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
  is not an entry (:data:`~contextpool_jax.runs.config_fields.NOT_OFFERED`,
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


# The package of the configs a name chooses (``--config default``): the checkout's configs/,
# installed (and mapped by the editable install) as this package.
CONFIGS_PACKAGE = 'contextpool_jax.configs'


def _package_configs_dir() -> Optional[pathlib.Path]:
  """The directory of :data:`CONFIGS_PACKAGE`, or None if it is not installed (a checkout
  run without ``pip install -e .``)."""
  spec = importlib.util.find_spec(CONFIGS_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()


def config_names() -> list[str]:
  """The configs ``--config NAME`` takes: the modules of :data:`CONFIGS_PACKAGE` with a
  ``get_config`` (not ``common``)."""
  directory = _package_configs_dir()
  if directory is None:
    return []
  return sorted(
      p.stem for p in directory.glob('*.py') if 'def get_config' in p.read_text(encoding='utf-8')
  )


def _is_name(path: str) -> bool:
  return bool(re.fullmatch(r'\w+', path)) and not pathlib.Path(path).is_file()


def _package_of(directory: pathlib.Path) -> str:
  """The package a directory of config files is imported as, so that their relative imports
  (``from . import common``) work: :data:`CONFIGS_PACKAGE` for its own directory, else the
  directory's name (``configs`` in a checkout), imported from that directory."""
  if directory == _package_configs_dir():
    return CONFIGS_PACKAGE
  name = directory.name
  loaded = sys.modules.get(name)
  if loaded is not None:
    paths = [pathlib.Path(p).resolve() for p in getattr(loaded, '__path__', [])]
    if directory not in paths:
      raise ConfigError(
          f'config directory {directory}: a different package {name!r} is already imported '
          f'(from {paths or loaded}); rename the directory.'
      )
    return name
  spec = importlib.util.spec_from_file_location(
      name, directory / '__init__.py', submodule_search_locations=[str(directory)]
  )
  assert spec is not None and spec.loader is not None  # a location with a .py file
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return name


def config_module(config_file: str) -> types.ModuleType:
  """The module of ``--config``'s value without its ``:ARG``: a name (``default``, a module of
  :data:`CONFIGS_PACKAGE`) or a file. A file in a package directory (one with
  ``__init__.py``, like ``configs/``) is imported as a module of that package
  (:func:`_package_of`); any other file on its own.

  Raises:
    ConfigError: no such name or file.
  """
  if _is_name(config_file):
    if config_file not in config_names():
      names = config_names()
      raise ConfigError(
          f'config {config_file}: not a config of {CONFIGS_PACKAGE} (it has: '
          f'{", ".join(names)}) nor a file.'
          if names
          else f'config {config_file}: {CONFIGS_PACKAGE} is not installed (pip install -e . '
          f'in the checkout) and there is no such file; pass the path, configs/{config_file}.py.'
      )
    return importlib.import_module(f'{CONFIGS_PACKAGE}.{config_file}')
  path = pathlib.Path(config_file)
  if not path.is_file() or path.suffix != '.py':
    raise ConfigError(f'config file {config_file}: {config_file} is not a Python file.')
  path = path.resolve()
  if (path.parent / '__init__.py').is_file():
    return importlib.import_module(f'{_package_of(path.parent)}.{path.stem}')
  spec = importlib.util.spec_from_file_location('config_file', path)
  assert spec is not None and spec.loader is not None  # a location with a .py file
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config_file(config_file: str) -> ml_collections.ConfigDict:
  """The config ``NAME[:ARG]`` or ``FILE[:ARG]`` gives (its ``get_config(ARG)``: the module
  :func:`config_module` finds), completed (:func:`~contextpool_jax.runs.config_fields.complete`):
  what the command line's ``--config.<path>`` overrides apply to, so that they reach every
  field of the model.

  Raises:
    ConfigError: the name or file does not exist, has no ``get_config``, or its
      ``get_config`` raised a ValueError (a bad argument: its message says which).
  """
  path, has_argument, argument = config_file.partition(':')
  module = config_module(path)
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
  assert config_file is not None  # overrides come with the --config they override
  filled = load_config_file(config_file).model.name
  name = override_values['model.name']
  if name == filled:
    return None
  return (
      f'config file {config_file}: override --config.model.name={name} is not allowed: '
      f'config.model holds the fields of {filled!r} (its preset where the file sets none); '
      "choose the model with the config file's argument (FILE:ARG) or another config file."
  )


# ----------------------------------------------------------------------------
# What the commands (contextpool-train, contextpool-compile) share.
# ----------------------------------------------------------------------------


def missing_extra(command: str, extra: str, error: ModuleNotFoundError) -> str:
  """The one line for a command whose extra is not installed (``pip install .`` alone
  installs what loading and sampling need, not training: pyproject.toml)."""
  return (
      f'{command} needs the [{extra}] extra, not installed here (no module named'
      f" {error.name!r}): pip install 'contextpool-jax[{extra}]'"
  )


def fail(message: str) -> NoReturn:
  """Ends a command with ``error: <message>`` on stderr and exit status 1."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
  """``app.run``'s flag parsing, with one line for an override that does not fit the config.

  The config file's config is completed (every field of its model, with its
  default: :func:`load_config_file`), then config_flags applies the
  ``--config.<path>`` overrides while parsing; a path the config does not have
  ends there in a traceback (KeyError / AttributeError / ValueError), which
  becomes ``error: config file F: unknown override --config.<path>; did you mean:
  ...?``. Changing ``model.name`` is refused: the config's model fields were
  filled in for its own model.
  """
  flags.FLAGS['config'].parser = ConfigFileParser()
  try:
    rest = app.parse_flags_with_usage(argv)
  except Exception:  # pylint: disable=broad-except  # explained below, or re-raised
    message = override_error(argv)
    if message is None:
      raise
    fail(message)
  message = model_name_error(argv, config_flags.get_override_values(flags.FLAGS['config']))
  if message:
    fail(message)
  return rest


def quiet_console() -> None:
  """One line per event unless ``--verbosity`` (``-v``) is given (docs/training.md#console).

  Without it: absl at WARNING (orbax's and grain's INFO logs would drown the
  progress bar) and TFDS quiet (``console.set_quiet``: no progress bars while it
  prepares a dataset, none of its warnings a user cannot act on). With it: the
  level asked for, and TFDS as it is by default.
  """
  from contextpool_jax.io import console  # pylint: disable=g-import-not-at-top

  quiet = not flags.FLAGS['verbosity'].present
  if quiet:
    logging.set_verbosity(logging.WARNING)
  console.set_quiet(quiet)
