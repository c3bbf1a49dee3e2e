"""Config readers: a run's config (``ml_collections.ConfigDict``), read and checked.

Used only by the section readers that ``training.spec.read`` calls (the top level,
``config.model``, the task's fields, ``config.dataset``, ``config.optimizer``, the
writers', ``config.profile``: the table in :mod:`contextpool_jax.training.spec`); never by
the layers and models, which check their fields with :mod:`contextpool_jax.base.checks`.

Readers take the root config and a dotted path (``read_int(config,
'dataset.seq_len', minimum=1)``) and work on ``ml_collections.ConfigDict``,
dicts and attribute objects alike. A missing entry or ``None`` means "use the
default"; without a default the entry is required. Every reader raises
:class:`~contextpool_jax.base.errors.ConfigError` naming the entry, the value it got and
what is allowed.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional

from contextpool_jax.base.checks import check_choice, is_int, is_number
from contextpool_jax.base.errors import ConfigError

REQUIRED = object()  # the default of a reader for a required entry


def _child(node: Any, key: str) -> Any:
  if node is None:
    return None
  if isinstance(node, dict) or hasattr(node, 'keys'):
    try:
      return node[key] if key in node else None
    except TypeError:
      return None
  return getattr(node, key, None)


def lookup(config: Any, path: str, default: Any = REQUIRED) -> Any:
  """``config.<path>``; a missing entry or None gives ``default`` (required if none)."""
  node = config
  for key in path.split('.'):
    node = _child(node, key)
  if node is None:
    if default is REQUIRED:
      raise ConfigError(f'config.{path} is missing.')
    return default
  return node


def _bad(path: str, value: Any, expected: str) -> ConfigError:
  return ConfigError(f'config.{path}={value!r} is invalid; expected {expected}.')


def read_int(config: Any, path: str, *, minimum: int = 0, default: Any = REQUIRED) -> int:
  """An integer entry ``>= minimum``."""
  value = lookup(config, path, default)
  if not is_int(value) or value < minimum:
    raise _bad(path, value, f'an integer >= {minimum}')
  return int(value)


def read_float(
    config: Any,
    path: str,
    *,
    lo: float = -float('inf'),
    hi: float = float('inf'),
    lo_open: bool = False,
    default: Any = REQUIRED,
) -> float:
  """A number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
  value = lookup(config, path, default)
  ok = is_number(value) and (lo < value if lo_open else lo <= value) and value <= hi
  if not ok:
    raise _bad(path, value, f'a number in {"(" if lo_open else "["}{lo}, {hi}]')
  return float(value)


def read_bool(config: Any, path: str, *, default: Any = REQUIRED) -> bool:
  value = lookup(config, path, default)
  if not isinstance(value, bool):
    raise _bad(path, value, 'True or False')
  return value


def read_str(config: Any, path: str, *, default: Any = REQUIRED) -> Any:
  """A non-empty string (or the default, which may be None)."""
  value = lookup(config, path, default)
  if value is default and default is None:
    return None
  if not isinstance(value, str) or not value:
    raise _bad(path, value, 'a non-empty string')
  return value


def read_dir(config: Any, path: str) -> Optional[str]:
  """A directory setting: a path string, or None for the library's default
  (``''`` and an absent entry also mean the default, never the current directory)."""
  value = lookup(config, path, None)
  if value is None or value == '':
    return None
  if not isinstance(value, (str, os.PathLike)):
    raise _bad(path, value, 'a directory path (a string), or None / "" for the default')
  return os.fspath(value)


def read_choice(config: Any, path: str, allowed: Iterable[Any], *, default: Any = REQUIRED) -> Any:
  value = lookup(config, path, default)
  check_choice('config', path, value, allowed)
  return value


def share(total: Any, process_count: int, path: str, *, multiple: int = 1) -> int:
  """A global batch size ``total`` (the value of ``config.<path>``) divided over the
  processes: a positive integer divisible by ``process_count``, each process's
  share divisible by ``multiple`` (e.g. its local device count)."""
  if not is_int(total) or total < 1 or total % (process_count * multiple):
    need = f'{process_count} processes' + (f' x {multiple} devices each' if multiple > 1 else '')
    raise _bad(path, total, f'a positive integer divisible by the {need}')
  return int(total) // process_count


def per_process(
    config: Any, path: str, process_count: int, *, default: Any = REQUIRED, multiple: int = 1
) -> int:
  """:func:`share` of ``config.<path>``."""
  return share(lookup(config, path, default), process_count, path, multiple=multiple)
