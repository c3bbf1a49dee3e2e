"""Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) on device, inside the train step.

:func:`mixup_cutmix` is jittable; the classification objective applies it to
each training batch (``config.dataset.mixup_alpha``, ``cutmix_alpha``,
``mixup_switch_prob``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def cutmix_box(
    rng: jax.Array, height: int, width: int, lam: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """CutMix box (Yun et al. 2019): sides ``sqrt(1 - lam)`` of the image's, uniform
  centre, clipped at the border. Returns ``(mask [h, w] bool, lam_adjusted)``
  where ``lam_adjusted = 1 - box area / image area`` (after clipping)."""
  ky, kx = jax.random.split(rng)
  cut = jnp.sqrt(1.0 - lam)
  ch = jnp.floor(height * cut).astype(jnp.int32)
  cw = jnp.floor(width * cut).astype(jnp.int32)
  cy = jax.random.randint(ky, (), 0, height)
  cx = jax.random.randint(kx, (), 0, width)
  y0, x0 = cy - ch // 2, cx - cw // 2
  y1, y0 = jnp.clip(y0 + ch, 0, height), jnp.clip(y0, 0, height)
  x1, x0 = jnp.clip(x0 + cw, 0, width), jnp.clip(x0, 0, width)
  ys = jnp.arange(height)[:, None]
  xs = jnp.arange(width)[None, :]
  mask = (ys >= y0) & (ys < y1) & (xs >= x0) & (xs < x1)
  lam_adjusted = 1.0 - ((y1 - y0) * (x1 - x0)).astype(jnp.float32) / (height * width)
  return mask, lam_adjusted


def mixup_cutmix(
    rng: jax.Array,
    images: jax.Array,
    labels_onehot: jax.Array,
    *,
    mixup_alpha: float,
    cutmix_alpha: float,
    switch_prob: float = 0.5,
) -> tuple[jax.Array, jax.Array]:
  """Batch-level Mixup or CutMix, as in DeiT (mixup 0.8, cutmix 1.0, switch 0.5).

  Example ``i`` is mixed with example ``b - 1 - i`` (the batch reversed), with
  one ``lam ~ Beta(alpha, alpha)`` per batch. With both alphas > 0, CutMix is
  used with probability ``switch_prob``, else Mixup; an alpha of 0 disables
  that method, both 0 return the inputs unchanged. CutMix's ``lam`` is the
  kept area after clipping the box. Labels become ``lam y_i + (1 - lam)
  y_{b-1-i}`` (float32, rows sum to 1 for one-hot input).

  Args:
    rng: a PRNG key.
    images: [b, h, w, c] (any float dtype; kept).
    labels_onehot: [b, num_classes].
    mixup_alpha, cutmix_alpha, switch_prob: Python numbers (static).

  Returns:
    ``(images, soft_labels)``.
  """
  for field, v, hi in (
      ('mixup_alpha', mixup_alpha, math.inf),
      ('cutmix_alpha', cutmix_alpha, math.inf),
      ('switch_prob', switch_prob, 1.0),
  ):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
      raise ValueError(f'mixup_cutmix: {field}={v!r} is invalid; expected a number in [0, {hi}].')
  labels = labels_onehot.astype(jnp.float32)
  if mixup_alpha <= 0 and cutmix_alpha <= 0:
    return images, labels
  k_switch, k_mix, k_cut, k_box = jax.random.split(rng, 4)
  other_images, other_labels = images[::-1], labels[::-1]
  h, w = images.shape[1:3]

  def mixup():
    lam = jax.random.beta(k_mix, mixup_alpha, mixup_alpha).astype(jnp.float32)
    lam_x = lam.astype(images.dtype)
    return lam_x * images + (1 - lam_x) * other_images, lam

  def cutmix():
    lam = jax.random.beta(k_cut, cutmix_alpha, cutmix_alpha).astype(jnp.float32)
    box, lam = cutmix_box(k_box, h, w, lam)
    return jnp.where(box[None, :, :, None], other_images, images), lam

  if cutmix_alpha <= 0:
    mixed, lam = mixup()
  elif mixup_alpha <= 0:
    mixed, lam = cutmix()
  else:
    use_cutmix = jax.random.uniform(k_switch) < switch_prob
    mixed, lam = jax.lax.cond(use_cutmix, cutmix, mixup)
  return mixed, lam * labels + (1 - lam) * other_labels
