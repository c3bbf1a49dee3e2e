"""Slow numpy references for ContextPool, written from the paper (float64 loops).

Nothing here imports the implementation: the formulas are re-derived from
Huang et al. (ICML 2022) Sec. 3.2 (Eq. 3, Eq. 4) and Appendix A (Eq. 6).
"""

from __future__ import annotations

import numpy as np


def coords(spatial):
  """Row-major coordinates of every position of a sequence or grid."""
  return [tuple(c) for c in np.ndindex(*spatial)]


def pool(
    x,
    w,
    sigma=None,
    *,
    mask=None,
    causal=False,
    centres=None,
    locality='gaussian',
    window=None,
    support=None,
):
  """Eq. 4 / Eq. 6 by direct loops.

  y_k = sum_j x_j W_j G^k_j / sum_j W_j G^k_j, G^k_j = exp(-|c_k - p_j|^2 / (2 sigma_k^2)).

  Args:
    x: [*spatial, d] features of one example.
    w: [*spatial] pooling weights (any positive scale), or [m, *spatial]
      query-dependent weights (non-local, Eq. 3) indexed by output position.
    sigma: [*spatial] standard deviations (gaussian / adaptive window).
    mask: [*spatial] bool, True = real.
    causal: sequences only, j <= i.
    centres: list of input coordinates (tuples) of the outputs; default all.
    locality: 'gaussian' | 'none' | 'fixed_window' | 'adaptive_window' | 'support'.
    window: radius for 'fixed_window'.
    support: [m, n] bool for locality='support' (random sparse).

  Returns:
    [m, d] pooled features, rows at padded centres are x at the centre.
  """
  x = np.asarray(x, np.float64)
  spatial = x.shape[:-1]
  positions = coords(spatial)
  if centres is None:
    centres = positions
  mask = np.ones(spatial, bool) if mask is None else np.asarray(mask, bool)
  w = np.asarray(w, np.float64)
  out = np.zeros((len(centres), x.shape[-1]))
  for k, c in enumerate(centres):
    if not mask[c]:
      out[k] = x[c]
      continue
    num = np.zeros(x.shape[-1])
    den = 0.0
    for j, p in enumerate(positions):
      if not mask[p]:
        continue
      if causal and p[0] > c[0]:
        continue
      d2 = sum((a - b) ** 2 for a, b in zip(c, p))
      if locality == 'gaussian':
        g = np.exp(-d2 / (2.0 * float(sigma[c]) ** 2))
      elif locality == 'none':
        g = 1.0
      elif locality == 'fixed_window':
        g = float(d2 <= window**2)
      elif locality == 'adaptive_window':
        g = float(d2 <= float(sigma[c]) ** 2)
      elif locality == 'support':
        g = float(support[k, j])
      else:
        raise ValueError(locality)
      wj = w[k][p] if w.ndim == len(spatial) + 1 else w[p]
      num += x[p] * wj * g
      den += wj * g
    out[k] = num / den
  return out


def softmax(z, valid):
  z = np.where(valid, z, -np.inf)
  e = np.exp(z - z[valid].max()) * valid
  return e / e.sum()


def sizes_to_sigma(raw, mask, *, size_norm, causal, ratio, grid=False, length=None):
  """s = softmax over positions (prefix softmax if causal) or sigmoid; sigma = r n s.

  Sequences: n is the number of real tokens (causal: real tokens <= i), or the
  static ``length`` when given. Grids: sigma = r * S * (h + w) / 2.
  """
  raw = np.asarray(raw, np.float64)
  mask = np.asarray(mask, bool)
  flat, fmask = raw.reshape(-1), mask.reshape(-1)
  s = np.zeros_like(flat)
  extent = np.zeros_like(flat)
  for i in range(flat.size):
    if not fmask[i]:
      continue
    if size_norm == 'sigmoid':
      s[i] = 1.0 / (1.0 + np.exp(-flat[i]))
    else:
      visible = fmask.copy()
      if causal:
        visible[i + 1 :] = False
      s[i] = softmax(flat, visible)[i]
    if grid:
      extent[i] = sum(raw.shape) / 2.0
    elif length is not None:
      extent[i] = length
    elif causal:
      extent[i] = fmask[: i + 1].sum()
    else:
      extent[i] = fmask.sum()
  return (ratio * extent * s).reshape(raw.shape)


def conv(x, kernel, bias, *, causal=False):
  """A flax-layout convolution ([*k, in, out] kernel), stride 1, by loops.

  'SAME' padding (lax's: pad_lo = (k - 1) // 2), or causal left padding k - 1.
  """
  x = np.asarray(x, np.float64)
  kernel = np.asarray(kernel, np.float64)
  spatial = x.shape[:-1]
  ksize = kernel.shape[:-2]
  out = np.zeros(spatial + (kernel.shape[-1],)) + np.asarray(bias, np.float64)
  for pos in np.ndindex(*spatial):
    for off in np.ndindex(*ksize):
      src = []
      for p, o, k in zip(pos, off, ksize):
        lo = k - 1 if causal else (k - 1) // 2
        src.append(p + o - lo)
      if all(0 <= s < n for s, n in zip(src, spatial)):
        out[pos] += x[tuple(src)] @ kernel[off]
    # (zero padding: out-of-range sources contribute nothing)
  return out


def relu(z):
  return np.maximum(z, 0.0)


def linear(x, kernel):
  """x W, no bias (Eq. 3's theta and phi)."""
  return np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)


def dense(x, params):
  return np.asarray(x, np.float64) @ np.asarray(params['kernel'], np.float64) + np.asarray(
      params['bias'], np.float64
  )


def single_head_attention(x, params, valid, causal):
  """flax MultiHeadDotProductAttention with one head, by loops."""
  x = np.asarray(x, np.float64)
  proj = lambda name: np.einsum(
      'nd,dhk->nhk', x, np.asarray(params[name]['kernel'], np.float64)
  ) + np.asarray(params[name]['bias'], np.float64)
  q, k, val = proj('query'), proj('key'), proj('value')
  n = x.shape[0]
  out = np.zeros_like(q)
  for i in range(n):
    logits = np.array([q[i, 0] @ k[j, 0] for j in range(n)]) / np.sqrt(q.shape[-1])
    allowed = valid.copy() & valid[i]
    if causal:
      allowed[i + 1 :] = False
    if not allowed.any():
      allowed = np.ones(n, bool)  # flax: a fully masked row is uniform
    p = softmax(logits, allowed)
    out[i, 0] = p @ val[:, 0]
  o = params['out']
  return np.einsum('nhk,hkd->nd', out, np.asarray(o['kernel'], np.float64)) + np.asarray(
      o['bias'], np.float64
  )
