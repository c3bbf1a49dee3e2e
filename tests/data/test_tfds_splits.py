"""One split of a prepared TFDS dataset (``data/tfds_splits.py``): opened by name or slice, and
every failure one error: not prepared (the caller's how-to, DatasetNotFoundError), or a split
that is not there or selects nothing (a ConfigError naming the setting and the prepared splits).
On the scikit-learn digits, prepared in a temporary directory."""

import pytest
import tensorflow_datasets as tfds

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import image_builders as ib
from contextpool_jax.data import tfds_splits

SETTING = "config.dataset.eval_split='{}'"


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('tfds'))
  ib.prepare(root)
  return root


def _open(split, data_dir):
  return tfds_splits.open_split(
      ib.NAME,
      split,
      data_dir,
      setting=SETTING.format(split),
      how_to_prepare=lambda: 'prepare the digits first',
  )


def test_a_split_and_a_slice_open_with_their_sizes(data_dir):
  splits = tfds.builder(ib.NAME, data_dir=data_dir).info.splits
  assert len(_open('test', data_dir)) == splits['test'].num_examples
  assert len(_open('train[:10]', data_dir)) == 10


@pytest.mark.parametrize('split', ['valid', 'train[:0]', 'train[5:2]'])
def test_a_missing_or_empty_split_names_the_setting_and_the_prepared_splits(split, data_dir):
  splits = tfds.builder(ib.NAME, data_dir=data_dir).info.splits
  prepared = ', '.join(f'{s} ({info.num_examples} examples)' for s, info in splits.items())
  with pytest.raises(ConfigError) as error:
    _open(split, data_dir)
  message = str(error.value)
  assert message.startswith(SETTING.format(split)) and f'Prepared splits: {prepared};' in message


def test_a_dataset_not_prepared_is_the_callers_how_to(tmp_path):
  with pytest.raises(DatasetNotFoundError, match=r'^prepare the digits first \('):
    _open('test', str(tmp_path / 'empty'))


def test_a_source_without_examples_names_the_setting():
  with pytest.raises(ConfigError, match=r"^config.x='a' selects no example of 'mnist'"):
    tfds_splits.require_examples([], "config.x='a'", 'mnist', data_dir='/nonexistent')
  tfds_splits.require_examples([0], "config.x='a'", 'mnist')
