"""A TFDS builder for a real image dataset that exists offline: scikit-learn's digits.

:class:`SklearnDigits` (TFDS name ``sklearn_digits``) -- the 1,797 8x8 images of
handwritten digits (10 classes) that scikit-learn ships inside its package
(``sklearn/datasets/data/digits.csv.gz``, read with
``sklearn.datasets.load_digits``): the test set of the UCI "Optical
Recognition of Handwritten Digits" data (Alpaydin & Kaynak, 1998; CC BY 4.0),
32x32 bitmaps from NIST forms reduced to counts of on pixels in 4x4 blocks
(0..16). No download: a fresh machine with ``scikit-learn`` installed has it.

Stored as array_record (read with ``tfds.data_source``, no TensorFlow):
``{'image': uint8 [8, 8, 1], 'label': int64}``; pixels are the counts scaled to
0..255 (``round(count * 255 / 16)``).

Splits (a choice: the data has no official split): stratified by class with a
fixed seed -- in each class, the examples in a seeded random order, the first
70% (rounded down) to ``train``, the next 15% (rounded down) to ``validation``,
the rest to ``test`` (1,252 / 266 / 279 examples). Every example is in exactly one split; the split depends
only on the data and :data:`SPLIT_SEED`.

Prepared on first use by the image pipeline
(:func:`contextpool_jax.data.image_input.open_source`), or by hand::

  python -c "from contextpool_jax.data import image_builders as b; b.prepare('/path/to/tfds')"
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import utils as tfds_utils

from contextpool_jax.io import console
from contextpool_jax.data import DatasetNotFoundError, builder_code_path

NAME = 'sklearn_digits'
NUM_CLASSES = 10
IMAGE_SHAPE = (8, 8, 1)
MAX_COUNT = 16  # pixel values of the source: on-pixel counts in 4x4 blocks
SPLIT_FRACTIONS = {'train': 0.70, 'validation': 0.15, 'test': 0.15}
SPLIT_SEED = 0


def load_source() -> tuple[np.ndarray, np.ndarray]:
  """``(images uint8 [1797, 8, 8, 1] on 0..255, labels int64 [1797])`` from scikit-learn."""
  try:
    from sklearn import datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DatasetNotFoundError(
        f"{NAME} is read from scikit-learn's bundled copy: pip install scikit-learn ({e})."
    ) from e
  digits = datasets.load_digits()
  assert not isinstance(digits, tuple)  # a Bunch: return_X_y is off
  images = np.rint(digits.images * (255.0 / MAX_COUNT)).astype(np.uint8)
  return images[..., None], digits.target.astype(np.int64)


def split_indices(labels: np.ndarray, seed: int = SPLIT_SEED) -> dict[str, np.ndarray]:
  """``{split: sorted example indices}``: per class, a seeded permutation cut at
  the cumulative :data:`SPLIT_FRACTIONS` (rounded down; the rest is ``test``)."""
  rng = np.random.default_rng(seed)
  parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLIT_FRACTIONS}
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    a = int(len(idx) * SPLIT_FRACTIONS['train'])
    b = a + int(len(idx) * SPLIT_FRACTIONS['validation'])
    parts['train'].append(idx[:a])
    parts['validation'].append(idx[a:b])
    parts['test'].append(idx[b:])
  return {s: np.sort(np.concatenate(p)) for s, p in parts.items()}


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
  """scikit-learn's 8x8 handwritten digits (the module docstring)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Stratified 70/15/15 split, seed 0; pixels scaled to 0..255.'}

  code_path = tfds_utils.classproperty(
      classmethod(builder_code_path)  # pyright: ignore[reportArgumentType]  # tfds: narrow stub
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=(__doc__ or '').split('\n\n')[1],
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Tensor(shape=IMAGE_SHAPE, dtype=np.uint8),
                'label': tfds.features.ClassLabel(num_classes=NUM_CLASSES),
            }
        ),
        supervised_keys=('image', 'label'),
        homepage='https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    images, labels = load_source()
    return {
        split: self._generate_examples(images, labels, idx)
        for split, idx in split_indices(labels).items()
    }

  def _generate_examples(self, images, labels, indices):
    for i in indices:
      yield int(i), {'image': images[i], 'label': int(labels[i])}


def prepare(data_dir: Optional[str] = None) -> SklearnDigits:
  """Prepares ``sklearn_digits`` in ``data_dir`` (TFDS's default if None) unless
  it is prepared; returns the builder."""
  builder = SklearnDigits(data_dir=data_dir)
  if not builder.is_prepared():
    console.event(f'Preparing sklearn_digits (once; later runs reuse it): {builder.data_dir}')
    with console.library_output():
      builder.download_and_prepare(file_format='array_record')
  return builder
