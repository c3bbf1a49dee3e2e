"""Lambda layers (Bello, "LambdaNetworks", ICLR 2021) in Flax Linen.

A lambda layer summarises its context into one small linear map per query
position (a "lambda") instead of an attention map, and applies that map to the
query. With self-context (C = X, so m ranges over the same positions as n) and
the multi-query formulation (paper Sec. 3.1-3.2; equation labels L1-L5 are
this module's), per position n and query head h::

  (L1) Q = BN(X W_Q) [n, h, k];  K = X W_K [m, k, u];  V = BN(X W_V) [m, v, u],
       |v| = d_out / |h|
  (L2) K̄ = softmax(K, axis=m)                      normalised keys
  (L3) λ^c   = K̄^T V   = Σ_m Σ_u K̄_mku V_mvu  [k, v]  content lambda (shared)
       λ^p_n = E_n^T V = Σ_m Σ_u E_nmku V_mvu [k, v]  position lambdas
  (L4) λ_n = λ^c + λ^p_n
  (L5) y_nh = λ_n^T q_nh  [v]; the |h| heads are concatenated into h * v = d_out.

Relative position embeddings are translation invariant, E_nm = R[pos(m) -
pos(n)], so the position lambdas are a cross-correlation of V with the table R
and are computed with ``jax.lax.conv_general_dilated``; the ``[n, m, k, u]``
tensor E is never materialised (memory O(n k v) rather than O(n m k)). The
price is FLOPs: a 'global' correlation visits (2H - 1)(2W - 1) offsets per
query, about 4x the n * m products of the direct sum (most taps hit padding).

Table indexing (sign convention). The learned table R has shape
``[*kernel, k, u]``; along each spatial axis of size ``s`` the table entry at
index ``j`` is the embedding of the offset ``pos(m) - pos(n) = j - c`` with
centre ``c = (s - 1) // 2``: context position *minus* query position, so
``R[c + 1]`` is the embedding of the context position one step after (below /
to the right of) the query. Thus::

  'global': kernel = (2H - 1, 2W - 1) (1D: 2L - 1), c = (H - 1, W - 1);
            every query sees every context position.
  'conv':   kernel = (r_h, r_w) (1D: r), c = (r // 2); E_nm = 0 when the offset
            is outside the scope; context outside the input is zero padding
            (it contributes nothing). The content lambda stays global.
  'none':   no position lambda (content-only ablation).

Only the offsets an input of the given size can reach, ``|offset| <= size - 1``,
are used; a 'conv' scope larger than 2 * size - 1 is cropped to it (same
result, less work on small inputs).

Four exact algorithms for the position lambdas (``position_algorithm``;
:func:`position_lambdas`, :func:`position_lambdas_rows`,
:func:`position_lambdas_banded`, :func:`position_lambdas_fft`,
:func:`choose_position_algorithm`)::

  'correlation': the cross-correlation above (position_lambdas);
            memory O(batch n k v), ~4x the direct FLOPs for 'global'.
  'rows':   'global' on a grid only (position_lambdas_rows): the direct
            sum over m, one query row at a time. The table is unrolled along
            the width into the Toeplitz blocks T[di][J, j] = R[di, J - j]
            ([2H - 1, W, u, W, k], ~2 n W k u elements, built once), and each
            query row i is one matrix product of the H blocks di = I - i with
            all of V: exactly the n * m * k * v * u products of L3, memory
            bounded by the table (never an [n, m] map). A custom VJP keeps
            the backward pass at the same cost and memory.
  'banded': the same correlation with wide features
            (position_lambdas_banded): the width is cut into blocks of
            B = 4 query columns, and each block is one convolution along the
            height with the table as a banded [(B + r_w - 1) u, B k] map. The
            correlation's |u| (= 1) input features leave XLA's CPU convolution
            at a few GFLOP/s; the banded form is a dense matrix product with
            (B + r_w - 1) / r_w of the direct products (1.13x at r = 23).
            Memory: ~(B + r_w - 1) / B times the values (forward), ~r_h
            times the values (backward, a custom VJP: the transpose of the
            correlation with its rows unfolded into features).
  'fft':    the same correlation by the correlation theorem
            (position_lambdas_fft): per example, FFTs of the v u value maps
            and the v k outputs (length >= size + reach per axis, so the
            circular correlation is the linear one) and v u k products per
            frequency: ~0.1 of the direct FLOPs at 56x56, r = 23; exact to
            float32 rounding (~1e-6 of the largest output).
  'auto':   'rows' for 'global' on a grid whenever its table is smaller than
            an n x m map (|T| < n^2, i.e. roughly H > 2 k u), else
            'correlation'; for 'conv', 'fft' on a grid whose reachable scope
            has more than FFT_MIN_TAPS = 256 taps (r >= 17), else 'banded'
            (choose_position_algorithm). The scanned axis of 'rows' is the
            longer one (the table is then the smaller).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
from flax.linen import dtypes
import jax
import jax.numpy as jnp
from jax import lax

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.base import checks

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
PrecisionLike = Any

_OWNER = 'LambdaLayer'
POSITIONS = ('global', 'conv', 'none')
POSITION_ALGORITHMS = ('auto', 'correlation', 'rows', 'banded', 'fft')
_EMBEDDING = 'position_embedding'


def normalize_keys(keys: Array) -> Array:
  """Softmax of the keys over the context positions (L2).

  Args:
    keys: ``[batch, m, k, u]``.

  Returns:
    ``[batch, m, k, u]``, summing to one over ``m`` for every ``(k, u)``.
    Computed in float32 (a softmax over thousands of positions loses too much
    in bfloat16), returned in the input dtype.
  """
  return jax.nn.softmax(keys.astype(jnp.float32), axis=1).astype(keys.dtype)


def content_lambda(
    keys_normalized: Array, values: Array, *, precision: PrecisionLike = None
) -> Array:
  """λ^c = Σ_m Σ_u K̄_mku V_mvu (L3, content lambda; sums over ``|u|``).

  Args:
    keys_normalized: ``[batch, m, k, u]``.
    values: ``[batch, m, v, u]``.
    precision: ``jax.lax.Precision`` for the contraction.

  Returns:
    ``[batch, k, v]``, one lambda shared by every query position.
  """
  return jnp.einsum('bmku,bmvu->bkv', keys_normalized, values, precision=precision)


def table_reach(kernel: Sequence[int], spatial: Sequence[int]) -> tuple[int, ...]:
  """Per axis, the largest offset a centred table of odd sizes ``kernel`` holds that an
  input of sizes ``spatial`` can reach: ``min((kernel - 1) // 2, spatial - 1)``."""
  return tuple(min((t - 1) // 2, s - 1) for t, s in zip(kernel, spatial))


def reachable_table(table: Array, spatial: Sequence[int]) -> tuple[Array, tuple[int, ...]]:
  """Crops a centred relative table to the offsets an input can reach.

  Args:
    table: ``[*kernel, k, u]`` with odd kernel sizes; index ``c + o`` holds the
      embedding of offset ``o = pos(m) - pos(n)``, ``c = (size - 1) // 2``.
    spatial: input sizes ``(L,)`` or ``(H, W)``.

  Returns:
    ``(cropped, reach)``: ``cropped`` is ``[*(2 * reach + 1), k, u]`` holding
    offsets ``-reach .. reach`` per axis, ``reach_i = min(c_i, spatial_i - 1)``.
  """
  reach = table_reach(table.shape[:-2], spatial)
  index = tuple(
      slice((t - 1) // 2 - r, (t - 1) // 2 + r + 1) for t, r in zip(table.shape[:-2], reach)
  )
  return table[index], reach


def position_lambdas(values: Array, table: Array, *, precision: PrecisionLike = None) -> Array:
  """λ^p_n = Σ_m Σ_u R[pos(m) - pos(n)]_ku V_mvu as a convolution (L3).

  The sum over m with a translation-invariant E_nm is the cross-correlation
  ``λ^p[n] = Σ_o R[c + o] V[n + o]`` with zero padding, i.e.
  ``lax.conv_general_dilated`` with ``|u|`` input features, ``|k|`` output features
  and ``|v|`` folded into the batch (one correlation per value channel; the paper's
  "lambda convolution"). Memory: the output, O(batch n k v); E is never built.

  Args:
    values: ``[batch, *spatial, v, u]`` (spatial = ``(L,)`` or ``(H, W)``).
    table: ``[*kernel, k, u]`` relative embeddings, centred as documented in the
      module docstring; offsets beyond ``spatial - 1`` are cropped away.
    precision: ``jax.lax.Precision`` for the convolution.

  Returns:
    ``[batch, v, *spatial, k]`` position lambdas (``|v|`` before the positions).
  """
  batch, *spatial, depth_v, depth_u = values.shape
  spatial_rank = len(spatial)
  kernel, reach = reachable_table(table, spatial)
  kernel = jnp.swapaxes(kernel, -1, -2)  # [*kernel, u, k]: spatial..., I, O.
  lhs = jnp.moveaxis(values, -2, 1).reshape(batch * depth_v, *spatial, depth_u)
  spec = 'N' + 'HW'[:spatial_rank] + 'C'
  kernel_spec = 'HW'[:spatial_rank] + 'IO'
  numbers = lax.conv_dimension_numbers(lhs.shape, kernel.shape, (spec, kernel_spec, spec))
  out = lax.conv_general_dilated(
      lhs,
      kernel,
      window_strides=(1,) * spatial_rank,
      padding=tuple((r, r) for r in reach),
      dimension_numbers=numbers,
      precision=precision,
  )
  return out.reshape(batch, depth_v, *spatial, out.shape[-1])


def rows_table_size(spatial: Sequence[int], depth_k: int, depth_u: int) -> int:
  """Elements of the Toeplitz table of the 'rows' algorithm for a grid.

  The longer axis is scanned (size ``a``), the shorter one (size ``s``) is
  unrolled: ``(2a - 1) * s * s * k * u`` elements.
  """
  scanned, unrolled = max(spatial), min(spatial)
  return (2 * scanned - 1) * unrolled * unrolled * depth_k * depth_u


# 'auto' takes 'fft' for a lambda convolution on a grid whose reachable kernel has more taps
# than this (17 x 17 and up; 'banded' at 13 x 13 and below): the crossover measured at 56x56 and
# 28x28, batch 1, 2 and 8, forward and forward+backward (benchmarks/results/lambda_conv_forward_cpu.md).
FFT_MIN_TAPS = 256


def choose_position_algorithm(
    position: str,
    spatial: Sequence[int],
    depth_k: int,
    depth_u: int,
    kernel: Sequence[int] | None = None,
) -> str:
  """'auto': which exact algorithm computes the position lambdas.

  For ``position='conv'``: 'fft' on a grid whose reachable kernel (``kernel``,
  the table's spatial shape, cropped as :func:`reachable_table` crops it) has
  more than :data:`FFT_MIN_TAPS` taps, else 'banded' (sequences, small scopes,
  small grids): each measured the faster there, forward and forward+backward
  (benchmarks/results/lambda_conv_forward_cpu.md; 'banded' beat 'correlation' at
  every conv shape tried, 7x faster forward at the peers table's 56x56, r = 23).
  'rows' (direct sum, ~4x fewer FLOPs than the correlation for a global table)
  for ``position='global'`` on a grid whenever its Toeplitz table is smaller
  than one ``[n, m]`` map (n = m = H * W), so no [n, m]-sized intermediate
  ever exists; otherwise 'correlation' (global sequences and small global grids
  with ``H < ~2 k u``: there 'banded' would need ~W / 2 times the values'
  memory for its windows).
  """
  if position == 'conv':
    if len(spatial) != 2 or kernel is None:
      return 'banded'
    reach = table_reach(kernel, spatial)
    return 'fft' if math.prod(2 * r + 1 for r in reach) > FFT_MIN_TAPS else 'banded'
  if position != 'global' or len(spatial) != 2:
    return 'correlation'
  num = math.prod(spatial)
  return 'rows' if rows_table_size(spatial, depth_k, depth_u) < num * num else 'correlation'


def row_toeplitz(table: Array, width: int) -> Array:
  """Unrolls a global 2D table along the width into Toeplitz blocks.

  Args:
    table: ``[2H - 1, 2 * width - 1, k, u]``, centred (module docstring).
    width: W, the grid width.

  Returns:
    ``[2H - 1, W, u, W, k]`` with ``T[di, J, :, j, :] = R[di, c + J - j]^T``
    (``c = width - 1``): block ``di`` maps a context row's ``[J, u]`` to a
    query row's ``[j, k]`` for the row offset ``di - (H - 1)``.
  """
  cols = jnp.arange(width)
  index = cols[:, None] - cols[None, :] + width - 1  # [J, j]
  return jnp.transpose(table[:, index], (0, 1, 4, 2, 3))


def _row_blocks(toeplitz: Array, i: Array, height: int) -> Array:
  """The H blocks of query row i, ``di = I - i``: ``[H(I), W(J), u, W(j), k]``."""
  return lax.dynamic_slice_in_dim(toeplitz, height - 1 - i, height, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rows_core(values: Array, toeplitz: Array, precision: PrecisionLike) -> Array:
  """``[H, W, u, c], [2H - 1, W, u, W, k] -> [H(i), W(j), k, c]`` (c = batch * v)."""
  height = values.shape[0]

  def row(i):
    blocks = _row_blocks(toeplitz, i, height)
    return jnp.einsum('IJujk,IJuc->jkc', blocks, values, precision=precision)

  return lax.map(row, jnp.arange(height))


def _rows_core_fwd(values, toeplitz, precision):
  return _rows_core(values, toeplitz, precision), (values, toeplitz)


def _rows_core_bwd(precision, residuals, grad):
  """One scan over query rows: dV += T_i^T g_i, dT[blocks of i] += g_i V^T."""
  values, toeplitz = residuals
  height = values.shape[0]

  def step(carry, i):
    d_values, d_toeplitz = carry
    blocks = _row_blocks(toeplitz, i, height)
    g = grad[i]  # [j, k, c]
    d_values = d_values + jnp.einsum('IJujk,jkc->IJuc', blocks, g, precision=precision)
    d_blocks = jnp.einsum('jkc,IJuc->IJujk', g, values, precision=precision)
    d_blocks = d_blocks + _row_blocks(d_toeplitz, i, height)
    d_toeplitz = lax.dynamic_update_slice_in_dim(d_toeplitz, d_blocks, height - 1 - i, axis=0)
    return (d_values, d_toeplitz), None

  init = (jnp.zeros_like(values), jnp.zeros_like(toeplitz))
  (d_values, d_toeplitz), _ = lax.scan(step, init, jnp.arange(height))
  return d_values, d_toeplitz


_rows_core.defvjp(_rows_core_fwd, _rows_core_bwd)


def position_lambdas_rows(values: Array, table: Array, *, precision: PrecisionLike = None) -> Array:
  """λ^p_n = Σ_m R[pos(m) - pos(n)] V_m as the direct sum, row by row (L3).

  Same result as :func:`position_lambdas` for a global table on a grid,
  computed without the correlation's padding taps: for every query row i,
  ``λ^p[i, j] = Σ_I Σ_J Σ_u T[I - i][J, u, j] V[I, J, u]`` with the Toeplitz
  blocks of :func:`row_toeplitz` -- one ``[W k, H W u] x [H W u, batch v]``
  matrix product per row (``lax.map``), n * m * k * v * u products in all.
  Memory: the table and its gradient (``[2H - 1, W, u, W, k]`` each) plus
  one row's blocks; the backward pass (custom VJP) is one scan over the rows
  with the same products. The longer spatial axis is the scanned one.

  Args:
    values: ``[batch, H, W, v, u]``.
    table: ``[2h - 1, 2w - 1, k, u]`` with ``h >= H``, ``w >= W`` (a larger
      global table is cropped to its centre).
    precision: ``jax.lax.Precision`` for the products.

  Returns:
    ``[batch, v, H, W, k]`` position lambdas (as :func:`position_lambdas`).
  """
  if values.ndim != 5 or table.ndim != 4:
    raise ValueError(
        'position_lambdas_rows needs a grid: values [batch, H, W, v, u] and '
        f'table [2H - 1, 2W - 1, k, u]; got {values.shape} and {table.shape}.'
    )
  batch, height, width, depth_v, depth_u = values.shape
  table, _ = reachable_table(table, (height, width))
  if width > height:  # Scan the longer axis: transpose the grid and the table.
    out = position_lambdas_rows(
        jnp.swapaxes(values, 1, 2), jnp.swapaxes(table, 0, 1), precision=precision
    )
    return jnp.swapaxes(out, 2, 3)
  toeplitz = row_toeplitz(table, width)
  flat = jnp.transpose(values, (1, 2, 4, 0, 3)).reshape(height, width, depth_u, batch * depth_v)
  out = _rows_core(flat, toeplitz, precision)  # [H, W, k, batch * v]
  out = out.reshape(height, width, table.shape[-2], batch, depth_v)
  return jnp.transpose(out, (3, 4, 0, 1, 2))


#: Query columns per block of the 'banded' algorithm: a block of B query columns
#: reads B + r_w - 1 context columns, so the products are (B + r_w - 1) / r_w of
#: the direct sum's (1.13x at B = 4, r = 23). B = 2, 4, 8 and 16 timed alike within
#: noise at the peers' conv shape; 4 wastes little and keeps the features wide
#: (benchmarks/results/lambda_conv_forward_cpu.md).
BANDED_BLOCK = 4


def banded_kernel(kernel: Array, block: int) -> Array:
  """The conv table as a banded map from a block of context columns to query columns.

  Args:
    kernel: ``[kh, kw, k, u]`` (odd sizes, centred as documented in the module
      docstring), already cropped to the reachable offsets.
    block: B, query columns per block.

  Returns:
    ``[kh, 1, (B + kw - 1) * u, B * k]``: entry ``[O, 0, (J, u), (j, k)]`` is
    ``R[O, J - j, k, u]`` where ``0 <= J - j < kw``, else 0. Column ``J`` of a
    block's window is context column ``start - kw // 2 + J`` of query column
    ``start + j``, so ``J - j`` is the table index of their offset.
  """
  kh, kw, depth_k, depth_u = kernel.shape
  span = block + kw - 1
  index = jnp.arange(span)[:, None] - jnp.arange(block)[None, :]  # [J, j]
  inside = (index >= 0) & (index < kw)
  band = kernel[:, jnp.clip(index, 0, kw - 1)]  # [kh, J, j, k, u]
  band = jnp.where(inside[None, :, :, None, None], band, jnp.zeros((), kernel.dtype))
  band = jnp.transpose(band, (0, 1, 4, 2, 3))  # [kh, J, u, j, k]
  return band.reshape(kh, 1, span * depth_u, block * depth_k)


def _banded_forward(lhs: Array, kernel: Array, precision: PrecisionLike) -> Array:
  """``[c, H, W, u], [kh, kw, k, u] -> [c, H, W, k]``: blocks of B query columns.

  The width is cut into blocks of :data:`BANDED_BLOCK` query columns; each
  block's window of ``B + kw - 1`` context columns (zero padding outside) is
  gathered into the feature axis, and one convolution along the height with
  the banded table (:func:`banded_kernel`: ``(B + kw - 1) u`` input and ``B k``
  output features) computes the whole block. Wide features make XLA's CPU
  convolution a dense matrix product, where the |u|-feature correlation runs
  at a few GFLOP/s.
  """
  count, height, width, depth_u = lhs.shape
  kh, kw, depth_k, _ = kernel.shape
  block = min(BANDED_BLOCK, width)
  blocks = -(-width // block)
  span = block + kw - 1
  reach_h, reach_w = (kh - 1) // 2, (kw - 1) // 2
  padded = jnp.pad(lhs, ((0, 0), (0, 0), (reach_w, reach_w + blocks * block - width), (0, 0)))
  columns = block * jnp.arange(blocks)[:, None] + jnp.arange(span)[None, :]  # [blocks, span]
  windows = padded[:, :, columns].reshape(count, height, blocks, span * depth_u)
  out = lax.conv_general_dilated(
      windows,
      banded_kernel(kernel, block),
      window_strides=(1, 1),
      padding=((reach_h, reach_h), (0, 0)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=precision,
  )  # [c, H, blocks, B * k]
  out = out.reshape(count, height, blocks * block, depth_k)
  return out[:, :, :width]


def _unfolded_correlation(lhs: Array, kernel: Array, precision: PrecisionLike) -> Array:
  """``[c, H, W, u], [kh, kw, k, u] -> [c, H, W, k]``, the longer kernel axis unfolded.

  The ``kh`` (or ``kw``, if longer) shifted copies of the input are stacked
  into the feature axis (``kh * u`` features) and one convolution along the
  other axis does the rest. Differentiated by JAX, this is the backward pass
  of the 'banded' algorithm: its convolutions have ``k`` and ``kh * u``
  features, several times faster on CPU than the banded forward's own
  transposes (the scatter of overlapping windows and the band's gather).
  """
  if kernel.shape[1] > kernel.shape[0]:  # Unfold the width instead: swap the axes.
    out = _unfolded_correlation(jnp.swapaxes(lhs, 1, 2), jnp.swapaxes(kernel, 0, 1), precision)
    return jnp.swapaxes(out, 1, 2)
  height = lhs.shape[1]
  kh, kw, depth_k, depth_u = kernel.shape
  reach_h, reach_w = (kh - 1) // 2, (kw - 1) // 2
  padded = jnp.pad(lhs, ((0, 0), (reach_h, reach_h), (0, 0), (0, 0)))
  stacked = jnp.concatenate([padded[:, o : o + height] for o in range(kh)], axis=-1)
  rhs = jnp.transpose(kernel, (1, 0, 3, 2)).reshape(1, kw, kh * depth_u, depth_k)
  return lax.conv_general_dilated(
      stacked,
      rhs,
      window_strides=(1, 1),
      padding=((0, 0), (reach_w, reach_w)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=precision,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _banded_core(lhs: Array, kernel: Array, precision: PrecisionLike) -> Array:
  """``[c, H, W, u], [kh, kw, k, u] -> [c, H, W, k]`` (c = batch * v)."""
  return _banded_forward(lhs, kernel, precision)


def _banded_core_fwd(lhs, kernel, precision):
  return _banded_forward(lhs, kernel, precision), (lhs, kernel)


def _plain_correlation(lhs: Array, kernel: Array, precision: PrecisionLike) -> Array:
  """``[c, H, W, u], [kh, kw, k, u] -> [c, H, W, k]``: the |u|-feature correlation."""
  kh, kw = kernel.shape[:2]
  pad_h, pad_w = (kh - 1) // 2, (kw - 1) // 2
  return lax.conv_general_dilated(
      lhs,
      jnp.swapaxes(kernel, -1, -2),
      window_strides=(1, 1),
      padding=((pad_h, pad_h), (pad_w, pad_w)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
      precision=precision,
  )


def _banded_core_bwd(precision, residuals, grad):
  """The transpose of the (linear) correlation: from its unfolded form on a grid
  (both kernel axes longer than 1), else (sequences) from the plain correlation,
  whose transposes are the faster there and need no ``kw``-times unfolded copy."""
  lhs, kernel = residuals
  form = _unfolded_correlation if min(kernel.shape[:2]) > 1 else _plain_correlation
  _, vjp = jax.vjp(lambda a, b: form(a, b, precision), lhs, kernel)
  return vjp(grad)


_banded_core.defvjp(_banded_core_fwd, _banded_core_bwd)


def position_lambdas_banded(
    values: Array, table: Array, *, precision: PrecisionLike = None
) -> Array:
  """λ^p_n = Σ_m R[pos(m) - pos(n)] V_m as a banded matrix product per block (L3).

  Same result as :func:`position_lambdas` (the same zero-padded correlation),
  computed with wide features: the forward pass cuts the width into blocks of
  :data:`BANDED_BLOCK` query columns and applies the table as a banded
  ``[(B + kw - 1) u, B k]`` map per row offset (:func:`banded_kernel`), a
  convolution along the height only; the products are ``(B + kw - 1) / kw``
  of the direct sum's. The backward pass (custom VJP) is the transpose of the
  correlation with its longer kernel axis unfolded into features (on a grid;
  for sequences, of the plain correlation). Memory: the forward's windows,
  ``(B + kw - 1) / B`` times the values; the backward's unfolded values, ``kh``
  times the values on a grid (on the order of the output λ^p, ``k`` times the
  values).
  Sequences are a grid of height 1.

  Args:
    values: ``[batch, *spatial, v, u]`` (spatial = ``(L,)`` or ``(H, W)``).
    table: ``[*kernel, k, u]``, centred; offsets beyond ``spatial - 1`` are
      cropped away.
    precision: ``jax.lax.Precision`` for the convolutions.

  Returns:
    ``[batch, v, *spatial, k]`` position lambdas (as :func:`position_lambdas`).
  """
  batch, *spatial, depth_v, depth_u = values.shape
  kernel, _ = reachable_table(table, spatial)
  if len(spatial) == 1:
    values, kernel = values[:, None], kernel[None]
  height, width = values.shape[1:3]
  lhs = jnp.moveaxis(values, -2, 1).reshape(batch * depth_v, height, width, depth_u)
  out = _banded_core(lhs, kernel, precision)
  return out.reshape(batch, depth_v, *spatial, out.shape[-1])


def _fft_size(n: int) -> int:
  """The smallest ``m >= n`` with no prime factor above 5 (a fast FFT length)."""
  m = n
  while True:
    rest = m
    for p in (2, 3, 5):
      while rest % p == 0:
        rest //= p
    if rest == 1:
      return m
    m += 1


def _table_spectrum(table: Array, reach: Sequence[int], sizes: Sequence[int]) -> Array:
  """``[*(2 reach + 1), k, u] -> [k, u, *frequencies]``: the conjugate spectrum of the table
  with offset ``o`` placed at index ``o mod N`` (so a product with a spectrum correlates)."""
  axes = tuple(range(-len(sizes), 0))
  kernel = jnp.moveaxis(table, (-2, -1), (0, 1))  # [k, u, *kernel]
  pad = [(0, 0), (0, 0)] + [(0, n - (2 * r + 1)) for n, r in zip(sizes, reach)]
  placed = jnp.roll(jnp.pad(kernel, pad), [-r for r in reach], axis=axes)
  return jnp.conj(jnp.fft.rfftn(placed, s=sizes, axes=axes))


def _fft_correlation(values: Array, r_hat: Array, sizes: Sequence[int], precision) -> Array:
  """One example: ``[*spatial, v, u]`` and the table's spectrum -> ``[v, *spatial, k]``."""
  spatial = values.shape[:-2]
  axes = tuple(range(-len(sizes), 0))
  lhs = jnp.moveaxis(values, (-2, -1), (0, 1))  # [v, u, *spatial]: FFT axes minor
  v_hat = jnp.fft.rfftn(lhs, s=sizes, axes=axes)
  out_hat = jnp.einsum('vu...,ku...->vk...', v_hat, r_hat, precision=precision)
  out = jnp.fft.irfftn(out_hat, s=sizes, axes=axes)[(Ellipsis, *(slice(0, s) for s in spatial))]
  return jnp.moveaxis(out, 1, -1)  # [v, *spatial, k]


def position_lambdas_fft(values: Array, table: Array, *, precision: PrecisionLike = None) -> Array:
  """λ^p_n = Σ_m R[pos(m) - pos(n)] V_m by the correlation theorem (L3).

  The same zero-padded correlation as :func:`position_lambdas`, computed in the
  frequency domain: per spatial axis an FFT of length ``N >= size + reach`` (the
  next 5-smooth length), so the circular correlation equals the linear one on
  the ``size`` outputs kept; the table's offset ``o`` sits at index ``o mod N``.
  Per example the products are ``v u k`` per frequency plus FFTs of the ``v u``
  inputs and the ``v k`` outputs, against ``v u k r_h r_w`` per position for the
  direct sum: at 56x56 with r = 23, ~0.1 of its FLOPs. Computed in float32 (or
  the values' wider type) and cast back; exact up to the FFT's rounding (about
  1e-6 of the largest output in float32). One example at a time (``lax.map``): a
  batch at once leaves the ``[v, k, N, N]`` spectra out of cache (measured:
  benchmarks/results/lambda_conv_forward_cpu.md).

  Args:
    values: ``[batch, *spatial, v, u]`` (spatial = ``(L,)`` or ``(H, W)``).
    table: ``[*kernel, k, u]``, centred; offsets beyond ``spatial - 1`` are
      cropped away.
    precision: ``jax.lax.Precision`` for the product of the spectra.

  Returns:
    ``[batch, v, *spatial, k]`` position lambdas (as :func:`position_lambdas`).
  """
  spatial = values.shape[1:-2]
  kernel, reach = reachable_table(table, spatial)
  sizes = tuple(_fft_size(n + r) for n, r in zip(spatial, reach))
  work = jnp.promote_types(values.dtype, jnp.float32)
  r_hat = _table_spectrum(kernel.astype(work), reach, sizes)  # once, shared by the examples
  out = lax.map(
      lambda example: _fft_correlation(example, r_hat, sizes, precision), values.astype(work)
  )
  return out.astype(values.dtype)


class LambdaLayer(nn.Module):
  """Multi-query lambda layer with content and relative-position lambdas.

  Implements L1-L5 of the module docstring with self-context (C = X). Input
  ``[batch, length, d]`` (sequence) or ``[batch, height, width, d]`` (grid,
  height != width allowed); output ``[batch, ..., d_out]`` with the same
  leading shape, ``d_out = out_features or d``.

  Choices the paper left open (all configurable):
    * Projections have no bias: queries and values are batch-normalised (a bias
      is cancelled) and a per-channel key bias cancels in the softmax over m.
    * Initialisation: projections and the embedding table draw from
      N(0, 1 / d) (stddev d^-1/2, d = input channels), untruncated. The paper
      uses normal initialisers; the slides we work from give no scale, so the
      d^-1/2 for the table is our choice. Override with ``kernel_init`` /
      ``embedding_init``.
    * BatchNorm is over the batch and all positions, one statistic per query
      channel (h, k) and per value channel (v, u); scale 1, bias 0 at init;
      Flax defaults momentum 0.99, epsilon 1e-5.
    * Channel layouts: query kernel ``[d, h, k]``, key ``[d, k, u]``, value
      ``[d, v, u]``; the output concatenates heads as ``[h, v]`` -> ``h * v``.
      No output projection (the paper has none).
    * Global tables are sized from the first input (or ``context_size``); a
      smaller input uses the table's centre, a larger one is an error.
    * The key softmax runs in float32 whatever ``dtype`` is.

  Attributes:
    out_features: d_out; None keeps the input depth d. Must divide by ``heads``.
    key_depth: ``|k|``, query/key depth (paper default 16).
    heads: ``|h|``, number of queries per position (multi-query; default 4);
      ``|v| = d_out / |h|``.
    intra_depth: ``|u|``, intra-depth; keys/values/embeddings carry a ``|u|`` axis
      that is summed over (default 1).
    position: 'global' (relative embeddings over the whole input), 'conv'
      (lambda convolution with ``scope_size``) or 'none' (content only).
    scope_size: lambda-convolution scope r (odd; int or one per spatial
      axis); used only when position='conv' (paper: 23). Named ``scope_size``
      because ``Module.scope`` is reserved by Flax.
    content: include the content lambda λ^c; False gives the position-only
      ablation (then position must not be 'none').
    context_size: spatial size (int or per-axis) the global table covers; None
      uses the size of the input at initialisation. Only for position='global'.
    position_algorithm: how the position lambdas are computed, all exact:
      'correlation' (:func:`position_lambdas`), 'rows' (direct sum row by row,
      :func:`position_lambdas_rows`; position='global' on a grid only),
      'banded' (:func:`position_lambdas_banded`: the correlation as banded
      matrix products over blocks of columns), 'fft'
      (:func:`position_lambdas_fft`: the correlation theorem) or 'auto'
      (:func:`choose_position_algorithm`: for 'conv', 'fft' on a grid whose
      reachable scope has more than 256 taps, else 'banded'; for 'global',
      'rows' where its table is smaller than an n x m map, else
      'correlation').
    batch_norm: batch-normalise queries and values (paper default; False is the
      paper's "no batch normalization" ablation).
    batch_norm_momentum: BatchNorm running-average decay.
    batch_norm_epsilon: BatchNorm variance epsilon.
    bn_axis_name: the mapped axis name (``jax.pmap`` / ``shard_map``) over which
      BatchNorm averages its batch statistics; None = the local batch only. Leave
      it None under ``jax.jit`` with sharded arrays (the statistics are then
      already over the global batch); set it in your own ``pmap`` / ``shard_map``
      loop, or each device normalises with its own statistics and the replicas
      drift apart.
    kernel_init: initialiser of the q/k/v projections; None = N(0, 1/d).
    embedding_init: initialiser of the relative table; None = N(0, 1/d).
    precision: ``jax.lax.Precision`` for contractions and convolutions.
    dtype: computation dtype; None infers from inputs and params.
    param_dtype: dtype of the parameters.
  """

  out_features: int | None = None
  key_depth: int = 16
  heads: int = 4
  intra_depth: int = 1
  position: str = 'global'
  scope_size: int | Sequence[int] = 23
  content: bool = True
  context_size: int | Sequence[int] | None = None
  position_algorithm: str = 'auto'
  batch_norm: bool = True
  batch_norm_momentum: float = 0.99
  batch_norm_epsilon: float = 1e-5
  bn_axis_name: str | None = None
  kernel_init: Initializer | None = None
  embedding_init: Initializer | None = None
  precision: PrecisionLike = None
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32

  def _check_config(self) -> None:
    checks.check_choice(_OWNER, 'position', self.position, POSITIONS)
    checks.check_choice(_OWNER, 'position_algorithm', self.position_algorithm, POSITION_ALGORITHMS)
    checks.check_positive(_OWNER, 'key_depth', self.key_depth, integer=True)
    checks.check_positive(_OWNER, 'heads', self.heads, integer=True)
    checks.check_positive(_OWNER, 'intra_depth', self.intra_depth, integer=True)
    checks.check_positive(_OWNER, 'out_features', self.out_features, integer=True, allow_none=True)
    checks.check_choice(_OWNER, 'content', self.content, (True, False))
    checks.check_choice(_OWNER, 'batch_norm', self.batch_norm, (True, False))
    checks.check_probability(_OWNER, 'batch_norm_momentum', self.batch_norm_momentum)
    checks.check_positive(_OWNER, 'batch_norm_epsilon', self.batch_norm_epsilon)
    if self.position == 'none' and not self.content:
      raise ConfigError(
          f"{_OWNER}.content=False with {_OWNER}.position='none' leaves nothing "
          "to compute; enable the content lambda or choose position 'global' or "
          "'conv'."
      )

  def _table_shape(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
    """Kernel shape of the relative table for this input (validated)."""
    rank = len(spatial)
    if self.position == 'conv':
      if isinstance(self.scope_size, int):
        checks.check_positive(_OWNER, 'scope_size', self.scope_size, integer=True)
      scope = checks.as_tuple(_OWNER, 'scope_size', self.scope_size, rank)
      if any(r % 2 == 0 for r in scope):
        raise ConfigError(
            f'{_OWNER}.scope_size={self.scope_size!r} is invalid; expected odd '
            'positive sizes (the window is centred on the query).'
        )
      return scope
    if self.context_size is not None:
      size = checks.as_tuple(_OWNER, 'context_size', self.context_size, rank)
    elif self.has_variable('params', _EMBEDDING):
      kernel = self.get_variable('params', _EMBEDDING).shape[:-2]
      size = tuple((t + 1) // 2 for t in kernel)
    else:
      size = spatial
    if len(size) != rank:
      raise ValueError(
          f'{_OWNER}: the global table covers {len(size)} spatial '
          f'axes but the input has {rank}.'
      )
    if any(s < n for s, n in zip(size, spatial)):
      raise ValueError(
          f'{_OWNER}: input spatial size {spatial} exceeds the global table '
          f'size {size} (context_size={self.context_size!r}); set context_size '
          "to the largest input, or use position='conv'."
      )
    return tuple(2 * s - 1 for s in size)

  def _position_algorithm(
      self, spatial: tuple[int, ...], depth_k: int, depth_u: int, kernel: tuple[int, ...]
  ) -> str:
    """The algorithm of the position lambdas for this input (validated)."""
    if self.position_algorithm == 'auto':
      return choose_position_algorithm(self.position, spatial, depth_k, depth_u, kernel)
    if self.position_algorithm == 'rows' and (self.position != 'global' or len(spatial) != 2):
      raise ConfigError(
          f"{_OWNER}.position_algorithm='rows' needs position='global' and a "
          f'[batch, height, width, d] input; got position={self.position!r} and '
          f"{len(spatial)} spatial axes. Use 'auto' or 'correlation'."
      )
    return self.position_algorithm

  @nn.compact
  def __call__(self, x: Array, *, train: bool = False) -> Array:
    """Applies the lambda layer.

    Args:
      x: ``[batch, length, d]`` or ``[batch, height, width, d]``.
      train: use batch statistics in BatchNorm and update the running averages
        (then the 'batch_stats' collection must be mutable); False uses the
        running averages. A Python bool: ``nn.remat`` traces keyword
        arguments, so under remat fix it outside the remat boundary (e.g. remat
        a parent block that holds ``train`` as a field).

    Returns:
      ``[batch, length, d_out]`` or ``[batch, height, width, d_out]``.
    """
    self._check_config()
    checks.check_rank(_OWNER, 'x', x, (3, 4), '[batch, length, d] or [batch, height, width, d]')
    batch, *spatial, d = x.shape
    spatial = tuple(spatial)
    d_out = d if self.out_features is None else self.out_features
    if d_out % self.heads:
      raise ConfigError(
          f'{_OWNER}.heads={self.heads} must divide the output depth '
          f'{d_out} (out_features={self.out_features!r}, input depth {d}); '
          '|v| = d_out / heads.'
      )
    depth_v, depth_k, depth_u = d_out // self.heads, self.key_depth, self.intra_depth
    table_shape = algorithm = None
    if self.position != 'none':
      table_shape = self._table_shape(spatial)
      algorithm = self._position_algorithm(spatial, depth_k, depth_u, table_shape)

    default_init = nn.initializers.normal(stddev=d**-0.5)
    queries = self._projection((self.heads, depth_k), 'query', default_init)(x)  # [b, *s, h, k]
    values = self._projection((depth_v, depth_u), 'value', default_init)(x)  # [b, *s, v, u]
    if self.batch_norm:
      queries = self._batch_norm('query_norm', train)(queries)
      values = self._batch_norm('value_norm', train)(values)

    num = math.prod(spatial)
    q_flat = queries.reshape(batch, num, self.heads, depth_k)
    out = None
    if self.content:
      out = self._content_output(x, values, q_flat, default_init)
    if self.position != 'none':
      assert table_shape is not None and algorithm is not None  # set above for a position
      out_p = self._position_output(values, q_flat, table_shape, algorithm, default_init)
      out = out_p if out is None else out + out_p
    assert out is not None  # _check_config: the content lambda, a position one or both
    return out.reshape(batch, *spatial, self.heads * depth_v)

  def _projection(self, features: tuple[int, int], name: str, default_init: Initializer):
    """A bias-free projection of x (L1): ``query``, ``key`` or ``value``."""
    return nn.DenseGeneral(
        features,
        use_bias=False,
        kernel_init=self.kernel_init or default_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        precision=self.precision,
        name=name,
    )

  def _batch_norm(self, name: str, train: bool) -> nn.Module:
    """BatchNorm of the queries or values (L1) over their last two axes."""
    return nn.BatchNorm(
        use_running_average=not train,
        axis=(-2, -1),  # pyright: ignore[reportArgumentType]  # flax's annotation: int only
        momentum=self.batch_norm_momentum,
        epsilon=self.batch_norm_epsilon,
        axis_name=self.bn_axis_name,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=name,
    )

  def _content_output(
      self, x: Array, values: Array, q_flat: Array, default_init: Initializer
  ) -> Array:
    """``λ^c q_nh`` (L2, L3, L5): the content lambda applied to every query,
    ``[b, n, h, v]`` from x, the values ``[b, *s, v, u]`` and the queries
    ``q_flat [b, n, h, k]``."""
    batch, num, _, depth_k = q_flat.shape
    depth_v, depth_u = values.shape[-2:]
    keys = self._projection((depth_k, depth_u), 'key', default_init)(x)  # [b, *s, k, u]
    keys = normalize_keys(keys.reshape(batch, num, depth_k, depth_u))
    keys, v_flat = dtypes.promote_dtype(
        keys, values.reshape(batch, num, depth_v, depth_u), dtype=self.dtype
    )
    lam_c = content_lambda(keys, v_flat, precision=self.precision)  # [b, k, v]
    return jnp.einsum('bkv,bnhk->bnhv', lam_c, q_flat.astype(lam_c.dtype), precision=self.precision)

  def _position_output(
      self,
      values: Array,
      q_flat: Array,
      table_shape: tuple[int, ...],
      algorithm: str,
      default_init: Initializer,
  ) -> Array:
    """``λ^p_n q_nh`` (L3, L5): the position lambdas (by ``algorithm``, from the
    relative table of shape ``table_shape``) applied to their queries, ``[b, n,
    h, v]``."""
    batch, num, _, depth_k = q_flat.shape
    depth_v, depth_u = values.shape[-2:]
    table = self.param(
        _EMBEDDING,
        self.embedding_init or default_init,
        (*table_shape, depth_k, depth_u),
        self.param_dtype,
    )
    values_c, table = dtypes.promote_dtype(values, table, dtype=self.dtype)
    compute = {
        'rows': position_lambdas_rows,
        'banded': position_lambdas_banded,
        'fft': position_lambdas_fft,
        'correlation': position_lambdas,
    }[algorithm]
    lam_p = compute(values_c, table, precision=self.precision)
    lam_p = lam_p.reshape(batch, depth_v, num, depth_k)  # [b, v, n, k]
    return jnp.einsum(
        'bvnk,bnhk->bnhv', lam_p, q_flat.astype(lam_p.dtype), precision=self.precision
    )
