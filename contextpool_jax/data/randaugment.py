"""RandAugment (Cubuk et al. 2020) on uint8 images with PIL, for the host-side image pipeline.

Each op takes (PIL image, magnitude m in [0, 10], rng) and returns a PIL image
of the same size and mode. Magnitudes map linearly to the AutoAugment ranges,
"increasing" so that m = 0 is the identity for every op with a magnitude:
rotate up to 30 degrees, shear up to 0.3, translate up to 45% of the side
(signs random); enhance factors 1 +- 0.9 m/10; posterize to 8 - 4 m/10 bits;
solarize above 256 (1 - m/10). Uncovered pixels are filled with grey 128.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

MAX_MAGNITUDE = 10.0  # RandAugment's magnitude scale is 0..10
_FILL = (128, 128, 128)
_BILINEAR = Image.Resampling.BILINEAR


def _signed(rng: np.random.Generator, value: float) -> float:
  return value if rng.random() < 0.5 else -value


def _affine(img: Image.Image, coeffs: tuple) -> Image.Image:
  return img.transform(
      img.size, Image.Transform.AFFINE, coeffs, resample=_BILINEAR, fillcolor=_FILL
  )


def ra_identity(img, m, rng):
  """Identity."""
  return img


def ra_autocontrast(img, m, rng):
  """Stretch each channel to the full 0..255 range (no magnitude)."""
  return ImageOps.autocontrast(img)


def ra_equalize(img, m, rng):
  """Histogram equalisation per channel (no magnitude)."""
  return ImageOps.equalize(img)


def ra_rotate(img, m, rng):
  """Rotate about the centre by +-30 m/10 degrees."""
  return img.rotate(_signed(rng, 30.0 * m / MAX_MAGNITUDE), resample=_BILINEAR, fillcolor=_FILL)


def ra_solarize(img, m, rng):
  """Invert pixels >= 256 (1 - m/10)."""
  return ImageOps.solarize(img, threshold=int(round(256 * (1 - m / MAX_MAGNITUDE))))


def ra_posterize(img, m, rng):
  """Keep the 8 - round(4 m/10) most significant bits."""
  return ImageOps.posterize(img, 8 - int(round(4 * m / MAX_MAGNITUDE)))


def _enhance(enhancer: Callable) -> Callable:
  def op(img, m, rng):
    return enhancer(img).enhance(1.0 + _signed(rng, 0.9 * m / MAX_MAGNITUDE))

  op.__doc__ = f'PIL ImageEnhance.{enhancer.__name__} with factor 1 +- 0.9 m/10.'
  return op


ra_color = _enhance(ImageEnhance.Color)
ra_contrast = _enhance(ImageEnhance.Contrast)
ra_brightness = _enhance(ImageEnhance.Brightness)
ra_sharpness = _enhance(ImageEnhance.Sharpness)


def ra_shear_x(img, m, rng):
  """x' = x + s y with s = +-0.3 m/10."""
  return _affine(img, (1, _signed(rng, 0.3 * m / MAX_MAGNITUDE), 0, 0, 1, 0))


def ra_shear_y(img, m, rng):
  """y' = y + s x with s = +-0.3 m/10."""
  return _affine(img, (1, 0, 0, _signed(rng, 0.3 * m / MAX_MAGNITUDE), 1, 0))


def ra_translate_x(img, m, rng):
  """Shift by +-0.45 m/10 of the width."""
  return _affine(img, (1, 0, _signed(rng, 0.45 * m / MAX_MAGNITUDE * img.size[0]), 0, 1, 0))


def ra_translate_y(img, m, rng):
  """Shift by +-0.45 m/10 of the height."""
  return _affine(img, (1, 0, 0, 0, 1, _signed(rng, 0.45 * m / MAX_MAGNITUDE * img.size[1])))


# The 14 ops of the RandAugment paper (Sec. 3).
RANDAUGMENT_OPS: dict[str, Callable] = {
    'identity': ra_identity,
    'autocontrast': ra_autocontrast,
    'equalize': ra_equalize,
    'rotate': ra_rotate,
    'solarize': ra_solarize,
    'color': ra_color,
    'posterize': ra_posterize,
    'contrast': ra_contrast,
    'brightness': ra_brightness,
    'sharpness': ra_sharpness,
    'shear_x': ra_shear_x,
    'shear_y': ra_shear_y,
    'translate_x': ra_translate_x,
    'translate_y': ra_translate_y,
}
_OP_NAMES = tuple(RANDAUGMENT_OPS)


def randaugment(
    image: np.ndarray,
    rng: np.random.Generator,
    *,
    num_ops: int,
    magnitude: float,
    magnitude_std: float = 0.0,
    prob: float = 1.0,
) -> np.ndarray:
  """Applies ``num_ops`` ops drawn uniformly (with replacement) from RANDAUGMENT_OPS.

  Each drawn op is applied with probability ``prob`` at magnitude ``magnitude``
  (0..10), or, if ``magnitude_std > 0``, at N(magnitude, magnitude_std) clipped
  to [0, 10] (timm's ``mstd``). uint8 [h, w, 3] in and out.
  """
  img = Image.fromarray(image)
  for _ in range(num_ops):
    op = RANDAUGMENT_OPS[_OP_NAMES[rng.integers(len(_OP_NAMES))]]
    if prob < 1.0 and rng.random() >= prob:
      continue
    m = magnitude
    if magnitude_std > 0:
      m = float(np.clip(rng.normal(magnitude, magnitude_std), 0.0, MAX_MAGNITUDE))
    img = op(img, m, rng)
  return np.array(img)
