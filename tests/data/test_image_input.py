"""Image classification input (contextpool_jax.data.image_input).

The TFDS pipelines run on ``tfds.testing.mock_data`` (random examples with the
real features of cifar10 / imagenet2012, built from the builders' code, so no
download or metadata file is needed). Properties that need known pixel values
or labels (sharding, shuffling, crops, normalisation) use small in-memory
sources passed as ``source=``: sequences of ``{'image': uint8, 'label'}``
dicts, the same format ``tfds.data_source`` returns.
"""

import itertools

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.data import image_input as ii

NUM_CLASSES = {'cifar10': 10, 'imagenet2012': 1000}


def make_config(name='cifar10', batch_size=4, seed=0, **dataset):
  dataset = {
      'name': name,
      'num_threads': 2,
      'prefetch_buffer_size': 16,
      'eval_batch_size': 6,
      **dataset,
  }
  return ml_collections.ConfigDict({'seed': seed, 'batch_size': batch_size, 'dataset': dataset})


def mock(num_examples=24):
  return tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE)


def indexed_source(n, size=(32, 32)):
  """Example i: label i, image filled with i % 256 (so we can track examples)."""
  return [{'image': np.full(size + (3,), i % 256, np.uint8), 'label': i} for i in range(n)]


def take(ds, n, it=None):
  it = iter(ds) if it is None else it
  return [next(it) for _ in range(n)]


def denormalise(image, name='cifar10'):
  mean, std = (np.asarray(v, np.float32) for v in ii.NORMALIZATION[name])
  return image * std + mean


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


# ----------------------------------------------------------------------------
# Pipelines on mock TFDS data
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('name', ['cifar10', 'imagenet2012'])
def test_train_and_eval_batches_from_mock_tfds(name):
  size = 32 if name == 'cifar10' else 224
  cfg = make_config(name, batch_size=4, randaugment_num_ops=2, randaugment_magnitude_std=0.5)
  with mock(10):
    batches = take(ii.make_train_dataset(ii.resolve_spec(cfg), process_index=1, process_count=2), 3)
    evals = list(ii.make_eval_batches(ii.resolve_spec(cfg), process_index=1, process_count=2))
  for b in batches:
    assert b['image'].shape == (2, size, size, 3) and b['image'].dtype == np.float32
    assert b['label'].shape == (2,) and b['label'].dtype == np.int32
    assert np.all((0 <= b['label']) & (b['label'] < NUM_CLASSES[name]))
    assert np.all(np.isfinite(b['image']))
  # 10 examples, 2 processes: 5 here, 3 per batch -> 2 batches, 1 padding row.
  assert len(evals) == 2
  for b in evals:
    assert b['image'].shape == (3, size, size, 3) and b['image'].dtype == np.float32
    assert b['label'].dtype == np.int32 and b['mask'].dtype == np.bool_
  assert [b['mask'].tolist() for b in evals] == [[True] * 3, [True, True, False]]


def test_train_is_deterministic_and_state_round_trips():
  cfg = make_config('cifar10', batch_size=4, randaugment_num_ops=1)
  with mock(20):
    ds = ii.make_train_dataset(ii.resolve_spec(cfg), process_index=0, process_count=1)
    first = take(ds, 8)  # 32 examples: more than one epoch
    assert_batches_equal(
        first,
        take(ii.make_train_dataset(ii.resolve_spec(cfg), process_index=0, process_count=1), 8),
    )
    it = iter(ds)
    take(ds, 3, it)
    state = it.get_state()
    resumed = iter(ii.make_train_dataset(ii.resolve_spec(cfg), process_index=0, process_count=1))
    resumed.set_state(state)
    assert_batches_equal(take(ds, 5, resumed), first[3:])
    other = take(
        ii.make_train_dataset(
            ii.resolve_spec(make_config('cifar10', batch_size=4, seed=1, randaugment_num_ops=1)),
            process_index=0,
            process_count=1,
        ),
        1,
    )
  assert not np.array_equal(other[0]['image'], first[0]['image'])


def test_epochs_are_permutations_reshuffled_every_epoch():
  n, batch = 12, 4
  ds = ii.make_train_dataset(
      ii.resolve_spec(make_config(batch_size=batch)),
      process_index=0,
      process_count=1,
      source=indexed_source(n),
  )
  labels = np.concatenate([b['label'] for b in take(ds, 3 * n // batch)]).reshape(3, n)
  for epoch in labels:
    assert sorted(epoch) == list(range(n))
  assert not np.array_equal(labels[0], labels[1]) and not np.array_equal(labels[0], np.arange(n))


def test_train_shards_are_disjoint_per_process():
  n, count = 24, 3
  source = indexed_source(n)
  seen = []
  for p in range(count):
    ds = ii.make_train_dataset(
        ii.resolve_spec(make_config(batch_size=6)),
        process_index=p,
        process_count=count,
        source=source,
    )
    batches = take(ds, 4)  # one epoch of this process's 8 examples, 2 per batch
    assert all(b['label'].shape == (2,) for b in batches)
    labels = np.concatenate([b['label'] for b in batches])
    assert sorted(labels) == list(range(p, n, count))
    seen.append(set(labels.tolist()))
  assert set.union(*seen) == set(range(n))


def test_eval_padding_mask_and_shards():
  n, count = 25, 3
  source = indexed_source(n)
  cfg = make_config(eval_batch_size=6)  # 2 per process
  valid, num_batches = [], set()
  for p in range(count):
    batches = list(
        ii.make_eval_batches(
            ii.resolve_spec(cfg), 'test', process_index=p, process_count=count, source=source
        )
    )
    num_batches.add(len(batches))
    for b in batches:
      assert b['image'].shape == (2, 32, 32, 3) and b['mask'].shape == (2,)
      assert np.all(b['image'][~b['mask']] == 0) and np.all(b['label'][~b['mask']] == 0)
      valid += b['label'][b['mask']].tolist()
    # Re-iterable and deterministic.
    assert_batches_equal(
        batches,
        list(
            ii.make_eval_batches(
                ii.resolve_spec(cfg), 'test', process_index=p, process_count=count, source=source
            )
        ),
    )
  assert num_batches == {5}  # ceil(ceil(25 / 3) / 2) on every process
  assert sorted(valid) == list(range(n))


@pytest.mark.parametrize('name,size', [('cifar10', (32, 32)), ('imagenet2012', (40, 70))])
def test_normalisation_per_channel(name, size):
  rgb = np.array([10, 128, 250], np.uint8)
  source = [{'image': np.broadcast_to(rgb, size + (3,)).copy(), 'label': 3}]
  cfg = make_config(name, eval_batch_size=1)
  (batch,) = list(
      ii.make_eval_batches(ii.resolve_spec(cfg), process_index=0, process_count=1, source=source)
  )
  mean, std = ii.NORMALIZATION[name]
  expected = (rgb - np.array(mean)) / np.array(std)
  s = 32 if name == 'cifar10' else 224
  assert batch['image'].shape == (1, s, s, 3)
  np.testing.assert_allclose(
      batch['image'][0], np.broadcast_to(expected, (s, s, 3)), rtol=1e-5, atol=1e-5
  )
  # Overridden statistics.
  cfg = make_config(name, eval_batch_size=1, mean=(127.5,) * 3, std=(127.5,) * 3)
  (batch,) = list(
      ii.make_eval_batches(ii.resolve_spec(cfg), process_index=0, process_count=1, source=source)
  )
  np.testing.assert_allclose(batch['image'][0, 0, 0], rgb / 127.5 - 1, rtol=1e-5)


# ----------------------------------------------------------------------------
# Augmentation
# ----------------------------------------------------------------------------


def _windows(image, padding=4):
  h, w = image.shape[:2]
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  for y, x in itertools.product(range(2 * padding + 1), repeat=2):
    window = padded[y : y + h, x : x + w]
    yield (y, x, False), window
    yield (y, x, True), window[:, ::-1]


def _which_window(out, image):
  matches = [key for key, window in _windows(image) if np.array_equal(out, window)]
  assert matches, 'output is not a window of the zero-padded image (flipped or not)'
  return matches[0]


def test_cifar_pad_crop_flip_is_a_window_of_the_padded_image():
  image = np.random.default_rng(0).integers(1, 256, (32, 32, 3), dtype=np.uint8)
  kinds = {
      _which_window(ii.pad_crop_flip(image, np.random.default_rng(seed)), image)
      for seed in range(40)
  }
  assert {flip for _, _, flip in kinds} == {False, True}
  assert len({(y, x) for y, x, _ in kinds}) > 10


def test_cifar_train_pipeline_crops_and_flips():
  image = np.random.default_rng(1).integers(1, 256, (32, 32, 3), dtype=np.uint8)
  source = [{'image': image, 'label': 0}] * 4
  ds = ii.make_train_dataset(
      ii.resolve_spec(make_config(batch_size=4)), process_index=0, process_count=1, source=source
  )
  kinds = set()
  for batch in take(ds, 4):
    for out in batch['image']:
      out = np.round(denormalise(out)).astype(np.int64)
      # Zero padding normalises to -mean/std and comes back as 0.
      kinds.add(_which_window(np.clip(out, 0, 255).astype(np.uint8), image))
  assert len(kinds) > 4


def test_random_resized_crop_box():
  rng = np.random.default_rng(0)
  ratios, areas = [], []
  for _ in range(200):
    top, left, ch, cw = ii.random_resized_crop_box(rng, 120, 160, (0.08, 1.0))
    assert 0 <= top and top + ch <= 120 and 0 <= left and left + cw <= 160
    areas.append(ch * cw / (120 * 160))
    ratios.append(cw / ch)
  assert 0.07 < min(areas) and max(areas) <= 1.0 and np.ptp(areas) > 0.5
  assert 0.7 < min(ratios) and max(ratios) < 1.4
  # A strip no allowed crop fits: the central crop of the nearest allowed ratio.
  assert ii.random_resized_crop_box(rng, 10, 400, (0.9, 1.0)) == (0, 193, 10, 13)
  assert ii.random_resized_crop_box(rng, 400, 10, (0.9, 1.0)) == (193, 0, 13, 10)


def test_imagenet_train_and_eval_geometry():
  spec = ii.resolve_spec(make_config('imagenet2012', crop_area_min=0.5))
  assert spec.image_size == 224 and spec.crop_area_min == 0.5
  # Resize the shorter side to 256, centre crop 224 == this box of the original.
  assert ii.central_crop_box(512, 640, 224, 0.875) == (96.0, 32.0, 544.0, 480.0)
  # Left half black, right half white: the eval crop keeps the boundary centred.
  image = np.zeros((300, 500, 3), np.uint8)
  image[:, 250:] = 255
  out = denormalise(ii.eval_example({'image': image, 'label': 1}, spec)['image'], 'imagenet2012')
  assert out.shape == (224, 224, 3)
  np.testing.assert_allclose(out[:, :100], 0, atol=1e-3)
  np.testing.assert_allclose(out[:, 124:], 255, atol=1e-3)
  ex = ii.train_example({'image': image, 'label': 1}, np.random.default_rng(0), spec)
  assert ex['image'].shape == (224, 224, 3) and ex['image'].dtype == np.float32
  assert ex['label'] == 1 and ex['label'].dtype == np.int32


def test_cifar_resized_when_image_size_is_not_32():
  spec = ii.resolve_spec(make_config('cifar10', image_size=48))
  image = np.zeros((32, 32, 3), np.uint8)
  ex = ii.train_example({'image': image, 'label': 1}, np.random.default_rng(0), spec)
  assert ex['image'].shape == (48, 48, 3)
  assert ii.eval_example({'image': image, 'label': 1}, spec)['image'].shape == (48, 48, 3)


# ----------------------------------------------------------------------------
# Configuration and errors
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    'overrides,field',
    [
        ({'name': 'mnist'}, 'name'),
        ({'image_size': 0}, 'image_size'),
        ({'crop_area_min': 0.0}, 'crop_area_min'),
        ({'crop_area_min': 1.5}, 'crop_area_min'),
        ({'randaugment_num_ops': -1}, 'randaugment_num_ops'),
        ({'randaugment_magnitude': 11}, 'randaugment_magnitude'),
        ({'randaugment_prob': 2.0}, 'randaugment_prob'),
        ({'interpolation': 'nearest'}, 'interpolation'),
        ({'eval_crop_fraction': 0}, 'eval_crop_fraction'),
        ({'std': (1.0, 0.0, 1.0)}, 'std'),
        ({'mean': (1.0, 2.0)}, 'mean'),
        ({'eval_split': ''}, 'eval_split'),
        ({'num_workers': -1}, 'num_workers'),
    ],
)
def test_bad_config_raises_naming_the_field(overrides, field):
  with pytest.raises(ValueError, match=f'config.dataset.{field}='):
    ii.resolve_spec(make_config(**overrides))


def test_batch_sizes_must_divide_by_process_count():
  source = indexed_source(4)
  with pytest.raises(ValueError, match='config.batch_size=6'):
    ii.make_train_dataset(
        ii.resolve_spec(make_config(batch_size=6)), process_index=0, process_count=4, source=source
    )
  with pytest.raises(ValueError, match='config.dataset.eval_batch_size=6'):
    ii.make_eval_batches(
        ii.resolve_spec(make_config(eval_batch_size=6)),
        process_index=0,
        process_count=4,
        source=source,
    )
  with pytest.raises(ValueError, match='process_index'):
    ii.make_train_dataset(
        ii.resolve_spec(make_config()), process_index=2, process_count=2, source=source
    )


def test_defaults():
  cifar = ii.resolve_spec(make_config('cifar10', eval_batch_size=None))
  assert (
      cifar.image_size,
      cifar.train_split,
      cifar.eval_split,
      cifar.eval_batch_size,
      cifar.randaugment_num_ops,
  ) == (32, 'train', 'test', 1000, 0)
  imnet = ii.resolve_spec(make_config('imagenet2012', eval_batch_size=None))
  assert (imnet.image_size, imnet.eval_split, imnet.crop_area_min, imnet.eval_crop_fraction) == (
      224,
      'validation',
      0.08,
      0.875,
  )


@pytest.mark.parametrize('name', ['cifar10', 'imagenet2012'])
def test_missing_dataset_says_how_to_prepare_it(name, tmp_path):
  cfg = make_config(name, data_dir=str(tmp_path))
  with pytest.raises(DatasetNotFoundError) as info:
    ii.make_train_dataset(ii.resolve_spec(cfg), process_index=0, process_count=1)
  message = str(info.value)
  assert f'tfds build {name}' in message and '--file_format=array_record' in message
  assert str(tmp_path) in message
  if name == 'imagenet2012':
    assert f'{tmp_path}/downloads/manual/' in message
    assert 'ILSVRC2012_img_train.tar' in message and 'ILSVRC2012_img_val.tar' in message
  with pytest.raises(FileNotFoundError):  # DatasetNotFoundError is one
    ii.make_eval_batches(ii.resolve_spec(cfg), process_index=0, process_count=1)
