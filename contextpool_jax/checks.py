"""Every configuration check and config reader, in one place.

Used by the layers and models (module fields), the training system (the
top-level config and ``config.optimizer``) and the data pipelines
(``config.dataset``). Every check raises :class:`~contextpool_jax.errors.ConfigError`
naming the field, the value it got and what is allowed, so a bad
configuration fails before XLA compiles anything with a message a user can act
on; wrong array ranks (a shape bug, not a setting) raise ``ValueError``.

Readers take the root config and a dotted path (``read_int(config,
'dataset.seq_len', minimum=1)``) and work on ``ml_collections.ConfigDict``,
dicts and attribute objects alike. A missing entry or ``None`` means "use the
default"; without a default the entry is required.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Iterable, Optional, Sequence

from contextpool_jax.errors import ArgumentError, ConfigError

REQUIRED = object()  # the default of a reader for a required entry


# ----------------------------------------------------------------------------
# Values (module fields and config entries).
# ----------------------------------------------------------------------------


def check_argument(name: str, value: Any, ok: bool, expected: str) -> None:
  """Raises :class:`~contextpool_jax.errors.ArgumentError` (a ``ValueError``) unless
  ``ok``: a function argument (not a config entry) ``name=value`` is not allowed."""
  if not ok:
    raise ArgumentError(f'{name}={value!r} is not allowed; expected {expected}.')


def check_choice(owner: str, field: str, value: Any, allowed: Iterable[Any]) -> None:
  """Raises unless ``value`` is one of ``allowed``."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise ConfigError(
        f'{owner}.{field}={value!r} is not supported; allowed values: '
        f'{", ".join(repr(a) for a in allowed)}.'
    )


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_positive(
    owner: str,
    field: str,
    value: Any,
    *,
    allow_none: bool = False,
    integer: bool = False,
    allow_zero: bool = False,
) -> None:
  """Raises unless ``value`` is a positive (or non-negative) number."""
  if value is None and allow_none:
    return
  kind = 'integer' if integer else 'number'
  bound = '>= 0' if allow_zero else '> 0'
  ok = _is_int(value) if integer else _is_number(value)
  if ok:
    ok = value >= 0 if allow_zero else value > 0
  if not ok:
    extra = ' or None' if allow_none else ''
    raise ConfigError(
        f'{owner}.{field}={value!r} is invalid; expected a {kind} ' f'{bound}{extra}.'
    )


def check_finite(owner: str, field: str, value: Any) -> None:
  """Raises unless ``value`` is a finite real number (not a bool)."""
  if not (_is_number(value) and math.isfinite(value)):
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a finite number.')


def check_probability(owner: str, field: str, value: Any) -> None:
  """Raises unless ``0 <= value < 1`` (a dropout rate)."""
  if not _is_number(value) or not 0.0 <= value < 1.0:
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a ' 'number in [0, 1).')


def check_rank(owner: str, name: str, array: Any, ranks: Sequence[int], meaning: str) -> None:
  """Raises ValueError unless ``array.ndim`` is one of ``ranks``; ``meaning`` names the layouts."""
  ndim = getattr(array, 'ndim', None)
  if ndim not in tuple(ranks):
    raise ValueError(
        f'{owner}: {name} has rank {ndim} (shape {getattr(array, "shape", None)}); '
        f'expected rank {" or ".join(str(r) for r in ranks)}: {meaning}.'
    )


def as_tuple(owner: str, field: str, value: Any, length: int) -> tuple[int, ...]:
  """Turns an int or a sequence of ``length`` positive ints into a tuple."""
  given = value
  if _is_int(value):
    value = (value,) * length
  value = tuple(value) if isinstance(value, (tuple, list)) else value
  if (
      not isinstance(value, tuple)
      or len(value) != length
      or not all(_is_int(v) and v > 0 for v in value)
  ):
    raise ConfigError(
        f'{owner}.{field}={given!r} is invalid; expected a positive '
        f'int or a sequence of {length} positive ints.'
    )
  return value


# ----------------------------------------------------------------------------
# Config readers.
# ----------------------------------------------------------------------------


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
  if not _is_int(value) or value < minimum:
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
  ok = _is_number(value) and (lo < value if lo_open else lo <= value) and value <= hi
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


# ----------------------------------------------------------------------------
# Processes.
# ----------------------------------------------------------------------------


def check_process(process_index: Any, process_count: Any) -> tuple[int, int]:
  """``(process_index, process_count)`` as ints; ValueError unless 0 <= index < count."""
  if (
      not _is_int(process_index)
      or not _is_int(process_count)
      or process_count < 1
      or not 0 <= process_index < process_count
  ):
    raise ValueError(
        f'process_index={process_index!r}, process_count={process_count!r} are '
        'invalid; expected integers with 0 <= process_index < process_count.'
    )
  return int(process_index), int(process_count)


def share(total: Any, process_count: int, path: str, *, multiple: int = 1) -> int:
  """A global batch size ``total`` (the value of ``config.<path>``) divided over the
  processes: a positive integer divisible by ``process_count``, each process's
  share divisible by ``multiple`` (e.g. its local device count)."""
  if not _is_int(total) or total < 1 or total % (process_count * multiple):
    need = f'{process_count} processes' + (f' x {multiple} devices each' if multiple > 1 else '')
    raise _bad(path, total, f'a positive integer divisible by the {need}')
  return int(total) // process_count


def per_process(
    config: Any, path: str, process_count: int, *, default: Any = REQUIRED, multiple: int = 1
) -> int:
  """:func:`share` of ``config.<path>``."""
  return share(lookup(config, path, default), process_count, path, multiple=multiple)
