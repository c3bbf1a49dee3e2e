"""RandAugment (contextpool_jax.data.randaugment): every op keeps the image's shape and dtype, is
the identity at magnitude 0 and changes the image at 10; the policy is seeded, and no ops or a
probability of 0 leave the image as it is."""

import numpy as np
import pytest

from contextpool_jax.data import randaugment

MAGNITUDE_OPS = [n for n in randaugment.RANDAUGMENT_OPS if n not in ('autocontrast', 'equalize')]


@pytest.mark.parametrize('name', list(randaugment.RANDAUGMENT_OPS))
def test_randaugment_op_keeps_shape_and_dtype(name):
  from PIL import Image  # pylint: disable=g-import-not-at-top

  image = np.random.default_rng(0).integers(0, 256, (20, 28, 3), dtype=np.uint8)
  op = randaugment.RANDAUGMENT_OPS[name]
  for m in (0.0, 5.0, 10.0):
    out = np.asarray(op(Image.fromarray(image), m, np.random.default_rng(1)))
    assert out.shape == image.shape and out.dtype == np.uint8
    if m == 0 and name in MAGNITUDE_OPS:
      np.testing.assert_array_equal(out, image)  # magnitude 0 is the identity
    if m == 10 and name in MAGNITUDE_OPS and name != 'identity':
      assert not np.array_equal(out, image)


def test_randaugment():
  image = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)

  def run(seed, **kw):
    return randaugment.randaugment(image, np.random.default_rng(seed), **kw)

  out = run(0, num_ops=3, magnitude=9, magnitude_std=0.5)
  assert out.shape == image.shape and out.dtype == np.uint8
  np.testing.assert_array_equal(out, run(0, num_ops=3, magnitude=9, magnitude_std=0.5))
  np.testing.assert_array_equal(run(0, num_ops=0, magnitude=9), image)
  np.testing.assert_array_equal(run(0, num_ops=2, magnitude=9, prob=0.0), image)
  assert any(not np.array_equal(run(s, num_ops=2, magnitude=9), image) for s in range(5))
