"""Attention-augmented convolution (Bello et al., ICCV 2019).

The layer concatenates a convolution and a multi-head self-attention over the
pixels of the feature map along the channel axis. Equations (labels used in
the docstrings below; the paper numbers only the parameter count, Eq. 5):

  [AA]   AAConv(X) = Concat[Conv(X), MHA(X)]
  [MHA]  MHA(X) = Concat[O_1, ..., O_Nh] W^O
  [O]    O_h = Softmax((Q K^T + S^rel_H + S^rel_W) / sqrt(d_k^h)) V
  [REL]  l_ij = q_i^T (k_j + r^W_{j_x - i_x} + r^H_{j_y - i_y}) / sqrt(d_k^h)
  [Eq.5] Delta_params ~ F_in F_out (2 kappa + (1 - k^2) nu + F_out nu^2 / F_in)

with Q = X W_q, K = X W_k, V = X W_v computed by one 1x1 convolution with
2 d_k + d_v output channels and W^O a 1x1 convolution with d_v input and output
channels that mixes the heads. d_k = kappa * F_out (``key_ratio``) and
d_v = nu * F_out (``value_ratio``); the k x k convolution gets the remaining
F_out - d_v channels. In [O] and [REL],
S^rel_W[i, j] = q_i^T r^W_{j_x - i_x}, S^rel_H[i, j] = q_i^T r^H_{j_y - i_y},
with learned tables r^W (2W - 1 rows) and r^H (2H - 1 rows). They are computed
by ``relative_logits_2d`` without ever building an ``[HW, HW, d_k]`` tensor:
the per-offset logits q_i^T r_m for all 2W - 1 offsets m are a
``[batch, heads, H, W, 2W - 1]`` tensor, which is then re-indexed from relative
to absolute key positions (the "rel_to_abs" step) by a static gather at
m = j_x - i_x + W - 1, and broadcast over the other axis. The embedding part
costs O(HW d_k) memory; the logits themselves are ``[HW, HW]`` per head as in
any global attention.

Choices the paper leaves open (each one is a field of ``AugmentedConv2D``):

* Strides (``attention_downsample``). The paper does not say how the attention
  branch follows a strided convolution. Default ``'avg_pool'``: queries, keys
  and values all come from the input average-pooled with window = stride =
  ``strides`` ('SAME' padding, padded cells excluded from the mean), so the
  attention runs on the output grid (ceil(H/s) x ceil(W/s)): every input pixel
  contributes, the cost is O((HW/s^2)^2) and the relative tables live on the
  output grid. ``'subsample'`` takes the pixels at (s_y a, s_x b) (what a
  strided 1x1 convolution computing q/k/v would see). ``'query_subsample'``
  keeps keys and values at full resolution and only subsamples the queries
  (cost (HW)^2 / s^2; the relative offsets are measured on the full grid).
* Rounding of d_k and d_v (``depth_rounding``). ``'error'`` (default): kappa *
  F_out and nu * F_out must be positive integers divisible by ``num_heads``;
  anything else raises, so the parameter count never changes silently.
  ``'nearest'``: round to the nearest positive multiple of ``num_heads``.
* Relative tables (``relative_per_head``): shared by all heads (default) or one
  pair per head; initialised N(0, (d_k^h)^-1). Their row counts follow the key
  grid of the first call; a later call on another size raises ValueError.
* ``position='sine2d'``: a fixed 2D sinusoidal encoding is *added* to the input
  of the attention branch (the absolute encoding X + P of the paper's ablation):
  the first ceil(C/2) channels encode the row y, the other floor(C/2) the column
  x, each with the 1D encoding of Vaswani et al. (sin on even, cos on odd
  channels, frequencies 10000^(-2i/d)), on the grid the keys live on.
* ``position='coordconv'``: two channels (y, x) scaled to [-1, 1] (0 for a grid
  of size 1) are concatenated to the input of the attention branch only.
* The softmax is computed in float32 whatever ``dtype`` is, then cast back.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.base import checks

_OWNER = 'AugmentedConv2D'
POSITIONS = ('relative', 'none', 'sine2d', 'coordconv')
DOWNSAMPLES = ('avg_pool', 'subsample', 'query_subsample')
DEPTH_ROUNDINGS = ('error', 'nearest')


def attention_depths(
    features: int,
    key_ratio: float,
    value_ratio: float,
    num_heads: int,
    depth_rounding: str = 'error',
    owner: str = _OWNER,
) -> tuple[int, int]:
  """Returns (d_k, d_v) = (kappa * F_out, nu * F_out), checked or rounded.

  Args:
    features: F_out, the output channels of the whole layer.
    key_ratio: kappa.
    value_ratio: nu.
    num_heads: N_h; d_k and d_v must be divisible by it.
    depth_rounding: ``'error'`` raises unless kappa * F_out and nu * F_out are
      (up to float round-off) positive integers divisible by ``num_heads``;
      ``'nearest'`` rounds each to the nearest positive multiple of
      ``num_heads``.
    owner: name used in error messages.

  Returns:
    ``(d_k, d_v)``, with ``d_v < features`` so the convolution keeps at least
    one channel.

  Raises:
    ValueError: naming the field and value when the depths are not allowed.
  """
  checks.check_choice(owner, 'depth_rounding', depth_rounding, DEPTH_ROUNDINGS)
  depths = []
  for field, ratio, symbol in (
      ('key_ratio', key_ratio, 'd_k'),
      ('value_ratio', value_ratio, 'd_v'),
  ):
    checks.check_positive(owner, field, ratio)
    exact = ratio * features
    if depth_rounding == 'nearest':
      depth = max(1, round(exact / num_heads)) * num_heads
    else:
      depth = round(exact)
      if abs(exact - depth) > 1e-6 * max(1.0, exact) or depth <= 0 or depth % num_heads:
        raise ConfigError(
            f'{owner}.{field}={ratio!r} is invalid: {symbol} = {field} * '
            f'features = {ratio!r} * {features} = {exact:g} must be a positive '
            f'integer divisible by num_heads={num_heads}. Pick {field} so that '
            f'{field} * features is a multiple of num_heads, or set '
            "depth_rounding='nearest'."
        )
    depths.append(depth)
  d_k, d_v = depths
  if d_v >= features:
    raise ConfigError(
        f'{owner}.value_ratio={value_ratio!r} is invalid: d_v = {d_v} must be '
        f'smaller than features={features} so that the convolution keeps '
        'features - d_v > 0 channels.'
    )
  return d_k, d_v


def _rel_to_abs(rel: jax.Array, num_keys: int, stride: int) -> jax.Array:
  """Re-indexes per-offset logits from relative to absolute key positions.

  Args:
    rel: ``[..., num_queries, 2 * num_keys - 1]``; ``rel[..., a, m]`` is the
      logit of query a for the offset m - (num_keys - 1).
    num_keys: number of key positions along this axis.
    stride: query a sits at key-grid position ``stride * a``.

  Returns:
    ``[..., num_queries, num_keys]`` with ``out[..., a, j] =
    rel[..., a, j - stride * a + num_keys - 1]``: a static gather, equivalent to
    the pad-and-reshape rel_to_abs trick (and defined for strided queries).
  """
  num_queries = rel.shape[-2]
  rows = np.arange(num_queries)[:, None]
  index = np.arange(num_keys)[None, :] - stride * rows + num_keys - 1
  return rel[..., rows, index]


def relative_logits_2d(
    q: jax.Array, rel_w: jax.Array, rel_h: jax.Array, query_strides: Sequence[int] = (1, 1)
) -> jax.Array:
  """2D relative position logits S^rel_H + S^rel_W of [O] / [REL].

  ``out[b, h, iy, ix, jy, jx] = q[b, iy, ix, h] . (rel_w[jx - s_x ix + W_k - 1]
  + rel_h[jy - s_y iy + H_k - 1])``, i.e. q_i^T (r^W_{j_x - i_x} +
  r^H_{j_y - i_y}) with query i at key-grid position (s_y iy, s_x ix). The
  scale 1/sqrt(d_k^h) is not applied here: pass already-scaled queries.

  Memory: the intermediates are ``[batch, heads, H_q, W_q, 2 W_k - 1]`` and
  ``[batch, heads, H_q, W_q, 2 H_k - 1]``; no ``[HW, HW, d_k]`` tensor is built.

  Args:
    q: queries ``[batch, q_height, q_width, heads, depth]``.
    rel_w: width table ``[2 * k_width - 1, depth]`` shared by the heads, or
      ``[heads, 2 * k_width - 1, depth]`` per head; row m is the offset
      m - (k_width - 1).
    rel_h: height table, ``[2 * k_height - 1, depth]`` or
      ``[heads, 2 * k_height - 1, depth]``.
    query_strides: (s_y, s_x), the query spacing on the key grid.

  Returns:
    Logits ``[batch, heads, q_height, q_width, k_height, k_width]``.

  Raises:
    ValueError: on bad ranks, even table lengths, or queries outside the grid.
  """
  owner = 'relative_logits_2d'
  checks.check_rank(owner, 'q', q, (5,), '[batch, height, width, heads, depth]')
  checks.check_rank(
      owner, 'rel_w', rel_w, (2, 3), '[2 * width - 1, depth] or [heads, 2 * width - 1, depth]'
  )
  checks.check_rank(
      owner, 'rel_h', rel_h, (2, 3), '[2 * height - 1, depth] or [heads, 2 * height - 1, depth]'
  )
  s_y, s_x = checks.as_tuple(owner, 'query_strides', query_strides, 2)
  _, q_height, q_width, heads, _ = q.shape
  for name, table in (('rel_w', rel_w), ('rel_h', rel_h)):
    if table.ndim == 3 and table.shape[0] != heads:
      raise ValueError(
          f'{owner}: {name} has shape {table.shape}; a per-head table needs '
          f'{heads} heads (q has shape {q.shape}).'
      )
  sizes = []
  for name, table, stride, num_q in (
      ('rel_h', rel_h, s_y, q_height),
      ('rel_w', rel_w, s_x, q_width),
  ):
    rows = table.shape[-2]
    num_keys = (rows + 1) // 2
    if rows % 2 == 0 or stride * (num_q - 1) > num_keys - 1:
      raise ValueError(
          f'{owner}: {name} has {rows} rows; expected 2 * n - 1 rows for a key '
          f'axis of n >= stride * (queries - 1) + 1 = {stride * (num_q - 1) + 1}'
          ' positions.'
      )
    sizes.append(num_keys)
  k_height, k_width = sizes

  eq_w = 'byxhd,hmd->bhyxm' if rel_w.ndim == 3 else 'byxhd,md->bhyxm'
  rel_x = jnp.einsum(eq_w, q, rel_w)  # [b, h, y, x, 2W_k-1]
  logits_w = _rel_to_abs(rel_x, k_width, s_x)  # [b, h, y, x, W_k]
  eq_h = 'byxhd,hmd->bhxym' if rel_h.ndim == 3 else 'byxhd,md->bhxym'
  rel_y = jnp.einsum(eq_h, q, rel_h)  # [b, h, x, y, 2H_k-1]
  logits_h = _rel_to_abs(rel_y, k_height, s_y)  # [b, h, x, y, H_k]
  logits_h = jnp.swapaxes(logits_h, 2, 3)  # [b, h, y, x, H_k]
  return logits_h[..., :, None] + logits_w[..., None, :]


def sine_encoding_1d(length: int, depth: int) -> np.ndarray:
  """Vaswani et al. sinusoids ``[length, depth]`` for positions 0..length-1.

  ``pe[p, 2i] = sin(p * 10000^(-2i/depth))``, ``pe[p, 2i+1] = cos(p *
  10000^(-2i/depth))``; an odd ``depth`` ends with a sine channel.
  """
  positions = np.arange(length, dtype=np.float64)[:, None]
  channel = np.arange(depth)
  freqs = 10000.0 ** (-(channel - channel % 2) / max(depth, 1))
  angles = positions * freqs[None, :]
  return np.where(channel % 2 == 0, np.sin(angles), np.cos(angles))


def sine_encoding_2d(height: int, width: int, channels: int) -> np.ndarray:
  """2D sinusoidal encoding ``[height, width, channels]``.

  The first ceil(channels / 2) channels are ``sine_encoding_1d`` of the row y,
  the remaining floor(channels / 2) that of the column x.
  """
  depth_y = (channels + 1) // 2
  depth_x = channels - depth_y
  enc_y = np.broadcast_to(sine_encoding_1d(height, depth_y)[:, None, :], (height, width, depth_y))
  enc_x = np.broadcast_to(sine_encoding_1d(width, depth_x)[None, :, :], (height, width, depth_x))
  return np.concatenate([enc_y, enc_x], axis=-1)


def coord_channels(height: int, width: int) -> np.ndarray:
  """CoordConv channels ``[height, width, 2]``: (y, x) scaled to [-1, 1].

  An axis of size 1 gets the coordinate 0.
  """

  def axis(n):
    return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros((1,))

  y, x = np.meshgrid(axis(height), axis(width), indexing='ij')
  return np.stack([y, x], axis=-1)


class AugmentedConv2D(nn.Module):
  """Attention-augmented 2D convolution, [AA]: Concat[Conv(X), MHA(X)].

  Input ``[batch, height, width, channels]``; output ``[batch, ceil(height /
  s_y), ceil(width / s_x), features]``: the first ``features - d_v`` channels
  are a 'SAME'-padded convolution, the last ``d_v`` the multi-head attention of
  [MHA], [O], [REL] (see the module docstring for the equations and for every choice
  the paper left open).

  Attributes:
    features: F_out, total output channels.
    kernel_size: kernel of the convolution branch (int or (k_h, k_w)).
    strides: strides of both branches (int or (s_y, s_x)); see
      ``attention_downsample``.
    key_ratio: kappa, d_k = kappa * features.
    value_ratio: nu, d_v = nu * features (d_v < features).
    num_heads: N_h; d_k and d_v must be divisible by it.
    position: ``'relative'`` (2D relative logits, paper default), ``'none'``,
      ``'sine2d'`` (sinusoids added to the attention input) or ``'coordconv'``
      ((y, x) channels concatenated to the attention input).
    attention_downsample: how the attention branch follows ``strides``:
      ``'avg_pool'`` (attention on the average-pooled map), ``'subsample'``
      (attention on the pixels (s_y a, s_x b)) or ``'query_subsample'``
      (queries at (s_y a, s_x b), keys and values at full resolution). All
      three coincide for stride 1.
    depth_rounding: ``'error'`` or ``'nearest'``; see ``attention_depths``.
    relative_per_head: one pair of relative tables per head instead of one
      shared pair.
    use_bias: whether the convolution and both 1x1 convolutions have biases.
    dtype: compute dtype (None: inferred from inputs and params).
    param_dtype: dtype of the parameters.
  """

  features: int
  kernel_size: int | Sequence[int] = (3, 3)
  strides: int | Sequence[int] = (1, 1)
  key_ratio: float = 0.2
  value_ratio: float = 0.2
  num_heads: int = 8
  position: str = 'relative'
  attention_downsample: str = 'avg_pool'
  depth_rounding: str = 'error'
  relative_per_head: bool = False
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32

  def _check_config(self) -> tuple[tuple[int, int], tuple[int, int], int, int]:
    """Validates the fields; returns (kernel_size, strides, d_k, d_v)."""
    checks.check_positive(_OWNER, 'features', self.features, integer=True)
    checks.check_positive(_OWNER, 'num_heads', self.num_heads, integer=True)
    kernel_h, kernel_w = checks.as_tuple(_OWNER, 'kernel_size', self.kernel_size, 2)
    stride_h, stride_w = checks.as_tuple(_OWNER, 'strides', self.strides, 2)
    checks.check_choice(_OWNER, 'position', self.position, POSITIONS)
    checks.check_choice(_OWNER, 'attention_downsample', self.attention_downsample, DOWNSAMPLES)
    d_k, d_v = attention_depths(
        self.features, self.key_ratio, self.value_ratio, self.num_heads, self.depth_rounding
    )
    return (kernel_h, kernel_w), (stride_h, stride_w), d_k, d_v

  def _relative_table(self, name: str, num_keys: int, depth: int) -> jax.Array:
    """The ``[(heads,) 2 * num_keys - 1, depth]`` table r^W or r^H."""
    shape = (2 * num_keys - 1, depth)
    if self.relative_per_head:
      shape = (self.num_heads,) + shape
    if self.has_variable('params', name):
      got = self.get_variable('params', name).shape
      if tuple(got) != shape:
        raise ValueError(
            f'{_OWNER}: params[{name!r}] has shape {tuple(got)} but this input '
            f'needs {shape} (2 * {num_keys} - 1 relative offsets); the relative '
            'tables are sized by the key grid of the first call, so apply the '
            'layer to feature maps of that size.'
        )
    init = nn.initializers.normal(stddev=depth**-0.5)
    return self.param(name, init, shape, self.param_dtype)

  def _attention(self, x: jax.Array, strides: tuple[int, int], d_k: int, d_v: int) -> jax.Array:
    """MHA branch: ``[b, H, W, C]`` -> ``[b, ceil(H/s_y), ceil(W/s_x), d_v]``."""
    query_strides = (1, 1)
    if strides != (1, 1):
      if self.attention_downsample == 'avg_pool':
        x = nn.avg_pool(x, strides, strides, padding='SAME', count_include_pad=False)
      elif self.attention_downsample == 'subsample':
        x = x[:, :: strides[0], :: strides[1]]
      else:
        query_strides = strides
    batch, k_height, k_width, channels = x.shape
    if self.position == 'sine2d':
      x = x + jnp.asarray(sine_encoding_2d(k_height, k_width, channels), x.dtype)
    elif self.position == 'coordconv':
      coords = jnp.asarray(coord_channels(k_height, k_width), x.dtype)
      x = jnp.concatenate([x, jnp.broadcast_to(coords, (batch, k_height, k_width, 2))], axis=-1)

    qkv = nn.Conv(
        2 * d_k + d_v,
        (1, 1),
        use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='qkv',
    )(x)
    q, k, v = jnp.split(qkv, [d_k, 2 * d_k], axis=-1)
    q = q[:, :: query_strides[0], :: query_strides[1]]
    heads = self.num_heads
    depth_k = d_k // heads
    q = q.reshape(q.shape[:3] + (heads, depth_k)) * (depth_k**-0.5)
    k = k.reshape(k.shape[:3] + (heads, depth_k))
    v = v.reshape(v.shape[:3] + (heads, d_v // heads))

    logits = jnp.einsum('byxhd,bzwhd->bhyxzw', q, k)
    if self.position == 'relative':
      rel_w = self._relative_table('rel_width', k_width, depth_k)
      rel_h = self._relative_table('rel_height', k_height, depth_k)
      logits = logits + relative_logits_2d(
          q, rel_w.astype(q.dtype), rel_h.astype(q.dtype), query_strides
      )
    flat = logits.reshape(logits.shape[:4] + (k_height * k_width,))
    weights = jax.nn.softmax(flat.astype(jnp.float32), axis=-1)
    weights = weights.astype(v.dtype).reshape(logits.shape)
    out = jnp.einsum('bhyxzw,bzwhd->byxhd', weights, v)
    out = out.reshape(out.shape[:3] + (d_v,))
    return nn.Conv(
        d_v,
        (1, 1),
        use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='attn_out',
    )(out)

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    """Applies the layer.

    Args:
      inputs: ``[batch, height, width, channels]``.

    Returns:
      ``[batch, ceil(height / s_y), ceil(width / s_x), features]``: conv
      channels first, then the d_v attention channels.

    Raises:
      ValueError: at trace time, for a bad field or an input of rank != 4.
    """
    kernel, strides, d_k, d_v = self._check_config()
    checks.check_rank(_OWNER, 'inputs', inputs, (4,), '[batch, height, width, channels]')
    conv = nn.Conv(
        self.features - d_v,
        kernel,
        strides,
        padding='SAME',
        use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='conv',
    )(inputs)
    attn = self._attention(inputs, strides, d_k, d_v)
    return jnp.concatenate([conv, attn.astype(conv.dtype)], axis=-1)
