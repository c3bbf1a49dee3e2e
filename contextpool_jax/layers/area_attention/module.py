"""Multi-head area attention as a Linen module: :class:`AreaAttention`."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from contextpool_jax.layers.area_attention.areas import AreaFeatures
from contextpool_jax.layers.area_attention.core import area_attention
from contextpool_jax.layers.area_attention.key_encoder import AreaKeyEncoder
from contextpool_jax.layers.area_attention.keys import LEARNED_KEYS
from contextpool_jax.layers.area_attention.keys import key_base
from contextpool_jax.layers.area_attention.streaming import StreamingMixin
from contextpool_jax.layers.area_attention.validate import AreaSettings
from contextpool_jax.layers.area_attention.validate import check_decode
from contextpool_jax.layers.area_attention.validate import check_head_dim
from contextpool_jax.layers.area_attention.validate import check_module_fields
from contextpool_jax.layers.area_attention.validate import check_module_inputs

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
LearnedKeyFn = Callable[[Array, AreaFeatures], Array]

_OWNER = 'AreaAttention'


class AreaAttention(StreamingMixin, nn.Module):
  """Multi-head area attention (Li et al., 2019), self- or cross-attention, 1D or 2D.

  Queries, keys and values are projected per head (``DenseGeneral`` named
  ``query``, ``key``, ``value``), every area of the memory gets a key (by
  ``key_mode``) and a value (by ``value_mode``) from the projected items,
  each query attends over the areas it may see, and the heads are projected
  back to ``out_features`` (``out``). ``max_area_width = max_area_height = 1``
  is ordinary multi-head attention.

  Key modes (``f`` is the base feature of the mode, ``sigma`` the std of the
  item keys, Eq. 5):

  ===================  =========================================  ==============
  key_mode             area key (``e = [e_h; e_w]``)              parameters
  ===================  =========================================  ==============
  'mean'               mean of item keys (Eq. 3, basic form)      none
  'max'                element-wise max of item keys              none
  'sample'             mean + sigma * eps (eps only in training)  none
  'concat'             ReLU([mean; sigma; e] W) Wd (Eq. 9)        AreaKeyEncoder
  'max_concat'         ReLU([max; e] W) Wd                        AreaKeyEncoder
  'sample_concat'      ReLU([sample; e] W) Wd                     AreaKeyEncoder
  'sum'                ReLU((mean + sigma + e) W) Wd              AreaKeyEncoder
  'sample_sum'         ReLU((sample + e) W) Wd                    AreaKeyEncoder
  'max_std_concat'     ReLU([max; sigma; e] W) Wd (Eq. 9, f=max)  AreaKeyEncoder
  'sample_std_concat'  ReLU([sample; sigma; e] W) Wd              AreaKeyEncoder
  'sample_std_sum'     ReLU((sample + sigma + e) W) Wd            AreaKeyEncoder
  ===================  =========================================  ==============

  (Biases ``b1``, ``bd`` omitted.) Every mode tensor2tensor's
  ``compute_area_key`` has (the first eight rows) computes what it computes
  there: no std in ``max_concat``, ``sample_concat``, ``sample_sum``; height
  and width embeddings ``head_dim // 2`` wide each, concatenated (so ``'sum'``
  modes need an even head dim); the MLP's hidden width is the head dim and it
  is shared by the heads. The ``*_std_*`` modes are Eq. 9 (which has sigma)
  with the other base features, names of our own.

  Sample noise ``eps ~ N(0, I)`` is reparameterised and drawn from the
  ``'dropout'`` rng stream only when ``deterministic=False``; at evaluation
  the sample is the mean. Value modes: ``'sum'`` (Eq. 4), ``'mean'``,
  ``'max'`` of the projected item values.

  Memories: ``inputs_kv`` ``[batch, kv_len, features]`` is a grid of
  ``memory_height`` rows stored row-major (``kv_len`` must be a multiple), or
  ``[batch, height, width, features]``, whose grid is taken from its shape
  (then ``memory_height`` must be 1 or ``height``). ``inputs_q`` may likewise
  be ``[batch, q_len, features]`` or ``[batch, height, width, features]``;
  the output has its layout with ``out_features`` channels. Positions in
  masks and causality are flattened row-major indices.

  Attributes:
    num_heads: number of heads.
    qkv_features: total query/key/value width (``None``: query features);
      must be divisible by ``num_heads``.
    out_features: output width (``None``: query features).
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of a flattened 2D memory (1: a sequence).
    key_mode: see the table.
    value_mode: ``'sum'``, ``'mean'`` or ``'max'``.
    causal: query ``i`` sees only areas whose items all have index ``<= i``
      (raster order in 2D; top-left aligned for cross-attention).
    dropout_rate: dropout on attention probabilities (rng ``'dropout'``).
    std_epsilon: variance floor inside the area std.
    area_key_hidden_dim: hidden width of the Eq. 9 MLP (``None``: head dim).
    area_embedding_dim: ``S``, width of each shape embedding (``None``: head
      dim // 2, as tensor2tensor; ``'sum'`` modes allow only that).
    per_head_area_key_params: one Eq. 9 MLP per head instead of a shared one.
    dtype: compute dtype (``None``: inferred); the softmax runs in float32.
    param_dtype: parameter dtype.
    kernel_init: projection kernel initializer.
    bias_init: projection bias initializer.
    use_bias: biases in the projections and the Eq. 9 MLP.
    decode: incremental decoding of causal 1D self-attention: the first call,
      on the full ``[batch, max_len, features]``, creates the ``'cache'``
      collection and returns the ordinary output; every later call takes one
      query ``[batch, 1, features]`` (``mask=None``, ``deterministic=True``)
      and attends over the areas ending at or before it (:meth:`_decode_step`).
      Non-causal (cross-attention over a fixed memory, e.g. the encoder
      output): the first call stores the memory's projected item keys and
      values (``cached_memory_key`` / ``cached_memory_value`` ``[batch,
      kv_len, heads, depth]``) and later calls read them instead of
      projecting the memory again; the areas and the mask are those of the
      ordinary call.
    implementation: None (the dense softmax over the areas) or ``'pallas_tpu'``
      (jax's Pallas TPU flash kernel over the area keys and values: memory linear in
      the length; padding masks only; not for dropout in training or the decoding
      steps, which take the dense path; :func:`~.core.flash_over_areas`).
  """

  num_heads: int
  qkv_features: int | None = None
  out_features: int | None = None
  max_area_width: int = 1
  max_area_height: int = 1
  memory_height: int = 1
  key_mode: str = 'mean'
  value_mode: str = 'sum'
  causal: bool = False
  dropout_rate: float = 0.0
  std_epsilon: float = 1e-6
  area_key_hidden_dim: int | None = None
  area_embedding_dim: int | None = None
  per_head_area_key_params: bool = False
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  use_bias: bool = True
  decode: bool = False
  implementation: str | None = None

  @nn.compact
  def __call__(
      self,
      inputs_q: Array,
      inputs_kv: Array | None = None,
      mask: Array | None = None,
      deterministic: bool = True,
  ) -> Array:
    """Applies area attention.

    Args:
      inputs_q: ``[batch, q_len, features]`` or ``[batch, h, w, features]``;
        ``batch`` may be 0 (an empty output).
      inputs_kv: memory, same layouts; ``None`` -> self-attention on
        ``inputs_q``.
      mask: item-level boolean mask broadcastable to
        ``[batch, num_heads, q_len, kv_len]`` (flattened positions), True = may
        attend.
      deterministic: no dropout and no sampling noise. Positional so that
        ``nn.remat(AreaAttention, static_argnums=(4,))`` can make it static.

    Returns:
      ``[batch, q_len, out_features]`` or ``[batch, h, w, out_features]`` (the
      layout of ``inputs_q``).
    """
    check_module_fields(_OWNER, self)
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    memory_height = check_module_inputs(_OWNER, self, inputs_q, inputs_kv, mask)
    head_dim = check_head_dim(_OWNER, self, self.qkv_features or inputs_q.shape[-1])
    out_features = self.out_features or inputs_q.shape[-1]
    x_q, x_kv = _flatten_positions(inputs_q), _flatten_positions(inputs_kv)
    query, key, value = self._project_heads(x_q, x_kv, head_dim)
    learned_key = self._learned_key()
    sample_rng, dropout_rng = self._draw_rngs(deterministic)
    cache = None
    if self.decode and self.causal:  # a cached step, or the call that creates the cache
      check_decode(_OWNER, self, x_q, x_kv, memory_height, mask, deterministic)
      cache = self._area_cache(key, value, self._steps_through_items(learned_key))
    if cache is not None:
      out = self._decode_step(cache, query, key, value, learned_key)
    else:
      out = area_attention(
          query,
          key,
          value,
          mask,
          self.area_settings(memory_height),
          sample_rng=sample_rng,
          dropout_rng=dropout_rng,
          learned_key=learned_key,
      )
    out = self._output_projection(out_features)(out)
    return out.reshape(inputs_q.shape[:-1] + (out_features,))

  def area_settings(self, memory_height: int | None = None) -> AreaSettings:
    """The fields as the settings both entry points share; ``memory_height``:
    the memory's (the height of a ``[batch, height, width, features]``
    memory), None: the field."""
    return AreaSettings(
        max_area_width=self.max_area_width,
        max_area_height=self.max_area_height,
        memory_height=self.memory_height if memory_height is None else memory_height,
        key_mode=self.key_mode,
        value_mode=self.value_mode,
        causal=self.causal,
        dropout_rate=self.dropout_rate,
        std_epsilon=self.std_epsilon,
        implementation=self.implementation,
    )

  def _project_heads(self, x_q: Array, x_kv: Array, head_dim: int) -> tuple[Array, Array, Array]:
    """The per-head ``query``, ``key`` and ``value`` projections ``[batch, len,
    heads, head_dim]`` of the queries ``x_q`` and the memory ``x_kv``; with
    ``decode`` and not causal the memory's are cached (a fixed memory)."""
    dense = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, head_dim), axis=-1, **self._layer_options()
    )
    query = dense(name='query')(x_q)
    if self.decode and not self.causal:  # a fixed memory: projected once, cached
      key, value = self._memory_keys_values(dense, x_kv)
    else:
      key, value = dense(name='key')(x_kv), dense(name='value')(x_kv)
    return query, key, value

  def _learned_key(self) -> LearnedKeyFn | None:
    """``learned_key(base, key_features)``: the Eq. 9 area keys of a learned key
    mode (:class:`~.key_encoder.AreaKeyEncoder`, parameters ``area_key``), or
    None for a parameter-free mode."""
    learned = LEARNED_KEYS.get(self.key_mode)
    if learned is None:
      return None
    encoder = AreaKeyEncoder(
        max_area_width=self.max_area_width,
        max_area_height=self.max_area_height,
        mode=learned.combine,
        hidden_dim=self.area_key_hidden_dim,
        embedding_dim=self.area_embedding_dim,
        per_head=self.per_head_area_key_params,
        name='area_key',
        **self._layer_options(),
    )
    return lambda base, feats: encoder(
        base, feats.std if learned.std else None, feats.height, feats.width
    )

  def _draw_rngs(self, deterministic: bool) -> tuple[Array | None, Array | None]:
    """``(sample_rng, dropout_rng)``, drawn in this order from the ``'dropout'``
    stream: the noise of ``'sample'`` keys and the dropout on the
    probabilities, each None where this call has none."""
    sample_rng = dropout_rng = None
    if key_base(self.key_mode) == 'sample' and not deterministic:
      sample_rng = self.make_rng('dropout')
    if not deterministic and self.dropout_rate > 0.0:
      dropout_rng = self.make_rng('dropout')
    return sample_rng, dropout_rng

  def _output_projection(self, out_features: int) -> nn.Module:
    """The heads projected back to ``out_features`` (parameters ``out``)."""
    return nn.DenseGeneral(
        features=out_features, axis=(-2, -1), name='out', **self._layer_options()
    )

  def _layer_options(self) -> dict[str, Any]:
    """The dtypes, initialisers and bias every parameterised layer here takes."""
    return dict(
        use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=self.kernel_init,
        bias_init=self.bias_init,
    )


def _flatten_positions(x: Array) -> Array:
  """``[batch, *spatial, features] -> [batch, positions, features]`` (row-major)."""
  return x.reshape((x.shape[0], math.prod(x.shape[1:-1]), x.shape[-1]))
