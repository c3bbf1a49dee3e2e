"""The checks of module fields and arguments (``base/checks.py``): each bad value is one error
naming the owner, the field, the value and what is allowed."""

import numpy as np
import pytest

from contextpool_jax.base import checks
from contextpool_jax.base.errors import ArgumentError, ConfigError


def test_bools_are_neither_ints_nor_numbers():
  assert checks.is_int(3) and checks.is_int(np.int32(3)) and not checks.is_int(True)
  assert checks.is_number(0.5) and checks.is_number(2) and not checks.is_number(False)
  assert not checks.is_int(3.0) and not checks.is_number('1')


def test_a_choice_names_the_owner_field_value_and_every_allowed_value():
  checks.check_choice('ContextPool', 'weights', 'learned', ('learned', 'uniform'))
  with pytest.raises(ConfigError) as error:
    checks.check_choice('ContextPool', 'weights', 'learnt', ('learned', 'uniform'))
  assert str(error.value) == (
      "ContextPool.weights='learnt' is not supported; allowed values: 'learned', 'uniform'."
  )


@pytest.mark.parametrize(
    'value,kwargs,ok',
    [
        (1, {}, True),
        (0.5, {}, True),
        (0, {}, False),
        (0, {'allow_zero': True}, True),
        (-1, {'allow_zero': True}, False),
        (None, {}, False),
        (None, {'allow_none': True}, True),
        (2.0, {'integer': True}, False),
        (True, {}, False),
    ],
)
def test_positive_values(value, kwargs, ok):
  if ok:
    checks.check_positive('M', 'f', value, **kwargs)
  else:
    with pytest.raises(ConfigError, match=rf'^M\.f={value!r} is invalid; expected a '):
      checks.check_positive('M', 'f', value, **kwargs)


def test_finite_numbers_and_probabilities():
  checks.check_finite('M', 'x', -3.5)
  checks.check_probability('M', 'rate', 0.0)
  for bad in (float('inf'), float('nan'), True, 'x'):
    with pytest.raises(ConfigError, match='expected a finite number'):
      checks.check_finite('M', 'x', bad)
  for bad in (1.0, -0.1, None):
    with pytest.raises(ConfigError, match=r'expected a number in \[0, 1\)'):
      checks.check_probability('M', 'rate', bad)


def test_as_tuple_repeats_an_int_and_checks_a_sequence():
  assert checks.as_tuple('M', 'strides', 2, 3) == (2, 2, 2)
  assert checks.as_tuple('M', 'strides', [1, 2], 2) == (1, 2)
  for bad in ((1, 2), (1, 0), 0, 'ab'):
    with pytest.raises(ConfigError, match=r'^M\.strides=.* is invalid; expected a positive int'):
      checks.as_tuple('M', 'strides', bad, 3)


def test_a_wrong_rank_names_the_array_its_shape_and_the_layouts():
  checks.check_rank('Layer', 'x', np.zeros((2, 3, 4)), (3, 4), '[batch, length, features]')
  with pytest.raises(ValueError) as error:
    checks.check_rank('Layer', 'x', np.zeros((2, 3)), (3, 4), '[batch, length, features]')
  assert str(error.value) == (
      'Layer: x has rank 2 (shape (2, 3)); expected rank 3 or 4: [batch, length, features].'
  )


def test_arguments_and_processes():
  checks.check_argument('length', 4, True, 'an int >= 1')
  with pytest.raises(ArgumentError, match=r'^length=0 is not allowed; expected an int >= 1\.$'):
    checks.check_argument('length', 0, False, 'an int >= 1')
  assert checks.check_process(np.int64(1), 2) == (1, 2)
  for index, count in ((2, 2), (-1, 2), (0, 0), (0.0, 1)):
    with pytest.raises(ValueError, match='0 <= process_index < process_count'):
      checks.check_process(index, count)
