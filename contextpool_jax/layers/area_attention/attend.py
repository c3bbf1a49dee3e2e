"""Dot-product attention of queries over area keys and values (Eq. 1-2 over
areas): the masked float32 softmax over the areas, and dropout on it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.base import checks
from contextpool_jax.base.numerics import masked_softmax

Array = jax.Array


def attend_to_areas(
    query: Array,
    area_keys: Array,
    area_values: Array,
    area_mask: Array | None = None,
    *,
    scale: float | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: Array | None = None,
    deterministic: bool = True,
) -> Array:
  """Dot-product attention of queries over areas (Eq. 1-2 with area keys/values).

  ``p = softmax(scale * q . k_area)`` over the allowed areas, computed in
  float32 with max-subtraction; ``out = sum_area p * v_area``. A query with no
  allowed area outputs exactly zero. Dropout (inverted, element-wise, no
  broadcasting) is applied to the probabilities when ``not deterministic``.

  Args:
    query: ``[batch, q_len, heads, depth]``.
    area_keys: ``[batch, num_areas, heads, depth]``.
    area_values: ``[batch, num_areas, heads, depth_v]``.
    area_mask: ``None`` or boolean, broadcastable to
      ``[batch, heads, q_len, num_areas]`` (see :func:`~.masks.area_attention_mask`).
    scale: logit scale; ``None`` means ``1 / sqrt(depth)``.
    dropout_rate: dropout rate on the attention probabilities.
    dropout_rng: PRNG key, required if ``dropout_rate > 0`` and not
      ``deterministic``.
    deterministic: disables dropout.

  Returns:
    ``[batch, q_len, heads, depth_v]`` in the dtype of ``area_values``.
  """
  owner = 'attend_to_areas'
  checks.check_rank(owner, 'query', query, (4,), '[batch, q_len, heads, depth]')
  checks.check_rank(owner, 'area_keys', area_keys, (4,), '[batch, num_areas, heads, depth]')
  checks.check_rank(owner, 'area_values', area_values, (4,), '[batch, num_areas, heads, depth_v]')
  checks.check_probability(owner, 'dropout_rate', dropout_rate)
  if not deterministic and dropout_rate > 0.0 and dropout_rng is None:
    raise ValueError(
        f'{owner}: dropout_rng=None but dropout_rate={dropout_rate!r} and '
        'deterministic=False; pass dropout_rng= or deterministic=True.'
    )
  return attend(
      query,
      area_keys,
      area_values,
      area_mask,
      scale=scale,
      dropout_rate=dropout_rate,
      dropout_rng=None if deterministic else dropout_rng,
  )


def attend(
    query: Array,
    area_keys: Array,
    area_values: Array,
    area_mask: Array | None,
    *,
    scale: float | None,
    dropout_rate: float,
    dropout_rng: Array | None,
    heads_major: bool = False,
) -> Array:
  """:func:`attend_to_areas` on checked inputs; dropout iff ``dropout_rng`` is given.

  ``heads_major``: the areas are ``[batch, heads, num_areas, depth]`` (the
  decoding cache's layout, :meth:`~.module.AreaAttention._area_cache`) instead of
  ``[batch, num_areas, heads, depth]``."""
  a = 'bhad' if heads_major else 'bahd'
  scale = logit_scale(query, scale)
  logits = jnp.einsum(f'bqhd,{a}->bhqa', query, area_keys, preferred_element_type=jnp.float32)
  logits = logits * jnp.float32(scale)
  probs = area_probs(logits, area_mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng)
  return jnp.einsum(f'bhqa,{a}->bqhd', probs.astype(area_values.dtype), area_values)


def logit_scale(query: Array, scale: float | None) -> float:
  """The logit scale: ``scale``, or ``1 / sqrt(depth)`` when it is ``None``."""
  return 1.0 / np.sqrt(query.shape[-1]) if scale is None else scale


def area_probs(
    logits: Array, area_mask: Array | None, *, dropout_rate: float, dropout_rng: Array | None
) -> Array:
  """``[batch, heads, q_len, num_areas]`` attention probabilities over the areas:
  the float32 masked softmax of ``logits`` (0 on masked areas), then inverted
  element-wise dropout iff ``dropout_rng`` is given and ``dropout_rate > 0``."""
  return dropout(
      masked_softmax(logits, area_mask),
      dropout_keep(dropout_rng, dropout_rate, logits.shape),
      dropout_rate,
  )


def dropout_keep(rng: Array | None, rate: float, shape: tuple[int, ...]) -> Array | None:
  """The dropout draw of the probabilities ``[batch, heads, q_len, num_areas]``
  (True = kept), or ``None`` without dropout (no ``rng`` or ``rate == 0``)."""
  if rng is None or rate <= 0.0:
    return None
  return jax.random.bernoulli(rng, 1.0 - rate, shape)


def dropout(probs: Array, keep: Array | None, rate: float) -> Array:
  """Inverted dropout of ``probs`` by the draw ``keep`` (``None``: none)."""
  return probs if keep is None else jnp.where(keep, probs / (1.0 - rate), 0.0)
