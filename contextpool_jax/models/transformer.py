"""Transformers of the papers: encoder-decoder for translation, decoder-only character LM.

* :class:`Transformer` -- the encoder-decoder of Vaswani et al. (2017) in the
  sizes of the area attention paper (Li et al., 2019, Sec. 4.1): tiny (2
  layers, 128 hidden, 512 filter, 4 heads), small (2, 256, 1024, 4), base (6,
  512, 2048, 8), big (6, 1024, 4096, 16). Shared source/target/output
  embeddings, sinusoidal positions (or rotary: field ``positions``), dropout.
* :class:`TransformerLM` -- the decoder-only character LM of the ContextPool
  paper (Sec. 4.1: 12 layers, 512 hidden, 8 heads, 2048 filter, 256 bytes; the
  paper's 39M-parameter model), strictly causal everywhere.

Attention kinds (field ``attention``): ``'standard'`` multi-head dot-product
attention; ``'local'`` the same restricted to a window of ``local_window``
tokens on each side (decoder: the previous ``local_window``), the area
attention paper's local-attention baseline; ``'area'`` area attention (Li et
al., 2019) with areas of up to ``max_area_width`` items in the first
``num_area_layers`` layers -- encoder self-attention, decoder self-attention
(causal: an area never contains a future item) and encoder-decoder attention,
as in the paper's NMT experiments (max area 5, first two layers). Field
``area_key_mode`` picks the area key: ``'mean'`` (default) is the basic,
parameter-free form (Eq. 3-4), ``'concat'`` the rich form (Eq. 9); every
:data:`~contextpool_jax.layers.area_attention.KEY_MODES` is allowed. Field
``area_value_mode`` picks the area value: ``'sum'`` (default, Eq. 4),
``'mean'`` or ``'max'`` of the item values.

ContextPool (field ``context_pool``; None = off, a mapping of ContextPool
field overrides = on): "placed after each attention block, whose output token
features are pooled to the same number of features for use in the next
attention block" (Huang et al., Sec. 3.2, Fig. 2c). We read "attention block"
as a whole Transformer layer (self-attention [+ cross-attention] + feed-forward,
the paper's "self-attention module"); what is pooled "for use in the next
attention block" is a field, ``context_pool_position``: by default the pooled
features are what the next self-attention reads (``x + Attn(CP(LN(x)))``, the
residual stream is not pooled); ``'output'`` pools the whole residual stream
(each layer's output); ``'mlp_input'`` (an extension, issue 27) pools what the
feed-forward reads (``x + FFN(CP(LN(x)))``) and leaves the attention exact.
Encoder: ContextPool with the source
padding mask. Decoder and LM: ``causal=True`` (forced; a conflicting override
raises) with the target padding mask.

Layers are pre-LayerNorm (``x + f(LN(x))``, final LayerNorm), as in the
tensor2tensor ``transformer_base`` recipes the area attention paper used and
in flax's wmt example. Token id 0 is padding in the encoder-decoder; the LM
treats every byte as a real token (its windows are never padded).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any, Callable, Literal, Mapping, NamedTuple, Optional, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.base import checks
from contextpool_jax.layers.area_attention import AreaAttention
from contextpool_jax.layers.area_attention import KEY_MODES as AREA_KEY_MODES
from contextpool_jax.layers.area_attention import VALUE_MODES as AREA_VALUE_MODES
from contextpool_jax.layers.context_pool import make_context_pool
from contextpool_jax.layers import tpu_attention
from contextpool_jax.models.positions import POSITIONS, apply_rotary, sinusoidal_positions
from contextpool_jax.models.common import Fields, bundle, remat, remat_policy
from contextpool_jax.base.numerics import NEG_INF

Array = jax.Array
Dtype = Any

ATTENTIONS = ('standard', 'local', 'area')
# Dense kernels: Glorot/Xavier uniform, as tensor2tensor and flax's wmt example;
# embeddings N(0, d^-1/2) scaled by sqrt(d) on input (Vaswani et al., Sec. 3.4).
_KERNEL_INIT = nn.initializers.xavier_uniform()


def causal_mask(length: int) -> Array:
  """``[1, 1, length, length]`` bool, True where key j <= query i."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def padding_mask(q_valid: Array, kv_valid: Array) -> Array:
  """``[batch, 1, q_len, kv_len]`` bool from per-token validity."""
  return q_valid[:, None, :, None] & kv_valid[:, None, None, :]


CONTEXT_POOL_POSITIONS = ('output', 'attention_input', 'mlp_input')
# TransformerConfig.attention_implementation: jax.nn.dot_product_attention's
# implementation (None: automatic), or jax's Pallas TPU flash-attention kernel
# ('pallas_tpu': tpu_attention.py).
ATTENTION_IMPLEMENTATIONS = (None, 'xla', 'cudnn', 'pallas_tpu')
# Which inputs of the self-attention read the pooled features
# (context_pool_position='attention_input'): queries, keys and values; keys and
# values only; queries only.
CONTEXT_POOL_READS = ('qkv', 'kv', 'q')


@dataclasses.dataclass(unsafe_hash=True, kw_only=True)
class TransformerConfig(Fields):
  """Every field of the Transformer family, declared once (flax wmt's ``TransformerConfig``).

  :class:`Transformer` and :class:`TransformerLM` have these as their own
  fields (``Transformer(num_layers=2)``, ``model.num_layers``, registry
  overrides); ``model.config`` bundles them into this dataclass, which
  is passed down the tree: stack, layer, attention, feed-forward, embedder.
  What differs inside the tree (encoder or decoder, a layer's attention kind,
  training) are fields of those modules, not of the config.

  Attributes:
    vocab_size: token ids (shared source/target/output embedding).
    num_layers: layers of the encoder, of the decoder, or of the LM.
    emb_dim: token width.
    mlp_dim: feed-forward hidden width.
    num_heads: attention heads.
    dropout_rate: dropout on the embeddings, each sub-layer output and the
      feed-forward hidden layer.
    attention_dropout_rate: dropout on the attention probabilities.
    attention: ``'standard' | 'local' | 'area'`` (module docstring).
    attention_implementation: the ``implementation`` of
      ``jax.nn.dot_product_attention`` (standard and local attention, without
      attention dropout, not when decoding step by step), one of
      :data:`ATTENTION_IMPLEMENTATIONS`: None (JAX chooses: cuDNN where it
      can, else XLA; on the CPU both run its einsum form, :func:`_dot_product_attention`),
      ``'xla'``, ``'cudnn'`` (GPU only: elsewhere a ConfigError
      when the model is traced, before XLA compiles), or ``'pallas_tpu'``: jax's
      Pallas TPU flash-attention kernel, memory linear in the length (TPU, or
      the CPU in Pallas interpret mode; a local window is a ConfigError;
      :mod:`~contextpool_jax.layers.tpu_attention`), which area attention also
      takes (over its area keys and values: ``AreaAttention.implementation``).
      It changes no parameter.
    positions: how the model knows token order, one of
      :data:`~contextpool_jax.models.positions.POSITIONS`: ``'sinusoidal'``
      (the papers': added to the embeddings) or ``'rotary'`` (RoPE, Su et al.,
      2021: every self-attention rotates its queries and keys by their
      positions, the embeddings get none; cross-attention reads the encoder
      output unrotated; not with area attention, whose keys are summaries of
      spans; an even head size). :mod:`~contextpool_jax.models.positions`.
    local_window: tokens on each side (causal: before) for ``'local'``.
    num_area_layers: the first layers that use area attention (``'area'``).
    max_area_width: largest area (``'area'``).
    area_key_mode: area key, one of the area attention ``KEY_MODES``.
    area_value_mode: area value, one of the area attention ``VALUE_MODES``
      (``'sum'``: Eq. 4).
    context_pool: None (off) or a mapping of ContextPool field overrides.
    context_pool_position: ``'attention_input' | 'output' | 'mlp_input'``
      (:class:`TransformerLayer`).
    context_pool_first_layer: the first layer with ContextPool (0: every
      layer). 1 is the paper's "after each attention block ... for use in the
      next attention block" read literally with ``'attention_input'``: layer
      0's attention reads the unpooled embeddings.
    context_pool_last_layer: the last layer with ContextPool (None: the
      last layer); the layers after it read ``LN x``. An extension (issue 27):
      the top layer's attention reads exact features, the lower ones pooled.
    context_pool_reads: ``'attention_input'`` only: which inputs of the
      self-attention read the pooled features, ``'qkv'`` | ``'kv'`` (queries read
      ``LN x``) | ``'q'`` (keys and values read ``LN x``). The default, ``'qkv'``, is
      the paper's reading and its recipes' (``configs/enwik8.py``, ``text8.py``,
      ``wmt14.py``); ``configs/default.py`` reads ``'kv'``, which ended ahead of
      ``'qkv'`` on that small LM and is not measured at the paper's scale
      (docs/context_pool.md, A6).
    context_pool_heads: ``'attention_input'`` only: how many heads (the first
      ones) read the pooled features; the others read ``LN x``. None: all.
    scan_layers: one ``nn.scan`` over the identical layers of each stack.
    remat: what each layer keeps for the backward pass, a name of
      ``models.common.REMAT_POLICIES`` (``'none'``, ``'full'``,
      ``'dots'``, ``'dots_no_batch'``: what each keeps, docs/models.md#memory),
      or a bool of older configs (``models.common.remat_policy``).
    dtype: compute dtype (e.g. ``jnp.bfloat16``); None infers it.
    param_dtype: parameter dtype.
  """

  vocab_size: int = 32000
  num_layers: int = 6
  emb_dim: int = 512
  mlp_dim: int = 2048
  num_heads: int = 8
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  attention: str = 'standard'
  attention_implementation: Optional[str] = None
  positions: str = 'sinusoidal'
  local_window: int = 64
  num_area_layers: int = 2
  max_area_width: int = 5
  area_key_mode: str = 'mean'
  area_value_mode: str = 'sum'
  context_pool: Optional[Mapping[str, Any]] = None
  context_pool_position: str = 'attention_input'
  context_pool_first_layer: int = 0
  context_pool_last_layer: Optional[int] = None
  context_pool_reads: str = 'qkv'
  context_pool_heads: Optional[int] = None
  scan_layers: bool = False
  remat: str | bool = 'none'
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  def check(self, owner: str) -> None:
    """Raises ConfigError naming ``owner.field`` for an invalid value."""
    checks.check_choice(owner, 'attention', self.attention, ATTENTIONS)
    checks.check_choice(
        owner, 'attention_implementation', self.attention_implementation, ATTENTION_IMPLEMENTATIONS
    )
    remat_policy(owner, self.remat)
    checks.check_choice(owner, 'area_key_mode', self.area_key_mode, AREA_KEY_MODES)
    checks.check_choice(owner, 'area_value_mode', self.area_value_mode, AREA_VALUE_MODES)
    checks.check_choice(
        owner, 'context_pool_position', self.context_pool_position, CONTEXT_POOL_POSITIONS
    )
    for field in (
        'vocab_size',
        'num_layers',
        'emb_dim',
        'mlp_dim',
        'num_heads',
        'local_window',
        'max_area_width',
    ):
      checks.check_positive(owner, field, getattr(self, field), integer=True)
    checks.check_positive(
        owner, 'num_area_layers', self.num_area_layers, integer=True, allow_zero=True
    )
    self.check_context_pool_placement(owner)
    checks.check_probability(owner, 'dropout_rate', self.dropout_rate)
    checks.check_probability(owner, 'attention_dropout_rate', self.attention_dropout_rate)
    if self.emb_dim % self.num_heads:
      raise ConfigError(
          f'{owner}.num_heads={self.num_heads!r} does not divide emb_dim={self.emb_dim!r}.'
      )
    self.check_positions(owner)

  def check_positions(self, owner: str) -> None:
    """``positions``: a known kind; rotary needs pairs of head features and no area attention."""
    checks.check_choice(owner, 'positions', self.positions, POSITIONS)
    if self.positions != 'rotary':
      return
    if self.attention == 'area':
      raise ConfigError(
          f"{owner}.positions='rotary' is not supported with attention='area' (an area's key "
          "summarises a span of positions, which no one rotation fits); allowed with 'area': "
          "positions='sinusoidal'."
      )
    if (self.emb_dim // self.num_heads) % 2:
      raise ConfigError(
          f"{owner}.positions='rotary' rotates pairs of head features, but the head size "
          f'emb_dim / num_heads = {self.emb_dim} / {self.num_heads} = '
          f'{self.emb_dim // self.num_heads} is odd; expected an even head size.'
      )

  def context_pool_layers(self) -> range:
    """The layers with ContextPool when the model has it:
    ``context_pool_first_layer`` to ``context_pool_last_layer``."""
    last = (
        self.num_layers - 1
        if self.context_pool_last_layer is None
        else self.context_pool_last_layer
    )
    return range(self.context_pool_first_layer, last + 1)

  def check_context_pool_placement(self, owner: str) -> None:
    """The ``context_pool_*`` placement fields (first layer, reads, heads)."""
    checks.check_choice(owner, 'context_pool_reads', self.context_pool_reads, CONTEXT_POOL_READS)
    checks.check_positive(
        owner,
        'context_pool_first_layer',
        self.context_pool_first_layer,
        integer=True,
        allow_zero=True,
    )
    checks.check_positive(
        owner, 'context_pool_heads', self.context_pool_heads, integer=True, allow_none=True
    )
    checks.check_positive(
        owner,
        'context_pool_last_layer',
        self.context_pool_last_layer,
        integer=True,
        allow_zero=True,
        allow_none=True,
    )
    if self.context_pool is None:
      return
    if self.context_pool_first_layer >= self.num_layers:
      raise ConfigError(
          f'{owner}.context_pool_first_layer={self.context_pool_first_layer!r} leaves no '
          f'layer with ContextPool (num_layers={self.num_layers}); expected 0 to '
          f'{self.num_layers - 1}, or context_pool=None for no ContextPool.'
      )
    last = self.context_pool_last_layer
    if last is not None and not self.context_pool_first_layer <= last < self.num_layers:
      raise ConfigError(
          f'{owner}.context_pool_last_layer={last!r} is outside context_pool_first_layer='
          f'{self.context_pool_first_layer} to num_layers - 1 = {self.num_layers - 1};'
          ' expected a layer in that range, or None (the last layer).'
      )
    if self.context_pool_heads is not None and self.context_pool_heads > self.num_heads:
      raise ConfigError(
          f'{owner}.context_pool_heads={self.context_pool_heads!r} exceeds '
          f'num_heads={self.num_heads}; expected 1 to {self.num_heads}, or None (all).'
      )
    split = self.context_pool_reads != 'qkv' or self.context_pool_heads is not None
    if split and self.context_pool_position != 'attention_input':
      raise ConfigError(
          f'{owner}.context_pool_reads={self.context_pool_reads!r} / context_pool_heads='
          f'{self.context_pool_heads!r} choose what the attention reads, which needs '
          f"context_pool_position='attention_input' (got {self.context_pool_position!r}); "
          "allowed with 'output': reads='qkv', heads=None."
      )
    if self.context_pool_heads is not None and self.attention == 'area':
      raise ConfigError(
          f'{owner}.context_pool_heads={self.context_pool_heads!r} is not supported with '
          "attention='area' (area attention pools its own keys); allowed: None."
      )


class HeadMix(NamedTuple):
  """An attention input whose first ``heads`` heads read ``pooled`` and the
  others ``plain`` (both ``[batch, length, features]``): the query, key and
  value projections of those heads are applied to ``pooled``
  (``TransformerConfig.context_pool_heads``)."""

  pooled: Array
  plain: Array
  heads: int


def _width(inputs: Array | HeadMix) -> int:
  return (inputs.plain if isinstance(inputs, HeadMix) else inputs).shape[-1]


def _project(proj: nn.Module, inputs: Array | HeadMix) -> Array:
  """``proj`` (``[..., features] -> [..., heads, head_dim]``) of ``inputs``; for
  a :class:`HeadMix`, heads ``< inputs.heads`` project ``pooled``, the rest
  ``plain`` (one set of parameters)."""
  if not isinstance(inputs, HeadMix):
    return proj(inputs)
  pooled, plain = proj(inputs.pooled), proj(inputs.plain)
  first = jnp.arange(pooled.shape[-2]) < inputs.heads
  return jnp.where(first[:, None], pooled, plain)


class MultiHeadAttention(nn.Module):
  """Multi-head attention; standard, local window or area (Li et al., 2019).

  ``__call__(inputs_q, inputs_kv, mask, deterministic)`` with inputs
  ``[batch, length, features]`` (standard and local attention: or a
  :class:`HeadMix`, different inputs for different heads) and a bool mask
  broadcastable to ``[batch, heads, q_len, kv_len]``. Standard and local attention use
  ``jax.nn.dot_product_attention`` (on GPU it can dispatch to cuDNN flash
  attention); local attention passes ``local_window_size``. Every attention of
  the family is this module (built in :meth:`TransformerLayer.make_attention`).

  Incremental decoding (``decode=True``, causal self-attention only), in
  Flax's usual form: a first call on the full-length ``[batch, max_len,
  features]`` input creates the ``'cache'`` collection (``cached_key``,
  ``cached_value`` ``[batch, heads, max_len, head_dim]``, ``cache_index``) and
  computes the ordinary output; every later call takes one token ``[batch, 1,
  features]``, writes its key and value at ``cache_index`` and attends over
  the cached keys ``j <= cache_index`` (local: also ``j >= cache_index -
  local_window``). Decoded tokens are all real, so ``mask`` must be None.
  The cache is heads-major (a decision, measured): the step's two
  contractions then have their batch axes (batch, heads) leading, so XLA
  reads the cache in place; the ``[batch, max_len, heads, head_dim]`` layout
  of the full forward made XLA:CPU transpose the whole cache at every step
  (measured: docs/performance.md#decoding). Area attention delegates to
  :class:`AreaAttention`'s own cache.

  Non-causal attention with ``decode=True`` (the decoder's cross-attention)
  attends over a fixed memory (the encoder output): the cache-creating call
  stores the memory's projected keys and values (``cached_memory_key`` /
  ``cached_memory_value`` ``[batch, heads, memory_len, head_dim]``) and every
  step reads them instead of projecting the whole memory again (most of a
  small decoder step's FLOPs; measured: docs/performance.md#decoding).
  The step's ``inputs_kv`` is then unused; ``mask`` (the source padding) is
  applied as usual. Area cross-attention caches the memory's projected item
  keys and values the same way (:class:`AreaAttention`).

  Attributes:
    config: heads, windows, area options, ``attention_dropout_rate``, dtypes.
    kind: ``'standard' | 'local' | 'area'``, this call site's.
    causal: mask keys after the query.
    decode: incremental decoding with a key/value cache (see above); for
      non-causal attention (standard or area), a cache of the fixed memory's keys and values.
    rotary: rotate the queries and keys by their positions
      (:func:`~contextpool_jax.models.positions.apply_rotary`; a self-attention of a
      model with ``positions='rotary'``): positions ``0 .. length - 1``, or
      ``cache_index`` for a decoding step, whose key enters the cache rotated.
  """

  config: TransformerConfig
  kind: str = 'standard'
  causal: bool = False
  decode: bool = False
  rotary: bool = False

  @nn.compact
  def __call__(
      self,
      inputs_q: Array | HeadMix,
      inputs_kv: Array | HeadMix,
      mask: Optional[Array],
      deterministic: bool,
  ) -> Array:
    cfg = self.config
    features = _width(inputs_q)
    if self.decode and self.causal and mask is not None:
      raise ValueError(
          'MultiHeadAttention: decode=True takes mask=None (decoded tokens are '
          f'all real); got a mask of shape {jnp.shape(mask)}.'
      )
    if self.kind == 'area':
      if isinstance(inputs_q, HeadMix) or isinstance(inputs_kv, HeadMix):
        raise ConfigError('MultiHeadAttention: area attention takes arrays, not a HeadMix.')
      return self._area_attention()(inputs_q, inputs_kv, mask, deterministic)
    if features % cfg.num_heads:
      raise ConfigError(
          f'MultiHeadAttention: features={features} is not divisible by '
          f'num_heads={cfg.num_heads}.'
      )
    head_dim = features // cfg.num_heads
    dense = functools.partial(
        nn.DenseGeneral,
        features=(cfg.num_heads, head_dim),
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_KERNEL_INIT,
    )
    q = _project(dense(name='query'), inputs_q)
    if self.decode and not self.causal:  # cross-attention over a fixed memory
      return self._output(features, self._memory_attention(q, inputs_kv, mask, dense))
    k = _project(dense(name='key'), inputs_kv)
    val = _project(dense(name='value'), inputs_kv)
    window = None
    if self.kind == 'local':
      window = (cfg.local_window, 0 if self.causal else cfg.local_window)
    stepping = self.decode and self.has_variable('cache', 'cache_index')
    q, k = self._rotate(q, k, stepping)
    padding = mask
    if self.causal and not stepping:
      if self.decode:  # the first call: create the cache for this length
        self._cached_keys_values(k, val, window)
      cm = causal_mask(q.shape[1])
      mask = cm if mask is None else mask & cm
    rate = cfg.attention_dropout_rate
    if (
        cfg.attention_implementation == 'pallas_tpu'
        and not stepping
        and not (rate > 0.0 and not deterministic)
    ):
      if window is not None:
        raise ConfigError(
            "MultiHeadAttention: attention_implementation='pallas_tpu' has no local window;"
            " use attention='standard' with it, or another implementation."
        )
      y = tpu_attention.flash_attention(q, k, val, causal=self.causal, mask=padding)
    elif stepping:
      y = self._step_attention(q, k, val, window)
    elif rate > 0.0 and not deterministic:
      # jax.nn.dot_product_attention has no dropout on the probabilities.
      y = _einsum_attention(q, k, val, mask, window, (rate, self.make_rng('dropout')))
    else:
      y = _dot_product_attention(
          q, k, val, cfg.attention_implementation, mask=mask, local_window_size=window
      )
    return self._output(features, y)

  def _area_attention(self) -> AreaAttention:
    """Area attention (``kind='area'``): :class:`AreaAttention` with this config's area
    fields; through the Pallas TPU kernel with ``attention_implementation='pallas_tpu'``."""
    cfg = self.config
    return AreaAttention(
        num_heads=cfg.num_heads,
        max_area_width=cfg.max_area_width,
        key_mode=cfg.area_key_mode,
        value_mode=cfg.area_value_mode,
        causal=self.causal,
        dropout_rate=cfg.attention_dropout_rate,
        decode=self.decode,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        implementation='pallas_tpu' if cfg.attention_implementation == 'pallas_tpu' else None,
        name='area',
    )

  def _rotate(self, q: Array, k: Array, stepping: bool) -> tuple[Array, Array]:
    """Rotary positions (field ``rotary``; else ``q``, ``k`` as they are): ``0 .. length -
    1``, or a decoding step's ``cache_index`` (the cache slot its key is written to)."""
    if not self.rotary:
      return q, k
    if stepping:
      positions = self.get_variable('cache', 'cache_index')[None]
    else:
      positions = jnp.arange(q.shape[1])
    return apply_rotary(q, positions), apply_rotary(k, positions)

  def _output(self, features: int, y: Array) -> Array:
    """The output projection ``[batch, len, heads, head_dim] -> [batch, len, features]``."""
    cfg = self.config
    return nn.DenseGeneral(
        features,
        axis=(-2, -1),
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_KERNEL_INIT,
        name='out',
    )(y)

  def _memory_attention(
      self, q: Array, memory: Array | HeadMix, mask: Optional[Array], dense
  ) -> Array:
    """Attention over a fixed memory with its keys and values cached (class
    docstring): projected and stored heads-major by the cache-creating call,
    read by every later one."""
    assert not isinstance(memory, HeadMix)  # a HeadMix is a self-attention's input
    initialized = self.has_variable('cache', 'cached_memory_key')
    if not initialized:
      k, val = dense(name='key')(memory), dense(name='value')(memory)
      for name, a in (('cached_memory_key', k), ('cached_memory_value', val)):
        self.variable('cache', name, lambda a=a: jnp.swapaxes(a, 1, 2))
      if self.config.attention_implementation == 'pallas_tpu':
        return tpu_attention.flash_attention(q, k, val, causal=False, mask=mask)
      return _dot_product_attention(q, k, val, self.config.attention_implementation, mask=mask)
    keys = self.get_variable('cache', 'cached_memory_key')
    values = self.get_variable('cache', 'cached_memory_value')
    allowed = True if mask is None else mask
    return _cached_attention(q, keys, values, allowed)

  def _step_attention(
      self, q: Array, k: Array, val: Array, window: Optional[tuple[int, int]]
  ) -> Array:
    """A decoding step: ``q`` over the cache, this step's ``k`` and ``val`` written in."""
    cached = self._cached_keys_values(k, val, window)
    assert cached is not None  # a step: the cache exists
    return _cached_attention(q, *cached)

  def _cached_keys_values(
      self, k: Array, val: Array, window: Optional[tuple[int, int]]
  ) -> Optional[tuple[Array, Array, Array]]:
    """The cache of ``decode=True`` (class docstring).

    Creates ``cached_key`` / ``cached_value`` ``[batch, heads, max_len,
    head_dim]`` from ``k`` / ``val`` ``[batch, max_len, heads, head_dim]``
    (the first, full-length call; returns None then) or, once they exist,
    writes this step's ``[batch, 1, heads, head_dim]`` key and value at
    ``cache_index`` and returns the cached keys, values and the step's
    ``[max_len]`` mask: ``j <= index`` and, for a local window, ``j >= index -
    window[0]``.
    """
    initialized = self.has_variable('cache', 'cache_index')
    heads_major = lambda a: jnp.swapaxes(a, 1, 2)
    shape = heads_major(k).shape
    cached_k = self.variable('cache', 'cached_key', jnp.zeros, shape, k.dtype)
    cached_v = self.variable('cache', 'cached_value', jnp.zeros, shape, val.dtype)
    index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return None
    if k.shape[1] != 1:
      raise ValueError(
          f'MultiHeadAttention: a decoding step takes one token; got inputs of '
          f'length {k.shape[1]} (the cache holds {cached_k.value.shape[2]}).'
      )
    i = index.value
    put = lambda c, a: lax.dynamic_update_slice_in_dim(c, heads_major(a).astype(c.dtype), i, 2)
    cached_k.value = put(cached_k.value, k)
    cached_v.value = put(cached_v.value, val)
    index.value = i + 1
    j = jnp.arange(cached_k.value.shape[2])
    allowed = j <= i
    if window is not None:
      allowed = allowed & (j >= i - window[0])
    return cached_k.value, cached_v.value, allowed


# The platform attention is traced for: None, the process's (jax.default_backend()); the
# compile command lowers for a TPU or GPU from a CPU process and names it (compiling_for).
_TARGET_PLATFORM: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    'contextpool_attention_platform', default=None
)


@contextlib.contextmanager
def compiling_for(platform: str):
  """Traces the Transformers' attention for ``platform`` (``'tpu'``, ``'gpu'`` or
  ``'cpu'``) instead of this process's backend, while the block lowers a program for
  other devices (``training.aot``): the program is the one that platform's runs build."""
  token = _TARGET_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TARGET_PLATFORM.reset(token)


def _dot_product_attention(
    q: Array,
    k: Array,
    val: Array,
    implementation: Optional[str],
    mask: Optional[Array] = None,
    local_window_size: Optional[tuple[int, int]] = None,
) -> Array:
  """``jax.nn.dot_product_attention(q, k, val, mask=mask, local_window_size=...,
  implementation=implementation)`` (``q`` ``[batch, q_len, heads, head_dim]``, ``k`` /
  ``val`` ``[batch, kv_len, heads, head_dim]``).

  ``implementation='cudnn'`` (``TransformerConfig.attention_implementation``) off a
  GPU raises a ConfigError here, as the model is traced, instead of JAX's error
  from the cuDNN lowering.

  On the CPU, None and ``'xla'`` run :func:`_einsum_attention`: the formula of JAX's XLA
  path (float32 logits, the same scaling, masking and softmax: the same outputs and
  gradients to float rounding), without the group axis it maps over, whose
  probabilities XLA's CPU backend transposes in memory: a training
  step of the study's 2-layer LM at 1,024 bytes took 0.44 s instead of 0.70 s
  (docs/models.md, "Attention implementation"). Elsewhere JAX's own path runs.
  Float16 on the CPU goes through float32 inputs (a product of two float16 values is
  exact in float32); the output is float16 again. CPU float16 is for tests: GPUs run
  the float16 path itself.
  """
  backend = jax.default_backend()
  if implementation == 'cudnn' and backend != 'gpu':
    raise ConfigError(
        f"Transformer.attention_implementation='cudnn' needs an NVIDIA GPU; this process "
        f"runs on {backend!r}. Use None (JAX chooses) or 'xla'."
    )
  if (_TARGET_PLATFORM.get() or backend) == 'cpu':
    up = (lambda a: a.astype(jnp.float32)) if q.dtype == jnp.float16 else (lambda a: a)
    return _einsum_attention(up(q), up(k), up(val), mask, local_window_size).astype(q.dtype)
  # implementation is 'xla', 'cudnn' or None here ('pallas_tpu' never reaches this function).
  jax_implementation = cast(Literal['xla', 'cudnn'] | None, implementation)
  return jax.nn.dot_product_attention(
      q, k, val, mask=mask, local_window_size=local_window_size, implementation=jax_implementation
  )


def _cached_attention(q: Array, keys: Array, values: Array, allowed: Array | bool) -> Array:
  """One decoding step's attention: ``q [batch, 1, heads, head_dim]`` over the
  heads-major cache ``keys`` / ``values`` ``[batch, heads, len, head_dim]``
  where ``allowed`` (bool, broadcastable to ``[batch, heads, 1, len]``);
  float32 logits and softmax, masked logits filled with the finite ``NEG_INF``
  (``jax.nn.dot_product_attention`` also fills finitely, so a row with
  nothing allowed, an all-padding source, gets the same uniform average),
  output ``[batch, 1, heads, head_dim]``."""
  logits = jnp.einsum('bqhd,bhkd->bhqk', q, keys, preferred_element_type=jnp.float32)
  logits = jnp.where(allowed, logits / math.sqrt(q.shape[-1]), NEG_INF)
  p = jax.nn.softmax(logits, axis=-1).astype(values.dtype)
  return jnp.einsum('bhqk,bhkd->bqhd', p, values)


def _einsum_attention(q, k, val, mask=None, window=None, dropout=None):
  """``softmax(q k^T / sqrt(head_dim))`` over the allowed keys, times ``val``, with the
  logits ``[batch, heads, q_len, kv_len]`` and the softmax in float32 (as
  ``jax.nn.dot_product_attention``'s XLA path). ``mask``: bool, broadcast to the logits;
  ``window``: ``(left, right)`` keys allowed around each query (local attention);
  ``dropout``: ``(rate, rng)`` on the probabilities (training only)."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  logits = logits * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), logits.dtype)
  allowed = None
  if window is not None:
    i = jnp.arange(logits.shape[-2])[:, None]
    j = jnp.arange(logits.shape[-1])[None, :]
    allowed = (j >= i - window[0]) & (j <= i + window[1])
  if mask is not None:
    allowed = mask if allowed is None else allowed & mask
  if allowed is not None:
    logits = jnp.where(allowed, logits, NEG_INF)
  p = jax.nn.softmax(logits, axis=-1)
  if dropout is not None:
    rate, rng = dropout
    keep = jax.random.bernoulli(rng, 1.0 - rate, p.shape)
    p = jnp.where(keep, p / (1.0 - rate), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', p.astype(val.dtype), val)


class FeedForward(nn.Module):
  """Position-wise feed-forward ``W2 relu(W1 x)`` (Vaswani et al., Eq. 2)."""

  config: TransformerConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dense = functools.partial(
        nn.Dense, dtype=cfg.dtype, param_dtype=cfg.param_dtype, kernel_init=_KERNEL_INIT
    )
    h = nn.relu(dense(cfg.mlp_dim, name='wi')(x))
    h = nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
    return dense(x.shape[-1], name='wo')(h)


class TransformerLayer(nn.Module):
  """One pre-LN layer: self-attention, optional cross-attention, feed-forward, ContextPool.

  ``context_pool_position``: ``'attention_input'`` (default) pools the
  normalised input of the self-attention, ``x + Attn(CP(LN(x)))``, so the
  attention reads pooled features while the residual stream keeps every
  token's own features; ``'output'`` pools the layer's output (the residual
  stream the next layer reads); ``'mlp_input'`` pools the normalised input of
  the feed-forward, ``x + FFN(CP(LN(x)))``, and every attention reads exact
  features (an extension: the pooled features as a local n-gram input of the
  feed-forward, not of the queries). The default is the ablation's choice
  (docs/results.md).

  ``__call__(x, x_valid, memory, memory_valid) -> x`` where ``x_valid`` is
  ``[batch, length]`` (True = real token) and ``memory`` the encoder output
  (None for encoder and LM layers).

  Attributes:
    config: the model's :class:`TransformerConfig`.
    attention_kind: this layer's self-attention kind (the stack sets
      ``'area'`` in the first ``num_area_layers`` layers, see there).
    causal: decoder or LM layer (causal self-attention and ContextPool).
    deterministic: no dropout.
    decode: incremental decoding (causal layers only): the self-attention and
      ContextPool keep a ``'cache'`` (:class:`MultiHeadAttention`,
      :class:`~contextpool_jax.layers.context_pool.ContextPool`); after the
      cache-creating call on the full length, ``x`` is one token ``[batch, 1,
      emb_dim]``, a real one (``x_valid`` True).
    use_context_pool: False: this layer has no ContextPool even if the model
      has (the stack sets it from ``config.context_pool_first_layer``).
  """

  def attention_inputs(
      self, h: Array, pooled: Optional[Array]
  ) -> tuple[Array | HeadMix, Array | HeadMix]:
    """The self-attention's query and key/value inputs from ``h = LN(x)`` and
    its pooled features (None: no ContextPool before the attention), by
    ``config.context_pool_reads`` and ``config.context_pool_heads``."""
    cfg = self.config
    if pooled is None:
      return h, h
    read: Array | HeadMix = pooled
    if cfg.context_pool_heads is not None:
      read = HeadMix(pooled, h, cfg.context_pool_heads)
    reads = cfg.context_pool_reads
    return (read if 'q' in reads else h), (read if 'kv' in reads else h)

  config: TransformerConfig
  attention_kind: str = 'standard'
  causal: bool = False
  deterministic: bool = True
  decode: bool = False
  use_context_pool: bool = True

  def make_attention(
      self, kind: str, causal: bool, name: str, self_attention: bool
  ) -> MultiHeadAttention:
    """The layer's attention modules (self and cross), all built here."""
    # decode: causal self-attention caches decoded tokens, cross-attention its memory.
    # Rotary positions rotate a self-attention's queries and keys, never the memory's.
    rotary = self_attention and self.config.positions == 'rotary'
    return MultiHeadAttention(
        self.config, kind=kind, causal=causal, decode=self.decode, rotary=rotary, name=name
    )

  @nn.compact
  def __call__(
      self,
      x: Array,
      x_valid: Array,
      memory: Optional[Array] = None,
      memory_valid: Optional[Array] = None,
  ) -> Array:
    cfg = self.config
    norm = functools.partial(nn.LayerNorm, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)

    pool = make_context_pool(
        cfg.context_pool if self.use_context_pool else None,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name='context_pool',
        **({'causal': True, 'decode': self.decode} if self.causal else {}),
    )
    h = norm(name='self_attention_norm')(x)
    pooled = None
    if pool is not None and cfg.context_pool_position == 'attention_input':
      pooled = pool(h, x_valid, self.deterministic)  # attention reads pooled features
    # Decoding: every cached token is real (a cache has no key mask).
    self_mask = None if self.decode else padding_mask(x_valid, x_valid)
    h = self.make_attention(self.attention_kind, self.causal, 'self_attention', True)(
        *self.attention_inputs(h, pooled), self_mask, self.deterministic
    )
    x = x + drop(h)
    if memory is not None:
      # Encoder-decoder attention: area over the source when attention='area';
      # a local window is meaningless across languages, so 'local' uses standard.
      kind = 'area' if self.attention_kind == 'area' else 'standard'
      h = norm(name='cross_attention_norm')(x)
      assert memory_valid is not None  # given with the memory
      h = self.make_attention(kind, False, 'cross_attention', False)(
          h, memory, padding_mask(x_valid, memory_valid), self.deterministic
      )
      x = x + drop(h)
    h = norm(name='mlp_norm')(x)
    if pool is not None and cfg.context_pool_position == 'mlp_input':
      h = pool(h, x_valid, self.deterministic)  # the feed-forward reads pooled features
    h = FeedForward(cfg, self.deterministic, name='mlp')(h)
    x = x + drop(h)
    if pool is not None and cfg.context_pool_position == 'output':
      x = pool(x, x_valid, self.deterministic)
    return x


class _ScanBody(nn.Module):
  """Adapts a layer to ``nn.scan``'s ``(carry, x) -> (carry, y)`` signature."""

  layer: Callable[..., nn.Module]

  @nn.compact
  def __call__(self, x, *args):
    return self.layer(name='layer')(x, *args), None


class TransformerStack(nn.Module):
  """``num_layers`` TransformerLayers and a final LayerNorm (an encoder, decoder or LM).

  With ``attention='area'`` the first ``num_area_layers`` layers use area
  attention and the rest standard attention (Li et al., 2019); with
  ContextPool, layers outside ``context_pool_first_layer`` to
  ``context_pool_last_layer`` have none. With ``scan_layers`` the identical
  layers between those are one ``nn.scan``
  (parameters stacked on a leading axis), so one layer is compiled instead of
  n. ``remat`` chooses what each layer keeps for the backward pass (a policy of
  ``models.common.REMAT_POLICIES``).

  ``__call__(x, valid, memory=None, memory_valid=None, train=False,
  decode=False)``; ``decode`` (causal stacks): incremental decoding with a
  ``'cache'`` per layer (:class:`TransformerLayer`).

  Attributes:
    config: the model's :class:`TransformerConfig`.
    causal: a decoder or LM stack.
  """

  config: TransformerConfig
  causal: bool = False

  @nn.compact
  def __call__(
      self,
      x: Array,
      valid: Array,
      memory: Optional[Array] = None,
      memory_valid: Optional[Array] = None,
      train: bool = False,
      decode: bool = False,
  ) -> Array:
    cfg = self.config
    if decode and not self.causal:
      raise ConfigError('TransformerStack: decode=True needs a causal stack (causal=True).')
    layer_cls = remat(TransformerLayer, cfg.remat, 'Transformer')
    layer = functools.partial(
        layer_cls, cfg, causal=self.causal, deterministic=not train, decode=decode
    )
    args = (valid,) if memory is None else (valid, memory, memory_valid)
    num_area = min(cfg.num_area_layers, cfg.num_layers) if cfg.attention == 'area' else 0
    rest_kind = 'standard' if cfg.attention == 'area' else cfg.attention
    # The layers that differ from the middle ones (area attention, no
    # ContextPool) are built one by one; the identical middle may be one nn.scan.
    pooled = cfg.context_pool_layers() if cfg.context_pool is not None else range(cfg.num_layers)
    first = max(num_area, pooled.start)
    stop = max(first, pooled.stop)  # the middle: layers first .. stop - 1
    one = lambda i: layer(
        attention_kind='area' if i < num_area else rest_kind,
        use_context_pool=i in pooled,
        name=f'layer_{i}',
    )
    for i in range(first):
      x = one(i)(x, *args)
    x = self._middle(layer, rest_kind, first, stop, x, args)
    for i in range(stop, cfg.num_layers):
      x = one(i)(x, *args)
    return nn.LayerNorm(dtype=cfg.dtype, param_dtype=cfg.param_dtype, name='norm')(x)

  def _middle(self, layer, kind: str, first: int, stop: int, x: Array, args: tuple) -> Array:
    """Layers ``first .. stop - 1`` (identical: one ``nn.scan`` with
    ``scan_layers``), each with ContextPool if the model has it."""
    cfg = self.config
    rest = stop - first
    if cfg.scan_layers and rest > 1:
      in_axes = (nn.broadcast,) * len(args)
      scanned = nn.scan(
          _ScanBody,
          variable_axes={'params': 0, 'intermediates': 0, 'cache': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=in_axes,  # pyright: ignore[reportArgumentType]  # flax: unannotated
          length=rest,
      )
      x, _ = scanned(functools.partial(layer, attention_kind=kind), name='scanned_layers')(x, *args)
    else:
      for i in range(first, stop):
        x = layer(attention_kind=kind, name=f'layer_{i}')(x, *args)
    return x


def _check_tokens(owner: str, name: str, tokens: Array) -> None:
  checks.check_rank(owner, name, tokens, (2,), '[batch, length] int32 token ids')
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'{owner}: {name} has dtype {tokens.dtype}; expected integer token ids.')


class _DecodePositions(nn.Module):
  """The position encodings of incremental decoding, ``[1, 1, dim]`` per step.

  The cache-creating call (``tokens [batch, max_len]``) stores the table
  :func:`sinusoidal_positions` ``[1, max_len, dim]`` (no batch axis: shared by
  every row, the same numbers as the full forward) and ``cache_index``; each
  later call returns the row of ``cache_index`` and advances it.
  """

  @nn.compact
  def __call__(self, length: int, dim: int) -> Array:
    initialized = self.has_variable('cache', 'cache_index')
    table = self.variable(
        'cache', 'positions', lambda: jnp.asarray(sinusoidal_positions(length, dim))[None]
    )
    index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return table.value
    row = lax.dynamic_slice_in_dim(table.value, index.value, 1, axis=1)
    index.value = index.value + 1
    return row


class _Embedder(nn.Module):
  """Shared token embedding (scaled by sqrt(d), Vaswani Sec. 3.4) + sinusoidal positions
  (none with ``positions='rotary'``: the self-attentions rotate their queries and keys).

  ``__call__(tokens, decode=False)``: with ``decode``, the first call (the
  full length) creates the position cache and later calls embed one token
  ``[batch, 1]`` at the next position (:class:`_DecodePositions`).
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    self.embedding = nn.Embed(
        cfg.vocab_size,
        cfg.emb_dim,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        embedding_init=nn.initializers.normal(stddev=cfg.emb_dim**-0.5),
        name='embedding',
    )
    self.decode_positions = _DecodePositions(name='decode_positions')

  def __call__(self, tokens: Array, decode: bool = False) -> Array:
    d = self.config.emb_dim
    x = self.embedding(tokens) * math.sqrt(d)
    if self.config.positions == 'rotary':  # the attention rotates; nothing is added
      return x
    if decode:
      return x + self.decode_positions(tokens.shape[1], d).astype(x.dtype)
    pe = sinusoidal_positions(tokens.shape[1], d)
    return x + jnp.asarray(pe, x.dtype)[None]

  def attend(self, x: Array) -> Array:
    """Output logits with the (tied) embedding matrix, in float32."""
    return self.embedding.attend(x).astype(jnp.float32)


class _TransformerModel(TransformerConfig, nn.Module):
  """The top modules' base: :class:`TransformerConfig`'s fields are theirs (common.bundle)."""

  @property
  def config(self) -> TransformerConfig:
    """This module's fields as one :class:`TransformerConfig`."""
    return bundle(self, TransformerConfig)

  @nn.nowrap
  def check_fields(self) -> None:
    """Raises ConfigError naming ``<class>.<field>`` for an invalid field
    (:meth:`TransformerConfig.check`): the model calls it, and so does a run's config
    reader, before anything is traced."""
    self.config.check(type(self).__name__)


class Transformer(_TransformerModel):
  """Encoder-decoder Transformer for translation (see the module docstring).

  Fields: :class:`TransformerConfig`'s.

  ``__call__(inputs, targets, train=False) -> logits [batch, target_len, vocab]``
  with ``inputs [batch, source_len]`` and ``targets [batch, target_len]`` int
  token ids (0 = padding); the decoder reads ``targets`` shifted right by one
  (teacher forcing), so logits[:, t] predicts targets[:, t]. For inference,
  ``encode(inputs)`` and ``decode(encoded, inputs, decoder_inputs)`` (the
  decoder reads ``decoder_inputs`` as given; start with 0 = BOS/pad).

  Incremental decoding (Flax's usual form): ``decode(..., decode=True)`` with
  ``mutable=['cache']``, first on ``decoder_inputs [batch, max_len]`` (any ids:
  it creates the ``'cache'`` collection, see
  :func:`contextpool_jax.inference.decoding.init_cache`), then one token
  ``[batch, 1]`` per call, returning that position's logits ``[batch, 1,
  vocab]``; equal to the full forward's (tests/inference/test_decoding.py).
  """

  def setup(self):
    self.check_fields()
    config = self.config
    self.embedder = _Embedder(config)
    self.encoder = TransformerStack(config, causal=False)
    self.decoder = TransformerStack(config, causal=True)
    self.embedding_dropout = nn.Dropout(config.dropout_rate)

  def encode(self, inputs: Array, train: bool = False) -> Array:
    """``[batch, source_len]`` ids -> ``[batch, source_len, emb_dim]``."""
    _check_tokens('Transformer', 'inputs', inputs)
    x = self.embedding_dropout(self.embedder(inputs), deterministic=not train)
    return self.encoder(x, inputs != 0, train=train)

  def decode(
      self,
      encoded: Array,
      inputs: Array,
      decoder_inputs: Array,
      train: bool = False,
      decode: bool = False,
  ) -> Array:
    """Logits ``[batch, len, vocab]`` (float32) for every decoder input position.

    Every decoder input is a real token (the BOS at position 0 has id 0);
    target padding only matters through the loss mask. ``decode``: one step
    of incremental decoding (class docstring).
    """
    _check_tokens('Transformer', 'decoder_inputs', decoder_inputs)
    valid = jnp.ones(decoder_inputs.shape, bool)
    x = self.embedder(decoder_inputs, decode=decode)
    x = self.embedding_dropout(x, deterministic=not train)
    x = self.decoder(x, valid, encoded, inputs != 0, train=train, decode=decode)
    return self.embedder.attend(x)

  def __call__(self, inputs: Array, targets: Array, train: bool = False) -> Array:
    _check_tokens('Transformer', 'targets', targets)
    encoded = self.encode(inputs, train)
    decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    return self.decode(encoded, inputs, decoder_inputs, train)


class TransformerLM(_TransformerModel):
  """Decoder-only causal LM (the ContextPool paper's character-level model).

  Fields: :class:`TransformerConfig`'s; the defaults that differ are
  redeclared here (the paper's 12 x 512 model over 256 bytes).

  ``__call__(tokens, train=False) -> logits [batch, length, vocab]`` (float32),
  where logits[:, t] predicts tokens[:, t + 1]: every position only reads
  tokens <= t (attention, area attention and ContextPool are all causal).

  Incremental decoding: ``__call__(tokens, decode=True)`` with
  ``mutable=['cache']``, first on ``[batch, max_len]`` (creates the cache),
  then one token ``[batch, 1]`` per call (as :meth:`Transformer.decode`).
  """

  vocab_size: int = 256
  num_layers: int = 12
  local_window: int = 256

  @nn.compact
  def __call__(self, tokens: Array, train: bool = False, decode: bool = False) -> Array:
    self.check_fields()
    config = self.config
    _check_tokens('TransformerLM', 'tokens', tokens)
    embedder = _Embedder(config, name='embedder')
    x = nn.Dropout(config.dropout_rate)(embedder(tokens, decode), deterministic=not train)
    x = TransformerStack(config, causal=True, name='decoder')(
        x, jnp.ones(tokens.shape, bool), train=train, decode=decode
    )
    return embedder.attend(x)


# ----------------------------------------------------------------------------
# Registry.
# ----------------------------------------------------------------------------

NMT_PRESETS = {  # Li et al. (2019), Sec. 4.1.
    'tiny': dict(num_layers=2, emb_dim=128, mlp_dim=512, num_heads=4),
    'small': dict(num_layers=2, emb_dim=256, mlp_dim=1024, num_heads=4),
    'base': dict(num_layers=6, emb_dim=512, mlp_dim=2048, num_heads=8),
    'big': dict(num_layers=6, emb_dim=1024, mlp_dim=4096, num_heads=16),
}

MODELS: dict[str, Callable[..., nn.Module]] = {}
for _size, _preset in NMT_PRESETS.items():
  MODELS[f'transformer_{_size}'] = functools.partial(Transformer, **_preset)
  MODELS[f'cp_transformer_{_size}'] = functools.partial(Transformer, context_pool={}, **_preset)
  MODELS[f'area_transformer_{_size}'] = functools.partial(Transformer, attention='area', **_preset)
  MODELS[f'local_transformer_{_size}'] = functools.partial(
      Transformer, attention='local', **_preset
  )
MODELS['transformer_lm'] = TransformerLM
MODELS['cp_transformer_lm'] = functools.partial(TransformerLM, context_pool={})
