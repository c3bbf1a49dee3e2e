"""scikit-learn's digits as a TFDS dataset (image_builders) and through the image pipeline.

These run on the real data: it ships inside scikit-learn, so it is offline and
small (1,797 8x8 images; prepared in about a second).
"""

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax.data import image_builders as ib
from contextpool_jax.data import image_input as ii


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('tfds')
  ib.prepare(str(d))
  return str(d)


def _split(data_dir, split):
  source = tfds.data_source(ib.NAME, split=split, data_dir=data_dir, download=False)
  images = np.stack([source[i]['image'] for i in range(len(source))])
  labels = np.array([source[i]['label'] for i in range(len(source))])
  return images, labels


def _multiset(images, labels):
  return sorted(im.tobytes() + bytes([int(l)]) for im, l in zip(images, labels))


def test_splits_partition_the_data_stratified(data_dir):
  # Imported here, not at collection: scikit-learn takes 1-2 s to import, in every
  # xdist worker that collects this file, and only this test reads it directly.
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top

  raw = sk_datasets.load_digits()
  expected_images = np.rint(raw.images * 255.0 / 16.0).astype(np.uint8)[..., None]
  splits = {s: _split(data_dir, s) for s in ('train', 'validation', 'test')}
  # Every example of scikit-learn's copy is in exactly one split, pixels scaled to 0..255.
  all_images = np.concatenate([im for im, _ in splits.values()])
  all_labels = np.concatenate([l for _, l in splits.values()])
  assert _multiset(all_images, all_labels) == _multiset(expected_images, raw.target)
  assert all_images.dtype == np.uint8 and all_images.shape[1:] == (8, 8, 1)
  # Stratified 70 / 15 / 15 in every class.
  for c in range(10):
    n = int((raw.target == c).sum())
    counts = {s: int((l == c).sum()) for s, (_, l) in splits.items()}
    assert counts['train'] == int(0.7 * n) and counts['validation'] == int(0.15 * n)
    assert sum(counts.values()) == n


def test_split_is_a_function_of_the_seed():
  labels = np.repeat(np.arange(10), 20)
  a, b = ib.split_indices(labels, 0), ib.split_indices(labels, 0)
  assert all(np.array_equal(a[s], b[s]) for s in a)
  c = ib.split_indices(labels, 1)
  assert not np.array_equal(a['train'], c['train'])


def test_normalisation_is_the_training_split_statistics(data_dir):
  images, _ = _split(data_dir, 'train')
  mean, std = ii.NORMALIZATION[ib.NAME]
  np.testing.assert_allclose(mean, images.mean(), atol=0.01)
  np.testing.assert_allclose(std, images.std(), atol=0.01)


def _config(data_dir, **dataset):
  return ml_collections.ConfigDict(
      {
          'seed': 0,
          'batch_size': 8,
          'dataset': {'name': ib.NAME, 'data_dir': data_dir, 'num_threads': 1, **dataset},
      }
  )


def test_pipeline_batches_and_geometry(data_dir):
  config = _config(data_dir)
  spec = ii.resolve_spec(config)
  assert (spec.image_size, spec.crop_padding, spec.flip, spec.eval_split) == (
      16,
      1,
      False,
      'validation',
  )
  batch = next(
      iter(ii.make_train_dataset(ii.resolve_spec(config), process_index=0, process_count=1))
  )
  assert batch['image'].shape == (8, 16, 16, 3) and batch['image'].dtype == np.float32
  assert batch['label'].shape == (8,) and set(batch['label']) <= set(range(10))
  evals = list(
      ii.make_eval_batches(ii.resolve_spec(config), 'test', process_index=0, process_count=1)
  )
  assert sum(int(b['mask'].sum()) for b in evals) == len(_split(data_dir, 'test')[1])


def test_digits_are_never_mirrored():
  image = np.arange(64, dtype=np.uint8).reshape(8, 8, 1)
  rng = np.random.default_rng(0)
  # No padding: the crop is the image itself; only a flip could change it.
  outs = [ii.pad_crop_flip(image, rng, padding=0, flip=False) for _ in range(50)]
  assert all(np.array_equal(o, image) for o in outs)
  flipped = [ii.pad_crop_flip(image, rng, padding=0, flip=True) for _ in range(50)]
  assert any(np.array_equal(o, image[:, ::-1]) for o in flipped)


def test_prepared_on_first_use_in_an_empty_data_dir(tmp_path):
  config = _config(str(tmp_path / 'fresh'))
  batch = next(
      iter(ii.make_eval_batches(ii.resolve_spec(config), process_index=0, process_count=1))
  )
  assert batch['image'].shape == (300, 16, 16, 3)
  assert (tmp_path / 'fresh' / ib.NAME).is_dir()
