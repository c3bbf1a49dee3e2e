"""The ContextPool module: its fields, the mapping m(X), and the whole-sequence call.

``__call__`` checks the fields and inputs (:mod:`.validate`), runs the mapping
(:meth:`ContextPool._mapping`), turns its outputs into Eq. 4's terms
(:meth:`ContextPool._mapping_outputs`, shared with the decoding step), pools
(:func:`~.pool.pool_dense` or :func:`~.blockwise.pool_blockwise`) and combines
the pooled features with the input (:meth:`ContextPool._combine`, also shared).
The ``decode=True`` step and its cache are :mod:`.streaming`. :func:`make_context_pool`
builds ContextPool from a model's ``context_pool`` field.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.base import checks
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.context_pool.blockwise import GAUSSIAN_SKIP_NATS
from contextpool_jax.layers.context_pool.blockwise import pool_blockwise
from contextpool_jax.layers.context_pool.geometry import pool_centres
from contextpool_jax.layers.context_pool.geometry import query_indices
from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolInputs
from contextpool_jax.layers.context_pool.pool import PoolRule
from contextpool_jax.layers.context_pool.pool import mask_features
from contextpool_jax.layers.context_pool.pool import pool_dense
from contextpool_jax.layers.context_pool.pool import pool_weights
from contextpool_jax.layers.context_pool.pool import valid_positions
from contextpool_jax.layers.context_pool.randomness import support_probability
from contextpool_jax.layers.context_pool.sizes import DEFAULT_RATIO
from contextpool_jax.layers.context_pool.sizes import SizePrefix
from contextpool_jax.layers.context_pool.sizes import log_weights
from contextpool_jax.layers.context_pool.sizes import normalised_size
from contextpool_jax.layers.context_pool.sizes import num_channels
from contextpool_jax.layers.context_pool.sizes import pooling_sigma
from contextpool_jax.layers.context_pool.sizes import step_sizes
from contextpool_jax.layers.context_pool.sizes import uses_size
from contextpool_jax.layers.context_pool.streaming import StreamingMixin
from contextpool_jax.layers.context_pool.validate import ACTIVATIONS
from contextpool_jax.layers.context_pool.validate import AUTO_BLOCKWISE_THRESHOLD
from contextpool_jax.layers.context_pool.validate import OWNER
from contextpool_jax.layers.context_pool.validate import check_fields
from contextpool_jax.layers.context_pool.validate import check_inputs

Array = jax.Array
Dtype = Any

_ZEROS = nn.initializers.zeros_init()

# ContextPool fields that the model inserting it sets (make_context_pool's
# ``defaults``: a decoder's ``causal`` and ``decode``, a ResNet's ``strides``; the
# model's ``dtype`` and ``param_dtype``), and ``window_shape``, which only places
# the centres of a strided pool. A config does not offer them
# (contextpool_jax.runs.config_fields); every other field is a config entry.
CONTEXT_POOL_MODEL_FIELDS = ('causal', 'decode', 'strides', 'window_shape', 'dtype', 'param_dtype')


class MappingOutputs(NamedTuple):
  """Eq. 4's learned terms of one call (:meth:`ContextPool._mapping_outputs`);
  None where the variant has no such term.

  Attributes:
    log_w: ``[batch, n]`` float32 log pooling weights a_j.
    theta: ``[batch, m, k]`` non-local queries ``W^theta x_i`` (Eq. 3).
    phi: ``[batch, n, k]`` non-local keys ``W^phi x_j`` (Eq. 3).
    size: ``[batch, n]`` float32 normalised sizes s (A1).
    sigma: ``[batch, n]`` float32 Gaussian std or window radius, in tokens.
  """

  log_w: Optional[Array]
  theta: Optional[Array]
  phi: Optional[Array]
  size: Optional[Array]
  sigma: Optional[Array]


class ContextPool(StreamingMixin, nn.Module):
  """Adaptive context pooling (Huang et al., ICML 2022), Eq. 4 and Eq. 6.

  Pools each token's neighbourhood with learned per-token weights and a learned
  Gaussian size, so that attention reads features of an adaptive context. The
  equations, the memory of both implementations and every choice the paper
  leaves open (A1-A7): docs/context_pool.md.

  ``__call__(x, mask=None, deterministic=True)``: ``x`` is ``[batch, length,
  features]`` (a sequence) or ``[batch, height, width, features]`` (a grid;
  ``batch`` may be 0); ``mask`` (bool, ``x.shape[:-1]``, True = real token)
  keeps padding from changing any real output (A5); ``deterministic=False``
  enables dropout on the pooling weights (rng ``'dropout'``). Returns ``x``'s
  shape, or for ``strides > 1`` the grid sampled at the pooling centres.
  Sows into ``'intermediates'``: ``'pool_weights'`` (w, ``[batch, *spatial]``;
  ``'nonlocal'``: the pairwise weights ``[batch, *out_spatial, *spatial]``),
  and for a learned size ``'pool_size'`` (s in [0, 1]) and ``'pool_sigma'``
  (sigma in tokens, or the adaptive window's radius), ``[batch, *spatial]``.

  Attributes:
    weights: ``'learned' | 'unnormalized' | 'uniform' | 'nonlocal'`` (Tables 1-2).
    locality: ``'gaussian' | 'none' | 'fixed_window' | 'adaptive_window' |
      'random_sparse'`` (Tables 1-2).
    mapping: ``'cnn' | 'mlp' | 'attention'``: m(X), predicting the raw weight
      and size channels the variant uses (Table 3).
    size_norm: A1, ``'sigmoid'`` (per token, sigma in (0, r n)) or
      ``'softmax'`` (over positions, the literal reading).
    ratio: r of ``sigma = r n s``; None: 0.1 for sequences, 0.05 for grids.
    sigma_length: sequences: a static n in ``sigma = r n s``; None: n counts
      the real tokens (causal: up to i). A7.
    size_bias_init: initial bias of the raw size channel (0: flax's zero bias;
      -3.2 starts narrow, s ~ 0.04). A7.
    residual: A3. False: the pooled features replace the input; True:
      ``x + pool(x)``.
    gate: a learned per-feature gate g, ``y = x + g * (pool(x) - x)`` (not in
      the paper; not combined with ``residual``). A7.
    gate_init: the gate's initial value (1.0: the paper's replacement).
    causal: A4, sequences only: no output depends on a later input.
    strides: output stride per spatial axis (a pooling layer's replacement);
      not with ``causal``.
    window_shape: the replaced pooling op's window, which places the centres
      (as ``nn.avg_pool``'s 'SAME'); None: ``strides``.
    kernel_size: A2, kernel size of both mapping convolutions.
    hidden_features: A2, width of the mapping's hidden layer.
    activation: A2, ``'relu' | 'gelu' | 'silu' | 'tanh'``.
    window: radius in tokens of ``'fixed_window'``, and the window whose size
      ``'random_sparse'`` matches in expectation.
    window_softness: ``'adaptive_window'``: width in tokens of the sigmoid edge
      whose gradient trains the radius (straight-through).
    random_seed: seed of the ``'random_sparse'`` support (fixed, not an rng).
    random_span: radius the ``'random_sparse'`` support is drawn from; None:
      ``4 * window``; must be ``>= window``.
    nonlocal_features: width of theta and phi for ``'nonlocal'`` weights; None:
      the input width.
    dropout_rate: dropout on the normalised pooling weights (a counter-based
      mask, the same in both implementations).
    implementation: ``'auto' | 'dense' | 'blockwise'``. ``'dense'`` builds the
      ``[batch, m, n]`` pooling matrix; ``'blockwise'`` never does (an online
      softmax and a custom VJP: reverse-mode autodiff only); ``'auto'`` is
      blockwise when n > :data:`AUTO_BLOCKWISE_THRESHOLD` (1024).
    block_size: query and key block length of ``'blockwise'``.
    gaussian_skip_nats: ``'blockwise'`` with Gaussian locality and
      query-independent weights: skip a key block whose every logit is this
      many nats below each centre's running maximum (a row loses at most
      ``n exp(-nats)`` of its mass); None: never skip.
    decode: streaming (needs ``causal``): the first call, on the full
      sequence, creates the ``'cache'``; each later call pools one position.
    dtype: compute dtype (None: the input's); the pooling softmax is float32.
    param_dtype: parameter dtype.
  """

  weights: str = 'learned'
  locality: str = 'gaussian'
  mapping: str = 'cnn'
  size_norm: str = 'sigmoid'
  ratio: Optional[float] = None
  sigma_length: Optional[int] = None
  size_bias_init: float = 0.0
  residual: bool = False
  gate: bool = False
  gate_init: float = 1.0
  causal: bool = False
  strides: Union[int, Sequence[int]] = 1
  window_shape: Optional[Union[int, Sequence[int]]] = None
  kernel_size: int = 3
  hidden_features: int = 32
  activation: str = 'relu'
  window: int = 8
  window_softness: float = 1.0
  random_seed: int = 0
  random_span: Optional[int] = None
  nonlocal_features: Optional[int] = None
  dropout_rate: float = 0.0
  implementation: str = 'auto'
  block_size: int = 512
  gaussian_skip_nats: Optional[float] = GAUSSIAN_SKIP_NATS
  decode: bool = False
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  # -- configuration ---------------------------------------------------------

  def check_config(self) -> None:
    """Raises ValueError for any invalid field (called by ``__call__``)."""
    check_fields(self)

  def resolved_random_span(self) -> int:
    """Radius the ``'random_sparse'`` support is drawn from: ``random_span``, or
    4 * ``window`` when it is None."""
    return 4 * self.window if self.random_span is None else self.random_span

  def resolved_implementation(self, num_inputs: int) -> str:
    """``'dense'`` or ``'blockwise'``: what ``implementation`` means for n inputs."""
    if self.implementation != 'auto':
      return self.implementation
    return 'blockwise' if num_inputs > AUTO_BLOCKWISE_THRESHOLD else 'dense'

  def resolved_ratio(self, ndim: int) -> float:
    """r of ``sigma = r n s``: ``ratio``, or the paper's for ``ndim`` spatial axes."""
    return self.ratio if self.ratio is not None else DEFAULT_RATIO[ndim]

  def pool_rule(self, spatial: Sequence[int], dropout: bool) -> PoolRule:
    """The fields as :func:`~.pool.pool_block` reads them, for inputs on the grid
    ``spatial``; ``dropout``: whether this call drops pooling weights."""
    span = self.resolved_random_span()
    return PoolRule(
        spatial=tuple(spatial),
        causal=self.causal,
        locality=self.locality,
        window=self.window,
        window_softness=float(self.window_softness),
        support_seed=self.random_seed & 0xFFFFFFFF,
        support_prob=(
            support_probability(len(spatial), self.window, span)
            if self.locality == 'random_sparse'
            else 1.0
        ),
        support_span=span,
        dropout_rate=float(self.dropout_rate) if dropout else 0.0,
    )

  def _compute_dtype(self, x: Array) -> Dtype:
    return self.dtype if self.dtype is not None else jnp.result_type(x)

  # -- m(X), for the whole sequence and for one step --------------------------

  def _out_bias_init(self) -> Callable[..., Array]:
    """Bias init of the mapping's last layer: zeros, and ``size_bias_init`` on
    the raw size channel (the last one) when the variant has one."""
    has_size = uses_size(self.locality)

    def init(key, shape, dtype=jnp.float32):
      del key
      bias = jnp.zeros(shape, dtype)
      return bias.at[..., -1].set(self.size_bias_init) if has_size else bias

    return init

  def _dense(self, features: int, name: str, dtype: Dtype, last: bool = False) -> nn.Module:
    """A dense layer of the mapping; ``last``: its output layer (the raw channels)."""
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=self.param_dtype,
        bias_init=self._out_bias_init() if last else _ZEROS,
        name=name,
    )

  def _conv(
      self, features: int, name: str, dtype: Dtype, ndim: int, padding: Any, last: bool = False
  ) -> nn.Module:
    """A convolution of the ``'cnn'`` mapping (A2); ``last``: its output layer."""
    return nn.Conv(
        features,
        (self.kernel_size,) * ndim,
        padding=padding,
        dtype=dtype,
        param_dtype=self.param_dtype,
        bias_init=self._out_bias_init() if last else _ZEROS,
        name=name,
    )

  def _mapping_attention(self, dtype: Dtype, decode: bool) -> nn.Module:
    """The self-attention mapping's one-head attention (Table 3), for both the
    whole-sequence call and the cached decoding step."""
    return nn.MultiHeadDotProductAttention(
        num_heads=1,
        qkv_features=self.hidden_features,
        out_features=self.hidden_features,
        dtype=dtype,
        param_dtype=self.param_dtype,
        decode=decode,
        name='mapping_attention',
    )

  def _mlp(self, x: Array, channels: int, dtype: Dtype) -> Array:
    """The ``'mlp'`` mapping (Table 3): two per-token dense layers."""
    h = ACTIVATIONS[self.activation](self._dense(self.hidden_features, 'mapping_dense_0', dtype)(x))
    return self._dense(channels, 'mapping_dense_1', dtype, last=True)(h)

  def _mapping(self, x: Array, valid: Array, dtype: Dtype) -> Optional[Array]:
    """m(X): ``[batch, *spatial, features] -> [batch, n, channels]`` raw outputs
    (float32), the channels the variant uses (:func:`~.sizes.num_channels`;
    None when it uses none)."""
    channels = num_channels(self.weights, self.locality)
    if not channels:
      return None
    batch, spatial = x.shape[0], x.shape[1:-1]
    valid_sp = valid.reshape(valid.shape[0], *spatial, 1)
    x = mask_features(valid_sp, x, 0.0)
    if self.mapping == 'cnn':
      padding = [(self.kernel_size - 1, 0)] if self.causal else 'SAME'
      conv = lambda f, name, last=False: self._conv(f, name, dtype, len(spatial), padding, last)
      h = ACTIVATIONS[self.activation](conv(self.hidden_features, 'mapping_conv_0')(x))
      # Zero the hidden map at padded positions too, so that padding behaves
      # exactly like the convolution's own zero padding.
      h = mask_features(valid_sp, h, 0.0)
      out = conv(channels, 'mapping_conv_1', last=True)(h)
    elif self.mapping == 'mlp':
      out = self._mlp(x, channels, dtype)
    else:  # 'attention'
      tokens = x.reshape(batch, math.prod(spatial), x.shape[-1])
      attn_mask = valid[:, None, :, None] & valid[:, None, None, :]
      if self.causal:
        attn_mask = attn_mask & jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
      # decode: its own key/value cache (see _mapping_step).
      h = self._mapping_attention(dtype, self.decode)(tokens, tokens, mask=attn_mask)
      out = self._dense(channels, 'mapping_dense', dtype, last=True)(h)
    return out.reshape(batch, math.prod(spatial), channels).astype(jnp.float32)

  def _mapping_step(
      self, x: Array, valid: Array, dtype: Dtype, cache: dict[str, Any]
  ) -> Optional[Array]:
    """m(X) at the new position of a decoding step: ``x [batch, 1, features]`` ->
    ``[batch, 1, channels]`` float32, equal to :meth:`_mapping`'s output there
    (the same parameters). The causal convolutions read the cached last k - 1
    inputs (``'VALID'`` over a window of k), the mlp reads the token, the
    attention mapping attends over its cache with the cached validity."""
    channels = num_channels(self.weights, self.locality)
    if not channels:
      return None
    keep = valid[..., None]  # [b, 1, 1]
    x = mask_features(keep, x, 0.0)
    if self.mapping == 'cnn':
      conv = lambda f, name, last=False: self._conv(f, name, dtype, 1, 'VALID', last)
      window = jnp.concatenate([cache['conv_inputs'].value, x.astype(dtype)], axis=1)
      h = ACTIVATIONS[self.activation](conv(self.hidden_features, 'mapping_conv_0')(window))
      h = mask_features(keep, h, 0.0)
      hidden = jnp.concatenate([cache['conv_hidden'].value, h.astype(dtype)], axis=1)
      out = conv(channels, 'mapping_conv_1', last=True)(hidden)
      cache['conv_inputs'].value = window[:, 1:]
      cache['conv_hidden'].value = hidden[:, 1:]
    elif self.mapping == 'mlp':
      out = self._mlp(x, channels, dtype)
    else:  # 'attention': flax's cache masks j > t; the cached validity masks padding.
      attn_mask = valid[:, None, :, None] & cache['valid'].value[:, None, None, :]
      h = self._mapping_attention(dtype, True)(x, x, mask=attn_mask)
      out = self._dense(channels, 'mapping_dense', dtype, last=True)(h)
    return out.reshape(x.shape[0], 1, channels).astype(jnp.float32)

  # -- the mapping's outputs as Eq. 4's terms ----------------------------------

  def _mapping_outputs(
      self,
      raw: Optional[Array],
      valid: Array,
      x_inputs: Array,
      dtype: Dtype,
      spatial: Sequence[int],
      q_index: Optional[np.ndarray] = None,
      prefix: Optional[SizePrefix] = None,
  ) -> tuple[MappingOutputs, Optional[SizePrefix]]:
    """Eq. 4's learned terms from the mapping's raw outputs ``raw [batch, n,
    channels]`` (None: the variant predicts none) and the inputs ``x_inputs
    [batch, n, features]`` (validity ``valid [batch, n]``, on the grid
    ``spatial``; the centres are the inputs ``q_index [m]``, None: all of
    them): a_j (:func:`~.sizes.log_weights`), the non-local theta_i and phi_j
    (Eq. 3: linear maps ``W^theta x``, ``W^phi x`` without bias), s and sigma.

    The whole-sequence call and the decoding step both come here; a step has
    n = m = 1 and passes ``prefix``, the size statistics of the positions
    before it (:func:`~.sizes.step_sizes`). Returns the terms and the
    statistics up to the new position (None without ``prefix``).
    """
    theta = phi = None
    if self.weights == 'nonlocal':  # Eq. 3
      k = self.nonlocal_features or x_inputs.shape[-1]
      proj = lambda name: nn.DenseGeneral(
          k, use_bias=False, dtype=dtype, param_dtype=self.param_dtype, name=name
      )
      theta = proj('nonlocal_theta')(x_inputs if q_index is None else x_inputs[:, q_index])
      phi = proj('nonlocal_phi')(x_inputs)
    size = sigma = None
    if uses_size(self.locality):
      assert raw is not None  # a learned size is a channel of the mapping's output
      size, sigma, prefix = self._sizes(raw[..., -1], valid, spatial, prefix)
    return MappingOutputs(log_weights(raw, self.weights), theta, phi, size, sigma), prefix

  def _sizes(
      self, raw_size: Array, valid: Array, spatial: Sequence[int], prefix: Optional[SizePrefix]
  ) -> tuple[Array, Array, Optional[SizePrefix]]:
    """``(s, sigma, prefix)`` from the raw size channel ``[batch, n]``: the whole
    sequence's (:func:`~.sizes.normalised_size`, :func:`~.sizes.pooling_sigma`),
    or one decoding step's from the earlier positions' ``prefix``."""
    ratio = self.resolved_ratio(len(spatial))
    if prefix is not None:
      return step_sizes(
          raw_size, valid, prefix, size_norm=self.size_norm, ratio=ratio, length=self.sigma_length
      )
    size = normalised_size(raw_size, valid, size_norm=self.size_norm, causal=self.causal)
    sigma = pooling_sigma(
        size,
        valid,
        causal=self.causal,
        ratio=ratio,
        grid_extent=(sum(spatial) / 2 if len(spatial) == 2 else None),
        length=self.sigma_length,
    )
    return size, sigma, None

  # -- forward ---------------------------------------------------------------

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array] = None, deterministic: bool = True) -> Array:
    """Pools ``x`` (see the class docstring): ``[batch, *out_spatial, features]``."""
    strides = check_inputs(self, x, mask)
    if self.decode:  # streaming: a step, or the call that creates the cache
      if self.has_variable('cache', 'cache_index'):
        return self._decode_step(x, mask, deterministic)
      self._stream_cache(x.shape[0], x.shape[1], x.shape[-1], self.dtype or x.dtype)
    dtype = self._compute_dtype(x)
    x = x.astype(dtype)
    batch, spatial, features = x.shape[0], tuple(x.shape[1:-1]), x.shape[-1]
    n = math.prod(spatial)
    valid = valid_positions(mask, batch, n)
    tokens = x.reshape(batch, n, features)
    window_shape = (
        strides
        if self.window_shape is None
        else checks.as_tuple(OWNER, 'window_shape', self.window_shape, len(spatial))
    )
    centre_axes = pool_centres(spatial, strides, window_shape)
    out_spatial = tuple(len(c) for c in centre_axes)
    q_index = query_indices(spatial, centre_axes)  # [m] (static)

    raw = self._mapping(x, valid, dtype)
    outputs, _ = self._mapping_outputs(raw, valid, tokens, dtype, spatial, q_index)
    if outputs.sigma is not None:
      assert outputs.size is not None  # _sizes gives both
      self.sow('intermediates', 'pool_size', outputs.size.reshape(batch, *spatial))
      self.sow('intermediates', 'pool_sigma', outputs.sigma.reshape(batch, *spatial))
    inputs = self._pool_inputs(outputs, q_index, valid, tokens, deterministic)
    rule = self.pool_rule(spatial, dropout=inputs.dropout_seeds is not None)
    if self.is_mutable_collection('intermediates'):  # only built when they are sown
      pairwise = out_spatial if self.weights == 'nonlocal' else ()
      w = pool_weights(rule, inputs.centres, inputs.context, self.weights)
      self.sow('intermediates', 'pool_weights', w.reshape((batch,) + pairwise + spatial))
    if self.resolved_implementation(n) == 'dense':
      y = pool_dense(rule, inputs)
    else:
      y = pool_blockwise(rule, self.block_size, inputs, self.gaussian_skip_nats)
    x_centres = tokens[:, q_index]
    y = self._combine(x_centres, y)
    # Padded positions are passed through unchanged.
    y = mask_features(inputs.centres.valid[..., None], y, x_centres)
    return y.reshape(batch, *out_spatial, features)

  def _pool_inputs(
      self,
      outputs: MappingOutputs,
      q_index: np.ndarray,
      valid: Array,
      tokens: Array,
      deterministic: bool,
  ) -> PoolInputs:
    """The centres (``q_index``: their static flat positions), the context (every
    input, ``tokens [batch, n, features]``) and the dropout seeds of a
    whole-sequence call."""
    dropout_seeds = None
    if self.dropout_rate > 0.0 and not deterministic:
      dropout_seeds = jax.random.bits(self.make_rng('dropout'), (valid.shape[0],), jnp.uint32)
    sigma = None if outputs.sigma is None else outputs.sigma[:, q_index]  # [b, m]
    centres = Centres(
        index=q_index.astype(np.int32), valid=valid[:, q_index], sigma=sigma, theta=outputs.theta
    )
    context = Context(
        index=jnp.arange(valid.shape[1], dtype=jnp.int32),
        valid=valid,
        x=tokens,
        log_w=outputs.log_w,
        phi=outputs.phi,
    )
    return PoolInputs(centres, context, dropout_seeds)

  def _combine(self, x: Array, pooled: Array) -> Array:
    """What the layer returns at the centres from their inputs ``x`` and the
    pooled features (both ``[batch, m, features]``): the pooled features (the
    paper), ``x + pooled`` (``residual``) or ``x + g * (pooled - x)``
    (``gate``), for the whole-sequence call and the decoding step alike."""
    if self.residual:
      return x + pooled
    if self.gate:
      g = self.param(
          'gate', nn.initializers.constant(self.gate_init), (x.shape[-1],), self.param_dtype
      )
      return x + g.astype(x.dtype) * (pooled - x)
    return pooled


def make_context_pool(
    context_pool: Optional[Mapping[str, Any]],
    *,
    dtype: Optional[Dtype],
    param_dtype: Dtype,
    name: Optional[str] = None,
    **defaults: Any,
) -> Optional[ContextPool]:
  """A ContextPool built from a model's ``context_pool`` field, or None.

  Convention used by every model: ``context_pool=None`` means no ContextPool;
  a mapping (possibly empty) means "insert ContextPool" with those field
  overrides on top of ``defaults`` (e.g. ``causal=True`` set by a decoder; a
  user override of a default the model needs, like ``causal``, raises).

  Raises:
    ValueError: for an unknown ContextPool field or a conflicting override.
  """
  if context_pool is None:
    return None
  overrides = dict(context_pool)
  fields = set(ContextPool.__dataclass_fields__) - {'parent', 'name'}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ConfigError(
        f'context_pool has unknown field(s) {unknown}; ContextPool fields: '
        f'{", ".join(sorted(fields))}.'
    )
  for key, value in defaults.items():
    if key in overrides and overrides[key] != value:
      raise ConfigError(
          f'context_pool.{key}={overrides[key]!r} conflicts with this model, '
          f'which needs {key}={value!r}.'
      )
  kwargs = {**defaults, **overrides}
  kwargs.setdefault('dtype', dtype)
  kwargs.setdefault('param_dtype', param_dtype)
  return ContextPool(name=name, **kwargs)
