"""ContextPool(implementation='blockwise'): the dense result, its gradients, 'auto', memory.

Every comparison runs both implementations on the same parameters and checks
outputs and the gradients of a loss with respect to the input and every
parameter (so also sigma's path through the mapping) to float32 tolerance.
Most comparisons run op by op (no ``jax.jit``): with tiny shapes, compiling
each variant's whole program twice would dominate the run time; one-off shapes
and ``test_vmap_and_jit`` use jit.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.layers import context_pool as cp
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.context_pool.blocks import key_block_ranges
from contextpool_jax.layers.context_pool.randomness import dropout_keep
import ref_context_pool as ref
from init_keys import init_variables

D = 3
# Op-by-op execution compiles each primitive once per shape: every comparison
# uses one of these two input shapes, so most of them reuse compiled kernels.
SEQ = (2, 37, D)  # 37: not a multiple of any block size used below but 37
GRID = (2, 6, 7, D)
WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')


def _x(shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _right_pad_mask(n, lengths):
  return jnp.arange(n)[None, :] < jnp.asarray(lengths)[:, None]


def _value_and_grads(module, params, x, mask, jit=False, **apply_kwargs):
  """Outputs, and gradients of a fixed random projection of them (float32)."""

  def loss(p, z):
    y = module.apply(p, z, mask, **apply_kwargs)
    probe = jax.random.normal(jax.random.key(99), y.shape, jnp.float32)
    return jnp.sum(jnp.sin(y.astype(jnp.float32)) * probe), y

  step = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  (_, y), grads = (jax.jit(step) if jit else step)(params, x)
  return y, grads


def _assert_grads_close(got, want, rtol=5e-6):
  """Per leaf: |got - want| <= rtol * max(1, max |want|) (float32 tolerance, measured
  at most 1.9e-6; some leaves, e.g. the bias of the softmax weight channel, are 0
  in exact arithmetic)."""
  for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
    w, g = np.asarray(w, np.float32), np.asarray(g, np.float32)
    tol = rtol * max(1.0, float(np.abs(w).max()))
    err = float(np.abs(g - w).max())
    assert err <= tol, f'{jax.tree_util.keystr(path)}: max error {err} > {tol}'


def _check_blockwise_matches_dense(
    x, mask=None, block_size=8, spread=2.0, seed=1, apply_kwargs=None, jit=False, **fields
):
  """jit: compile instead of running op by op (cheaper for a one-off output shape)."""
  apply_kwargs = apply_kwargs or {}
  dense = ContextPool(implementation='dense', **fields)
  block = ContextPool(implementation='blockwise', block_size=block_size, **fields)
  params = jax.tree.map(lambda p: p * spread, init_variables(dense, jax.random.key(seed), x, mask))
  y_d, g_d = _value_and_grads(dense, params, x, mask, jit, **apply_kwargs)
  y_b, g_b = _value_and_grads(block, params, x, mask, jit, **apply_kwargs)
  chex.assert_trees_all_close(y_b, y_d, atol=2e-6, rtol=0)
  _assert_grads_close(g_b, g_d)
  return params, y_b


# ----------------------------------------------------------------------------
# blockwise == dense, outputs and gradients.
# ----------------------------------------------------------------------------

# Every weights x locality pair; causal alternates so each pair is checked once
# and both settings cover every weights and every locality. n = 37 with blocks
# of 8: padded queries and keys, several blocks, skipped causal blocks.
SEQ_CASES = [
    (w, l, (i + j) % 2 == 1) for i, w in enumerate(WEIGHTS) for j, l in enumerate(LOCALITIES)
]


@pytest.mark.parametrize('weights,locality,causal', SEQ_CASES)
@pytest.mark.sweep
def test_sequence_variants_match_dense(weights, locality, causal):
  x = _x(SEQ)
  _check_blockwise_matches_dense(
      x,
      _right_pad_mask(37, [37, 23]),
      weights=weights,
      locality=locality,
      causal=causal,
      window=3,
      size_norm='sigmoid',
      ratio=0.3,
  )


@pytest.mark.parametrize('mapping,causal', [('mlp', False), ('attention', True)])
def test_mapping_variants_match_dense(mapping, causal):
  x = _x(SEQ)
  _check_blockwise_matches_dense(
      x,
      _right_pad_mask(37, [37, 13]),
      mapping=mapping,
      causal=causal,
      block_size=5,
      jit=mapping == 'attention',
  )


@pytest.mark.parametrize('block_size', [4, 7, 37, 64])
@pytest.mark.sweep
def test_block_sizes_match_dense(block_size):
  """Many small blocks, an odd size, exactly n, one block larger than n."""
  x = _x(SEQ)
  _check_blockwise_matches_dense(
      x, _right_pad_mask(37, [37, 18]), causal=True, block_size=block_size, size_norm='softmax'
  )


@pytest.mark.parametrize(
    'fields',
    [
        dict(),  # gaussian, learned, softmax sizes
        dict(locality='fixed_window', window=2, weights='unnormalized'),
        dict(locality='adaptive_window', size_norm='sigmoid', weights='uniform'),
        dict(locality='random_sparse', window=2, weights='nonlocal'),
    ],
    ids=lambda f: '-'.join(f'{k}={v}' for k, v in f.items()) or 'default',
)
@pytest.mark.sweep
def test_grid_variants_match_dense(fields):
  """42 positions in blocks of 8 (padded) or of 14 (whole rows, no padding)."""
  x = _x(GRID)
  mask = jnp.ones(GRID[:-1], bool).at[1, 3:, 4:].set(False)
  _check_blockwise_matches_dense(x, mask, block_size=14 if fields else 8, **fields)


@pytest.mark.parametrize(
    'strides,window_shape,locality',
    [(2, None, 'gaussian'), (2, 3, 'random_sparse'), ((3, 2), None, 'adaptive_window')],
)
@pytest.mark.sweep
def test_strided_grids_match_dense(strides, window_shape, locality):
  x = _x(GRID)
  mask = jnp.ones(GRID[:-1], bool).at[1, -2:, :].set(False)
  _check_blockwise_matches_dense(
      x,
      mask,
      block_size=4,
      jit=True,
      strides=strides,
      window_shape=window_shape,
      locality=locality,
      window=2,
      size_norm='sigmoid',
  )


def test_residual_and_rows_without_support_match_dense():
  """An example with no real token: every row has no allowed position (0 weight,
  passed-through outputs), no NaN in the forward or the backward pass."""
  x = _x(SEQ)
  _, y = _check_blockwise_matches_dense(
      x, _right_pad_mask(37, [37, 0]), residual=True, causal=True, block_size=8
  )
  chex.assert_trees_all_equal(y[1], x[1])


def test_tiny_sigma_is_identity_and_finite():
  """sigma -> 0: huge logits (-d^2 / 1e-12) in the key blocks read before the one
  holding the centre must not overflow the running softmax."""
  x = _x(SEQ)
  module = ContextPool(
      implementation='blockwise', block_size=8, ratio=1e-7, size_norm='sigmoid', weights='uniform'
  )
  params = init_variables(module, jax.random.key(0), x)
  y, grads = _value_and_grads(module, params, x, None)
  chex.assert_trees_all_equal(y, x)
  chex.assert_tree_all_finite(grads)


@pytest.mark.slow
def test_dropout_is_identical_in_both_implementations_and_unbiased():
  x = _x(SEQ)
  mask = _right_pad_mask(37, [37, 17])
  rngs = {'dropout': jax.random.key(7)}
  params, drop = _check_blockwise_matches_dense(
      x,
      mask,
      causal=True,
      dropout_rate=0.3,
      block_size=8,
      apply_kwargs=dict(deterministic=False, rngs=rngs),
  )
  module = ContextPool(implementation='blockwise', block_size=8, dropout_rate=0.3, causal=True)
  assert not np.allclose(drop, module.apply(params, x, mask))
  with pytest.raises(Exception, match='dropout'):
    module.apply(params, x, mask, deterministic=False)
  # The keep mask has the right rate, and it is independent across examples.
  keep = dropout_keep(jnp.array([1, 2], jnp.uint32), 0.3, jnp.arange(512), jnp.arange(512))
  assert abs(float(keep.mean()) - 0.7) < 0.005
  assert abs(float(jnp.mean(keep[0] == keep[1])) - (0.7**2 + 0.3**2)) < 0.005


@pytest.mark.parametrize('weights', ['learned', 'nonlocal'])
def test_sown_intermediates_are_what_blockwise_pools_with(weights):
  """The sown weights (pairwise for non-local) and sigma, put into the slow Eq. 4
  reference, give the blockwise output."""
  x = _x(SEQ)
  mask = _right_pad_mask(37, [37, 9])
  block = ContextPool(
      implementation='blockwise',
      block_size=4,
      weights=weights,
      causal=True,
      size_norm='sigmoid',
      ratio=0.3,
  )
  params = jax.tree.map(lambda p: 2.0 * p, init_variables(block, jax.random.key(0), x, mask))
  y, state = block.apply(params, x, mask, mutable=['intermediates'])
  sown = {k: v[0] for k, v in state['intermediates'].items()}
  for b in range(SEQ[0]):
    want = ref.pool(x[b], sown['pool_weights'][b], sown['pool_sigma'][b], mask=mask[b], causal=True)
    chex.assert_trees_all_close(np.asarray(y[b]), want, atol=2e-6, rtol=0)  # measured 6.4e-7


@pytest.mark.slow
def test_bfloat16_compute_is_finite_and_close():
  x = _x((2, 30, 8))
  fields = dict(causal=True, weights='nonlocal')
  bf16 = ContextPool(implementation='blockwise', block_size=8, dtype=jnp.bfloat16, **fields)
  params = init_variables(bf16, jax.random.key(0), x)
  dense32 = ContextPool(implementation='dense', **fields)
  y32 = jax.jit(dense32.apply)(params, x)
  y16 = jax.jit(bf16.apply)(params, x)
  loss = lambda module: lambda p: jnp.sum(module.apply(p, x).astype(jnp.float32) ** 2)
  grads = jax.jit(jax.grad(loss(bf16)))(params)
  assert y16.dtype == jnp.bfloat16
  # Measured: 0.0148 = 1.2 bfloat16 epsilons (2^-8) of max |y| = 3.2.
  scale = float(jnp.max(jnp.abs(y32)))
  chex.assert_trees_all_close(y16.astype(jnp.float32), y32, atol=3 * 2.0**-8 * scale, rtol=0)
  chex.assert_tree_all_finite(grads)
  chex.assert_trees_all_equal_dtypes(grads, params)
  # Measured: at most 0.016 of max(1, max |gradient|) per leaf.
  _assert_grads_close(grads, jax.jit(jax.grad(loss(dense32)))(params), rtol=0.035)


# ----------------------------------------------------------------------------
# Causality, vmap.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    'fields',
    [
        dict(),
        dict(weights='nonlocal', locality='random_sparse'),
        dict(locality='adaptive_window', weights='unnormalized'),
    ],
    ids=lambda f: '-'.join(f'{k}={v}' for k, v in f.items()) or 'default',
)
@pytest.mark.sweep
def test_causal_jacobian_is_exactly_zero_above_diagonal(fields):
  n = 10
  x = _x((1, n, 2))
  mask = _right_pad_mask(n, [9])
  module = ContextPool(
      implementation='blockwise', block_size=4, causal=True, ratio=0.5, window=2, **fields
  )
  params = jax.tree.map(lambda p: p * 3.0, init_variables(module, jax.random.key(0), x, mask))
  jac = jax.jit(jax.jacrev(lambda z: module.apply(params, z, mask)))(x)[0, :, :, 0]
  dep = np.asarray(jnp.abs(jac).sum((1, 3)))  # [i, j]
  assert np.all(dep[np.triu_indices(n, 1)] == 0.0), dep
  assert np.all(np.diag(dep)[:9] > 0.0)
  assert dep[np.tril_indices(9, -1)].sum() > 0.0


def _take_positions(t, s):
  """Positions ``s`` (a slice) of a Centres or Context: index on axis 0, the rest on axis 1."""
  return type(t)(
      *(
          None if a is None else (a[s] if name == 'index' else a[:, s])
          for name, a in zip(t._fields, t)
      )
  )


@pytest.mark.parametrize(
    'weights,locality',
    [
        ('learned', 'gaussian'),
        ('nonlocal', 'random_sparse'),
        ('unnormalized', 'adaptive_window'),
        ('uniform', 'fixed_window'),
    ],
)
@pytest.mark.sweep
def test_pool_block_of_any_block_is_that_slice_of_the_whole(weights, locality):
  """pool_block (what the dense path calls on everything and the blockwise path per
  block) depends only on each pair's positions and features: any block, e.g. the
  single centre of a decoding step, gives the slice of the whole-array block."""
  b, n, k = 2, 13, 4
  keys = iter(jax.random.split(jax.random.key(0), 5))
  valid = _right_pad_mask(n, [n, 9])
  nonlocal_ = weights == 'nonlocal'
  rule = ContextPool(
      weights=weights, locality=locality, causal=True, window=2, dropout_rate=0.2
  ).pool_rule((n,), dropout=True)
  centres = cp.Centres(
      index=np.arange(n),
      valid=valid,
      sigma=3.0 * jax.random.uniform(next(keys), (b, n)),
      theta=jax.random.normal(next(keys), (b, n, k)) if nonlocal_ else None,
  )
  context = cp.Context(
      index=np.arange(n),
      valid=valid,
      x=_x((b, n, D)),
      log_w=None if nonlocal_ or weights == 'uniform' else jax.random.normal(next(keys), (b, n)),
      phi=jax.random.normal(next(keys), (b, n, k)) if nonlocal_ else None,
  )
  seeds = jnp.array([3, 4], jnp.uint32)
  whole = cp.pool_block(rule, centres, context, seeds)
  assert (whole.allowed & whole.keep)[0].sum() < n * (n + 1) // 2  # not vacuous
  for q, k_ in [(slice(5, 6), slice(0, 6)), (slice(0, 4), slice(4, 13)), (slice(12, 13), None)]:
    k_ = k_ or slice(0, n)
    part = cp.pool_block(rule, _take_positions(centres, q), _take_positions(context, k_), seeds)
    for name, got in part._asdict().items():
      want = getattr(whole, name)
      if want is None:
        assert got is None, name
      elif want.dtype == bool:
        chex.assert_trees_all_equal(got, want[:, q, k_])
      else:
        chex.assert_trees_all_close(got, want[:, q, k_], atol=1e-6, rtol=0)


def test_skipped_key_blocks():
  """Causal: no key block above the diagonal; fixed window: none out of reach."""
  q = np.arange(37)
  causal = key_block_ranges(q, 8, 8, 5, causal=True, reach=None)
  assert causal == ((0, 1), (0, 2), (0, 3), (0, 4), (0, 5))
  window = key_block_ranges(q, 8, 8, 5, causal=False, reach=3)
  assert window == ((0, 2), (0, 3), (1, 4), (2, 5), (3, 5))
  # Grid 6 x 7, radius 2: reach = 2 * 7 + 2 flat positions.
  grid = key_block_ranges(np.arange(42), 7, 7, 6, causal=False, reach=16)
  assert grid[0] == (0, 4) and grid[5] == (2, 6)


@pytest.mark.slow
def test_vmap_and_jit():
  x = _x(SEQ)
  module = ContextPool(implementation='blockwise', block_size=8, causal=True)
  params = init_variables(module, jax.random.key(0), x)
  y = module.apply(params, x)
  y_v = jax.vmap(module.apply, in_axes=(None, 0))(params, jnp.stack([x, 2.0 * x]))
  chex.assert_trees_all_close(y_v[0], y, atol=1e-6)
  chex.assert_trees_all_close(y_v[1], module.apply(params, 2.0 * x), atol=1e-6)
  chex.assert_trees_all_close(jax.jit(module.apply)(params, x), y, atol=1e-6)


# ----------------------------------------------------------------------------
# 'auto', configuration.
# ----------------------------------------------------------------------------


def _uses_blockwise(module, x):
  params = jax.eval_shape(module.init, jax.random.key(0), x)
  return 'custom_vjp_call' in str(jax.make_jaxpr(module.apply)(params, x))


def test_auto_picks_blockwise_above_its_threshold():
  threshold = cp.AUTO_BLOCKWISE_THRESHOLD
  module = ContextPool()
  assert module.implementation == 'auto'
  assert module.resolved_implementation(threshold) == 'dense'
  assert module.resolved_implementation(threshold + 1) == 'blockwise'
  assert ContextPool(implementation='dense').resolved_implementation(10**6) == 'dense'
  assert ContextPool(implementation='blockwise').resolved_implementation(4) == 'blockwise'
  # What actually runs: sequences and grids, by the number of input positions.
  assert not _uses_blockwise(module, jnp.zeros((1, threshold, 2)))
  assert _uses_blockwise(module, jnp.zeros((1, threshold + 1, 2)))
  assert _uses_blockwise(
      ContextPool(weights='nonlocal', locality='adaptive_window'), jnp.zeros((1, threshold + 1, 2))
  )
  assert _uses_blockwise(ContextPool(strides=2), jnp.zeros((1, 33, 32, 2)))
  assert not _uses_blockwise(ContextPool(strides=2), jnp.zeros((1, 32, 32, 2)))


def test_forward_mode_autodiff_raises_with_blockwise_only():
  """The documented price of the custom VJP; 'dense' still supports jvp."""
  x = _x((1, 10, 2))
  params = init_variables(ContextPool(), jax.random.key(0), x)
  tangent = (x,)
  jax.jvp(lambda z: ContextPool(implementation='dense').apply(params, z), (x,), tangent)
  block = ContextPool(implementation='blockwise', block_size=4)
  with pytest.raises(TypeError, match='forward-mode autodiff'):
    jax.jvp(lambda z: block.apply(params, z), (x,), tangent)


@pytest.mark.parametrize(
    'field,value',
    [
        ('implementation', 'flash'),
        ('implementation', None),
        ('block_size', 0),
        ('block_size', 2.5),
        ('block_size', True),
        ('gaussian_skip_nats', 0.0),
        ('gaussian_skip_nats', 'high'),
    ],
)
def test_invalid_implementation_config_raises(field, value):
  with pytest.raises(ValueError) as err:
    ContextPool(**{field: value}).init(jax.random.key(0), _x((1, 6, D)))
  assert f'ContextPool.{field}={value!r}' in str(err.value)


# ----------------------------------------------------------------------------
# Gaussian block skipping: bounded against the dense path.
# ----------------------------------------------------------------------------


def _skip_case(spatial, causal, lengths, seed=0, features=None, max_sigma=4.0):
  """A rule and PoolInputs with small random sigmas (so that far key blocks
  can be skipped) and learned-style log weights, right-padded to ``lengths``."""
  n = int(np.prod(spatial))
  keys = jax.random.split(jax.random.key(seed), 3)
  valid = _right_pad_mask(n, lengths)
  rule = ContextPool(causal=causal).pool_rule(spatial, dropout=False)
  x = _x((len(lengths), n, D), seed + 1) if features is None else features
  centres = cp.Centres(
      index=np.arange(n),
      valid=valid,
      sigma=0.3 + max_sigma * jax.random.uniform(keys[0], (len(lengths), n)),
  )
  context = cp.Context(
      index=jnp.arange(n),
      valid=valid,
      x=x,
      log_w=2.0 * jax.random.normal(keys[1], (len(lengths), n)),
  )
  return rule, cp.PoolInputs(centres, context)


def _pool(rule, inputs, nats, block_size=16):
  if nats == 'dense':
    return cp.pool_dense(rule, inputs)
  return cp.pool_blockwise(rule, block_size, inputs, nats)


# (spatial, causal, largest sigma): on the 15 x 20 grid a block of 16 spans
# whole rows, so only rows far away can be skipped: smaller sigmas there.
SKIP_CASES = [((300,), False, 4.0), ((300,), True, 4.0), ((15, 20), False, 1.0)]


@pytest.mark.parametrize('spatial,causal,max_sigma', SKIP_CASES)
@pytest.mark.parametrize('nats', [8.0, cp.GAUSSIAN_SKIP_NATS])
@pytest.mark.sweep
def test_gaussian_skipping_loses_at_most_n_exp_minus_nats_of_each_row(
    spatial, causal, max_sigma, nats
):
  """Features = one-hot of the key block: the dense output is each row's mass per
  block, the skipping output is zero on the blocks it skipped; their dense mass
  is at most n exp(-nats), in float32 and with padding."""
  n, block = int(np.prod(spatial)), 16
  one_hot = jax.nn.one_hot(jnp.arange(n) // block, -(-n // block), dtype=jnp.float32)
  rule, inputs = _skip_case(
      spatial, causal, [n, 250], features=jnp.stack([one_hot] * 2), max_sigma=max_sigma
  )
  visited, planned = cp.blockwise_visits(rule, block, inputs, nats)
  # Not vacuous (on the grid, a block of whole rows is skipped less often).
  assert int(visited) < (planned // 2 if len(spatial) == 1 else planned), (int(visited), planned)
  mass = np.asarray(_pool(rule, inputs, 'dense'), np.float64)
  kept = np.asarray(_pool(rule, inputs, nats, block), np.float64)
  real = np.asarray(inputs.centres.valid)
  skipped_mass = np.where(kept == 0.0, mass, 0.0).sum(-1)[real]
  assert skipped_mass.max() <= n * np.exp(-nats) + 1e-6, skipped_mass.max()
  chex.assert_trees_all_close(kept.sum(-1)[real], np.ones(real.sum()), atol=2e-6)


@pytest.mark.parametrize('spatial,causal,max_sigma', SKIP_CASES)
@pytest.mark.sweep
def test_gaussian_skipping_outputs_and_gradients_match_dense(spatial, causal, max_sigma):
  """Outputs within the bound 2 max|x| n exp(-nats) (+ float32 rounding) at a
  small margin; at the default margin, outputs and gradients (sigma, a, x)
  within the float32 tolerances of blockwise == dense."""
  n = int(np.prod(spatial))
  rule, inputs = _skip_case(spatial, causal, [n, 250], max_sigma=max_sigma)
  y_dense = _pool(rule, inputs, 'dense')
  nats = 6.0
  y_small = _pool(rule, inputs, nats)
  bound = 2.0 * float(jnp.abs(inputs.context.x).max()) * n * np.exp(-nats) + 2e-6
  assert float(jnp.abs(y_small - y_dense).max()) <= bound
  chex.assert_trees_all_close(
      _pool(rule, inputs, cp.GAUSSIAN_SKIP_NATS), y_dense, atol=2e-6, rtol=0
  )

  probe = jax.random.normal(jax.random.key(99), y_dense.shape)

  def grads(nats):
    def loss(sigma, log_w, x):
      c = inputs.centres._replace(sigma=sigma)
      k = inputs.context._replace(log_w=log_w, x=x)
      return jnp.sum(jnp.sin(_pool(rule, cp.PoolInputs(c, k), nats)) * probe)

    return jax.grad(loss, (0, 1, 2))(inputs.centres.sigma, inputs.context.log_w, inputs.context.x)

  _assert_grads_close(grads(cp.GAUSSIAN_SKIP_NATS), grads('dense'))


def test_module_skips_by_default_and_matches_dense():
  """The module field: small sigmas (ratio 0.02) and blocks of 8, with padding;
  padding does not change the real tokens' outputs."""
  x = _x(SEQ)
  mask = _right_pad_mask(37, [37, 23])
  assert ContextPool().gaussian_skip_nats == cp.GAUSSIAN_SKIP_NATS
  params, y = _check_blockwise_matches_dense(x, mask, ratio=0.02, spread=3.0, causal=True)
  alone = ContextPool(implementation='blockwise', block_size=8, ratio=0.02, causal=True)
  y_alone = alone.apply(params, x[1:, :23])
  chex.assert_trees_all_close(y[1:, :23], y_alone, atol=2e-6, rtol=0)


@pytest.mark.slow
def test_gaussian_skipping_never_reads_later_inputs():
  """Causal: changing the inputs after t (their weights a_j included) leaves the
  outputs up to t exactly unchanged, with a skipping margin small enough to
  skip most blocks."""
  n, t = 64, 37
  module = ContextPool(
      implementation='blockwise', block_size=8, causal=True, ratio=0.05, gaussian_skip_nats=2.0
  )
  x = _x((1, n, 2))
  params = jax.tree.map(lambda p: p * 3.0, init_variables(module, jax.random.key(0), x))
  x_later = x.at[:, t + 1 :].set(10.0 * _x((1, n - t - 1, 2), 5))
  apply = jax.jit(module.apply)
  chex.assert_trees_all_equal(apply(params, x)[:, : t + 1], apply(params, x_later)[:, : t + 1])


# ----------------------------------------------------------------------------
# Memory: compiled only, never run.
# ----------------------------------------------------------------------------


def _compiled_temp_bytes(implementation, n):
  from benchmarks.contextpool_memory import compile_pool_step

  return compile_pool_step(n, implementation, batch=1, features=512, block_size=512, causal=True)[
      'temp_bytes'
  ]


def test_blockwise_temp_memory_at_8192_is_8x_below_dense():
  """enwik8's last stage: n = 8192, batch 1, 512 features, causal, cnn mapping."""
  dense = _compiled_temp_bytes('dense', 8192)
  block = _compiled_temp_bytes('blockwise', 8192)
  assert dense >= 8 * block, (dense / 2**20, block / 2**20)
  # The dense pooling matrix alone is 8192^2 float32 = 256 MiB; blockwise must
  # not hold anything of that order.
  assert block < 128 * 2**20, block / 2**20
