"""Slow, direct NumPy reference for AugmentedConv2D (float64, explicit loops).

Written from the paper's equations and the documented choices, not from the
layer's code: every pixel pair is visited, relative embeddings are looked up by
their offset, and the convolution and pooling windows are spelled out.
"""

from __future__ import annotations

import math

import numpy as np


def direct_relative_logits(q, rel_w, rel_h, query_strides=(1, 1)):
  """O((HW)^2) loop: out[b,h,iy,ix,jy,jx] = q . (r^W_{jx-px} + r^H_{jy-py}).

  q: [b, Hq, Wq, heads, d]; rel_*: [2n-1, d] or [heads, 2n-1, d]; the query
  (iy, ix) sits at key-grid position (py, px) = (s_y iy, s_x ix).
  """
  q = np.asarray(q, np.float64)
  rel_w = np.asarray(rel_w, np.float64)
  rel_h = np.asarray(rel_h, np.float64)
  batch, q_h, q_w, heads, _ = q.shape
  k_w = (rel_w.shape[-2] + 1) // 2
  k_h = (rel_h.shape[-2] + 1) // 2
  out = np.zeros((batch, heads, q_h, q_w, k_h, k_w))
  for b in range(batch):
    for h in range(heads):
      r_w = rel_w[h] if rel_w.ndim == 3 else rel_w
      r_h = rel_h[h] if rel_h.ndim == 3 else rel_h
      for iy in range(q_h):
        for ix in range(q_w):
          py, px = query_strides[0] * iy, query_strides[1] * ix
          for jy in range(k_h):
            for jx in range(k_w):
              emb = r_w[jx - px + k_w - 1] + r_h[jy - py + k_h - 1]
              out[b, h, iy, ix, jy, jx] = q[b, iy, ix, h] @ emb
  return out


def same_pads(size, window, stride):
  """(output size, low padding) of 'SAME' padding (TF/XLA convention)."""
  out = -(-size // stride)
  total = max((out - 1) * stride + window - size, 0)
  return out, total // 2


def conv2d_same(x, kernel, bias, strides):
  """x [b,H,W,C], kernel [kh,kw,C,F]: direct strided 'SAME' convolution."""
  batch, height, width, _ = x.shape
  k_h, k_w, _, feats = kernel.shape
  o_h, lo_h = same_pads(height, k_h, strides[0])
  o_w, lo_w = same_pads(width, k_w, strides[1])
  out = np.zeros((batch, o_h, o_w, feats))
  for a in range(o_h):
    for c in range(o_w):
      for dy in range(k_h):
        for dx in range(k_w):
          y = a * strides[0] - lo_h + dy
          z = c * strides[1] - lo_w + dx
          if 0 <= y < height and 0 <= z < width:
            out[:, a, c] += x[:, y, z] @ kernel[dy, dx]
  return out + (0 if bias is None else bias)


def avg_pool_same(x, strides):
  """Mean over each stride x stride cell, padded cells excluded."""
  _, height, width, _ = x.shape
  o_h, lo_h = same_pads(height, strides[0], strides[0])
  o_w, lo_w = same_pads(width, strides[1], strides[1])
  out = np.zeros((x.shape[0], o_h, o_w, x.shape[-1]))
  for a in range(o_h):
    for c in range(o_w):
      y0, x0 = a * strides[0] - lo_h, c * strides[1] - lo_w
      cell = x[:, max(y0, 0) : y0 + strides[0], max(x0, 0) : x0 + strides[1]]
      out[:, a, c] = cell.mean(axis=(1, 2))
  return out


def sine_2d(height, width, channels):
  """y on the first ceil(C/2) channels, x on the rest; sin even, cos odd."""
  enc = np.zeros((height, width, channels))
  d_y = (channels + 1) // 2
  d_x = channels - d_y
  for y in range(height):
    for x in range(width):
      for c in range(channels):
        pos, d, i = (y, d_y, c) if c < d_y else (x, d_x, c - d_y)
        angle = pos / 10000.0 ** ((i - i % 2) / d)
        enc[y, x, c] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
  return enc


def coords(height, width):
  enc = np.zeros((height, width, 2))
  for y in range(height):
    for x in range(width):
      enc[y, x, 0] = -1 + 2 * y / (height - 1) if height > 1 else 0.0
      enc[y, x, 1] = -1 + 2 * x / (width - 1) if width > 1 else 0.0
  return enc


def augmented_conv(params, x, *, d_k, d_v, num_heads, strides, position, attention_downsample):
  """AAConv(X) = Concat[Conv(X), MHA(X)] with the layer's own parameters."""
  p = {
      k: (
          np.asarray(v, np.float64)
          if not isinstance(v, dict)
          else {kk: np.asarray(vv, np.float64) for kk, vv in v.items()}
      )
      for k, v in params.items()
  }
  x = np.asarray(x, np.float64)
  conv = conv2d_same(x, p['conv']['kernel'], p['conv'].get('bias'), strides)

  qs = (1, 1)
  xa = x
  if tuple(strides) != (1, 1):
    if attention_downsample == 'avg_pool':
      xa = avg_pool_same(x, strides)
    elif attention_downsample == 'subsample':
      xa = x[:, :: strides[0], :: strides[1]]
    else:
      qs = tuple(strides)
  batch, k_h, k_w, chans = xa.shape
  if position == 'sine2d':
    xa = xa + sine_2d(k_h, k_w, chans)
  elif position == 'coordconv':
    xa = np.concatenate([xa, np.broadcast_to(coords(k_h, k_w), (batch, k_h, k_w, 2))], -1)
  qkv = xa @ p['qkv']['kernel'][0, 0] + p['qkv'].get('bias', 0)
  dkh, dvh = d_k // num_heads, d_v // num_heads
  q_h, q_w = conv.shape[1:3]
  heads_out = np.zeros((batch, q_h, q_w, d_v))
  for b in range(batch):
    for h in range(num_heads):
      rel_w = p.get('rel_width')
      rel_h = p.get('rel_height')
      if rel_w is not None and rel_w.ndim == 3:
        rel_w, rel_h = rel_w[h], rel_h[h]
      for iy in range(q_h):
        for ix in range(q_w):
          py, px = qs[0] * iy, qs[1] * ix
          q = qkv[b, py, px, h * dkh : (h + 1) * dkh]
          logits = np.zeros((k_h, k_w))
          values = np.zeros((k_h, k_w, dvh))
          for jy in range(k_h):
            for jx in range(k_w):
              key = qkv[b, jy, jx, d_k + h * dkh : d_k + (h + 1) * dkh].copy()
              if position == 'relative':
                key = key + rel_w[jx - px + k_w - 1] + rel_h[jy - py + k_h - 1]
              logits[jy, jx] = q @ key / math.sqrt(dkh)
              values[jy, jx] = qkv[b, jy, jx, 2 * d_k + h * dvh : 2 * d_k + (h + 1) * dvh]
          w = np.exp(logits - logits.max())
          w /= w.sum()
          heads_out[b, iy, ix, h * dvh : (h + 1) * dvh] = np.einsum('yx,yxd->d', w, values)
  attn = heads_out @ p['attn_out']['kernel'][0, 0] + p['attn_out'].get('bias', 0)
  return np.concatenate([conv, attn], -1)
