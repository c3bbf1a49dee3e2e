"""The key and value modes of area attention, and the area key's base feature.

Key modes named as in tensor2tensor's ``area_attention.py`` compute what they
compute there (some without sigma); the ``*_std_*`` modes are Eq. 9 (which has
sigma) with the other base features, names of our own. See
:class:`~.module.AreaAttention`'s table.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from contextpool_jax.layers.area_attention.areas import AreaFeatures

Array = jax.Array

PARAMETER_FREE_KEY_MODES = ('mean', 'max', 'sample')


class LearnedKey(NamedTuple):
  """A learned key mode: base feature f, whether sigma enters, how features combine."""

  base: str  # 'mean' | 'max' | 'sample'
  std: bool
  combine: str  # 'concat' | 'sum' (AreaKeyEncoder.mode)


# The learned key modes. The first five are tensor2tensor's names and compute
# what its compute_area_key computes for them; the last three are Eq. 9 with
# the std term for the other base features (names of our own).
LEARNED_KEYS = {
    'concat': LearnedKey('mean', True, 'concat'),
    'max_concat': LearnedKey('max', False, 'concat'),
    'sample_concat': LearnedKey('sample', False, 'concat'),
    'sum': LearnedKey('mean', True, 'sum'),
    'sample_sum': LearnedKey('sample', False, 'sum'),
    'max_std_concat': LearnedKey('max', True, 'concat'),
    'sample_std_concat': LearnedKey('sample', True, 'concat'),
    'sample_std_sum': LearnedKey('sample', True, 'sum'),
}
LEARNED_KEY_MODES = tuple(LEARNED_KEYS)
KEY_MODES = PARAMETER_FREE_KEY_MODES + LEARNED_KEY_MODES
VALUE_MODES = ('sum', 'mean', 'max')


def key_base(key_mode: str) -> str:
  """The base feature f of a key mode: 'mean', 'max' or 'sample'."""
  return LEARNED_KEYS[key_mode].base if key_mode in LEARNED_KEYS else key_mode


def key_features(key_mode: str) -> tuple[str, ...]:
  """Which per-area statistics of the item keys a key mode reads."""
  base, learned = key_base(key_mode), LEARNED_KEYS.get(key_mode)
  needs_std = base == 'sample' or (learned is not None and learned.std)
  return (('max',) if base == 'max' else ('mean',)) + (('std',) if needs_std else ())


def is_linear_in_items(key_mode: str, value_mode: str, sample_rng: Array | None) -> bool:
  """Whether the area keys are item-key means and the area values item-value
  sums or means (the basic form, Eq. 3-4), so that
  :func:`~.through_items.attend_through_items` computes the same attention as
  :func:`~.attend.attend` on the area features."""
  mean_key = key_mode == 'mean' or (key_mode == 'sample' and sample_rng is None)
  return mean_key and value_mode in ('sum', 'mean')


def base_area_key(feats: AreaFeatures, key_mode: str, sample_rng: Array | None) -> Array:
  """The key feature ``f``: mean (Eq. 3), max, or a sample ``mean + std * eps``.

  Sample modes draw ``eps ~ N(0, I)`` (``jax.random.normal(sample_rng,
  mean.shape)``, reparameterised so gradients flow to mean and std) only when
  ``sample_rng`` is given (training); otherwise ``f = mean``, the mean of the
  distribution.
  """
  base = key_base(key_mode)
  # ``feats`` holds the statistics that key_features(key_mode) names.
  if base == 'max':
    assert feats.max is not None
    return feats.max
  assert feats.mean is not None
  if base == 'sample' and sample_rng is not None:
    assert feats.std is not None
    eps = jax.random.normal(sample_rng, feats.mean.shape, jnp.float32)
    return (feats.mean + feats.std * eps.astype(feats.std.dtype)).astype(feats.mean.dtype)
  return feats.mean
