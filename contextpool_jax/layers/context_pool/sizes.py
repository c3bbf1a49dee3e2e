"""What the mapping's raw outputs become: log pooling weights a_j, normalised
sizes s (A1) and Gaussian widths sigma (Sec. 3.2, Appendix A).

``{w, s} = m(X)`` predicts a raw weight channel (first) and a raw size channel
(last), only those the variant uses (:func:`uses_weight`, :func:`uses_size`).
The whole-sequence call turns them into Eq. 4's terms with
:func:`log_weights`, :func:`normalised_size` and :func:`pooling_sigma`; the
streaming decode step does the same for one new position with
:func:`step_sizes`, which carries the causal prefix statistics
(:class:`SizePrefix`) from step to step. Which n enters ``sigma = r n s`` is
decided in one place, :func:`sigma_extent`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from contextpool_jax.base.numerics import NEG_INF

Array = jax.Array

DEFAULT_RATIO = {1: 0.1, 2: 0.05}  # r for sequences (Sec. 3.2) and grids (App. A).


def uses_weight(weights: str) -> bool:
  """Whether the mapping predicts a raw weight channel (learned or unnormalised weights)."""
  return weights in ('learned', 'unnormalized')


def uses_size(locality: str) -> bool:
  """Whether the mapping predicts a raw size channel (a learned Gaussian or window size)."""
  return locality in ('gaussian', 'adaptive_window')


def num_channels(weights: str, locality: str) -> int:
  """Output channels of the mapping: the raw weight (first) and raw size (last) it predicts."""
  return int(uses_weight(weights)) + int(uses_size(locality))


def _log_softplus(z: Array) -> Array:
  """log(softplus(z)) without underflow: equals z (to float32 precision) for z < -30."""
  safe = jnp.maximum(z, -30.0)
  return jnp.where(z < -30.0, z, jnp.log(jax.nn.softplus(safe)))


def log_weights(raw: Optional[Array], weights: str) -> Optional[Array]:
  """The log pooling weights ``a_j [batch, n]`` float32 from the mapping's raw
  outputs ``[batch, n, channels]``: ``'learned'``, the raw weight (softmax
  weights ``exp(a_j) / Z``, Z cancels in Eq. 4); ``'unnormalized'``,
  ``log softplus(raw)`` (``w_j = softplus(raw_j)``); None for uniform
  (a_j = 0) and non-local weights (Eq. 3, query dependent)."""
  if weights not in ('learned', 'unnormalized'):
    return None
  assert raw is not None  # these weights are a channel of the mapping's output
  return raw[..., 0] if weights == 'learned' else _log_softplus(raw[..., 0])


def _size_logits(raw_size: Array, valid: Array) -> Array:
  """The raw sizes as float32, ``NEG_INF`` at padded positions (no weight in a softmax)."""
  return jnp.where(valid, raw_size.astype(jnp.float32), NEG_INF)


def normalised_size(raw_size: Array, valid: Array, *, size_norm: str, causal: bool) -> Array:
  """The normalised pooling sizes ``s`` in [0, 1], ``[batch, n]`` float32 (A1),
  from the mapping's raw size channel ``[batch, n]``:

  * ``'softmax'``: the paper's literal reading, a softmax of the raw sizes over
    the valid positions (for ``causal``: over the valid positions ``<= i``, a
    prefix softmax, so that s_i never depends on later tokens);
  * ``'sigmoid'``: a per-token squashing, ``s_i = sigmoid(raw_i)``.

  0 at padded positions.
  """
  z = _size_logits(raw_size, valid)
  if size_norm == 'sigmoid':
    s = jax.nn.sigmoid(z)
  elif causal:
    s = jnp.exp(z - jax.lax.cumlogsumexp(z, axis=1))
  else:
    s = jax.nn.softmax(z, axis=1)
  return jnp.where(valid, s, 0.0)


def sigma_extent(
    valid: Array,
    *,
    causal: bool,
    grid_extent: Optional[float],
    length: Optional[float] = None,
    count: Optional[Array] = None,
) -> Union[float, Array]:
  """The extent n of ``sigma = r n s`` (or ``S (h + w) / 2`` of a grid), by one rule.

  Grids: the static ``grid_extent``. Sequences: ``length``
  (``ContextPool.sigma_length``) when given, the same static n for every
  token; else the number of real tokens token i pools over: for ``causal``
  those ``<= i`` (``count [batch, 1]`` when the streaming step gives its
  running count, else the cumulative sum of ``valid [batch, n]``), otherwise
  all of them (``[batch, 1]``), so the amount of padding or of future never
  changes a real token's size.
  """
  if grid_extent is not None:
    return grid_extent
  if length is not None:
    return length
  if count is not None:
    return count
  if causal:
    return jnp.cumsum(valid, axis=1, dtype=jnp.float32)
  return jnp.sum(valid, axis=1, keepdims=True, dtype=jnp.float32)


def pooling_sigma(
    s: Array,
    valid: Array,
    *,
    causal: bool,
    ratio: float,
    grid_extent: Optional[float],
    length: Optional[float] = None,
    count: Optional[Array] = None,
) -> Array:
  """Gaussian standard deviations in token units, ``[batch, n]`` (float32), from
  the normalised sizes ``s`` (:func:`normalised_size`).

  Sequences: ``sigma_i = r * n_i * s_i`` where ``n_i`` is the number of tokens
  token i pools over: the number of valid tokens (not the padded length, so the
  amount of padding never changes a real token's output) or, for ``causal``,
  the number of valid tokens ``<= i`` (so the output at i is the same whatever
  the length of the future); or, when ``length`` is given
  (``ContextPool.sigma_length``), that static n for every token, so a token's
  size does not depend on where it sits in the window. Grids: ``sigma = r * S
  * (h + w) / 2`` with the static grid size (``grid_extent``). ``count``: the
  streaming step's running count of real tokens (see :func:`sigma_extent`).
  """
  extent = sigma_extent(valid, causal=causal, grid_extent=grid_extent, length=length, count=count)
  return ratio * extent * s


class SizePrefix(NamedTuple):
  """The causal prefix statistics of the sizes up to the newest position t (the
  streaming step's cache).

  Attributes:
    count: ``[batch]`` float32, the number of real tokens ``<= t`` (n_t in
      ``sigma_t = r n_t s_t``).
    lse: ``[batch]`` float32, the logsumexp of the raw sizes ``<= t`` (the
      prefix softmax's denominator); None for ``size_norm='sigmoid'``.
  """

  count: Array
  lse: Optional[Array]


def step_sizes(
    raw_size: Array,
    valid: Array,
    prefix: SizePrefix,
    *,
    size_norm: str,
    ratio: float,
    length: Optional[float],
) -> tuple[Array, Array, SizePrefix]:
  """:func:`normalised_size` and :func:`pooling_sigma` of a causal sequence at
  one new position t, from the raw size ``[batch, 1]``, its validity
  ``[batch, 1]`` and the statistics of the positions before it: ``(s, sigma,
  prefix)``, both ``[batch, 1]`` float32, and the statistics up to t. O(1)
  work: the prefix softmax's denominator and the real-token count are carried
  one step on."""
  count = prefix.count + valid[:, 0].astype(jnp.float32)
  z = _size_logits(raw_size, valid)
  lse = prefix.lse
  if size_norm == 'sigmoid':
    s = jax.nn.sigmoid(z)
  else:
    assert lse is not None  # the softmax size norm's prefix carries it
    lse = jnp.logaddexp(lse, z[:, 0])
    s = jnp.exp(z - lse[:, None])
  s = jnp.where(valid, s, 0.0)
  sigma = pooling_sigma(
      s, valid, causal=True, ratio=ratio, grid_extent=None, length=length, count=count[:, None]
  )
  return s, sigma, SizePrefix(count, lse)
