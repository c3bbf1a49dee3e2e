"""The errors a user acts on (``base/errors.py``): one base class to catch, each keeping its
built-in base, and a WriteError that names the path, the cause and what to do."""

import pytest

from contextpool_jax.base import errors

BUILTIN = {
    errors.ConfigError: ValueError,
    errors.DataError: ValueError,
    errors.WriteError: OSError,
    errors.WorkdirLockedError: RuntimeError,
    errors.ArgumentError: ValueError,
    errors.DatasetNotFoundError: FileNotFoundError,
    errors.WorkdirError: FileNotFoundError,
    errors.CheckpointError: RuntimeError,
    errors.NonFiniteLossError: FloatingPointError,
}


@pytest.mark.parametrize('error,builtin', BUILTIN.items(), ids=lambda e: e.__name__)
def test_every_user_error_is_the_packages_and_its_builtin(error, builtin):
  assert issubclass(error, errors.ContextPoolJaxError) and issubclass(error, builtin)


def test_every_user_error_is_listed_here():
  defined = {
      v
      for v in vars(errors).values()
      if isinstance(v, type) and issubclass(v, errors.ContextPoolJaxError)
  }
  assert defined - {errors.ContextPoolJaxError} == set(BUILTIN)


def test_a_write_error_names_the_path_the_cause_and_a_hint_set_later():
  error = errors.WriteError('/w/metrics.jsonl', '[Errno 28] No space left on device')
  assert str(error) == 'cannot write /w/metrics.jsonl: [Errno 28] No space left on device'
  error.hint = 'rerun the same command to resume from step 250'
  assert str(error).endswith('device. rerun the same command to resume from step 250')
  assert (error.path, isinstance(error, OSError)) == ('/w/metrics.jsonl', True)
