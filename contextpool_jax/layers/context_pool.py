"""ContextPool: adaptive context pooling (Huang et al., ICML 2022).

For every token i, ContextPool pools the features of its neighbours with learned
per-token weights ``w`` and a learned, per-token Gaussian pooling size:

    y_i = sum_j x_j w_j g^i_j / sum_j w_j g^i_j                       (Eq. 4, Eq. 6)
    g^i_j = exp(-d(i, j)^2 / (2 sigma_i^2))
    sequences: sigma_i = r * n * s_i,            r = 0.1              (Sec. 3.2)
    grids:     sigma_k = r * S_k * (h + w) / 2,  r = 0.05             (Appendix A)
    {w, s} = m(X): two convolutions with two output channels.

With softmax-normalised weights, ``w_j = exp(a_j) / Z`` and the constant ``Z``
cancels between numerator and denominator, so Eq. 4 *is* a softmax over j of

    l_ij = a_j - d(i, j)^2 / (2 sigma_i^2)

applied to X. This module computes exactly that, in log space with a
max-subtracted softmax in float32 (whatever the compute dtype), so no
denominator can reach 0. Every ablation of the paper's Tables 1-3 is a choice of
how ``l_ij`` is built:

* ``weights`` (Table 1/2 middle cell): ``'learned'`` a_j = raw weight (softmax
  weights); ``'unnormalized'`` w_j = softplus(raw weight), a positive weight with
  no normalisation (exp would be identical to softmax, since Z cancels);
  ``'uniform'`` a_j = 0 (average pooling); ``'nonlocal'`` a_ij =
  theta(x_i)^T phi(x_j) / sqrt(k) (Eq. 3; query dependent, O(n^2) cost).
* ``locality`` (bottom cell): ``'gaussian'`` the adaptive Gaussian above;
  ``'none'`` no locality prior; ``'fixed_window'`` a hard window of radius
  ``window``; ``'adaptive_window'`` a hard window of learned radius
  rho_i = sigma_i; ``'random_sparse'`` a fixed, seeded random support.
* ``mapping`` (Table 3): ``'cnn'`` two convolutions; ``'mlp'`` two per-token
  dense layers; ``'attention'`` single-head self-attention followed by a dense
  layer.

Choices the paper leaves open (papers README, A1-A5) are fields, documented on
:class:`ContextPool` and in the README table.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.layers import _validation as v

Array = jax.Array
Dtype = Any

WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
MAPPINGS = ('cnn', 'mlp', 'attention')
SIZE_NORMS = ('softmax', 'sigmoid')
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    'relu': nn.relu,
    'gelu': nn.gelu,
    'silu': nn.silu,
    'tanh': jnp.tanh,
}
DEFAULT_RATIO = {1: 0.1, 2: 0.05}  # r for sequences (Sec. 3.2) and grids (App. A).

# A finite "minus infinity" for masked logits: exp() of it is exactly 0 in float32
# and, unlike -inf, it never produces inf - inf = NaN in a forward or backward pass.
_NEG = -1e30
# Added to 2 sigma^2 so that sigma -> 0 gives a finite (huge) Gaussian exponent.
_MIN_TWO_VARIANCE = 1e-12

_OWNER = 'ContextPool'


# ----------------------------------------------------------------------------
# Geometry: token coordinates, pooling centres, squared distances.
# ----------------------------------------------------------------------------


def pool_centres(spatial: Sequence[int], strides: Sequence[int],
                 window_shape: Sequence[int]) -> list[np.ndarray]:
  """Integer input coordinates of the pooling centres, per spatial axis.

  The output has ``ceil(size / stride)`` positions per axis, as
  ``nn.avg_pool(..., window_shape, strides, padding='SAME')``. Output position
  ``o`` pools around the centre of that op's window:
  ``o * stride - pad_lo + (window - 1) // 2`` where
  ``pad_lo = max((out - 1) * stride + window - size, 0) // 2``; for an even
  window the centre is rounded down to a grid position.

  Returns:
    One int array per axis, of length ``ceil(size / stride)``.
  """
  centres = []
  for size, stride, window in zip(spatial, strides, window_shape):
    out = -(-size // stride)
    pad_lo = max((out - 1) * stride + window - size, 0) // 2
    c = np.arange(out) * stride - pad_lo + (window - 1) // 2
    centres.append(np.clip(c, 0, size - 1))
  return centres


def _key_coordinates(spatial: Sequence[int]) -> Array:
  """Float32 coordinates of every input position, ``[n, ndim]`` (row-major)."""
  grids = jnp.meshgrid(*[jnp.arange(s, dtype=jnp.float32) for s in spatial],
                       indexing='ij')
  return jnp.stack([g.reshape(-1) for g in grids], axis=-1)


def _query_indices(spatial: Sequence[int], centres: Sequence[np.ndarray]) -> np.ndarray:
  """Flat (row-major) input indices of the pooling centres, ``[m]``."""
  mesh = np.meshgrid(*centres, indexing='ij')
  return np.ravel_multi_index([c.reshape(-1) for c in mesh], tuple(spatial))


def squared_distances(spatial: Sequence[int], query_index: np.ndarray) -> Array:
  """Squared Euclidean grid distance between centres and inputs, ``[m, n]``."""
  coords = _key_coordinates(spatial)
  q = coords[jnp.asarray(query_index)]
  return jnp.sum(jnp.square(q[:, None, :] - coords[None, :, :]), axis=-1)


# ----------------------------------------------------------------------------
# Pooling sizes (A1) and weights.
# ----------------------------------------------------------------------------


def pooling_sigma(raw_size: Array, valid: Array, *, size_norm: str, causal: bool,
                  ratio: float, grid_extent: Optional[float]) -> Array:
  """Gaussian standard deviations in token units, ``[batch, n]`` (float32).

  ``s`` is the normalised pooling size in [0, 1] (A1):

  * ``'softmax'``: the paper's literal reading, a softmax of the raw sizes over
    the valid positions (for ``causal``: over the valid positions ``<= i``, a
    prefix softmax, so that s_i never depends on later tokens);
  * ``'sigmoid'``: a per-token squashing, ``s_i = sigmoid(raw_i)``.

  Sequences: ``sigma_i = r * n_i * s_i`` where ``n_i`` is the number of tokens
  token i pools over: the number of valid tokens (not the padded length, so the
  amount of padding never changes a real token's output) or, for ``causal``,
  the number of valid tokens ``<= i`` (so the output at i is the same whatever
  the length of the future). Grids: ``sigma = r * S * (h + w) / 2`` with the
  static grid size (``grid_extent``).
  """
  z = jnp.where(valid, raw_size.astype(jnp.float32), _NEG)
  if size_norm == 'sigmoid':
    s = jax.nn.sigmoid(z)
  elif causal:
    s = jnp.exp(z - jax.lax.cumlogsumexp(z, axis=1))
  else:
    s = jax.nn.softmax(z, axis=1)
  s = jnp.where(valid, s, 0.0)
  if grid_extent is not None:
    extent = grid_extent
  elif causal:
    extent = jnp.cumsum(valid, axis=1, dtype=jnp.float32)
  else:
    extent = jnp.sum(valid, axis=1, keepdims=True, dtype=jnp.float32)
  return ratio * extent * s


def _log_softplus(z: Array) -> Array:
  """log(softplus(z)) without underflow: equals z (to float32 precision) for z < -30."""
  safe = jnp.maximum(z, -30.0)
  return jnp.where(z < -30.0, z, jnp.log(jax.nn.softplus(safe)))


def _normalise_rows(log_w: Array, allowed: Array) -> Array:
  """softmax of log-weights over the allowed positions of the last axis; 0 elsewhere."""
  z = jnp.where(allowed, log_w, _NEG)
  return jnp.where(allowed, jax.nn.softmax(z, axis=-1), 0.0)


# ----------------------------------------------------------------------------
# The pooling itself.
# ----------------------------------------------------------------------------


def masked_pool(logits: Array, allowed: Array, *,
                in_window: Optional[Array] = None,
                window_ste: Optional[Array] = None) -> Array:
  """Pooling weights ``p = softmax_n(logits)`` over the allowed positions.

  Args:
    logits: ``[batch or 1, m, n]`` float32 log pooling weights ``l_mn``.
    allowed: bool, broadcastable to logits; positions outside get p = 0.
    in_window: optional bool ``[batch, m, n]`` hard window (adaptive window only).
      The max is taken over ``allowed & in_window`` and positions outside the
      window are multiplied by ``window_ste``.
    window_ste: optional float32 ``[batch, m, n]`` straight-through window mask:
      exactly ``in_window`` in value, with the gradient of a soft window.

  Returns:
    ``p [batch, m, n]`` float32. A row with no allowed position gets ``p = 0``
    (never a division by 0).
  """
  support = allowed if in_window is None else allowed & in_window
  row_max = jnp.max(jnp.where(support, logits, _NEG), axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(row_max)
  shifted = logits - row_max
  if in_window is not None:
    # Outside the window the forward value is multiplied by 0; clamping the
    # exponent at 0 keeps exp() finite there (the max was taken inside).
    shifted = jnp.where(in_window, shifted, jnp.minimum(shifted, 0.0))
  e = jnp.exp(jnp.where(allowed, shifted, _NEG))
  if window_ste is not None:
    e = e * window_ste
  denom = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(denom > 0, denom, 1.0)


def _apply_pool(p: Array, x: Array) -> Array:
  """``[b, m, n] x [b, n, d] -> [b, m, d]`` in x's dtype, accumulated in float32."""
  y = jnp.einsum('bmn,bnd->bmd', p.astype(x.dtype), x,
                 preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


# ----------------------------------------------------------------------------
# The module.
# ----------------------------------------------------------------------------


class ContextPool(nn.Module):
  """Adaptive context pooling (Huang et al., ICML 2022), Eq. 4 and Eq. 6.

  ``__call__(x, mask=None, deterministic=True)``:

  * ``x``: ``[batch, length, features]`` (a sequence) or
    ``[batch, height, width, features]`` (a grid).
  * ``mask``: optional bool, ``x.shape[:-1]``; True marks a real token. Padded
    positions get zero pooling weight, are zeroed before the mapping reads them,
    and are passed through unchanged in the output, so their values can never
    change a real position's output (A5). For sequences the sizes also use the
    number of real tokens, so the amount of padding does not matter either.
  * ``deterministic``: False enables dropout on the pooling weights (rng
    ``'dropout'``).

  Returns ``x``'s shape, or for ``strides > 1`` the grid sampled at the pooling
  centres (see :func:`pool_centres`).

  Sows into ``'intermediates'`` (``apply(..., mutable=['intermediates'])``):
  ``'pool_weights'``: the normalised weights w, ``[batch, *spatial]`` (for
  ``weights='nonlocal'`` the pairwise weights ``[batch, *out_spatial, *spatial]``);
  ``'pool_sigma'``: sigma in token units, ``[batch, *spatial]`` (for
  ``'adaptive_window'`` the window radius; not sown for localities without a
  learned size). Output position o uses the sigma of its centre.

  Attributes:
    weights: ``'learned' | 'unnormalized' | 'uniform' | 'nonlocal'``.
    locality: ``'gaussian' | 'none' | 'fixed_window' | 'adaptive_window' |
      'random_sparse'``.
    mapping: ``'cnn' | 'mlp' | 'attention'`` -- m(X) predicting the raw weight
      and raw size channels (only the channels the variant uses are predicted).
    size_norm: A1. ``'softmax'`` (literal: over positions) or ``'sigmoid'``
      (per token). See :func:`pooling_sigma`.
    ratio: r; None means 0.1 for sequences, 0.05 for grids.
    residual: A3. False: the pooled features replace the input (the paper's
      "pool them ... for use in the next attention block"); True: ``x + pool(x)``.
    causal: A4. Sequences only. No output depends on a later input: the
      support is ``j <= i``; the cnn mapping is left-padded; the mlp mapping is
      per token; the attention mapping and non-local weights are causally
      masked; the softmax size normalisation is a prefix softmax; n in
      ``sigma = r n s`` counts tokens ``<= i``.
    strides: output stride per spatial axis (the ConvNet pooling replacement);
      not allowed with ``causal``.
    window_shape: window of the pooling op being replaced, used only to place
      the centres ('SAME' semantics as ``nn.avg_pool``); None means ``strides``.
    kernel_size: A2. kernel size of both mapping convolutions (per axis).
    hidden_features: A2. width of the mapping's hidden layer.
    activation: A2. ``'relu' | 'gelu' | 'silu' | 'tanh'``.
    window: radius (Euclidean, in tokens) of the ``'fixed_window'`` support,
      and the size a ``'random_sparse'`` support matches in expectation.
    window_softness: adaptive window only: width (tokens) of the sigmoid edge
      whose gradient trains the hard window's radius (straight-through).
    random_seed: seed of the ``'random_sparse'`` support (fixed, not an rng).
    nonlocal_features: width of theta/phi for ``weights='nonlocal'``; None
      means the input width (the paper's d x d projections).
    dropout_rate: dropout on the normalised pooling weights.
    dtype: compute dtype (None: the input's); the pooling softmax is always
      computed in float32.
    param_dtype: parameter dtype.
  """

  weights: str = 'learned'
  locality: str = 'gaussian'
  mapping: str = 'cnn'
  size_norm: str = 'softmax'
  ratio: Optional[float] = None
  residual: bool = False
  causal: bool = False
  strides: Union[int, Sequence[int]] = 1
  window_shape: Optional[Union[int, Sequence[int]]] = None
  kernel_size: int = 3
  hidden_features: int = 32
  activation: str = 'relu'
  window: int = 8
  window_softness: float = 1.0
  random_seed: int = 0
  nonlocal_features: Optional[int] = None
  dropout_rate: float = 0.0
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  # -- configuration ---------------------------------------------------------

  def check_config(self) -> None:
    """Raises ValueError for any invalid field (called by ``__call__``)."""
    v.check_choice(_OWNER, 'weights', self.weights, WEIGHTS)
    v.check_choice(_OWNER, 'locality', self.locality, LOCALITIES)
    v.check_choice(_OWNER, 'mapping', self.mapping, MAPPINGS)
    v.check_choice(_OWNER, 'size_norm', self.size_norm, SIZE_NORMS)
    v.check_choice(_OWNER, 'activation', self.activation, tuple(ACTIVATIONS))
    v.check_positive(_OWNER, 'ratio', self.ratio, allow_none=True)
    v.check_positive(_OWNER, 'kernel_size', self.kernel_size, integer=True)
    v.check_positive(_OWNER, 'hidden_features', self.hidden_features, integer=True)
    v.check_positive(_OWNER, 'window', self.window, integer=True)
    v.check_positive(_OWNER, 'window_softness', self.window_softness)
    v.check_positive(_OWNER, 'nonlocal_features', self.nonlocal_features,
                     allow_none=True, integer=True)
    v.check_probability(_OWNER, 'dropout_rate', self.dropout_rate)
    if not isinstance(self.random_seed, int) or isinstance(self.random_seed, bool):
      raise ValueError(f'{_OWNER}.random_seed={self.random_seed!r} is invalid; '
                       'expected an int.')
    for name in ('residual', 'causal'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'{_OWNER}.{name}={getattr(self, name)!r} is invalid; '
                         'expected True or False.')

  def _check_inputs(self, x: Array, mask: Optional[Array]) -> tuple[int, ...]:
    self.check_config()
    v.check_rank(_OWNER, 'x', x, (3, 4),
                 '[batch, length, features] or [batch, height, width, features]')
    ndim = x.ndim - 2
    strides = v.as_tuple(_OWNER, 'strides', self.strides, ndim)
    if self.window_shape is not None:
      v.as_tuple(_OWNER, 'window_shape', self.window_shape, ndim)
    if self.causal and ndim != 1:
      raise ValueError(f'{_OWNER}.causal=True needs a sequence [batch, length, '
                       f'features]; got a grid of shape {x.shape}. Causal pooling '
                       'is only defined for 1D sequences.')
    if self.causal and any(s != 1 for s in strides):
      raise ValueError(f'{_OWNER}.strides={self.strides!r} is not allowed with '
                       'causal=True; allowed: 1.')
    if mask is not None and tuple(mask.shape) != tuple(x.shape[:-1]):
      raise ValueError(f'{_OWNER}: mask has shape {tuple(mask.shape)}; expected '
                       f'x.shape[:-1] = {tuple(x.shape[:-1])} (True = real token).')
    return strides

  # -- m(X) ------------------------------------------------------------------

  def _mapping(self, x: Array, valid: Array, channels: int, dtype: Dtype) -> Array:
    """m(X): ``[batch, *spatial, features] -> [batch, n, channels]`` raw outputs."""
    batch, spatial = x.shape[0], x.shape[1:-1]
    act = ACTIVATIONS[self.activation]
    valid_sp = valid.reshape(valid.shape[0], *spatial, 1)
    x = jnp.where(valid_sp, x, 0)
    dense = lambda f, name: nn.Dense(f, dtype=dtype, param_dtype=self.param_dtype,
                                     name=name)
    if self.mapping == 'cnn':
      k = self.kernel_size
      padding = [(k - 1, 0)] if self.causal else 'SAME'
      conv = lambda f, name: nn.Conv(f, (k,) * len(spatial), padding=padding,
                                     dtype=dtype, param_dtype=self.param_dtype,
                                     name=name)
      h = act(conv(self.hidden_features, 'mapping_conv_0')(x))
      # Zero the hidden map at padded positions too, so that padding behaves
      # exactly like the convolution's own zero padding.
      h = jnp.where(valid_sp, h, 0)
      out = conv(channels, 'mapping_conv_1')(h)
    elif self.mapping == 'mlp':
      h = act(dense(self.hidden_features, 'mapping_dense_0')(x))
      out = dense(channels, 'mapping_dense_1')(h)
    else:  # 'attention'
      tokens = x.reshape(batch, -1, x.shape[-1])
      attn_mask = valid[:, None, :, None] & valid[:, None, None, :]
      if self.causal:
        attn_mask = attn_mask & jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
      h = nn.MultiHeadDotProductAttention(
          num_heads=1, qkv_features=self.hidden_features,
          out_features=self.hidden_features, dtype=dtype,
          param_dtype=self.param_dtype, name='mapping_attention')(
              tokens, tokens, mask=attn_mask)
      out = dense(channels, 'mapping_dense')(h)
    return out.reshape(batch, -1, channels).astype(jnp.float32)

  # -- forward ---------------------------------------------------------------

  @nn.compact
  def __call__(self, x: Array, mask: Optional[Array] = None,
               deterministic: bool = True) -> Array:
    strides = self._check_inputs(x, mask)
    dtype = self.dtype if self.dtype is not None else jnp.result_type(x)
    x = x.astype(dtype)
    batch, spatial, features = x.shape[0], tuple(x.shape[1:-1]), x.shape[-1]
    ndim, n = len(spatial), math.prod(spatial)
    ratio = self.ratio if self.ratio is not None else DEFAULT_RATIO[ndim]
    window_shape = (strides if self.window_shape is None else
                    v.as_tuple(_OWNER, 'window_shape', self.window_shape, ndim))

    valid = (jnp.ones((batch, n), bool) if mask is None
             else jnp.asarray(mask).reshape(batch, n).astype(bool))
    tokens = x.reshape(batch, n, features)

    centres = pool_centres(spatial, strides, window_shape)
    out_spatial = tuple(len(c) for c in centres)
    q_index = _query_indices(spatial, centres)  # [m] (static)
    m = len(q_index)
    key_index = jnp.arange(n)

    # Which (centre, input) pairs may be pooled: real inputs, and j <= i if causal.
    allowed = valid[:, None, :] & valid[:, q_index][:, :, None]  # [b, m, n]
    if self.causal:
      allowed = allowed & (key_index[None, :] <= jnp.asarray(q_index)[:, None])[None]

    # m(X): raw weight and/or raw size channels, only those the variant uses.
    uses_weight = self.weights in ('learned', 'unnormalized')
    uses_size = self.locality in ('gaussian', 'adaptive_window')
    channels = int(uses_weight) + int(uses_size)
    raw = self._mapping(x, valid, channels, dtype) if channels else None

    # Log pooling weights a: [b, 1, n] or, for non-local weights, [b, m, n].
    if self.weights == 'learned':
      log_w = raw[..., 0][:, None, :]
      sown_w = _normalise_rows(log_w[:, 0], valid)
    elif self.weights == 'unnormalized':
      log_w = _log_softplus(raw[..., 0])[:, None, :]
      sown_w = jnp.where(valid, jax.nn.softplus(raw[..., 0]), 0.0)
    elif self.weights == 'uniform':
      log_w = jnp.zeros((batch, 1, n), jnp.float32)
      sown_w = _normalise_rows(log_w[:, 0], valid)
    else:  # 'nonlocal' (Eq. 3)
      k = self.nonlocal_features or features
      proj = lambda name: nn.DenseGeneral(k, dtype=dtype, param_dtype=self.param_dtype,
                                          name=name)
      theta = proj('nonlocal_theta')(tokens[:, q_index])
      phi = proj('nonlocal_phi')(tokens)
      log_w = jnp.einsum('bmk,bnk->bmn', theta, phi,
                         preferred_element_type=jnp.float32) / math.sqrt(k)
      sown_w = _normalise_rows(log_w, allowed).reshape(batch, *out_spatial, *spatial)

    # Locality: a log-space bias and/or a hard support.
    in_window = window_ste = None
    bias = 0.0
    if uses_size:
      sigma = pooling_sigma(raw[..., -1], valid, size_norm=self.size_norm,
                            causal=self.causal, ratio=ratio,
                            grid_extent=(sum(spatial) / 2 if ndim == 2 else None))
      self.sow('intermediates', 'pool_sigma', sigma.reshape(batch, *spatial))
      sigma_q = sigma[:, q_index][:, :, None]  # [b, m, 1]
    if self.locality != 'none':
      d2 = squared_distances(spatial, q_index)[None]  # [1, m, n]
    if self.locality == 'gaussian':
      bias = -d2 / (2.0 * jnp.square(sigma_q) + _MIN_TWO_VARIANCE)
    elif self.locality == 'fixed_window':
      allowed = allowed & (d2 <= float(self.window) ** 2)
    elif self.locality == 'adaptive_window':
      # Hard window of learned radius rho = sigma. Forward: exactly the hard
      # window. Backward: the gradient of a sigmoid edge of width
      # `window_softness` (straight-through), so the radius is trainable.
      in_window = d2 <= jnp.square(sigma_q)
      soft = jax.nn.sigmoid((sigma_q - jnp.sqrt(d2)) / self.window_softness)
      window_ste = (in_window.astype(jnp.float32) + soft
                    - jax.lax.stop_gradient(soft))
    elif self.locality == 'random_sparse':
      allowed = allowed & self._random_support(spatial, q_index, d2)

    logits = log_w + bias
    p = masked_pool(logits, allowed, in_window=in_window,
                       window_ste=window_ste)
    self.sow('intermediates', 'pool_weights', sown_w if self.weights == 'nonlocal'
             else sown_w.reshape(batch, *spatial))
    if self.dropout_rate > 0.0:
      p = nn.Dropout(rate=self.dropout_rate)(p, deterministic=deterministic)
    y = _apply_pool(p, tokens)  # [b, m, d]

    x_centres = tokens[:, q_index]
    if self.residual:
      y = x_centres + y
    # Padded positions are passed through unchanged.
    y = jnp.where(valid[:, q_index][..., None], y, x_centres)
    return y.reshape(batch, *out_spatial, features)

  def _random_support(self, spatial: Sequence[int], q_index: np.ndarray,
                      d2: Array) -> Array:
    """Fixed random support ``[1, m, n]``: every token keeps itself, and each other
    position with probability ``p = K / (n - 1)``, where K is the number of other
    positions in a fixed window of radius ``window`` (causal: K and n - 1 are
    halved, as only earlier positions count), so that on average the support is
    as large as the fixed window's. Drawn from ``random_seed`` for the static
    ``[m, n]`` shape: the same for every batch element and every step."""
    n = math.prod(spatial)
    offsets = np.arange(-self.window, self.window + 1)
    grid = np.stack(np.meshgrid(*([offsets] * len(spatial)), indexing='ij'), -1)
    k = int(np.sum(np.sum(grid ** 2, -1) <= self.window ** 2)) - 1
    others = n - 1
    if self.causal:  # half the window lies before the token, and so do half the others
      k, others = k // 2, others / 2
    prob = min(1.0, k / max(others, 1))
    keep = jax.random.bernoulli(jax.random.key(self.random_seed), prob,
                                (len(q_index), n))
    return (keep | (d2[0] == 0))[None]
