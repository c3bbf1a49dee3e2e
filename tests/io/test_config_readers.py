"""Reading a run's config (``io/config_readers.py``): a missing entry means the default, a bad
one is a ConfigError naming the entry, its value and what is allowed."""

import ml_collections
import pytest

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.io import config_readers


@pytest.mark.parametrize('value', [None, ''])
def test_empty_data_dir_means_the_default_not_the_current_directory(value):
  config = ml_collections.ConfigDict({'dataset': {'data_dir': value}})
  assert config_readers.read_dir(config, 'dataset.data_dir') is None


def test_bad_data_dir_names_the_field():
  config = ml_collections.ConfigDict({'dataset': {'data_dir': 3}})
  with pytest.raises(ConfigError, match='config.dataset.data_dir=3'):
    config_readers.read_dir(config, 'dataset.data_dir')


def test_readers_take_a_dotted_path_and_name_it_with_the_value_and_the_range():
  config = ml_collections.ConfigDict({'a': {'n': 3, 'x': 0.5, 'flag': True, 'name': 'adam'}})
  assert config_readers.read_int(config, 'a.n', minimum=1) == 3
  assert config_readers.read_float(config, 'a.x', lo=0.0, hi=1.0) == 0.5
  assert config_readers.read_bool(config, 'a.flag') is True
  assert config_readers.read_choice(config, 'a.name', ('adam', 'sgd')) == 'adam'
  assert config_readers.read_int(config, 'a.missing', default=7) == 7
  with pytest.raises(ConfigError, match=r'^config.a.n=3 is invalid; expected an integer >= 4\.$'):
    config_readers.read_int(config, 'a.n', minimum=4)
  with pytest.raises(
      ConfigError, match=r'^config.a.x=0.5 is invalid; expected a number in \(0.5, 1'
  ):
    config_readers.read_float(config, 'a.x', lo=0.5, lo_open=True, hi=1.0)
  with pytest.raises(ConfigError, match=r'^config.a.missing is missing\.$'):
    config_readers.read_int(config, 'a.missing')
  with pytest.raises(ConfigError, match=r'config.a.flag=True is invalid; expected an integer'):
    config_readers.read_int(config, 'a.flag')  # a bool is not an int here


@pytest.mark.parametrize(
    'total,count,multiple,share', [(16, 2, 1, 8), (16, 2, 4, 8), (12, 3, 2, 4)]
)
def test_a_global_batch_is_shared_over_the_processes(total, count, multiple, share):
  assert config_readers.share(total, count, 'batch_size', multiple=multiple) == share


@pytest.mark.parametrize('total,count,multiple', [(15, 2, 1), (16, 2, 3), (0, 1, 1), (2.0, 1, 1)])
def test_a_batch_that_does_not_divide_names_the_processes_and_devices(total, count, multiple):
  with pytest.raises(
      ConfigError, match=rf'config.batch_size={total!r} is invalid; .*{count} processes'
  ):
    config_readers.share(total, count, 'batch_size', multiple=multiple)
