"""Streaming ContextPool (``decode=True``): the cache and the one-position step.

A step is the whole-sequence computation at n = 1: the same mapping parameters
(:meth:`~.module.ContextPool._mapping_step`), the same turning of the mapping's
outputs into a_t, theta_t, phi_t, s_t and sigma_t
(:meth:`~.module.ContextPool._mapping_outputs`, with the causal prefix
statistics carried in the cache, :class:`~.sizes.SizePrefix`) and the same
:func:`~.pool.pool_dense` for the one centre t over the cached inputs j <= t.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import jax
import jax.numpy as jnp

from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolInputs
from contextpool_jax.layers.context_pool.pool import mask_features
from contextpool_jax.layers.context_pool.pool import pool_dense
from contextpool_jax.layers.context_pool.pool import valid_positions
from contextpool_jax.layers.context_pool.sizes import SizePrefix
from contextpool_jax.layers.context_pool.sizes import uses_size
from contextpool_jax.layers.context_pool.sizes import uses_weight
from contextpool_jax.layers.context_pool.validate import check_step
from contextpool_jax.base.numerics import NEG_INF

Array = jax.Array
Dtype = Any


class StreamingMixin:
  """The ``decode=True`` half of :class:`~.module.ContextPool` (a mixin: it reads
  the module's fields and its helpers ``_compute_dtype``, ``_mapping_step``,
  ``_mapping_outputs``, ``_combine`` and ``pool_rule``)."""

  if TYPE_CHECKING:  # what it reads of ContextPool (fields, helpers) and flax's Module
    weights: str
    locality: str
    mapping: str
    size_norm: str
    kernel_size: int
    hidden_features: int
    nonlocal_features: Optional[int]
    variable: Callable[..., Any]
    _compute_dtype: Callable[..., Any]
    _mapping_step: Callable[..., Any]
    _mapping_outputs: Callable[..., Any]
    _combine: Callable[..., Any]
    pool_rule: Callable[..., Any]

  def _stream_cache(
      self, batch: int, length: Optional[int], features: int, dtype: Dtype
  ) -> dict[str, Any]:
    """The ``'cache'`` variables of ``decode=True``, created on the first call
    (``length`` = max_len; later calls pass None). Per example:

    * ``x [max_len, features]``, ``valid [max_len]``: the inputs x_j, j <= t;
    * ``log_w [max_len]`` float32: a_j (learned / unnormalised weights);
    * ``phi [max_len, k]``: the non-local keys (``weights='nonlocal'``);
    * ``count``, ``size_lse`` float32: the number of real tokens <= t (n in
      sigma = r n s) and, for the softmax size norm, the running logsumexp of
      the raw sizes (the prefix softmax's denominator);
    * ``conv_inputs [k - 1, features]``, ``conv_hidden [k - 1,
      hidden_features]``: the last k - 1 (masked) inputs of each mapping
      convolution (``mapping='cnn'``);

    and ``cache_index``, the next position t. The attention mapping keeps its
    own (flax) key/value cache.
    """
    zeros = lambda shape, dt: (lambda: jnp.zeros((batch,) + shape, dt))
    names = {
        'cache_index': lambda: jnp.array(0, jnp.int32),
        'x': zeros((length, features), dtype),
        'valid': zeros((length,), bool),
    }
    if uses_weight(self.weights):
      names['log_w'] = zeros((length,), jnp.float32)
    if self.weights == 'nonlocal':
      names['phi'] = zeros((length, self.nonlocal_features or features), dtype)
    if uses_size(self.locality):
      names['count'] = zeros((), jnp.float32)
      if self.size_norm == 'softmax':
        names['size_lse'] = lambda: jnp.full((batch,), NEG_INF, jnp.float32)
    if self.mapping == 'cnn':
      names['conv_inputs'] = zeros((self.kernel_size - 1, features), dtype)
      names['conv_hidden'] = zeros((self.kernel_size - 1, self.hidden_features), dtype)
    return {name: self.variable('cache', name, init) for name, init in names.items()}

  def _decode_step(self, x: Array, mask: Optional[Array], deterministic: bool) -> Array:
    """One streaming step: the pooled feature ``[batch, 1, features]`` of position
    t = ``cache_index`` from ``x [batch, 1, features]`` (mask ``[batch, 1]``).

    Eq. 4 for the one centre t over the cached inputs j <= t, by the same
    :func:`~.pool.pool_block` and dense pooling as the full forward: a_t (and
    phi_t, theta_t) from the new token's mapping output, and sigma_t = r n_t
    s_t (:func:`~.sizes.step_sizes`) from the running count n_t of real tokens
    and, for the softmax size norm, the running logsumexp of the raw sizes.
    O(t) work.
    """
    check_step(self, x, deterministic)
    dtype = self._compute_dtype(x)
    x = x.astype(dtype)
    valid = valid_positions(mask, x.shape[0], 1)
    cache = self._stream_cache(x.shape[0], None, x.shape[-1], dtype)
    t = cache['cache_index'].value
    length = cache['x'].value.shape[1]
    put = lambda name, new: jax.lax.dynamic_update_slice_in_dim(
        cache[name].value, new.astype(cache[name].value.dtype), t, axis=1
    )
    cache['x'].value = put('x', x)
    cache['valid'].value = put('valid', valid)
    raw = self._mapping_step(x, valid, dtype, cache)
    prefix = _size_prefix(cache)
    outputs, prefix = self._mapping_outputs(raw, valid, x, dtype, (length,), prefix=prefix)
    _store_step(cache, put, outputs, prefix)

    centres = Centres(
        index=t[None].astype(jnp.int32), valid=valid, sigma=outputs.sigma, theta=outputs.theta
    )
    cached = lambda name: cache[name].value if name in cache else None
    context = Context(
        index=jnp.arange(length, dtype=jnp.int32),
        valid=cache['valid'].value,
        x=cache['x'].value,
        log_w=cached('log_w'),
        phi=cached('phi'),
    )
    y = pool_dense(self.pool_rule((length,), dropout=False), PoolInputs(centres, context))
    cache['cache_index'].value = t + 1
    return mask_features(valid[..., None], self._combine(x, y), x)


def _size_prefix(cache: dict[str, Any]) -> Optional[SizePrefix]:
  """The size statistics of the positions before t, from the cache (None: no learned size)."""
  if 'count' not in cache:
    return None
  lse = cache['size_lse'].value if 'size_lse' in cache else None
  return SizePrefix(cache['count'].value, lse)


def _store_step(cache: dict[str, Any], put, outputs, prefix: Optional[SizePrefix]) -> None:
  """Writes position t's a_t and phi_t (``put`` at t) and the size statistics up to t."""
  if outputs.log_w is not None:
    cache['log_w'].value = put('log_w', outputs.log_w)
  if outputs.phi is not None:
    cache['phi'].value = put('phi', outputs.phi)
  if prefix is not None:
    cache['count'].value = prefix.count
    if prefix.lse is not None:
      cache['size_lse'].value = prefix.lse
