"""Input and configuration checks shared by every layer.

Every check raises ``ValueError`` naming the field, the value it got and what
is allowed, so that a bad configuration fails at trace time (before XLA
compiles anything) with a message a user can act on.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from contextpool_jax.errors import ConfigError


def check_choice(owner: str, field: str, value: Any, allowed: Iterable[Any]) -> None:
  """Raises unless ``value`` is one of ``allowed``."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise ConfigError(
        f'{owner}.{field}={value!r} is not supported; allowed values: '
        f'{", ".join(repr(a) for a in allowed)}.')


def check_positive(owner: str, field: str, value: Any, *, allow_none: bool = False,
                   integer: bool = False, allow_zero: bool = False) -> None:
  """Raises unless ``value`` is a positive (or non-negative) number."""
  if value is None and allow_none:
    return
  kind = 'integer' if integer else 'number'
  bound = '>= 0' if allow_zero else '> 0'
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if ok and integer:
    ok = isinstance(value, int)
  if ok:
    ok = value >= 0 if allow_zero else value > 0
  if not ok:
    extra = ' or None' if allow_none else ''
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a {kind} '
                     f'{bound}{extra}.')


def check_probability(owner: str, field: str, value: Any) -> None:
  """Raises unless ``0 <= value < 1`` (a dropout rate)."""
  if (not isinstance(value, (int, float)) or isinstance(value, bool)
      or not 0.0 <= value < 1.0):
    raise ConfigError(f'{owner}.{field}={value!r} is invalid; expected a '
                     'number in [0, 1).')


def check_rank(owner: str, name: str, array: Any, ranks: Sequence[int],
               meaning: str) -> None:
  """Raises unless ``array.ndim`` is one of ``ranks``; ``meaning`` names the layouts."""
  ndim = getattr(array, 'ndim', None)
  if ndim not in tuple(ranks):
    raise ValueError(
        f'{owner}: {name} has rank {ndim} (shape {getattr(array, "shape", None)}); '
        f'expected rank {" or ".join(str(r) for r in ranks)}: {meaning}.')


def as_tuple(owner: str, field: str, value: Any, length: int) -> tuple[int, ...]:
  """Turns an int or a sequence of ``length`` positive ints into a tuple."""
  given = value
  if isinstance(value, int) and not isinstance(value, bool):
    value = (value,) * length
  value = tuple(value) if isinstance(value, (tuple, list)) else value
  if (not isinstance(value, tuple) or len(value) != length
      or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
    raise ConfigError(f'{owner}.{field}={given!r} is invalid; expected a positive '
                     f'int or a sequence of {length} positive ints.')
  return value
