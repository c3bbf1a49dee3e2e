"""Streaming AreaAttention (``decode=True``, incremental decoding): the cache of
causal self-attention and its one-query step, and the cached memory of
cross-attention."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.layers.area_attention.areas import AreaFeatures
from contextpool_jax.layers.area_attention.areas import area_layout
from contextpool_jax.layers.area_attention.areas import compute_area_features
from contextpool_jax.layers.area_attention.attend import attend
from contextpool_jax.layers.area_attention.keys import base_area_key
from contextpool_jax.layers.area_attention.keys import is_linear_in_items
from contextpool_jax.layers.area_attention.keys import key_features
from contextpool_jax.layers.area_attention.through_items import attend_through_items

Array = jax.Array


class StreamingMixin:
  """The ``decode=True`` half of :class:`~.module.AreaAttention` (a mixin: it
  reads the module's fields)."""

  if TYPE_CHECKING:  # what it reads of AreaAttention (the fields) and flax's Module
    max_area_width: int
    key_mode: str
    value_mode: str
    std_epsilon: float
    has_variable: Callable[..., bool]
    get_variable: Callable[..., Any]
    variable: Callable[..., Any]

  def _memory_keys_values(self, dense, x_kv: Array) -> tuple[Array, Array]:
    """The fixed memory's item keys and values (``decode=True``, not causal):
    projected and stored by the first call, read by later ones."""
    if self.has_variable('cache', 'cached_memory_key'):
      return (
          self.get_variable('cache', 'cached_memory_key'),
          self.get_variable('cache', 'cached_memory_value'),
      )
    key, value = dense(name='key')(x_kv), dense(name='value')(x_kv)
    self.variable('cache', 'cached_memory_key', lambda: key)
    self.variable('cache', 'cached_memory_value', lambda: value)
    return key, value

  def _steps_through_items(self, learned_key) -> bool:
    """Whether a decoding step attends through the items (the basic form: mean
    keys, sum / mean values, :func:`~.through_items.attend_through_items`) rather than over
    cached area features."""
    return learned_key is None and is_linear_in_items(self.key_mode, self.value_mode, None)

  def _area_cache(self, key: Array, value: Array, through_items: bool) -> dict[str, Any] | None:
    """The ``'cache'`` of ``decode=True`` (W = ``max_area_width``, L = max_len),
    created by the first call (returns None then), else returned:

    * ``cached_key`` / ``cached_value`` ``[batch, heads, W - 1 + L, depth]``:
      the item keys / values, position t at ``W - 1 + t`` (W - 1 leading
      zeros, so the last W items are always a slice);
    * unless the step goes ``through_items`` (the basic form, which needs the
      items only): ``cached_area_key`` / ``cached_area_value`` ``[batch,
      heads, L * W, depth]``, the key and value of the area of width w ending
      at t in ``[:, :, t * W + w - 1]``;
    * ``cache_index``: the next position t.

    Heads-major, as :class:`~contextpool_jax.models.transformer.MultiHeadAttention`'s
    cache and for the same measured reason (the step's contractions read it
    in place, where ``[batch, L, heads, depth]`` made XLA transpose the whole
    cache at every step); the area cache is flat because a reshape of the
    updated cache made XLA:CPU duplicate the update and copy the cache every
    step.
    """
    width = self.max_area_width
    initialized = self.has_variable('cache', 'cache_index')
    b, length, heads, depth = key.shape
    zeros = lambda n, a: (lambda: jnp.zeros((b, heads, n, a.shape[3]), a.dtype))
    cache = {
        'cached_key': self.variable('cache', 'cached_key', zeros(width - 1 + length, key)),
        'cached_value': self.variable('cache', 'cached_value', zeros(width - 1 + length, value)),
        'cache_index': self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32)),
    }
    if not through_items:
      for name, a in (('cached_area_key', key), ('cached_area_value', value)):
        cache[name] = self.variable('cache', name, zeros(length * width, a))
    return cache if initialized else None

  def _decode_step(self, cache, query, key, value, learned_key) -> Array:
    """Area attention of the query at t = ``cache_index`` (``[batch, 1, heads,
    depth]``), its key and value appended to the cache; O(t W) work per step.

    The query attends over every area ending at or before t that starts at or
    after 0 (the causal area mask, :func:`~.masks.area_mask`). The basic form
    (:meth:`_steps_through_items`) does it through the cached items exactly as
    the full forward does (:func:`~.through_items.attend_through_items` over the W - 1 + L
    cached items, areas over the leading zeros masked): the step reads t
    items, not t W areas. Otherwise the W areas that end at t (widths 1..W)
    get their features from the last W cached items, by the same
    :func:`compute_area_features` on a memory of W items (the areas of that
    memory whose last item is t), and their keys by the same key mode (Eq. 3 /
    Eq. 9); they are stored, and the query attends over the cached areas.
    """
    width = self.max_area_width
    t = cache['cache_index'].value
    # [b, n, heads, depth] -> [b, heads, n, depth], written at ``at``.
    put = lambda name, new, at: jax.lax.dynamic_update_slice_in_dim(
        cache[name].value, jnp.swapaxes(new, 1, 2).astype(cache[name].value.dtype), at, 2
    )
    cache['cached_key'].value = put('cached_key', key, width - 1 + t)
    cache['cached_value'].value = put('cached_value', value, width - 1 + t)
    cache['cache_index'].value = t + 1
    if self._steps_through_items(learned_key):
      items = area_layout(cache['cached_key'].value.shape[2], max_area_width=width)
      allowed = (items.col >= width - 1) & (items.last_index <= width - 1 + t)
      return attend_through_items(
          query,
          cache['cached_key'].value,
          cache['cached_value'].value,
          allowed[None, None, None, :],
          layout=items,
          value_mode=self.value_mode,
          scale=None,
          dropout_rate=0.0,
          dropout_rng=None,
          heads_major=True,
      )

    last = lambda name: jnp.swapaxes(
        jax.lax.dynamic_slice_in_dim(cache[name].value, t, width, axis=2), 1, 2
    )
    layout = area_layout(width, max_area_width=width)
    ending = np.flatnonzero(layout.last_index == width - 1)  # widths 1..W, in order
    pick = lambda a: None if a is None else a[:, ending]

    def features(items, names):
      feats = compute_area_features(items, layout, features=names, std_epsilon=self.std_epsilon)
      sum_, mean, std, max_ = (pick(a) for a in feats[:4])
      return AreaFeatures(sum_, mean, std, max_, feats.height[ending], feats.width[ending])

    key_feats = features(last('cached_key'), key_features(self.key_mode))
    area_keys = base_area_key(key_feats, self.key_mode, None)
    if learned_key is not None:
      area_keys = learned_key(area_keys, key_feats)
    area_values = getattr(features(last('cached_value'), (self.value_mode,)), self.value_mode)
    cache['cached_area_key'].value = put('cached_area_key', area_keys, t * width)
    cache['cached_area_value'].value = put('cached_area_value', area_values, t * width)

    length = cache['cached_area_key'].value.shape[2] // width
    start = jnp.arange(length)[:, None] - jnp.arange(width)[None, :]  # [L, W]
    allowed = (jnp.arange(length)[:, None] <= t) & (start >= 0)
    return attend(
        query,
        cache['cached_area_key'].value,
        cache['cached_area_value'].value,
        allowed.reshape(1, 1, 1, length * width),
        scale=None,
        dropout_rate=0.0,
        dropout_rng=None,
        heads_major=True,
    )
