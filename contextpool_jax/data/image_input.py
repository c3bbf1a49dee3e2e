"""Image classification input: CIFAR-10, ImageNet (ILSVRC-2012) and digits through TFDS + grain.

Implements the contract of :mod:`contextpool_jax.data` for image classification,
over the spec :func:`resolve_spec` reads from the config:

* ``make_train_dataset(spec, *, process_index, process_count)`` -> an infinite
  ``grain.IterDataset`` of ``{'image': float32 [b, s, s, 3], 'label': int32 [b]}``
  with ``b = config.batch_size // process_count``;
* ``make_eval_batches(spec, split=None, *, process_index, process_count)`` ->
  a finite, re-iterable ``grain.IterDataset`` of the same batches plus
  ``'mask'`` (bool [b]; False for padding rows), every batch of size
  ``config.dataset.eval_batch_size // process_count``.

Examples are read with ``tfds.data_source`` (no TensorFlow) and augmented on the
host with numpy and PIL inside grain (RandAugment:
:mod:`contextpool_jax.data.randaugment`; Mixup and CutMix run on the devices in
the train step: :mod:`contextpool_jax.data.mixup`). The seeds derive from
``(config.seed, process_index)``, so a run is a deterministic function of its
config and ``iter(ds).get_state()`` / ``set_state`` resume it exactly. The
pipeline, each dataset's augmentation and normalisation, and every
``config.dataset`` field with its default: docs/data.md#image-classification-input.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import grain
import numpy as np
from PIL import Image

from contextpool_jax.base import checks
from contextpool_jax.io import config_readers
from contextpool_jax.data import image_builders, randaugment, tfds_splits
from contextpool_jax.base.errors import ConfigError

DATASETS = ('cifar10', 'imagenet2012', 'sklearn_digits')

# Per-channel (mean, std), 0..255 scale.
NORMALIZATION = {
    'cifar10': (
        tuple(255 * v for v in (0.4914, 0.4822, 0.4465)),
        tuple(255 * v for v in (0.2470, 0.2435, 0.2616)),
    ),
    'imagenet2012': (
        tuple(255 * v for v in (0.485, 0.456, 0.406)),
        tuple(255 * v for v in (0.229, 0.224, 0.225)),
    ),
    'sklearn_digits': ((77.93,) * 3, (95.99,) * 3),
}

_DATASET_DEFAULTS = {
    'cifar10': dict(image_size=32, eval_split='test', eval_batch_size=1000),
    'imagenet2012': dict(image_size=224, eval_split='validation', eval_batch_size=256),
    'sklearn_digits': dict(
        image_size=16, eval_split='validation', eval_batch_size=300, crop_padding=1, flip=False
    ),
}
# Augmented by padding, a random crop of the input size and (optionally) a flip.
_PAD_CROP = ('cifar10', 'sklearn_digits')

_INTERPOLATION = {'bilinear': Image.Resampling.BILINEAR, 'bicubic': Image.Resampling.BICUBIC}

CROP_ASPECT_RATIO = (3 / 4, 4 / 3)


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImageInputSpec:
  """The validated ``config.dataset`` fields (docs/data.md#image-classification-input),
  with ``config.seed`` and ``config.batch_size`` (checked against the process count
  where it is divided)."""

  name: str
  data_dir: Optional[str]
  image_size: int
  train_split: str
  eval_split: str
  eval_batch_size: int
  crop_padding: int = 4
  flip: bool = True
  crop_area_min: float = 0.08
  eval_crop_fraction: float = 0.875
  interpolation: str = 'bilinear'
  randaugment_num_ops: int = 0
  randaugment_magnitude: float = 9.0
  randaugment_magnitude_std: float = 0.0
  randaugment_prob: float = 1.0
  mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
  std: tuple[float, float, float] = (1.0, 1.0, 1.0)
  num_threads: int = 8
  prefetch_buffer_size: int = 256
  num_workers: int = 0
  # On-device batch mixing of the training objective (data/mixup.py; 0: off).
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  mixup_switch_prob: float = 0.5
  seed: int = 0
  batch_size: Any = None  # global training rows


def _bad(field: str, value: Any, expected: str) -> ConfigError:
  return ConfigError(f'config.dataset.{field}={value!r} is invalid; expected {expected}.')


def _triple(config: Any, field: str, default: Sequence[float], positive: bool) -> tuple:
  v = config_readers.lookup(config, f'dataset.{field}', default)
  try:
    t = tuple(float(x) for x in v)
  except (TypeError, ValueError):
    t = ()
  if len(t) != 3 or (positive and min(t) <= 0):
    raise _bad(
        field, v, f'three {"positive " if positive else ""}numbers (per channel, ' '0..255 scale)'
    )
  return t


def resolve_spec(config: Any) -> ImageInputSpec:
  """Reads and validates ``config.dataset``; ConfigError names a bad entry."""
  config_readers.lookup(config, 'dataset')
  name = config_readers.read_choice(config, 'dataset.name', DATASETS)
  dd = _DATASET_DEFAULTS[name]
  integer = lambda field, default, minimum: config_readers.read_int(
      config, f'dataset.{field}', minimum=minimum, default=default
  )
  number = lambda field, default, lo, hi, lo_open=False: config_readers.read_float(
      config, f'dataset.{field}', lo=lo, hi=hi, lo_open=lo_open, default=default
  )
  mean, std = NORMALIZATION[name]
  return ImageInputSpec(
      name=name,
      data_dir=config_readers.read_dir(config, 'dataset.data_dir'),
      image_size=integer('image_size', dd['image_size'], 1),
      train_split=config_readers.read_str(config, 'dataset.train_split', default='train'),
      eval_split=config_readers.read_str(config, 'dataset.eval_split', default=dd['eval_split']),
      eval_batch_size=integer('eval_batch_size', dd['eval_batch_size'], 1),
      crop_padding=integer('crop_padding', dd.get('crop_padding', 4), 0),
      flip=config_readers.read_bool(config, 'dataset.flip', default=dd.get('flip', True)),
      crop_area_min=number('crop_area_min', 0.08, 0.0, 1.0, lo_open=True),
      eval_crop_fraction=number('eval_crop_fraction', 0.875, 0.0, 1.0, lo_open=True),
      interpolation=config_readers.read_choice(
          config, 'dataset.interpolation', _INTERPOLATION, default='bilinear'
      ),
      randaugment_num_ops=integer('randaugment_num_ops', 0, 0),
      randaugment_magnitude=number('randaugment_magnitude', 9.0, 0.0, randaugment.MAX_MAGNITUDE),
      randaugment_magnitude_std=number('randaugment_magnitude_std', 0.0, 0.0, math.inf),
      randaugment_prob=number('randaugment_prob', 1.0, 0.0, 1.0),
      mean=_triple(config, 'mean', mean, positive=False),
      std=_triple(config, 'std', std, positive=True),
      num_threads=integer('num_threads', 8, 0),
      prefetch_buffer_size=integer('prefetch_buffer_size', 256, 0),
      num_workers=integer('num_workers', 0, 0),
      mixup_alpha=number('mixup_alpha', 0.0, 0.0, math.inf),
      cutmix_alpha=number('cutmix_alpha', 0.0, 0.0, math.inf),
      mixup_switch_prob=number('mixup_switch_prob', 0.5, 0.0, math.inf),
      seed=config_readers.read_int(config, 'seed', minimum=-(2**63), default=0),
      batch_size=config_readers.lookup(config, 'batch_size', None),
  )


def _seed(spec: ImageInputSpec, process_index: int, salt: int) -> int:
  state = np.random.SeedSequence([spec.seed % 2**63, process_index, salt]).generate_state(1)
  return int(state[0])


# --------------------------------------------------------------------------
# Source
# --------------------------------------------------------------------------


def _how_to_prepare(name: str, data_dir: Optional[str]) -> str:
  if data_dir is None:
    from tensorflow_datasets.core import constants  # pylint: disable=g-import-not-at-top

    data_dir = constants.get_default_data_dir()
  build = (
      f'`tfds build {name} --data_dir={data_dir} --file_format=array_record` '
      f"(or in Python: tfds.builder('{name}', data_dir='{data_dir}')"
      ".download_and_prepare(file_format='array_record'))"
  )
  if name == 'imagenet2012':
    return (
        f'imagenet2012 is not prepared as array_record in {data_dir}. ImageNet needs a '
        'manual download: get ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar '
        f'(https://image-net.org/), put them in {data_dir}/downloads/manual/, then run '
        f'{build}. Building (not reading) needs TensorFlow installed.'
    )
  return (
      f'{name} is not prepared as array_record in {data_dir}. Build it with {build}; '
      'building (not reading) needs TensorFlow installed.'
  )


def open_source(spec: ImageInputSpec, split: str, setting: Optional[str] = None) -> Sequence[dict]:
  """``tfds.data_source(name, split)``: random access to ``{'image', 'label', ...}``.

  ``setting`` names where ``split`` came from in messages (default ``split=...``).

  Raises:
    DatasetNotFoundError: the dataset is not prepared as array_record in
      ``spec.data_dir``; the message says how to prepare it.
    ValueError: the dataset is prepared but ``split`` is not one of its splits
      or selects no example; the message names ``setting`` and the splits.
  """
  if spec.name == 'sklearn_digits':  # offline and small: prepared on first use
    image_builders.prepare(spec.data_dir)
  return tfds_splits.open_split(
      spec.name,
      split,
      spec.data_dir,
      setting=setting or f'split={split!r}',
      how_to_prepare=lambda: _how_to_prepare(spec.name, spec.data_dir),
  )


def _eval_setting(spec: ImageInputSpec, split: Optional[str]) -> tuple[str, str]:
  """The evaluation split and how messages name it."""
  if split is None:
    return spec.eval_split, f'config.dataset.eval_split={spec.eval_split!r}'
  return split, f'the evaluation split {split!r} (config.eval_splits)'


# --------------------------------------------------------------------------
# Per-example transforms (uint8 HWC numpy in)
# --------------------------------------------------------------------------


def _rgb(image: np.ndarray) -> np.ndarray:
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return image.astype(np.uint8, copy=False)


def pad_crop_flip(
    image: np.ndarray, rng: np.random.Generator, padding: int = 4, flip: bool = True
) -> np.ndarray:
  """CIFAR augmentation (He et al. 2016): zero-pad, random crop of the input size, flip."""
  h, w = image.shape[:2]
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  y, x = rng.integers(0, 2 * padding + 1, size=2)
  out = padded[y : y + h, x : x + w]
  if flip and rng.random() < 0.5:
    out = out[:, ::-1]
  return np.ascontiguousarray(out)


def random_resized_crop_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    area_range: tuple[float, float] = (0.08, 1.0),
    ratio_range: tuple[float, float] = CROP_ASPECT_RATIO,
    attempts: int = 10,
) -> tuple[int, int, int, int]:
  """Inception-style crop ``(top, left, crop_height, crop_width)``.

  Draws area fraction ~ U(area_range) and log aspect ratio (w/h) ~
  U(log ratio_range) until the crop fits (``attempts`` tries); otherwise the
  largest central crop whose ratio is clipped to ``ratio_range``.
  """
  area = height * width
  log_lo, log_hi = math.log(ratio_range[0]), math.log(ratio_range[1])
  for _ in range(attempts):
    target = area * rng.uniform(*area_range)
    ratio = math.exp(rng.uniform(log_lo, log_hi))
    cw = int(round(math.sqrt(target * ratio)))
    ch = int(round(math.sqrt(target / ratio)))
    if 0 < cw <= width and 0 < ch <= height:
      top = int(rng.integers(0, height - ch + 1))
      left = int(rng.integers(0, width - cw + 1))
      return top, left, ch, cw
  ratio = width / height
  if ratio < ratio_range[0]:
    cw, ch = width, max(1, int(round(width / ratio_range[0])))
  elif ratio > ratio_range[1]:
    ch, cw = height, max(1, int(round(height * ratio_range[1])))
  else:
    ch, cw = height, width
  return (height - ch) // 2, (width - cw) // 2, ch, cw


def _resize_box(
    image: np.ndarray, box: tuple[float, float, float, float], size: int, interpolation: str
) -> np.ndarray:
  """Resamples the ``(left, top, right, bottom)`` box of ``image`` to ``size`` x ``size``."""
  out = Image.fromarray(image).resize((size, size), _INTERPOLATION[interpolation], box=box)
  return np.array(out)


def central_crop_box(
    height: int, width: int, image_size: int, crop_fraction: float
) -> tuple[float, float, float, float]:
  """The box that "resize shorter side to image_size / crop_fraction, centre crop
  image_size" takes from a ``height`` x ``width`` image, in input pixels."""
  side = crop_fraction * min(height, width)  # = image_size / scale
  top, left = (height - side) / 2, (width - side) / 2
  return left, top, left + side, top + side


def _finish(image: np.ndarray, spec: ImageInputSpec) -> np.ndarray:
  mean = np.asarray(spec.mean, np.float32)
  std = np.asarray(spec.std, np.float32)
  return (image.astype(np.float32) - mean) / std


def train_example(example: dict, rng: np.random.Generator, spec: ImageInputSpec) -> dict:
  """Decoded TFDS example -> ``{'image': float32 [s, s, 3], 'label': int32 []}``."""
  image = _rgb(example['image'])
  s = spec.image_size
  if spec.name in _PAD_CROP:
    image = pad_crop_flip(image, rng, spec.crop_padding, spec.flip)
  else:
    top, left, ch, cw = random_resized_crop_box(
        rng, image.shape[0], image.shape[1], (spec.crop_area_min, 1.0)
    )
    image = _resize_box(image, (left, top, left + cw, top + ch), s, spec.interpolation)
    if spec.flip and rng.random() < 0.5:
      image = np.ascontiguousarray(image[:, ::-1])
  if spec.randaugment_num_ops:
    image = randaugment.randaugment(
        image,
        rng,
        num_ops=spec.randaugment_num_ops,
        magnitude=spec.randaugment_magnitude,
        magnitude_std=spec.randaugment_magnitude_std,
        prob=spec.randaugment_prob,
    )
  if image.shape[:2] != (s, s):
    image = _resize_box(image, (0, 0, image.shape[1], image.shape[0]), s, spec.interpolation)
  return {'image': _finish(image, spec), 'label': np.int32(example['label'])}


def eval_example(example: dict, spec: ImageInputSpec) -> dict:
  """Decoded TFDS example -> ``{'image', 'label', 'mask'=True}`` (no randomness)."""
  image = _rgb(example['image'])
  s = spec.image_size
  h, w = image.shape[:2]
  if spec.name == 'imagenet2012':
    image = _resize_box(
        image, central_crop_box(h, w, s, spec.eval_crop_fraction), s, spec.interpolation
    )
  elif (h, w) != (s, s):
    image = _resize_box(image, (0, 0, w, h), s, spec.interpolation)
  return {
      'image': _finish(image, spec),
      'label': np.int32(example['label']),
      'mask': np.bool_(True),
  }


class _TrainTransform(grain.transforms.RandomMap):
  """Picklable grain transform (for worker processes)."""

  def __init__(self, spec: ImageInputSpec):
    self.spec = spec

  def random_map(self, element, rng):
    return train_example(element, rng, self.spec)


class _PaddedEvalExample(grain.transforms.Map):
  """Index ``i`` of this process's padded eval stream -> an example or a padding row."""

  def __init__(self, shard: Any, spec: ImageInputSpec):
    self.shard = shard
    self.spec = spec

  def map(self, element):
    i = int(element)
    if i < len(self.shard):
      return eval_example(self.shard[i], self.spec)
    s = self.spec.image_size
    return {'image': np.zeros((s, s, 3), np.float32), 'label': np.int32(0), 'mask': np.bool_(False)}


# --------------------------------------------------------------------------
# Pipelines
# --------------------------------------------------------------------------


def _read_options(spec: ImageInputSpec) -> grain.ReadOptions:
  return grain.ReadOptions(
      num_threads=spec.num_threads, prefetch_buffer_size=spec.prefetch_buffer_size
  )


def _maybe_workers(ds: grain.IterDataset, spec: ImageInputSpec) -> grain.IterDataset:
  if spec.num_workers:
    # grain 0.2.18 reads an absl flag in mp_prefetch and fails in scripts that
    # never parsed flags (google/grain#1355, fixed upstream): use the defaults.
    from absl import flags  # pylint: disable=g-import-not-at-top

    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=spec.num_workers))
  return ds


def make_train_dataset(
    spec: ImageInputSpec,
    *,
    process_index: int,
    process_count: int,
    source: Optional[Sequence[dict]] = None,
) -> grain.IterDataset:
  """Infinite per-process training batches (see the module docstring).

  Args:
    spec: the resolved ``config.dataset`` (:func:`resolve_spec`), with the global
      ``batch_size`` and the ``seed``.
    process_index, process_count: this process and the number of processes;
      each reads the examples ``process_index::process_count``.
    source: a random-access sequence of ``{'image': uint8 [h, w, 3], 'label'}``
      used instead of ``tfds.data_source`` (tests, custom data).
  """
  process_index, process_count = checks.check_process(process_index, process_count)
  batch = config_readers.share(spec.batch_size, process_count, 'batch_size')
  if source is None:
    source = open_source(spec, spec.train_split, f'config.dataset.train_split={spec.train_split!r}')
  shard = grain.MapDataset.source(source)[process_index::process_count]
  if len(shard) == 0:
    raise ConfigError(
        f'config.dataset.train_split={spec.train_split!r} has no examples for '
        f'process {process_index} of {process_count}.'
    )
  ds = (
      shard.shuffle(seed=_seed(spec, process_index, 0))
      .repeat(None)
      .random_map(_TrainTransform(spec), seed=_seed(spec, process_index, 1))
      .to_iter_dataset(_read_options(spec))
      .batch(batch, drop_remainder=True)
  )
  return _maybe_workers(ds, spec)


def num_eval_batches(num_examples: int, local_batch: int, process_count: int) -> int:
  """Batches per process: enough for the largest shard, the same on every process."""
  return -(-(-(-num_examples // process_count)) // local_batch)


def make_eval_batches(
    spec: ImageInputSpec,
    split: Optional[str] = None,
    *,
    process_index: int,
    process_count: int,
    source: Optional[Sequence[dict]] = None,
) -> grain.IterDataset:
  """Finite per-process eval batches with ``'mask'``; the same count on every process.

  Args:
    spec: as for :func:`make_train_dataset` (``eval_batch_size`` is the global
      eval batch size).
    split: a TFDS split; ``None`` = ``config.dataset.eval_split``.
    process_index, process_count: as for :func:`make_train_dataset`.
    source: replaces ``tfds.data_source`` (tests, custom data).

  Every example of the split appears exactly once across processes with
  ``mask`` True; padding rows have zero images, label 0 and ``mask`` False
  (so a split smaller than one batch gives one batch, mostly padding). A
  split with no examples raises ValueError naming it.
  """
  process_index, process_count = checks.check_process(process_index, process_count)
  batch = config_readers.share(spec.eval_batch_size, process_count, 'dataset.eval_batch_size')
  split, setting = _eval_setting(spec, split)
  if source is None:
    source = open_source(spec, split, setting)
  tfds_splits.require_examples(source, setting, spec.name, spec.data_dir)
  shard = grain.MapDataset.source(source)[process_index::process_count]
  total = num_eval_batches(len(source), batch, process_count) * batch
  ds = (
      grain.MapDataset.range(total)
      .map(_PaddedEvalExample(shard, spec))
      .to_iter_dataset(_read_options(spec))
      .batch(batch, drop_remainder=True)
  )
  return _maybe_workers(ds, spec)
