"""The checks of values: module fields (used by the layers and models), function
arguments and process indices.

Every check of a field raises :class:`~contextpool_jax.base.errors.ConfigError` naming the
owner and field, the value it got and what is allowed, so a bad configuration
fails before XLA compiles anything with a message a user can act on; wrong array
ranks (a shape bug, not a setting) raise ``ValueError``. Reading a run's config
(``ml_collections.ConfigDict``) is :mod:`contextpool_jax.io.config_readers`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Sequence

from contextpool_jax.base.errors import ArgumentError, ConfigError

# ----------------------------------------------------------------------------
# Values (module fields, function arguments).
# ----------------------------------------------------------------------------


def check_argument(name: str, value: Any, ok: bool, expected: str) -> None:
  """Raises :class:`~contextpool_jax.base.errors.ArgumentError` (a ``ValueError``) unless
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


def is_int(value: Any) -> bool:
  """An integer, not a bool."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """A real number, not a bool."""
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
  if allow_none and value is None:
    return
  kind = 'integer' if integer else 'number'
  bound = '>= 0' if allow_zero else '> 0'
  ok = is_int(value) if integer else is_number(value)
  if ok:
    ok = value >= 0 if allow_zero else value > 0
  if not ok:
    extra = ' or None' if allow_none else ''
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a {kind} {bound}{extra}.')


def check_finite(owner: str, field: str, value: Any) -> None:
  """Raises unless ``value`` is a finite real number (not a bool)."""
  if not (is_number(value) and math.isfinite(value)):
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a finite number.')


def check_probability(owner: str, field: str, value: Any) -> None:
  """Raises unless ``0 <= value < 1`` (a dropout rate)."""
  if not is_number(value) or not 0.0 <= value < 1.0:
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
  if is_int(value):
    value = (value,) * length
  value = tuple(value) if isinstance(value, (tuple, list)) else value
  if (
      not isinstance(value, tuple)
      or len(value) != length
      or not all(is_int(v) and v > 0 for v in value)
  ):
    raise ConfigError(
        f'{owner}.{field}={given!r} is invalid; expected a positive '
        f'int or a sequence of {length} positive ints.'
    )
  return value


# ----------------------------------------------------------------------------
# Processes.
# ----------------------------------------------------------------------------


def check_process(process_index: Any, process_count: Any) -> tuple[int, int]:
  """``(process_index, process_count)`` as ints; ValueError unless 0 <= index < count."""
  if (
      not is_int(process_index)
      or not is_int(process_count)
      or process_count < 1
      or not 0 <= process_index < process_count
  ):
    raise ValueError(
        f'process_index={process_index!r}, process_count={process_count!r} are '
        'invalid; expected integers with 0 <= process_index < process_count.'
    )
  return int(process_index), int(process_count)
