"""The learned area key of the rich form (Eq. 5-9): :class:`AreaKeyEncoder`."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes

from contextpool_jax.base import checks
from contextpool_jax.layers.area_attention.areas import check_area_options
from contextpool_jax.layers.area_attention.validate import check_embedding_dim

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]


class AreaKeyEncoder(nn.Module):
  """Learned area key of the rich form (Eq. 5-9), as tensor2tensor computes it.

  ``mode='concat'`` is Eq. 9 literally (a matmul of a concatenation equals the
  sum of per-block matmuls):
  ``k = ReLU([f; sigma; e_h; e_w] W + b1) Wd + bd`` with
  ``W = [W1; W2; W3]`` of shape ``[2 D + 2 S, hidden]``, where ``f`` is the
  base area feature (mean, max or sample, chosen by the caller), ``sigma`` the
  std of the item keys (Eq. 5), ``e_h = E_h[h - 1]``, ``e_w = E_w[w - 1]`` the
  height/width embeddings (Eq. 6-8; the one-hot products of Eq. 6-7 are table
  lookups), each ``S = D // 2`` wide by default (tensor2tensor's
  ``depth // 2``; the paper does not give S). Without ``std`` (tensor2tensor's
  ``max_concat`` and ``sample_concat``): ``k = ReLU([f; e_h; e_w] W + b1) Wd +
  bd``, ``W: [D + 2 S, hidden]``.

  ``mode='sum'`` is tensor2tensor's tied variant: the features are added
  element-wise before one projection, ``k = ReLU((f + sigma + [e_h; e_w]) W +
  b1) Wd + bd`` (``sigma`` only if ``std`` is given), ``W: [D, hidden]``, so
  ``2 S`` must equal ``D`` (an even ``D``; tensor2tensor fails otherwise).

  The paper does not say whether the MLP is shared by the heads; by default it
  is (as in tensor2tensor, which applies it to every head's ``D``-dim
  features), ``per_head=True`` gives every head its own ``W, b1, Wd, bd`` (a
  leading ``[heads]`` axis). Embeddings are shared by the heads in both cases.

  Parameters: ``height_embedding [max_area_height, S]``,
  ``width_embedding [max_area_width, S]``, ``hidden_kernel [(heads,) in,
  hidden]``, ``hidden_bias [(heads,) hidden]``, ``output_kernel [(heads,)
  hidden, D]``, ``output_bias [(heads,) D]`` (biases iff ``use_bias``); ``in =
  2 D + 2 S`` (concat with std), ``D + 2 S`` (concat without) or ``D`` (sum).

  Attributes:
    max_area_width: rows of the width embedding table.
    max_area_height: rows of the height embedding table.
    mode: ``'concat'`` (Eq. 9) or ``'sum'`` (tied variant).
    hidden_dim: width of the ReLU layer; ``None`` -> ``D`` (the paper's
      ``W1 in R^{D x D}`` reading, tensor2tensor's ``units=depth``).
    embedding_dim: ``S``, depth of each shape embedding; ``None`` -> ``D //
      2``; for ``'sum'`` only ``None`` or ``D / 2``.
    per_head: separate MLP parameters per head.
    use_bias: biases in both layers.
    dtype: compute dtype (``None``: inferred from inputs and params).
    param_dtype: parameter dtype.
    kernel_init: kernel initializer (fan-in of the whole ``in`` dimension).
    bias_init: bias initializer.
    embedding_init: shape-embedding initializer.
  """

  max_area_width: int
  max_area_height: int = 1
  mode: str = 'concat'
  hidden_dim: int | None = None
  embedding_dim: int | None = None
  per_head: bool = False
  use_bias: bool = True
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = nn.initializers.lecun_normal()
  bias_init: Initializer = nn.initializers.zeros_init()
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

  @nn.compact
  def __call__(self, base: Array, std: Array | None, height: Array, width: Array) -> Array:
    """Computes area keys.

    Args:
      base: ``[batch, num_areas, heads, D]`` base feature ``f``.
      std: ``[batch, num_areas, heads, D]`` standard deviation ``sigma``, or
        ``None`` for a key without the std term.
      height: ``[num_areas]`` int area heights in ``1..max_area_height``.
      width: ``[num_areas]`` int area widths in ``1..max_area_width``.

    Returns:
      ``[batch, num_areas, heads, D]`` area keys.
    """
    owner = 'AreaKeyEncoder'
    checks.check_choice(owner, 'mode', self.mode, ('concat', 'sum'))
    check_area_options(owner, self.max_area_width, self.max_area_height, 1)
    checks.check_positive(owner, 'hidden_dim', self.hidden_dim, allow_none=True, integer=True)
    checks.check_positive(owner, 'embedding_dim', self.embedding_dim, allow_none=True, integer=True)
    checks.check_rank(owner, 'base', base, (4,), '[batch, num_areas, heads, depth]')
    if std is not None:
      checks.check_rank(owner, 'std', std, (4,), '[batch, num_areas, heads, depth]')
      if std.shape != base.shape:
        raise ValueError(f'{owner}: std shape {std.shape} != base shape {base.shape}.')
    heads, depth = base.shape[2], base.shape[3]
    check_embedding_dim(
        owner, 'embedding_dim', self.embedding_dim, 'mode', self.mode, self.mode, depth
    )
    emb_dim = self.embedding_dim or depth // 2
    hidden = self.hidden_dim or depth
    num_features = 2 if std is not None else 1
    in_dim = depth if self.mode == 'sum' else num_features * depth + 2 * emb_dim
    lead = (heads,) if self.per_head else ()

    e_h_table = self.param(
        'height_embedding', self.embedding_init, (self.max_area_height, emb_dim), self.param_dtype
    )
    e_w_table = self.param(
        'width_embedding', self.embedding_init, (self.max_area_width, emb_dim), self.param_dtype
    )
    w_in = self.param('hidden_kernel', self.kernel_init, lead + (in_dim, hidden), self.param_dtype)
    w_out = self.param('output_kernel', self.kernel_init, lead + (hidden, depth), self.param_dtype)
    b_in = b_out = None
    if self.use_bias:
      b_in = self.param('hidden_bias', self.bias_init, lead + (hidden,), self.param_dtype)
      b_out = self.param('output_bias', self.bias_init, lead + (depth,), self.param_dtype)
    base, std, e_h_table, e_w_table, w_in, w_out, b_in, b_out = dtypes.promote_dtype(
        base, std, e_h_table, e_w_table, w_in, w_out, b_in, b_out, dtype=self.dtype
    )
    e_h = jnp.take(e_h_table, jnp.asarray(height) - 1, axis=0)  # [num_areas, S]
    e_w = jnp.take(e_w_table, jnp.asarray(width) - 1, axis=0)
    shape_emb = jnp.concatenate([e_h, e_w], -1)  # [num_areas, 2 S]

    if self.per_head:
      mm = lambda x, w: jnp.einsum('...hi,hio->...ho', x, w)
      mm_shape = lambda e, w: jnp.einsum('ai,hio->aho', e, w)  # [num_areas, heads, out]
    else:
      mm = lambda x, w: jnp.einsum('...i,io->...o', x, w)
      mm_shape = lambda e, w: jnp.einsum('ai,io->ao', e, w)[:, None, :]
    if self.mode == 'concat':  # [f; sigma; e] W as f W1 + sigma W2 + e W3
      pre = mm(base, w_in[..., :depth, :]) + mm_shape(
          shape_emb, w_in[..., in_dim - 2 * emb_dim :, :]
      )
      if std is not None:
        pre = pre + mm(std, w_in[..., depth : 2 * depth, :])
    else:  # (f + sigma + e) W as (f + sigma) W + e W: e is not broadcast to the batch
      pre = mm(base if std is None else base + std, w_in) + mm_shape(shape_emb, w_in)
    if b_in is not None:
      pre = pre + b_in
    out = mm(nn.relu(pre), w_out)
    if b_out is not None:
      out = out + b_out
    return out
