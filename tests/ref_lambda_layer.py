"""Direct einsum reference for the lambda layer, written from the paper.

Nothing here imports the implementation. Bello (ICLR 2021), Sec. 3, with
self-context and the multi-query formulation:

  Q = BN(X W_Q) [n, h, k],  K = X W_K [m, k, u],  V = BN(X W_V) [m, v, u]
  K̄ = softmax(K, axis=m)
  λ_n = Σ_m Σ_u (K̄_mku + E_nmku) V_mvu                [k, v]
  y_nh = λ_n^T q_nh                                     [v]

with the relative embeddings materialised explicitly as an ``[n, m, k, u]``
tensor, E_nm = R[c + pos(m) - pos(n)] (c = centre of the table, zero when the
offset falls outside the table: that is the lambda-convolution scope).

Every function takes ``xp`` (numpy or jax.numpy) so the same formulas give a
float64 value reference and a differentiable jax reference for gradients.
"""

from __future__ import annotations

import numpy as np


def coords(spatial):
  """Row-major coordinates of every position of a sequence or grid."""
  return np.array([tuple(c) for c in np.ndindex(*spatial)], dtype=np.int64)


def embedding_index(spatial, table_kernel):
  """Index arrays and validity mask that build E[n, m] from the table.

  Returns:
    (index, valid): ``index`` is a tuple of ``[n, m]`` int arrays, one per
    spatial axis, into the table; ``valid`` is ``[n, m]`` bool, False when
    pos(m) - pos(n) lies outside the table.
  """
  pos = coords(spatial)  # [n, rank]
  offset = pos[None, :, :] - pos[:, None, :]  # [n, m, rank]: m - n
  centre = (np.asarray(table_kernel) - 1) // 2
  idx = offset + centre
  valid = np.all((idx >= 0) & (idx < np.asarray(table_kernel)), axis=-1)
  idx = np.where(valid[..., None], idx, 0)
  return tuple(idx[..., a] for a in range(idx.shape[-1])), valid


def embeddings(table, spatial, xp=np):
  """E as an explicit ``[n, m, k, u]`` tensor (only the reference does this)."""
  index, valid = embedding_index(spatial, table.shape[:-2])
  return table[index] * xp.asarray(valid, table.dtype)[..., None, None]


def batch_norm(z, scale, bias, mean, var, epsilon, xp=np):
  """(z - mean) / sqrt(var + eps) * scale + bias, per trailing feature."""
  return (z - mean) / xp.sqrt(var + epsilon) * scale + bias


def batch_moments(z, xp=np):
  """Mean and biased variance over batch and positions ([b, n, ...] input)."""
  mean = xp.mean(z, axis=(0, 1))
  var = xp.mean((z - mean) ** 2, axis=(0, 1))
  return mean, var


def softmax(z, axis, xp=np):
  z = z - xp.max(z, axis=axis, keepdims=True)
  e = xp.exp(z)
  return e / xp.sum(e, axis=axis, keepdims=True)


def lambda_layer(
    variables,
    x,
    *,
    content=True,
    position=True,
    batch_norm_on=True,
    train=False,
    epsilon=1e-5,
    xp=np,
):
  """The lambda layer by direct einsums.

  Args:
    variables: the module's {'params': ..., 'batch_stats': ...}; kernels are
      ``query [d, h, k]``, ``key [d, k, u]``, ``value [d, v, u]``, table
      ``position_embedding [*kernel, k, u]``.
    x: ``[b, *spatial, d]``.
    content / position / batch_norm_on: which terms the module was built with.
    train: batch statistics (True) or the running averages (False).

  Returns:
    (y, moments): ``y`` is ``[b, *spatial, h * v]``; ``moments`` maps
    'query_norm' / 'value_norm' to the (mean, var) of the pre-norm
    activations over batch and positions.
  """
  p = variables['params']
  b, *spatial = x.shape[:-1]
  n = int(np.prod(spatial))
  xf = xp.reshape(x, (b, n, x.shape[-1]))
  q = xp.einsum('bnd,dhk->bnhk', xf, p['query']['kernel'])
  v = xp.einsum('bnd,dvu->bnvu', xf, p['value']['kernel'])
  moments = {}
  if batch_norm_on:
    for name, z in (('query_norm', q), ('value_norm', v)):
      moments[name] = batch_moments(z, xp)
    stats = variables.get('batch_stats', {})

    def norm(name, z):
      mean, var = moments[name] if train else (stats[name]['mean'], stats[name]['var'])
      return batch_norm(z, p[name]['scale'], p[name]['bias'], mean, var, epsilon, xp)

    q, v = norm('query_norm', q), norm('value_norm', v)
  h, k = q.shape[-2:]
  depth_v = v.shape[-2]
  lam = xp.zeros((b, n, k, depth_v), dtype=q.dtype)
  if content:
    keys = xp.einsum('bmd,dku->bmku', xf, p['key']['kernel'])
    kbar = softmax(keys, axis=1, xp=xp)
    lam = lam + xp.einsum('bmku,bmvu->bkv', kbar, v)[:, None]
  if position:
    e = embeddings(p['position_embedding'], spatial, xp)  # [n, m, k, u]
    lam = lam + xp.einsum('nmku,bmvu->bnkv', e, v)
  y = xp.einsum('bnkv,bnhk->bnhv', lam, q)
  return xp.reshape(y, (b, *spatial, h * depth_v)), moments
