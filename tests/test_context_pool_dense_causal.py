"""ContextPool 'dense', causal: row groups pooling only their prefix of inputs.

``_pool_dense(rule, inputs, causal_splits)`` with ``causal_splits >= 2`` must
give the rows of the one-block ``[m, n]`` matrix (``causal_splits=1``): the
same outputs and gradients (float32 rounding), the numpy reference, and no
dependence at all on later inputs.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.layers import context_pool as cp
from contextpool_jax.layers.context_pool import ContextPool
import ref_context_pool as ref

B, N, D, K = 2, 13, 3, 4  # 13: no split count below divides it


def _inputs(weights, lengths=(N, 9), centres=None, seed=0):
  """PoolInputs for a causal sequence of N positions, right-padded to ``lengths``,
  with learned-style sigmas and log weights (theta/phi for ``'nonlocal'``)."""
  keys = jax.random.split(jax.random.key(seed), 6)
  valid = jnp.arange(N)[None, :] < jnp.asarray(lengths)[:, None]
  q_index = np.arange(N, dtype=np.int32) if centres is None else np.asarray(centres, np.int32)
  m = len(q_index)
  centres = cp.Centres(
      index=q_index,
      valid=valid[:, q_index],
      sigma=0.5 + 3.0 * jax.random.uniform(keys[0], (B, m)),
      theta=jax.random.normal(keys[1], (B, m, K)) if weights == 'nonlocal' else None,
  )
  context = cp.Context(
      index=jnp.arange(N, dtype=jnp.int32),
      valid=valid,
      x=jax.random.normal(keys[2], (B, N, D)),
      log_w=None if weights == 'nonlocal' else 2.0 * jax.random.normal(keys[3], (B, N)),
      phi=jax.random.normal(keys[4], (B, N, K)) if weights == 'nonlocal' else None,
  )
  return cp.PoolInputs(centres, context)


def _rule(locality='gaussian', dropout=False, **fields):
  module = ContextPool(causal=True, locality=locality, window=2, dropout_rate=0.2, **fields)
  return module.pool_rule((N,), dropout=dropout)


def _value_and_grads(rule, inputs, splits):
  """Outputs, and gradients of a fixed random projection of them in x, sigma, a, theta, phi."""
  names = ('sigma', 'theta'), ('x', 'log_w', 'phi')

  def loss(diff):
    centres = inputs.centres._replace(**dict(zip(names[0], diff[0])))
    context = inputs.context._replace(**dict(zip(names[1], diff[1])))
    y = cp._pool_dense(rule, cp.PoolInputs(centres, context, inputs.dropout_seeds), splits)
    probe = jax.random.normal(jax.random.key(99), y.shape, jnp.float32)
    return jnp.sum(jnp.sin(y) * probe), y

  diff = (
      tuple(getattr(inputs.centres, n) for n in names[0]),
      tuple(getattr(inputs.context, n) for n in names[1]),
  )
  (_, y), grads = jax.value_and_grad(loss, has_aux=True)(diff)
  return y, grads


CASES = [
    dict(weights='learned', locality='gaussian'),
    dict(weights='nonlocal', locality='gaussian'),
    dict(weights='learned', locality='fixed_window'),
    dict(weights='learned', locality='adaptive_window'),
    dict(weights='learned', locality='random_sparse'),
    dict(weights='learned', locality='gaussian', dropout=True),
]


@pytest.mark.parametrize('splits', [2, 3, 4, 6])
@pytest.mark.parametrize('case', CASES, ids=lambda c: '-'.join(str(v) for v in c.values()))
def test_row_groups_match_the_one_block_matrix(case, splits):
  """Outputs and gradients (x, sigma, a, theta, phi) of every variant, with padding
  and dropout, equal the one-block matrix's to float32 rounding."""
  inputs = _inputs(case['weights'])
  if case.get('dropout'):
    inputs = inputs._replace(dropout_seeds=jnp.asarray([7, 123456789], jnp.uint32))
  rule = _rule(case['locality'], dropout=case.get('dropout', False))
  y, grads = _value_and_grads(rule, inputs, splits)
  y1, grads1 = _value_and_grads(rule, inputs, 1)
  chex.assert_tree_all_finite((y, grads))
  chex.assert_trees_all_close(y, y1, atol=1e-6, rtol=0)
  chex.assert_trees_all_close(grads, grads1, atol=5e-6, rtol=5e-6)


@pytest.mark.parametrize('splits', [1, 4])
def test_row_groups_match_numpy_reference_with_strided_centres(splits):
  """Centres every other position (a causal stride-2 pooling, m = 7): each row is
  the slow reference's causal Gaussian pooling with the softmax weights."""
  q_index = np.arange(0, N, 2)
  inputs = _inputs('learned', centres=q_index)
  y = cp._pool_dense(_rule(), inputs, splits)
  ctx = inputs.context
  for b in range(B):
    valid = np.asarray(ctx.valid[b])
    w = ref.softmax(np.asarray(ctx.log_w[b], np.float64), valid)
    sigma = np.zeros(N)
    sigma[q_index] = np.asarray(inputs.centres.sigma[b])
    want = ref.pool(
        ctx.x[b], w, sigma, mask=valid, causal=True, centres=[(int(i),) for i in q_index]
    )
    real = valid[q_index]  # padded centres pool nothing (the module passes them through)
    chex.assert_trees_all_close(np.asarray(y[b])[real], want[real], atol=1e-6, rtol=0)


@pytest.mark.parametrize('splits', [3, 4])
def test_row_groups_jacobian_is_exactly_zero_for_later_inputs(splits):
  """dy_i / dx_j, dy_i / da_j are exactly 0 for every j > i."""
  inputs = _inputs('learned', lengths=(N, N))
  rule = _rule()

  def pooled(x, log_w):
    context = inputs.context._replace(x=x, log_w=log_w)
    return cp._pool_dense(rule, inputs._replace(context=context), splits)[0, :, 0]

  jac_x, jac_a = jax.jacrev(pooled, argnums=(0, 1))(inputs.context.x, inputs.context.log_w)
  later = np.triu(np.ones((N, N), bool), k=1)  # [i, j]: j > i
  assert np.all(np.asarray(jac_x[:, 0, :, :])[later] == 0.0)
  assert np.all(np.asarray(jac_a[:, 0, :])[later] == 0.0)
  assert np.any(np.asarray(jac_x[:, 0, :, 0])[~later] != 0.0)  # the past is read


def test_module_default_is_split_and_matches_blockwise():
  """The module's dense causal path (DENSE_CAUSAL_SPLITS row groups) equals the
  blockwise path with Gaussian skipping off, outputs and input gradients."""
  assert cp.DENSE_CAUSAL_SPLITS >= 2
  x = jax.random.normal(jax.random.key(1), (B, 40, D))
  mask = jnp.arange(40)[None, :] < jnp.asarray([40, 31])[:, None]
  dense = ContextPool(causal=True, implementation='dense', size_norm='sigmoid')
  block = ContextPool(
      causal=True,
      implementation='blockwise',
      block_size=8,
      size_norm='sigmoid',
      gaussian_skip_nats=None,
  )
  params = jax.tree.map(lambda p: 3.0 * p, dense.init(jax.random.key(2), x, mask))

  def run(module, z):
    return module.apply(params, z, mask)

  y_d, vjp_d = jax.vjp(lambda z: run(dense, z), x)
  y_b, vjp_b = jax.vjp(lambda z: run(block, z), x)
  probe = jax.random.normal(jax.random.key(3), y_d.shape)
  chex.assert_trees_all_close(y_d, y_b, atol=1e-6, rtol=0)
  chex.assert_trees_all_close(vjp_d(probe), vjp_b(probe), atol=5e-6, rtol=5e-6)
