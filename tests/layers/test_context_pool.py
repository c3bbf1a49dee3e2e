"""ContextPool: Eq. 4 / Eq. 6 against slow references, limits, causality, padding."""

import functools
import itertools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.layers.context_pool import ContextPool, pool_centres
import ref_context_pool as ref

B, N, D = 2, 9, 3
WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
MAPPINGS = ('cnn', 'mlp', 'attention')


def _x(shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _right_pad_mask(batch, n, lengths):
  return jnp.arange(n)[None, :] < jnp.asarray(lengths)[:, None]


def _init_apply(module, x, mask=None, seed=1, params=None, spread=3.0):
  if params is None:
    params = module.init(jax.random.key(seed), x, mask)
    # Spread the mapping's outputs so weights and sizes vary a lot per token.
    params = jax.tree.map(lambda p: p * spread, params)
  y, state = module.apply(params, x, mask, mutable=['intermediates'])
  inter = {k: v[0] for k, v in state['intermediates'].items()}
  return params, y, inter


# ----------------------------------------------------------------------------
# Eq. 4 and Eq. 6 against the slow loops, using the sown weights and sigma.
# ----------------------------------------------------------------------------

SEQ_CASES = list(
    itertools.product(
        ('learned', 'unnormalized', 'uniform'),
        ('gaussian', 'none', 'fixed_window', 'adaptive_window'),
        (False, True),  # causal
    )
)


@pytest.mark.parametrize('weights,locality,causal', SEQ_CASES)
def test_eq4_sequence_matches_reference(weights, locality, causal):
  x = _x((B, N, D))
  mask = _right_pad_mask(B, N, [N, 6])
  module = ContextPool(
      weights=weights, locality=locality, causal=causal, size_norm='sigmoid', ratio=0.3, window=2
  )
  _, y, inter = _init_apply(module, x, mask)
  for b in range(B):
    want = ref.pool(
        x[b],
        inter['pool_weights'][b],
        inter.get('pool_sigma', [None] * B)[b],
        mask=mask[b],
        causal=causal,
        locality=locality,
        window=2,
    )
    chex.assert_trees_all_close(np.asarray(y[b]), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize('size_norm', ['softmax', 'sigmoid'])
@pytest.mark.parametrize('causal', [False, True])
def test_sigma_and_weights_follow_the_paper(size_norm, causal):
  """Sown w = softmax of the raw weight channel; sigma = r * n * s (A1 variants)."""
  x = _x((B, N, D))
  mask = _right_pad_mask(B, N, [N, 5])
  module = ContextPool(size_norm=size_norm, causal=causal, ratio=0.1)
  params, _, inter = _init_apply(module, x, mask)
  p = params['params']
  for b in range(B):
    xm = np.where(mask[b][:, None], x[b], 0.0)
    h = (
        ref.relu(
            ref.conv(xm, p['mapping_conv_0']['kernel'], p['mapping_conv_0']['bias'], causal=causal)
        )
        * np.asarray(mask[b])[:, None]
    )
    raw = ref.conv(h, p['mapping_conv_1']['kernel'], p['mapping_conv_1']['bias'], causal=causal)
    m = np.asarray(mask[b])
    chex.assert_trees_all_close(
        np.asarray(inter['pool_weights'][b]), ref.softmax(raw[:, 0], m), atol=7e-7, rtol=0
    )
    want_sigma = ref.sizes_to_sigma(raw[:, 1], m, size_norm=size_norm, causal=causal, ratio=0.1)
    chex.assert_trees_all_close(
        np.asarray(inter['pool_sigma'][b])[m], want_sigma[m], atol=3e-7, rtol=0
    )


def _ref_cnn_raw(p, x, mask, causal):
  """The cnn mapping's raw outputs ``[n, 2]`` of one example, by the reference convolutions."""
  m = np.asarray(mask)
  xm = np.where(m[:, None], x, 0.0)
  conv = lambda z, name: ref.conv(z, p[name]['kernel'], p[name]['bias'], causal=causal)
  return conv(ref.relu(conv(xm, 'mapping_conv_0')) * m[:, None], 'mapping_conv_1')


@pytest.mark.parametrize('size_norm', ['softmax', 'sigmoid'])
@pytest.mark.parametrize('causal', [False, True])
def test_static_sigma_length_replaces_n(size_norm, causal):
  """sigma_length=L: sigma_i = r L s_i at every position (not r n_i s_i), then Eq. 4."""
  x = _x((B, N, D))
  mask = _right_pad_mask(B, N, [N, 5])
  module = ContextPool(size_norm=size_norm, causal=causal, ratio=0.1, sigma_length=20)
  params, y, inter = _init_apply(module, x, mask)
  for b in range(B):
    m = np.asarray(mask[b])
    raw = _ref_cnn_raw(params['params'], np.asarray(x[b]), m, causal)
    sigma = ref.sizes_to_sigma(
        raw[:, 1], m, size_norm=size_norm, causal=causal, ratio=0.1, length=20
    )
    chex.assert_trees_all_close(
        np.asarray(inter['pool_sigma'][b])[m], sigma[m], atol=3e-7, rtol=1e-6
    )
    want = ref.pool(x[b], ref.softmax(raw[:, 0], m), sigma, mask=m, causal=causal)
    chex.assert_trees_all_close(np.asarray(y[b]), want, atol=1e-6, rtol=2e-6)  # float32 sums


@pytest.mark.parametrize('mapping', MAPPINGS)
def test_size_bias_init_sets_the_initial_size(mapping):
  """The raw size channel's bias starts at size_bias_init (the weight channel's
  at 0), so with a zero last kernel every real token starts at s = sigmoid(b)."""
  x = _x((B, N, D))
  module = ContextPool(mapping=mapping, causal=True, size_bias_init=-3.2)
  params = module.init(jax.random.key(0), x)['params']
  last = {'cnn': 'mapping_conv_1', 'mlp': 'mapping_dense_1', 'attention': 'mapping_dense'}[mapping]
  chex.assert_trees_all_equal(params[last]['bias'], jnp.array([0.0, -3.2]))
  params[last]['kernel'] = jnp.zeros_like(params[last]['kernel'])
  _, inter = module.apply({'params': params}, x, mutable=['intermediates'])
  s = inter['intermediates']['pool_size'][0]
  chex.assert_trees_all_close(s, jnp.full(s.shape, 1.0 / (1.0 + np.exp(3.2))), atol=1e-7, rtol=0)
  # No size channel (a fixed window): the one weight channel keeps a zero bias.
  fixed = ContextPool(locality='fixed_window', size_bias_init=-3.2).init(jax.random.key(0), x)
  chex.assert_trees_all_equal(fixed['params']['mapping_conv_1']['bias'], jnp.zeros(1))


@pytest.mark.parametrize('causal', [False, True])
def test_gate_interpolates_between_input_and_pooled_features(causal):
  """gate: y = x + g * (Eq. 4's pooled x - x), g learned per feature from gate_init."""
  x = _x((B, N, D))
  mask = _right_pad_mask(B, N, [N, 6])
  module = ContextPool(gate=True, gate_init=0.25, causal=causal, ratio=0.3)
  params = module.init(jax.random.key(1), x, mask)
  chex.assert_trees_all_equal(params['params']['gate'], jnp.full((D,), 0.25))
  g = jnp.array([0.0, 0.7, 1.3])
  params['params']['gate'] = g
  params, y, inter = _init_apply(module, x, mask, params=params)
  for b in range(B):
    m = np.asarray(mask[b])
    pooled = ref.pool(x[b], inter['pool_weights'][b], inter['pool_sigma'][b], mask=m, causal=causal)
    xb = np.asarray(x[b], np.float64)
    want = np.where(m[:, None], xb + np.asarray(g) * (pooled - xb), xb)
    chex.assert_trees_all_close(np.asarray(y[b]), want, atol=1e-6, rtol=0)
  # g = 0 everywhere is the identity.
  params['params']['gate'] = jnp.zeros((D,))
  chex.assert_trees_all_equal(module.apply(params, x, mask), x)


@pytest.mark.parametrize('mapping', MAPPINGS)
@pytest.mark.parametrize('causal', [False, True])
def test_mapping_variants_match_reference(mapping, causal):
  """m(X): cnn (two convolutions), mlp (per token), attention (single head)."""
  x = _x((1, N, D))
  mask = _right_pad_mask(1, N, [7])
  module = ContextPool(mapping=mapping, causal=causal, weights='unnormalized', size_norm='sigmoid')
  params, _, inter = _init_apply(module, x, mask)
  p = params['params']
  m = np.asarray(mask[0])
  xm = np.where(m[:, None], np.asarray(x[0]), 0.0)
  if mapping == 'cnn':
    h = (
        ref.relu(
            ref.conv(xm, p['mapping_conv_0']['kernel'], p['mapping_conv_0']['bias'], causal=causal)
        )
        * m[:, None]
    )
    raw = ref.conv(h, p['mapping_conv_1']['kernel'], p['mapping_conv_1']['bias'], causal=causal)
  elif mapping == 'mlp':
    raw = ref.dense(ref.relu(ref.dense(xm, p['mapping_dense_0'])), p['mapping_dense_1'])
  else:
    h = ref.single_head_attention(xm, p['mapping_attention'], m, causal)
    raw = ref.dense(h, p['mapping_dense'])
  softplus = np.logaddexp(0.0, raw[:, 0])
  chex.assert_trees_all_close(
      np.asarray(inter['pool_weights'][0])[m], softplus[m], atol=1e-7, rtol=5e-6
  )
  sigma = ref.sizes_to_sigma(raw[:, 1], m, size_norm='sigmoid', causal=causal, ratio=0.1)
  chex.assert_trees_all_close(np.asarray(inter['pool_sigma'][0])[m], sigma[m], atol=1e-6, rtol=0)


@pytest.mark.parametrize('causal', [False, True])
def test_nonlocal_weights_eq3(causal):
  """w^i_j = softmax_j(theta(x_i)^T phi(x_j) / sqrt(k)), pooled with the Gaussian."""
  x = _x((1, N, D))
  mask = _right_pad_mask(1, N, [7])
  module = ContextPool(weights='nonlocal', causal=causal, size_norm='sigmoid', ratio=0.3)
  params, y, inter = _init_apply(module, x, mask)
  p = params['params']
  # Eq. 3's theta and phi are linear maps: a kernel each, no bias.
  assert set(p['nonlocal_theta']) == set(p['nonlocal_phi']) == {'kernel'}
  xf = np.asarray(x[0], np.float64)
  theta = ref.linear(xf, p['nonlocal_theta']['kernel'])
  phi = ref.linear(xf, p['nonlocal_phi']['kernel'])
  logits = theta @ phi.T / np.sqrt(theta.shape[-1])
  m = np.asarray(mask[0])
  w = np.zeros((N, N))
  for i in range(N):
    visible = m & m[i]
    if causal:
      visible = visible & (np.arange(N) <= i)
    if visible.any():
      w[i] = ref.softmax(logits[i], visible)
  chex.assert_trees_all_close(np.asarray(inter['pool_weights'][0]), w, atol=5e-7, rtol=0)
  want = ref.pool(x[0], w, inter['pool_sigma'][0], mask=m, causal=causal)
  chex.assert_trees_all_close(np.asarray(y[0]), want, atol=3e-7, rtol=0)


@pytest.mark.parametrize('weights', ['learned', 'uniform'])
@pytest.mark.parametrize('locality', ['gaussian', 'fixed_window', 'adaptive_window'])
def test_eq6_grid_matches_reference(weights, locality):
  x = _x((B, 5, 6, D))
  mask = jnp.ones((B, 5, 6), bool).at[1, 3:, 4:].set(False)
  module = ContextPool(weights=weights, locality=locality, size_norm='sigmoid', window=2)
  _, y, inter = _init_apply(module, x, mask)
  for b in range(B):
    want = ref.pool(
        x[b],
        inter['pool_weights'][b],
        inter.get('pool_sigma', [None] * B)[b],
        mask=mask[b],
        locality=locality,
        window=2,
    )
    chex.assert_trees_all_close(np.asarray(y[b]).reshape(-1, D), want, atol=7e-7, rtol=0)


def test_grid_sigma_uses_half_perimeter():
  x = _x((1, 4, 7, D))
  module = ContextPool(size_norm='softmax')
  params, _, inter = _init_apply(module, x)
  p = params['params']
  h = ref.relu(ref.conv(x[0], p['mapping_conv_0']['kernel'], p['mapping_conv_0']['bias']))
  raw = ref.conv(h, p['mapping_conv_1']['kernel'], p['mapping_conv_1']['bias'])
  want = ref.sizes_to_sigma(
      raw[..., 1], np.ones((4, 7), bool), size_norm='softmax', causal=False, ratio=0.05, grid=True
  )
  chex.assert_trees_all_close(np.asarray(inter['pool_sigma'][0]), want, atol=2e-8, rtol=0)


# Expected centres, worked out by hand from the rule in docs/context_pool.md and the
# docstring: ceil(size / stride) outputs; output o pools around the centre of
# nn.avg_pool's 'SAME' window o (total padding (out - 1) * stride + window -
# size, half of it, rounded down, before), rounded down to a grid position.
STRIDED_CASES = [
    # 8 x 8, window = stride = 2 (the ResNets' downsampling): no padding,
    # windows {2o, 2o + 1}, centre 2o + 0.5 -> 2o.
    ((8, 8), 2, None, [0, 2, 4, 6], [0, 2, 4, 6]),
    # 7 x 7, window = stride = 2: one padded position after; windows {2o, 2o + 1} -> 2o.
    ((7, 7), 2, None, [0, 2, 4, 6], [0, 2, 4, 6]),
    # 7 x 9, stride 2, window 3: two padded positions, one before; windows
    # [2o - 1, 2o + 1] -> 2o.
    ((7, 9), 2, 3, [0, 2, 4, 6], [0, 2, 4, 6, 8]),
    # 6 x 5, strides (3, 2), windows (3, 2): rows [3o, 3o + 2] -> 3o + 1; columns
    # padded once after, [2o, 2o + 1] -> 2o.
    ((6, 5), (3, 2), None, [1, 4], [0, 2, 4]),
    # 9 x 7, stride 3, window 3: rows [3o, 3o + 2] -> 3o + 1; columns padded once
    # before and once after, [3o - 1, 3o + 1] -> 3o.
    ((9, 7), 3, 3, [1, 4, 7], [0, 3, 6]),
]


@pytest.mark.parametrize('shape,strides,window_shape,rows,cols', STRIDED_CASES)
@pytest.mark.sweep
def test_strided_grid_is_dense_grid_at_centres(shape, strides, window_shape, rows, cols):
  x = _x((B, *shape, D))
  strided = ContextPool(strides=strides, window_shape=window_shape, size_norm='sigmoid')
  dense = ContextPool(size_norm='sigmoid')
  params = strided.init(jax.random.key(3), x)
  y_s = strided.apply(params, x)
  y_d = dense.apply(params, x)
  chex.assert_shape(y_s, (B, len(rows), len(cols), D))
  chex.assert_trees_all_close(y_s, y_d[:, rows][:, :, cols], atol=1e-6, rtol=0)


def test_pool_centres_match_avg_pool_windows():
  """Centres are the centres of nn.avg_pool's 'SAME' windows, rounded down for
  even windows: averaging the input indices over an interior window (one not
  clipped by padding) gives its centre, c or c + 0.5."""
  for size, stride, window in [
      (8, 2, 3),
      (7, 2, 3),
      (9, 3, 3),
      (10, 2, 5),
      (8, 2, 2),
      (7, 2, 2),
      (10, 4, 4),
      (9, 3, 2),
  ]:
    x = jnp.arange(size, dtype=jnp.float32)[None, :, None]
    pooled = np.asarray(
        nn.avg_pool(x, (window,), (stride,), padding='SAME', count_include_pad=False)
    )[0, :, 0]
    (c,) = pool_centres((size,), (stride,), (window,))
    assert len(c) == len(pooled) == -(-size // stride)
    interior = [
        o for o in range(len(c)) if c[o] - (window - 1) // 2 >= 0 and c[o] + window // 2 <= size - 1
    ]
    assert interior, (size, stride, window)
    np.testing.assert_array_equal(np.floor(pooled[interior]), c[interior])


# ----------------------------------------------------------------------------
# Limits.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('weights', ['learned', 'unnormalized', 'uniform', 'nonlocal'])
@pytest.mark.parametrize('grid', [False, True])
def test_sigma_to_zero_is_identity(weights, grid):
  shape = (B, 4, 5, D) if grid else (B, N, D)
  x = _x(shape)
  module = ContextPool(weights=weights, ratio=1e-7, size_norm='sigmoid')
  _, y, _ = _init_apply(module, x)
  chex.assert_trees_all_equal(y, x)


@pytest.mark.parametrize('causal', [False, True])
def test_uniform_weights_infinite_sigma_is_mean_of_real_tokens(causal):
  x = _x((B, N, D))
  lengths = [N, 4]
  mask = _right_pad_mask(B, N, lengths)
  module = ContextPool(weights='uniform', ratio=1e7, size_norm='sigmoid', causal=causal)
  _, y, inter = _init_apply(module, x, mask, spread=1.0)
  assert float(jnp.min(jnp.where(mask, inter['pool_sigma'], jnp.inf))) > 1e4
  for b, length in enumerate(lengths):
    xr = np.asarray(x[b, :length], np.float64)
    want = (
        np.cumsum(xr, 0) / np.arange(1, length + 1)[:, None]
        if causal
        else np.broadcast_to(xr.mean(0), xr.shape)
    )
    chex.assert_trees_all_close(np.asarray(y[b, :length]), want, atol=4e-7, rtol=0)
    chex.assert_trees_all_equal(y[b, length:], x[b, length:])  # padding passed through


def test_no_locality_uniform_is_global_mean_on_grid():
  x = _x((1, 3, 4, D))
  _, y, _ = _init_apply(ContextPool(weights='uniform', locality='none'), x)
  chex.assert_trees_all_close(
      y, jnp.broadcast_to(x.mean((1, 2), keepdims=True), x.shape), atol=2e-7, rtol=0
  )


def test_residual_adds_the_pooled_features():
  x = _x((B, N, D))
  plain, res = ContextPool(size_norm='sigmoid'), ContextPool(size_norm='sigmoid', residual=True)
  params = plain.init(jax.random.key(0), x)
  chex.assert_trees_all_equal(res.apply(params, x), x + plain.apply(params, x))


# ----------------------------------------------------------------------------
# Random sparse support, adaptive window training.
# ----------------------------------------------------------------------------


def _support(module, spatial, params=None):
  """The pooling support [n, n] of a uniform-weights module: with one-hot input
  features (x_j = e_j), y_i = mean of e_j over i's support, so j is in it iff
  y_ij > 0."""
  n = int(np.prod(spatial))
  x = jnp.eye(n, dtype=jnp.float32).reshape(1, *spatial, n)
  if params is None:
    params = module.init(jax.random.key(0), x)
  return np.asarray(module.apply(params, x)).reshape(n, n) > 0


def _lattice_offsets(ndim, radius):
  """Non-zero integer offsets of Euclidean length <= radius, by brute force."""
  r = range(-radius, radius + 1)
  return [
      o for o in itertools.product(*[r] * ndim) if any(o) and sum(c * c for c in o) <= radius**2
  ]


@pytest.mark.parametrize(
    'spatial,window,span,causal',
    [
        ((160,), 4, None, False),
        ((160,), 4, None, True),
        ((160,), 3, 5, True),
        ((18, 18), 2, None, False),
    ],
)
def test_random_sparse_support_is_fixed_seeded_and_as_large_as_the_window(
    spatial, window, span, causal
):
  """Each token keeps itself and each position within radius random_span
  (default 4 * window) with probability K / M, K and M the offsets within
  window and random_span: as many, in expectation, as the fixed window."""
  fields = dict(
      weights='uniform', locality='random_sparse', window=window, random_span=span, causal=causal
  )
  module = ContextPool(**fields)
  support = _support(module, spatial)
  span = 4 * window if span is None else span
  n = support.shape[0]
  coords = np.stack(np.unravel_index(np.arange(n), spatial), -1)
  d2 = np.sum(np.square(coords[:, None] - coords[None, :]), -1)
  candidates = (d2 > 0) & (d2 <= span**2)
  if causal:
    candidates &= np.tril(np.ones((n, n), bool))
  assert support.diagonal().all()
  assert not (support & ~candidates & (d2 > 0)).any()  # nothing outside the span (or future)
  # Fixed: independent of the parameters; a different seed gives another support.
  x = jnp.zeros((1, *spatial, n))
  again = _support(module, spatial, module.init(jax.random.key(5), x))
  np.testing.assert_array_equal(support, again)
  other = _support(ContextPool(random_seed=1, **fields), spatial)
  assert (support != other).any()
  # Keep rate K / M over all candidates (binomial: within 5 standard deviations).
  prob = len(_lattice_offsets(len(spatial), window)) / len(_lattice_offsets(len(spatial), span))
  kept = support[candidates].mean()
  assert abs(kept - prob) < 5 * np.sqrt(prob * (1 - prob) / candidates.sum()), (kept, prob)
  # Tokens whose span lies inside the input keep K others on average (causal: K / 2).
  interior = np.all((coords >= span) & (coords < np.array(spatial) - span), -1)
  others = support[interior].sum(-1) - 1
  k = len(_lattice_offsets(len(spatial), window)) / (2 if causal else 1)
  assert abs(others.mean() - k) < 5 * np.sqrt(k / interior.sum()), (others.mean(), k)


def test_random_sparse_pools_uniformly_over_its_support():
  n = 40
  x = _x((1, n, 2))
  module = ContextPool(weights='uniform', locality='random_sparse', window=3)
  support = _support(module, (n,))
  y = module.apply(module.init(jax.random.key(0), x), x)
  want = ref.pool(x[0], np.ones(n), locality='support', support=support)
  chex.assert_trees_all_close(np.asarray(y[0]), want, atol=3e-7, rtol=0)


@pytest.mark.parametrize('implementation', ['dense', 'blockwise'])
def test_random_sparse_grid_support_does_not_depend_on_grid_padding(implementation):
  """The same 5 x 6 real grid alone or padded to 7 x 9: the same outputs."""
  x = _x((1, 7, 9, D))
  mask = jnp.zeros((1, 7, 9), bool).at[:, :5, :6].set(True)
  module = ContextPool(
      weights='uniform',
      locality='random_sparse',
      window=2,
      implementation=implementation,
      block_size=8,
  )
  params = module.init(jax.random.key(0), x, mask)
  padded = module.apply(params, x, mask)[:, :5, :6]
  alone = module.apply(params, x[:, :5, :6])
  chex.assert_trees_all_close(padded, alone, atol=4e-7, rtol=0)


def test_adaptive_window_radius_is_trainable():
  x = _x((1, 16, D))
  module = ContextPool(locality='adaptive_window', size_norm='sigmoid', ratio=0.3)
  params = module.init(jax.random.key(0), x)

  def loss(p):
    return jnp.sum(jnp.square(module.apply(p, x) - jnp.roll(x, 1, axis=1)))

  grads = jax.grad(loss)(params)['params']['mapping_conv_1']
  chex.assert_tree_all_finite(grads)
  # Channel 1 predicts the size; a hard window alone would give it no gradient.
  assert float(jnp.abs(grads['kernel'][..., 1]).sum()) > 0.0


# ----------------------------------------------------------------------------
# Causality (A4) and padding (A5).
# ----------------------------------------------------------------------------

CAUSAL_CASES = (
    [dict(weights=w) for w in WEIGHTS]
    + [dict(locality=l) for l in LOCALITIES if l != 'gaussian']
    + [dict(mapping=m) for m in MAPPINGS if m != 'cnn']
    + [
        dict(size_norm='softmax'),
        dict(residual=True),
        dict(mapping='attention', weights='nonlocal'),
        dict(kernel_size=5, size_norm='sigmoid', weights='unnormalized'),
        dict(sigma_length=6),
        dict(sigma_length=6, size_norm='softmax'),
        dict(gate=True, gate_init=0.5),
        dict(size_bias_init=-0.5),
    ]
)


def _case_id(case):
  return '-'.join(f'{k}={v}' for k, v in case.items())


@pytest.mark.parametrize('case', CAUSAL_CASES, ids=_case_id)
@pytest.mark.sweep
def test_causal_jacobian_is_exactly_zero_above_diagonal(case):
  n = 8
  x = _x((1, n, D))
  mask = _right_pad_mask(1, n, [7])
  module = ContextPool(causal=True, ratio=0.5, window=2, **case)
  params = jax.tree.map(lambda p: p * 3.0, module.init(jax.random.key(0), x, mask))
  jac = jax.jit(jax.jacrev(lambda z: module.apply(params, z, mask)))(x)[0, :, :, 0]  # [n,d,n,d]
  dep = np.asarray(jnp.abs(jac).sum((1, 3)))  # [i, j]
  assert np.all(dep[np.triu_indices(n, 1)] == 0.0), dep
  assert np.all(np.diag(dep)[:7] > 0.0)
  # Not vacuous: real positions do read earlier ones (except pure identity-like cases).
  assert dep[np.tril_indices(7, -1)].sum() > 0.0


@pytest.mark.parametrize('case', CAUSAL_CASES, ids=_case_id)
@pytest.mark.sweep
def test_causal_output_does_not_depend_on_sequence_length(case):
  """A prefix gives the same outputs as the full sequence: generation == training."""
  x = _x((B, 12, D))
  module = ContextPool(causal=True, ratio=0.5, window=2, **case)
  params = module.init(jax.random.key(0), x)
  full = module.apply(params, x)
  chex.assert_trees_all_close(module.apply(params, x[:, :7]), full[:, :7], atol=7e-7, rtol=0)


PAD_CASES = (
    [dict(weights=w) for w in WEIGHTS]
    + [dict(locality=l) for l in LOCALITIES]
    + [dict(mapping=m) for m in MAPPINGS]
    + [dict(size_norm='softmax'), dict(residual=True)]
    + [dict(sigma_length=12), dict(gate=True, gate_init=0.5)]
)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('case', PAD_CASES, ids=_case_id)
@pytest.mark.sweep
def test_padding_never_changes_real_outputs(case, causal):
  n, length = 10, 6
  x = _x((B, n, D))
  mask = _right_pad_mask(B, n, [length, length])
  module = ContextPool(causal=causal, window=2, **case)
  params = jax.tree.map(lambda p: p * 3.0, module.init(jax.random.key(0), x, mask))
  y = module.apply(params, x, mask)
  garbage = x.at[:, length:].set(1e4 * _x((B, n - length, D), seed=7))
  y_garbage = module.apply(params, garbage, mask)
  chex.assert_trees_all_equal(y[:, :length], y_garbage[:, :length])
  chex.assert_tree_all_finite(y_garbage)
  y_short = module.apply(params, x[:, :length])
  chex.assert_trees_all_close(y[:, :length], y_short, atol=2e-6, rtol=0)


@pytest.mark.parametrize(
    'case',
    [dict(), dict(weights='nonlocal'), dict(mapping='attention'), dict(locality='adaptive_window')],
    ids=_case_id,
)
def test_grid_padding_values_never_change_real_outputs(case):
  x = _x((B, 5, 6, D))
  mask = jnp.ones((B, 5, 6), bool).at[:, 3:, :].set(False).at[:, :, 5:].set(False)
  module = ContextPool(size_norm='sigmoid', **case)
  params = jax.tree.map(lambda p: p * 3.0, module.init(jax.random.key(0), x, mask))
  garbage = jnp.where(mask[..., None], x, 1e4)
  chex.assert_trees_all_equal(
      module.apply(params, x, mask)[mask], module.apply(params, garbage, mask)[mask]
  )


# ----------------------------------------------------------------------------
# Transformations, dtypes, dropout.
# ----------------------------------------------------------------------------

ALL_VARIANTS = (
    [dict(weights=w) for w in WEIGHTS]
    + [dict(locality=l) for l in LOCALITIES]
    + [dict(mapping=m) for m in MAPPINGS]
    + [dict(size_norm='softmax', causal=True)]
    + [dict(sigma_length=16, causal=True), dict(gate=True, gate_init=0.5)]
    + [dict(strides=2)]
)


@pytest.mark.parametrize('case', ALL_VARIANTS, ids=_case_id)
@pytest.mark.sweep
def test_jit_grad_vmap(case):
  grid = 'strides' in case
  x = _x((B, 6, 6, D) if grid else (B, N, D))
  module = ContextPool(**dict(dict(size_norm='sigmoid'), **case))
  params = module.init(jax.random.key(0), x)
  y = module.apply(params, x)
  chex.assert_trees_all_close(jax.jit(module.apply)(params, x), y, atol=1e-6)
  stacked = jnp.stack([x, 2.0 * x])
  y_v = jax.vmap(module.apply, in_axes=(None, 0))(params, stacked)
  chex.assert_trees_all_close(y_v[1], module.apply(params, 2.0 * x), atol=1e-6)
  chex.assert_trees_all_close(y_v[0], y, atol=1e-6)
  grads = jax.jit(jax.grad(lambda p, z: jnp.sum(jnp.sin(module.apply(p, z))), argnums=(0, 1)))(
      params, x
  )
  chex.assert_tree_all_finite(grads)


@pytest.mark.parametrize('case', ALL_VARIANTS, ids=_case_id)
@pytest.mark.sweep
def test_bfloat16_compute_is_finite_and_close(case):
  grid = 'strides' in case
  x = _x((B, 6, 6, D) if grid else (B, N, D))
  f32 = ContextPool(**case)
  bf16 = ContextPool(dtype=jnp.bfloat16, **case)
  params = f32.init(jax.random.key(0), x)
  chex.assert_trees_all_equal_dtypes(params, jax.tree.map(lambda p: p.astype(jnp.float32), params))
  loss = lambda module: lambda p: jnp.sum(module.apply(p, x).astype(jnp.float32) ** 2)

  @jax.jit  # one program per case: both forwards and both gradients
  def both(params):
    grads = (jax.grad(loss(m))(params) for m in (bf16, f32))
    return f32.apply(params, x), bf16.apply(params, x), *grads

  y32, y16, grads, grads32 = both(params)
  assert y16.dtype == jnp.bfloat16
  # Measured: 0.7 (no locality) to 1.9 (attention mapping) bfloat16 epsilons
  # (2^-8) of max |y|.
  scale = float(jnp.max(jnp.abs(y32)))
  chex.assert_trees_all_close(y16.astype(jnp.float32), y32, atol=4 * 2.0**-8 * scale, rtol=0)
  chex.assert_tree_all_finite(grads)
  # Measured: at most 0.017 of max(1, max |gradient|) per leaf (attention mapping).
  for g, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads32)):
    chex.assert_trees_all_close(
        g, want, atol=0.035 * max(1.0, float(jnp.max(jnp.abs(want)))), rtol=0
    )


@pytest.mark.parametrize('implementation', ['dense', 'blockwise'])
@pytest.mark.parametrize(
    'case',
    [
        dict(),
        dict(mapping='attention', weights='nonlocal'),
        dict(locality='random_sparse', causal=True),
        dict(strides=2, locality='adaptive_window'),
    ],
    ids=_case_id,
)
@pytest.mark.sweep
def test_empty_batch_gives_empty_outputs_and_gradients(implementation, case):
  """Batch size 0 (the end of a sharded evaluation): empty outputs, zero parameter
  gradients, an empty input gradient, no error."""
  shape = (0, 6, 5, D) if 'strides' in case else (0, N, D)
  x, mask = jnp.zeros(shape), jnp.ones(shape[:-1], bool)
  module = ContextPool(implementation=implementation, block_size=4, dropout_rate=0.1, **case)
  params = module.init(jax.random.key(0), x, mask)
  rngs = {'dropout': jax.random.key(1)}
  loss = lambda p, z: jnp.sum(module.apply(p, z, mask, False, rngs=rngs))
  apply_and_grad = lambda p, z: (
      module.apply(p, z, mask, False, rngs=rngs),
      jax.grad(loss, (0, 1))(p, z),
  )
  y, (g_params, g_x) = jax.jit(apply_and_grad)(params, x)
  out_shape = (0, 3, 3, D) if 'strides' in case else shape
  chex.assert_shape(y, out_shape)
  chex.assert_shape(g_x, shape)
  chex.assert_trees_all_equal(g_params, jax.tree.map(jnp.zeros_like, params))


@pytest.mark.slow
def test_extreme_inputs_stay_finite():
  x = 1e3 * _x((B, 32, D))
  for size_norm in ('softmax', 'sigmoid'):
    module = ContextPool(size_norm=size_norm, causal=True)
    params = jax.tree.map(lambda p: p * 10.0, module.init(jax.random.key(0), x))
    y, grads = jax.jit(jax.value_and_grad(lambda p: jnp.sum(module.apply(p, x))))(params)
    chex.assert_tree_all_finite((y, grads))


def test_dropout_on_pooling_weights():
  """deterministic=True (also the default) is exactly the module without dropout;
  deterministic=False drops pooling weights and rescales the kept ones by
  1 / (1 - rate), so the output is unbiased: the mean over many draws is the
  deterministic output."""
  x = _x((B, N, D))
  module = ContextPool(dropout_rate=0.5, size_norm='sigmoid')
  params = module.init(jax.random.key(0), x)
  no_dropout = ContextPool(size_norm='sigmoid').apply(params, x)
  chex.assert_trees_all_equal(module.apply(params, x, deterministic=True), no_dropout)
  chex.assert_trees_all_equal(module.apply(params, x), no_dropout)
  draws = 4000
  keys = jax.random.split(jax.random.key(1), draws)
  drop = jax.jit(
      jax.vmap(lambda k: module.apply(params, x, deterministic=False, rngs={'dropout': k}))
  )(keys)
  assert not np.allclose(drop[0], no_dropout) and not np.allclose(drop[0], drop[1])
  mean, stderr = np.mean(drop, 0), np.std(drop, 0) / np.sqrt(draws)
  assert np.all(np.abs(mean - no_dropout) <= 5 * stderr + 1e-6), np.max(
      np.abs(mean - no_dropout) / stderr
  )
  with pytest.raises(Exception, match='dropout'):
    module.apply(params, x, deterministic=False)


# ----------------------------------------------------------------------------
# Configuration and input errors.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    'field,value',
    [
        ('weights', 'softmax'),
        ('locality', 'gauss'),
        ('mapping', 'rnn'),
        ('size_norm', 'l1'),
        ('activation', 'swish2'),
        ('ratio', -0.1),
        ('ratio', 0),
        ('kernel_size', 0),
        ('kernel_size', 2.5),
        ('hidden_features', 0),
        ('window', 0),
        ('window_softness', 0.0),
        ('nonlocal_features', -3),
        ('dropout_rate', 1.0),
        ('random_seed', 1.5),
        ('random_span', 7),
        ('random_span', 16.0),
        ('residual', 'yes'),
        ('causal', 1),
        ('strides', 0),
        ('strides', (2, 2, 2)),
        ('window_shape', (0, 1)),
        ('sigma_length', 0),
        ('sigma_length', 2.5),
        ('size_bias_init', float('nan')),
        ('gate_init', 'one'),
        ('gate', 'yes'),
    ],
)
def test_invalid_config_raises_naming_field_and_value(field, value):
  x = _x((1, 6, 6, D))
  with pytest.raises(ValueError) as err:
    ContextPool(**{field: value}).init(jax.random.key(0), x)
  assert f'ContextPool.{field}={value!r}' in str(err.value)


def test_invalid_config_message_lists_allowed_values():
  with pytest.raises(ValueError, match="allowed values: 'learned', 'unnormalized'"):
    ContextPool(weights='soft').init(jax.random.key(0), _x((1, 4, D)))


@pytest.mark.parametrize('shape', [(4, D), (1, 2, 3, 4, D)])
def test_wrong_rank_raises(shape):
  with pytest.raises(ValueError, match='x has rank'):
    ContextPool().init(jax.random.key(0), jnp.zeros(shape))


def test_mismatched_mask_raises():
  with pytest.raises(ValueError, match=r'mask has shape \(2, 5\); expected'):
    ContextPool().init(jax.random.key(0), _x((2, 6, D)), jnp.ones((2, 5), bool))


def test_sigma_length_on_a_grid_and_gate_with_residual_raise():
  with pytest.raises(ValueError, match='sigma_length=8 is for sequences'):
    ContextPool(sigma_length=8).init(jax.random.key(0), _x((1, 4, 4, D)))
  with pytest.raises(ValueError, match='gate=True with residual=True'):
    ContextPool(gate=True, residual=True).init(jax.random.key(0), _x((1, 4, D)))


def test_causal_grid_and_causal_strides_raise():
  with pytest.raises(ValueError, match='causal=True needs a sequence'):
    ContextPool(causal=True).init(jax.random.key(0), _x((1, 4, 4, D)))
  with pytest.raises(ValueError, match='strides=2 is not allowed with causal=True'):
    ContextPool(causal=True, strides=2).init(jax.random.key(0), _x((1, 8, D)))


@pytest.mark.parametrize(
    'case',
    [dict(), dict(locality='adaptive_window'), dict(implementation='blockwise', block_size=4)],
    ids=_case_id,
)
@pytest.mark.sweep
def test_grad_through_scan_and_remat(case):
  """Inside nn.scan over layers and nn.remat (as the models use it), gradients
  equal those of the same layers unrolled without remat."""
  x = _x((B, N, D))
  mask = _right_pad_mask(B, N, [N, 5])

  class Stack(nn.Module):
    scan: bool

    @nn.compact
    def __call__(self, x):
      if self.scan:
        body = nn.scan(
            nn.remat(_PoolBody),
            variable_axes={'params': 0},
            split_rngs={'params': True},
            in_axes=nn.broadcast,
            length=2,
        )
        return body(case, name='layers')(x, mask)[0]
      for i in range(2):
        x = ContextPool(**case, name=f'layer_{i}')(x, mask)
      return x

  scanned, unrolled = Stack(scan=True), Stack(scan=False)
  params = scanned.init(jax.random.key(0), x)
  stacked = params['params']['layers']['pool']
  unrolled_params = {
      'params': {f'layer_{i}': jax.tree.map(lambda p: p[i], stacked) for i in range(2)}
  }
  loss = lambda m, p, x: jnp.sum(jnp.square(m.apply(p, x)))
  g_scan = jax.jit(jax.grad(functools.partial(loss, scanned), argnums=(0, 1)))(params, x)
  g_unrolled = jax.grad(functools.partial(loss, unrolled), argnums=(0, 1))(unrolled_params, x)
  chex.assert_trees_all_close(g_scan[1], g_unrolled[1], atol=1.5e-6, rtol=0)
  chex.assert_trees_all_close(
      jax.tree.map(lambda p: p[1], g_scan[0]['params']['layers']['pool']),
      g_unrolled[0]['params']['layer_1'],
      atol=3e-6,
      rtol=0,
  )


class _PoolBody(nn.Module):
  fields: dict

  @nn.compact
  def __call__(self, x, mask):
    return ContextPool(**self.fields, name='pool')(x, mask), None
