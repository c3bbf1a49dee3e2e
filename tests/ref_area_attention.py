"""Slow, obviously-correct numpy reference for area attention (Li et al., ICML 2019).

Written from the paper, independently of the implementation: python loops over
every area and every item in it, float64, no summed area tables, no sliding
maxima. Only the conventions that the paper leaves open are shared with the
library (and documented there): the area order (by shape height-major, then
top-left corner row-major), the masking rule (an area is attendable iff all
of its items are), causal = item index <= query index in raster order,
std = sqrt(max(var, 0) + eps), zeros for a query that sees no area, and the
parameter layout of the learned key (Eq. 9).
"""

from __future__ import annotations

import numpy as np


def enumerate_areas(length, max_area_width=1, max_area_height=1, memory_height=1):
  """Every area as (row, col, height, width), in the library's order."""
  grid_h, grid_w = memory_height, length // memory_height
  areas = []
  for h in range(1, max_area_height + 1):
    for w in range(1, max_area_width + 1):
      for r in range(grid_h):
        for c in range(grid_w):
          if r + h <= grid_h and c + w <= grid_w:
            areas.append((r, c, h, w))
  return areas


def area_items(area, grid_w):
  """Flattened (row-major) indices of the items of an area."""
  r, c, h, w = area
  return [(r + i) * grid_w + (c + j) for i in range(h) for j in range(w)]


def area_features(x, max_area_width=1, max_area_height=1, memory_height=1, eps=1e-6):
  """Features of every area of x [batch, length, *dims] by brute force.

  Returns a dict of sum, mean, std, max ([batch, num_areas, *dims], float64) and
  height, width ([num_areas]).
  """
  x = np.asarray(x, np.float64)
  length = x.shape[1]
  grid_w = length // memory_height
  areas = enumerate_areas(length, max_area_width, max_area_height, memory_height)
  out = {k: [] for k in ('sum', 'mean', 'std', 'max')}
  for area in areas:
    items = np.stack([x[:, j] for j in area_items(area, grid_w)], axis=1)  # [b, size, ...]
    mean = items.mean(axis=1)
    var = ((items - mean[:, None]) ** 2).mean(axis=1)
    out['sum'].append(items.sum(axis=1))
    out['mean'].append(mean)
    out['std'].append(np.sqrt(np.maximum(var, 0.0) + eps))
    out['max'].append(items.max(axis=1))
  res = {k: np.stack(vals, axis=1) for k, vals in out.items()}
  res['height'] = np.array([a[2] for a in areas])
  res['width'] = np.array([a[3] for a in areas])
  return res


def area_key(key_mode, mean, std, mx, eps, height, width, params):
  """The key of one area for one head, for every key mode.

  mean, std, mx: [D] mean, std and element-wise max of the area's item keys;
  eps: [D] sampling noise or None (evaluation: the sample is the mean);
  params: the AreaKeyEncoder parameter dict (for that head).

  The learned modes follow tensor2tensor's compute_area_key (layers/
  area_attention.py): e = [e_h; e_w], feature -> Dense(ReLU) -> Dense, with
  'concat' = [mean; std; e], 'max_concat' = [max; e], 'sample_concat' =
  [sample; e], 'sum' = mean + std + e, 'sample_sum' = sample + e. The '*_std_*'
  modes are Eq. 9 (with std) for the max and sample base features (ours).
  """
  sample = mean if eps is None else mean + std * eps
  if key_mode in ('mean', 'max', 'sample'):
    return {'mean': mean, 'max': mx, 'sample': sample}[key_mode]
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  e = np.concatenate([p['height_embedding'][height - 1], p['width_embedding'][width - 1]])
  feature = {
      'concat': lambda: np.concatenate([mean, std, e]),
      'max_concat': lambda: np.concatenate([mx, e]),
      'sample_concat': lambda: np.concatenate([sample, e]),
      'sum': lambda: mean + std + e,
      'sample_sum': lambda: sample + e,
      'max_std_concat': lambda: np.concatenate([mx, std, e]),
      'sample_std_concat': lambda: np.concatenate([sample, std, e]),
      'sample_std_sum': lambda: sample + std + e,
  }[key_mode]()
  hidden = feature @ p['hidden_kernel']
  if 'hidden_bias' in p:
    hidden = hidden + p['hidden_bias']
  out = np.maximum(hidden, 0.0) @ p['output_kernel']
  if 'output_bias' in p:
    out = out + p['output_bias']
  return out


def _head_params(params, head, per_head):
  if not per_head:
    return params
  shared = ('height_embedding', 'width_embedding')
  return {k: (v if k in shared else np.asarray(v)[head]) for k, v in params.items()}


def area_attention(
    query,
    key,
    value,
    *,
    max_area_width=1,
    max_area_height=1,
    memory_height=1,
    mask=None,
    causal=False,
    key_mode='mean',
    value_mode='sum',
    scale=None,
    eps=1e-6,
    key_params=None,
    per_head=False,
    sample_eps=None,
):
  """Multi-head area attention by brute force (Eq. 1-4, 5-9).

  query [b, q, h, d], key [b, kv, h, d], value [b, kv, h, dv] -> [b, q, h, dv].
  For every (batch, head, query) it loops over every area, checks each item of
  the area against the mask and causality, builds the area key/value from the
  area's items, and does a float64 softmax over the visible areas.

  key_mode: see area_key; sample modes take sample_eps [b, num_areas, h, d] (None:
  the deterministic mean); learned modes need key_params = the AreaKeyEncoder
  params.
  """
  q = np.asarray(query, np.float64)
  k = np.asarray(key, np.float64)
  val = np.asarray(value, np.float64)
  b, q_len, heads, depth = q.shape
  kv_len = k.shape[1]
  grid_w = kv_len // memory_height
  scale = 1.0 / np.sqrt(depth) if scale is None else scale
  if mask is None:
    mask = np.ones((b, heads, q_len, kv_len), bool)
  mask = np.broadcast_to(np.asarray(mask, bool), (b, heads, q_len, kv_len))
  areas = enumerate_areas(kv_len, max_area_width, max_area_height, memory_height)
  out = np.zeros((b, q_len, heads, val.shape[-1]))
  for bi in range(b):
    for hi in range(heads):
      keys, values = [], []
      for ai, area in enumerate(areas):
        idx = area_items(area, grid_w)
        ki = k[bi, idx, hi]  # [size, d]
        vi = val[bi, idx, hi]
        mean = ki.mean(0)
        std = np.sqrt(np.maximum(((ki - mean) ** 2).mean(0), 0.0) + eps)
        eps_i = None if sample_eps is None else np.asarray(sample_eps, np.float64)[bi, ai, hi]
        keys.append(
            area_key(
                key_mode,
                mean,
                std,
                ki.max(0),
                eps_i,
                area[2],
                area[3],
                _head_params(key_params, hi, per_head),
            )
        )
        values.append({'sum': vi.sum(0), 'mean': vi.mean(0), 'max': vi.max(0)}[value_mode])
      for qi in range(q_len):
        logits, vals = [], []
        for area, ak, av in zip(areas, keys, values):
          idx = area_items(area, grid_w)
          ok = all(mask[bi, hi, qi, j] for j in idx)
          if causal:
            ok = ok and all(j <= qi for j in idx)
          if ok:
            logits.append(scale * float(q[bi, qi, hi] @ ak))
            vals.append(av)
        if not logits:
          continue  # no attendable area: output stays zero
        logits = np.array(logits)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        out[bi, qi, hi] = (p[:, None] * np.stack(vals)).sum(0)
  return out


def area_attention_module(
    variables,
    inputs_q,
    inputs_kv=None,
    *,
    num_heads,
    mask=None,
    causal=False,
    max_area_width=1,
    max_area_height=1,
    memory_height=1,
    key_mode='mean',
    value_mode='sum',
    eps=1e-6,
    per_head=False,
):
  """AreaAttention forward pass (deterministic) from its parameters, by brute force."""
  params = variables['params']
  inputs_q = np.asarray(inputs_q, np.float64)
  inputs_kv = inputs_q if inputs_kv is None else np.asarray(inputs_kv, np.float64)
  q_shape = inputs_q.shape
  if inputs_kv.ndim == 4:
    memory_height = inputs_kv.shape[1]
  xq = inputs_q.reshape(q_shape[0], -1, q_shape[-1])
  xkv = inputs_kv.reshape(inputs_kv.shape[0], -1, inputs_kv.shape[-1])

  def dense(name, x):
    p = params[name]
    y = np.einsum('bli,ihd->blhd', x, np.asarray(p['kernel'], np.float64))
    if 'bias' in p:
      y = y + np.asarray(p['bias'], np.float64)
    return y

  q, k, val = dense('query', xq), dense('key', xkv), dense('value', xkv)
  o = area_attention(
      q,
      k,
      val,
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
      mask=mask,
      causal=causal,
      key_mode=key_mode,
      value_mode=value_mode,
      eps=eps,
      key_params=params.get('area_key'),
      per_head=per_head,
  )
  po = params['out']
  y = np.einsum('blhd,hdo->blo', o, np.asarray(po['kernel'], np.float64))
  if 'bias' in po:
    y = y + np.asarray(po['bias'], np.float64)
  return y.reshape(q_shape[:-1] + (y.shape[-1],))
