"""Mixup and CutMix (contextpool_jax.data.mixup): the soft labels' mass is the pixels' share, a
CutMix box has the area its lambda says, alphas of 0 are the identity, bad settings fail."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.data import mixup


def _two_images(b=4, h=16, w=12):
  """First half black with label 0, second half white with label 1."""
  images = jnp.concatenate([jnp.zeros((b // 2, h, w, 3)), jnp.ones((b // 2, h, w, 3))])
  labels = jax.nn.one_hot(jnp.array([0] * (b // 2) + [1] * (b // 2)), 5)
  return images, labels


@pytest.mark.parametrize('mixup_alpha,cutmix_alpha', [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_cutmix_label_mass_matches_pixels(mixup_alpha, cutmix_alpha):
  images, labels = _two_images()
  fn = jax.jit(
      lambda k: mixup.mixup_cutmix(
          k, images, labels, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, switch_prob=0.5
      )
  )
  kinds = set()
  for seed in range(12):
    out, soft = fn(jax.random.key(seed))
    assert out.shape == images.shape and out.dtype == images.dtype
    assert soft.shape == labels.shape and soft.dtype == jnp.float32
    np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=1e-6)
    # Example 0 (black) is mixed with the last (white): the white fraction of
    # its pixels is the weight of label 1, whether mixed (constant image) or cut.
    np.testing.assert_allclose(out[0].mean(), soft[0, 1], atol=1e-5)
    np.testing.assert_allclose(out[-1].mean(), soft[-1, 1], atol=1e-5)
    is_cut = bool(jnp.all((out == 0) | (out == 1)))
    if is_cut and 0 < soft[0, 1] < 1:
      assert bool(jnp.all(out[0] == out[0, :, :, :1]))  # a box, all channels
    kinds.add(is_cut)
  if cutmix_alpha == 0:
    assert kinds == {False}
  elif mixup_alpha == 0:
    assert kinds == {True}
  else:
    assert kinds == {False, True}


def test_cutmix_box_area_matches_lambda():
  for seed, lam in enumerate([0.0, 0.1, 0.37, 0.5, 0.9, 1.0]):
    mask, lam_adj = mixup.cutmix_box(jax.random.key(seed), 20, 30, jnp.float32(lam))
    assert mask.shape == (20, 30)
    np.testing.assert_allclose(1 - mask.mean(), lam_adj, atol=1e-6)
    assert float(lam_adj) >= lam - 1e-6  # clipping at the border only shrinks the box
    ys, xs = np.nonzero(np.asarray(mask))
    if len(ys):  # a rectangle
      assert mask.sum() == (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
  # Sides floor(sqrt(1 - lam) * side), less where the box is clipped at the border.
  sums = [
      int(mixup.cutmix_box(jax.random.key(s), 20, 30, jnp.float32(0.75))[0].sum())
      for s in range(20)
  ]
  assert max(sums) == 10 * 15 and min(sums) < 10 * 15


def test_mixup_cutmix_alpha_zero_is_identity():
  images, labels = _two_images()
  out, soft = mixup.mixup_cutmix(
      jax.random.key(0), images, labels, mixup_alpha=0.0, cutmix_alpha=0.0, switch_prob=0.5
  )
  np.testing.assert_array_equal(out, images)
  np.testing.assert_array_equal(soft, labels)
  with pytest.raises(ValueError, match='mixup_alpha'):
    mixup.mixup_cutmix(
        jax.random.key(0), images, labels, mixup_alpha=-1.0, cutmix_alpha=0.0, switch_prob=0.5
    )
  with pytest.raises(ValueError, match='switch_prob'):
    mixup.mixup_cutmix(
        jax.random.key(0), images, labels, mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=1.5
    )
