"""LambdaLayer: Eqs. 1-5 against a direct einsum reference, BN modes, transforms, errors."""

import functools
import itertools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.layers import lambda_layer as lambda_lib
from contextpool_jax.layers.lambda_layer import LambdaLayer
import ref_lambda_layer as ref

D, HEADS, K = 8, 2, 4
SHAPES = {'1d': (2, 7, D), '2d': (2, 5, 4, D)}  # 2D with height != width.
TOL = dict(rtol=2e-4, atol=2e-5)


def _x(shape, seed=0, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def _init(module, x, seed=0):
  """Variables with the module's own structure, filled by numpy (no compile).

  The real initialiser is exercised by the shape/dtype tests; everything else
  uses random values of the shapes ``module.init`` declares, including random
  BatchNorm scale/bias and running statistics so both BN modes are non-trivial.
  """
  shapes = jax.eval_shape(module.init, jax.random.key(seed), x)
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    name = jax.tree_util.keystr(path)
    if "'scale'" in name or "'var'" in name:
      value = rng.uniform(0.5, 1.5, leaf.shape)
    elif "'bias'" in name or "'mean'" in name:
      value = rng.normal(0.0, 0.3, leaf.shape)
    else:
      value = rng.normal(0.0, x.shape[-1] ** -0.5, leaf.shape)
    return jnp.asarray(value, leaf.dtype)

  return jax.tree_util.tree_map_with_path(fill, shapes)


@functools.lru_cache(maxsize=None)
def _jitted_apply(module, train):
  if train:
    return jax.jit(lambda v, z: module.apply(v, z, train=True, mutable=['batch_stats']))
  return jax.jit(module.apply)


def _apply(module, variables, x, train=False):
  """Jitted apply; in train mode returns (y, {'batch_stats': ...})."""
  return _jitted_apply(module, train)(variables, x)


def _apply_both(module, variables, x):
  """(eval output, train output, train batch_stats) from one compile."""

  def both(v, z):
    y_train, state = module.apply(v, z, train=True, mutable=['batch_stats'])
    return module.apply(v, z), y_train, state

  return jax.jit(both)(variables, x)


def _to64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _reference(module, variables, x, train):
  y, _ = ref.lambda_layer(
      _to64(variables),
      np.asarray(x, np.float64),
      content=module.content,
      position=module.position != 'none',
      batch_norm_on=module.batch_norm,
      train=train,
      epsilon=module.batch_norm_epsilon,
  )
  return y


# ----------------------------------------------------------------------------
# Shapes and parameters.


@pytest.mark.parametrize('shape', [(2, 9, 8), (1, 3, 7, 8)])
@pytest.mark.parametrize('position', ['global', 'conv', 'none'])
def test_output_shape_and_params(shape, position):
  module = LambdaLayer(key_depth=K, heads=HEADS, intra_depth=2, position=position, scope_size=3)
  x = _x(shape)
  y = _apply(module, _init(module, x, 1), x)
  chex.assert_shape(y, shape)
  chex.assert_tree_all_finite(y)
  p = jax.eval_shape(module.init, jax.random.key(0), x)['params']
  d, v = shape[-1], shape[-1] // HEADS
  chex.assert_shape(p['query']['kernel'], (d, HEADS, K))
  chex.assert_shape(p['key']['kernel'], (d, K, 2))
  chex.assert_shape(p['value']['kernel'], (d, v, 2))
  spatial = shape[1:-1]
  if position == 'global':
    chex.assert_shape(p['position_embedding'], (*(2 * s - 1 for s in spatial), K, 2))
  elif position == 'conv':
    chex.assert_shape(p['position_embedding'], (*(3,) * len(spatial), K, 2))
  else:
    assert 'position_embedding' not in p


def test_out_features_sets_value_depth():
  module = LambdaLayer(out_features=12, key_depth=K, heads=3)
  x = _x((2, 4, 5, D))
  variables = _init(module, x)
  chex.assert_shape(_apply(module, variables, x), (2, 4, 5, 12))
  chex.assert_shape(variables['params']['value']['kernel'], (D, 4, 1))


def test_defaults_follow_paper():
  module = LambdaLayer()
  assert (module.key_depth, module.heads, module.intra_depth) == (16, 4, 1)
  assert module.position == 'global' and module.scope_size == 23 and module.content
  p = jax.eval_shape(module.init, jax.random.key(0), _x((1, 5, 6, 16)))['params']
  chex.assert_shape(p['query']['kernel'], (16, 4, 16))
  chex.assert_shape(p['value']['kernel'], (16, 4, 1))
  chex.assert_shape(p['position_embedding'], (9, 11, 16, 1))


def test_initialisation_is_documented_normal():
  """Real ``init``: N(0, 1/d) projections and table, identity BatchNorm."""
  d = 64
  module = LambdaLayer()
  variables = jax.jit(module.init)(jax.random.key(0), _x((1, 8, 8, d)))
  p = variables['params']
  for leaf in (
      p['query']['kernel'],
      p['key']['kernel'],
      p['value']['kernel'],
      p['position_embedding'],
  ):
    leaf = np.asarray(leaf)
    assert abs(leaf.mean()) < 0.1 * d**-0.5
    np.testing.assert_allclose(leaf.std(), d**-0.5, rtol=0.1)
  for name in ('query_norm', 'value_norm'):
    chex.assert_trees_all_equal(p[name]['scale'], jnp.ones_like(p[name]['scale']))
    chex.assert_trees_all_equal(p[name]['bias'], jnp.zeros_like(p[name]['bias']))
    stats = variables['batch_stats'][name]
    chex.assert_trees_all_equal(stats['mean'], jnp.zeros_like(stats['mean']))
    chex.assert_trees_all_equal(stats['var'], jnp.ones_like(stats['var']))


def test_position_only_has_no_key_projection():
  module = LambdaLayer(key_depth=K, heads=HEADS, content=False)
  variables = jax.eval_shape(module.init, jax.random.key(0), _x(SHAPES['1d']))
  assert 'key' not in variables['params']


# ----------------------------------------------------------------------------
# Values against the direct einsum reference (module's own parameters).

# position x content x rank in full; |u| alternates so each (position,
# content) pair is checked with |u| = 1 and |u| = 4.
CASES = [
    (pos, content, 4 if content == (dims == '1d') else 1, dims)
    for pos, content, dims in itertools.product(('global', 'conv'), (True, False), ('1d', '2d'))
] + [('none', True, 1, '1d'), ('none', True, 4, '2d')]


@pytest.mark.parametrize('position,content,intra_depth,dims', CASES)
def test_matches_reference(position, content, intra_depth, dims):
  """Eval mode (running averages) and train mode (batch statistics)."""
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      intra_depth=intra_depth,
      position=position,
      scope_size=3,
      content=content,
  )
  x = _x(SHAPES[dims], seed=5)
  variables = _init(module, x, 2)
  y_eval, y_train, _ = _apply_both(module, variables, x)
  np.testing.assert_allclose(y_eval, _reference(module, variables, x, False), **TOL)
  np.testing.assert_allclose(y_train, _reference(module, variables, x, True), **TOL)


@pytest.mark.parametrize(
    'scope_size,shape',
    [
        ((5, 3), (2, 5, 4, D)),  # window smaller than the grid on both axes
        (9, (2, 3, 4, D)),  # scope wider than 2 * size - 1: cropped
        (5, (1, 11, D)),
    ],
)
@pytest.mark.parametrize('algorithm', ['banded', 'fft', 'correlation'])
def test_conv_scopes_match_reference(scope_size, shape, algorithm):
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      intra_depth=2,
      position='conv',
      scope_size=scope_size,
      position_algorithm=algorithm,
  )
  x = _x(shape, seed=7)
  variables = _init(module, x, 4)
  np.testing.assert_allclose(
      _apply(module, variables, x), _reference(module, variables, x, False), **TOL
  )


def test_no_batch_norm_matches_reference():
  module = LambdaLayer(key_depth=K, heads=HEADS, batch_norm=False)
  x = _x(SHAPES['2d'], seed=8)
  variables = _init(module, x)
  assert 'batch_stats' not in variables
  np.testing.assert_allclose(
      _apply(module, variables, x), _reference(module, variables, x, False), **TOL
  )


def test_global_table_centre_used_for_smaller_inputs():
  module = LambdaLayer(key_depth=K, heads=HEADS, context_size=(6, 7))
  variables = _init(module, _x((1, 6, 7, D)))
  chex.assert_shape(variables['params']['position_embedding'], (11, 13, K, 1))
  x = _x((2, 4, 5, D), seed=9)
  y = _apply(module, variables, x)
  np.testing.assert_allclose(y, _reference(module, variables, x, False), **TOL)
  # Without context_size the table size is read from the params: same result.
  plain = LambdaLayer(key_depth=K, heads=HEADS)
  np.testing.assert_allclose(_apply(plain, variables, x), y, rtol=1e-6, atol=1e-6)


def test_sign_convention_offset_is_context_minus_query():
  """A table non-zero only at index c + 1 makes y_n read x_n (query) and x_{n+1}."""
  length = 6
  module = LambdaLayer(key_depth=K, heads=HEADS, content=False, batch_norm=False)
  x = _x((1, length, D), seed=1)
  variables = _init(module, x)
  table = np.zeros(variables['params']['position_embedding'].shape, np.float32)
  table[(length - 1) + 1] = 1.0  # centre c = length - 1
  variables = {'params': {**variables['params'], 'position_embedding': jnp.asarray(table)}}
  jac = jax.jit(jax.jacobian(lambda z: module.apply(variables, z)))(x)
  reads = np.abs(np.asarray(jac[0, :, :, 0])).sum(axis=(1, 3)) > 0  # [n, j]
  for n in range(length):
    expected = {n, n + 1} if n + 1 < length else set()
    assert set(np.flatnonzero(reads[n])) == expected, (n, np.flatnonzero(reads[n]))


# ----------------------------------------------------------------------------
# BatchNorm modes.


def test_train_mode_updates_batch_stats():
  module = LambdaLayer(key_depth=K, heads=HEADS, batch_norm_momentum=0.9)
  x = _x(SHAPES['2d'], seed=11)
  variables = _init(module, x)
  y, updates = _apply(module, variables, x, train=True)
  _, moments = ref.lambda_layer(_to64(variables), np.asarray(x, np.float64), train=True)
  for name in ('query_norm', 'value_norm'):
    old = variables['batch_stats'][name]
    new = updates['batch_stats'][name]
    mean, var = moments[name]
    np.testing.assert_allclose(
        new['mean'], 0.9 * np.asarray(old['mean']) + 0.1 * mean, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        new['var'], 0.9 * np.asarray(old['var']) + 0.1 * var, rtol=1e-4, atol=1e-5
    )
  # Eval mode reads the running averages (different here) and mutates nothing.
  y_eval, state = jax.jit(lambda v, z: module.apply(v, z, mutable=['batch_stats']))(variables, x)
  chex.assert_trees_all_equal(state['batch_stats'], variables['batch_stats'])
  assert not np.allclose(y_eval, y, atol=1e-3)


def test_train_mode_requires_mutable_batch_stats():
  module = LambdaLayer(key_depth=K, heads=HEADS)
  x = _x(SHAPES['1d'])
  variables = jax.eval_shape(module.init, jax.random.key(0), x)
  with pytest.raises(Exception, match='batch_stats'):
    jax.eval_shape(lambda v, z: module.apply(v, z, train=True), variables, x)


# ----------------------------------------------------------------------------
# Transforms: jit, grad, vmap, remat; dtypes.


def _setup(position='global', dims='2d', **kw):
  module = LambdaLayer(
      key_depth=K, heads=HEADS, intra_depth=2, position=position, scope_size=3, **kw
  )
  x = _x(SHAPES[dims], seed=12)
  return module, _init(module, x), x


def test_jit_matches_eager():
  module, variables, x = _setup('conv')
  np.testing.assert_allclose(
      _apply(module, variables, x), module.apply(variables, x), rtol=1e-5, atol=1e-6
  )


def _assert_grad_matches_reference(module, variables, x, seed):
  """Gradients (params and input) of a weighted sum of the outputs equal those
  of the numpy reference's explicit-E einsum."""
  w = _x(x.shape[:-1] + (D,), seed=seed)

  def loss(fn):
    return lambda params, z: jnp.sum(w * fn({**variables, 'params': params}, z))

  def ours(v, z):
    return module.apply(v, z, train=True, mutable=['batch_stats'])[0]

  def theirs(v, z):
    with jax.default_matmul_precision('highest'):
      return ref.lambda_layer(v, z, train=True, xp=jnp)[0]

  g = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(variables['params'], x)
  g_ref = jax.jit(jax.grad(loss(theirs), argnums=(0, 1)))(variables['params'], x)
  chex.assert_trees_all_close(g, g_ref, rtol=2e-3, atol=2e-4)
  chex.assert_tree_all_finite(g)
  assert float(jnp.abs(g[0]['position_embedding']).sum()) > 0


@pytest.mark.parametrize('position,dims', [('global', '2d'), ('conv', '1d')])
def test_grad_matches_reference_grad(position, dims):
  """Gradients through the convolution equal those of the explicit-E einsum."""
  module, variables, x = _setup(position, dims)
  _assert_grad_matches_reference(module, variables, x, seed=13)


def test_vmap_matches_loop():
  """Outputs reach |y| ~ 30, so float32 rounding allows an absolute 1e-5."""
  module, variables, x = _setup('conv')
  xs = jnp.stack([x, 2.0 * x, -x])
  ys = jax.jit(jax.vmap(lambda z: module.apply(variables, z)))(xs)
  for i in range(xs.shape[0]):
    np.testing.assert_allclose(ys[i], _apply(module, variables, xs[i]), rtol=1e-5, atol=1e-5)
  # Training under vmap: per-example batch statistics, like a loop.
  ys, _ = jax.jit(
      jax.vmap(lambda z: module.apply(variables, z, train=True, mutable=['batch_stats']))
  )(xs)
  for i in range(xs.shape[0]):
    np.testing.assert_allclose(
        ys[i], _apply(module, variables, xs[i], True)[0], rtol=1e-5, atol=1e-5
    )


class _Block(nn.Module):
  """``train`` is keyword-only on LambdaLayer and nn.remat traces keyword
  arguments, so training code fixes it outside the remat boundary (a field)."""

  train: bool

  @nn.compact
  def __call__(self, x):
    return LambdaLayer(key_depth=K, heads=HEADS, intra_depth=2, name='lambda')(x, train=self.train)


def test_remat_matches_plain():
  module, variables, x = _setup('global')
  # Eval mode: remat the layer class directly.
  remat_layer = nn.remat(LambdaLayer)(key_depth=K, heads=HEADS, intra_depth=2)
  np.testing.assert_allclose(
      _apply(remat_layer, variables, x), _apply(module, variables, x), rtol=1e-5, atol=1e-6
  )
  # Train mode: remat a block that closes over train; gradients unchanged.
  wrapped = {c: {'lambda': t} for c, t in variables.items()}

  def grad(block):
    def loss(params):
      y, _ = block.apply({**wrapped, 'params': params}, x, mutable=['batch_stats'])
      return jnp.sum(y**2)

    return jax.jit(jax.grad(loss))(wrapped['params'])

  chex.assert_trees_all_close(
      grad(nn.remat(_Block)(train=True)), grad(_Block(train=True)), rtol=1e-4, atol=1e-5
  )


def test_bfloat16_compute():
  module, variables, x = _setup('global', dtype=jnp.bfloat16)
  y = _apply(module, variables, x)
  assert y.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(y)
  for p in jax.tree.leaves(variables['params']):
    assert p.dtype == jnp.float32
  y32 = _apply(LambdaLayer(key_depth=K, heads=HEADS, intra_depth=2), variables, x)
  scale = float(jnp.abs(y32).max())
  np.testing.assert_allclose(np.asarray(y, np.float32), y32, atol=0.05 * scale)
  grads = jax.jit(
      jax.grad(lambda p: jnp.sum(module.apply({**variables, 'params': p}, x).astype(jnp.float32)))
  )(variables['params'])
  chex.assert_tree_all_finite(grads)


def test_param_dtype():
  module = LambdaLayer(key_depth=K, heads=HEADS, param_dtype=jnp.bfloat16)
  x = _x(SHAPES['1d'])
  variables = _init(module, x)
  for p in jax.tree.leaves(variables['params']):
    assert p.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(_apply(module, variables, x))


# ----------------------------------------------------------------------------
# Memory: no [n, m]-sized intermediate anywhere in forward or backward.


def _max_intermediate(jaxpr):
  biggest = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      biggest = max(biggest, int(np.prod(getattr(var.aval, 'shape', ()))))
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          biggest = max(biggest, _max_intermediate(inner))
  return biggest


@pytest.mark.parametrize('position', ['global', 'conv'])
def test_no_n_by_m_intermediate(position):
  module = LambdaLayer(key_depth=16, heads=4, position=position, scope_size=5)
  x = _x((1, 12, 10, 16))
  variables = _init(module, x)
  n = 12 * 10

  def loss(params):
    y, _ = module.apply({**variables, 'params': params}, x, train=True, mutable=['batch_stats'])
    return jnp.sum(y**2)

  jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(variables['params']).jaxpr
  assert _max_intermediate(jaxpr) < n * n


# ----------------------------------------------------------------------------
# Errors at trace time (jax.eval_shape: nothing is compiled).


def _trace(module, shape):
  return jax.eval_shape(module.init, jax.random.key(0), jnp.zeros(shape))


@pytest.mark.parametrize('shape', [(8, 4), (1, 2, 3, 4, 8), (8,)])
def test_bad_rank(shape):
  with pytest.raises(ValueError, match=rf'rank {len(shape)}.*expected rank 3 or 4'):
    _trace(LambdaLayer(key_depth=K, heads=HEADS), shape)


@pytest.mark.parametrize(
    'kwargs,pattern',
    [
        ({'position': 'local'}, r"position='local'.*'global', 'conv', 'none'"),
        ({'position': 'conv', 'scope_size': 4}, r'scope_size=4.*odd'),
        ({'position': 'conv', 'scope_size': 0}, r'scope_size=0'),
        ({'position': 'conv', 'scope_size': (3, 3, 3)}, r'scope_size=\(3, 3, 3\)'),
        ({'heads': 3}, r'heads=3.*divide.*8'),
        ({'out_features': 10, 'heads': 4}, r'heads=4.*divide.*10'),
        ({'heads': 0}, r'heads=0'),
        ({'key_depth': -1}, r'key_depth=-1'),
        ({'intra_depth': 1.5}, r'intra_depth=1.5'),
        ({'out_features': 0}, r'out_features=0'),
        ({'position': 'none', 'content': False}, r'content=False.*position=.none.'),
        ({'context_size': (2, 3)}, r'exceeds the global table'),
        ({'context_size': (5, 5, 5)}, r'context_size=\(5, 5, 5\)'),
        ({'batch_norm_momentum': 1.0}, r'batch_norm_momentum=1.0'),
    ],
)
def test_bad_options(kwargs, pattern):
  module = LambdaLayer(**{'key_depth': K, 'heads': HEADS, **kwargs})
  with pytest.raises(ValueError, match=pattern):
    _trace(module, (2, 5, 4, D))


def test_global_input_larger_than_table_raises():
  module = LambdaLayer(key_depth=K, heads=HEADS)
  variables = jax.eval_shape(module.init, jax.random.key(0), _x((1, 4, 4, D)))
  with pytest.raises(ValueError, match=r'\(5, 4\) exceeds the global table size \(4, 4\)'):
    jax.eval_shape(module.apply, variables, jnp.zeros((1, 5, 4, D)))


@pytest.mark.parametrize('position', ['global', 'conv'])
def test_empty_batch_gives_empty_outputs_and_zero_gradients(position):
  """Batch 0 (the end of a sharded evaluation) in evaluation mode."""
  module = LambdaLayer(key_depth=K, heads=HEADS, position=position, scope_size=3)
  variables = _init(module, _x(SHAPES['2d']))
  empty = jnp.zeros((0, *SHAPES['2d'][1:]))
  y = _apply(module, variables, empty)
  chex.assert_shape(y, (0, *SHAPES['2d'][1:-1], D))
  grads = jax.grad(lambda p: module.apply({**variables, 'params': p}, empty).sum())(
      variables['params']
  )
  chex.assert_trees_all_equal(grads, jax.tree.map(jnp.zeros_like, grads))


# ----------------------------------------------------------------------------
# The 'rows' algorithm (direct sum row by row) against the reference and the
# correlation, values and gradients.

ROWS_CASES = [
    ((2, 5, 4, D), 1, None),  # H > W: rows scanned directly
    ((2, 3, 6, D), 2, None),  # W > H: the transposed grid is scanned
    ((1, 4, 4, D), 3, (6, 7)),  # table larger than the input: centre cropped
]


@pytest.mark.parametrize('shape,intra_depth,context_size', ROWS_CASES)
def test_rows_matches_reference(shape, intra_depth, context_size):
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      intra_depth=intra_depth,
      context_size=context_size,
      position_algorithm='rows',
  )
  x = _x(shape, seed=21)
  variables, y_eval = _assert_matches_reference_in_both_modes(module, x, 3)
  y_corr = _apply(module.clone(position_algorithm='correlation'), variables, x)
  np.testing.assert_allclose(y_eval, y_corr, **TOL)


def _assert_matches_reference_in_both_modes(module, x, seed):
  """Eval and train outputs equal the reference's; returns (variables, eval output)."""
  variables = _init(module, x, seed)
  y_eval, y_train, _ = _apply_both(module, variables, x)
  np.testing.assert_allclose(y_eval, _reference(module, variables, x, False), **TOL)
  np.testing.assert_allclose(y_train, _reference(module, variables, x, True), **TOL)
  return variables, y_eval


@pytest.mark.parametrize('shape', [(2, 5, 4, D), (2, 3, 6, D)])
def test_rows_grad_matches_reference_grad(shape):
  module = LambdaLayer(key_depth=K, heads=HEADS, intra_depth=2, position_algorithm='rows')
  x = _x(shape, seed=22)
  variables = _init(module, x, 4)
  _assert_grad_matches_reference(module, variables, x, seed=23)


@pytest.mark.parametrize('shape', [(2, 5, 4, 3, 2), (1, 3, 6, 2, 1), (0, 3, 3, 2, 1)])
@pytest.mark.sweep
def test_position_lambdas_rows_equals_correlation_with_vjp(shape):
  """The pure functions agree in float64, values and both cotangents."""
  _, height, width, _, depth_u = shape
  table_shape = (2 * height + 1, 2 * width - 1, 3, depth_u)
  _assert_equals_correlation_with_vjp(lambda_lib.position_lambdas_rows, shape, table_shape, 24)


def _assert_equals_correlation_with_vjp(compute, values_shape, table_shape, seed):
  """``compute(values, table)`` equals :func:`position_lambdas` in float64, values and
  both cotangents of a random weighted sum."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(seed)
    values = jnp.asarray(rng.normal(size=values_shape))
    table = jnp.asarray(rng.normal(size=table_shape))
    out = lambda_lib.position_lambdas(values, table)
    chex.assert_trees_all_close(compute(values, table), out, rtol=1e-12, atol=1e-12)
    w = jnp.asarray(rng.normal(size=out.shape))
    grads = [
        jax.grad(lambda v, t, f=f: jnp.sum(w * f(v, t)), argnums=(0, 1))(values, table)
        for f in (lambda_lib.position_lambdas, compute)
    ]
    chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


def test_rows_bfloat16_and_vmap():
  module = LambdaLayer(key_depth=K, heads=HEADS, position_algorithm='rows', dtype=jnp.bfloat16)
  x = _x(SHAPES['2d'], seed=25)
  variables = _init(module, x, 5)
  y = _apply(module, variables, x)
  assert y.dtype == jnp.bfloat16
  y32 = _apply(module.clone(dtype=None), variables, x)
  scale = float(jnp.abs(y32).max())
  np.testing.assert_allclose(np.asarray(y, np.float32), y32, atol=0.05 * scale)
  xs = jnp.stack([x, -x])
  ys = jax.jit(jax.vmap(lambda z: module.clone(dtype=None).apply(variables, z)))(xs)
  for i in range(xs.shape[0]):
    np.testing.assert_allclose(ys[i], _apply(module.clone(dtype=None), variables, xs[i]), **TOL)


def test_auto_picks_rows_only_where_its_table_is_below_n_by_m():
  choose = lambda_lib.choose_position_algorithm
  assert choose('global', (56, 56), 16, 1) == 'rows'
  assert choose('global', (12, 10), 16, 1) == 'correlation'  # table > n * m
  assert choose('global', (3136,), 16, 1) == 'correlation'  # sequences
  assert choose('conv', (56, 56), 16, 1, (23, 23)) == 'fft'  # 529 taps
  assert choose('conv', (56, 56), 16, 1, (17, 17)) == 'fft'  # 289
  assert choose('conv', (56, 56), 16, 1, (15, 15)) == 'banded'  # 225
  assert choose('conv', (7, 7), 16, 1, (23, 23)) == 'banded'  # cropped to 13 x 13
  assert choose('conv', (1024,), 16, 1, (23,)) == 'banded'  # sequences
  assert choose('conv', (56, 56), 16, 1) == 'banded'  # no kernel given
  for spatial, k, u in [((56, 56), 16, 1), ((40, 8), 4, 1), ((12, 10), 16, 1), ((8, 40), 4, 2)]:
    n = spatial[0] * spatial[1]
    assert (choose('global', spatial, k, u) == 'rows') == (
        lambda_lib.rows_table_size(spatial, k, u) < n * n
    )


def test_auto_rows_has_no_n_by_m_intermediate_and_matches_correlation():
  module = LambdaLayer(key_depth=4, heads=HEADS)
  x = _x((1, 8, 40, D), seed=26)  # W > H; |T| = 79 * 8 * 8 * 4 < (8 * 40)^2
  assert lambda_lib.choose_position_algorithm('global', (8, 40), 4, 1) == 'rows'
  variables = _init(module, x, 6)
  n = 8 * 40

  def loss(params):
    y, _ = module.apply({**variables, 'params': params}, x, train=True, mutable=['batch_stats'])
    return jnp.sum(y**2)

  jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(variables['params']).jaxpr
  assert _max_intermediate(jaxpr) < n * n
  y_corr = _apply(module.clone(position_algorithm='correlation'), variables, x)
  np.testing.assert_allclose(_apply(module, variables, x), y_corr, **TOL)


@pytest.mark.parametrize(
    'kwargs,shape,pattern',
    [
        ({'position_algorithm': 'fftw'}, (2, 5, 4, D), r"position_algorithm='fftw'.*'auto'"),
        ({'position_algorithm': 'rows', 'position': 'conv'}, (2, 5, 4, D), r"position='conv'"),
        ({'position_algorithm': 'rows'}, (2, 7, D), r'rows.*1 spatial axes'),
    ],
)
def test_bad_position_algorithm(kwargs, shape, pattern):
  module = LambdaLayer(**{'key_depth': K, 'heads': HEADS, 'scope_size': 3, **kwargs})
  with pytest.raises(ValueError, match=pattern):
    _trace(module, shape)


# ----------------------------------------------------------------------------
# The 'banded' algorithm (the correlation as banded matrix products over blocks
# of query columns, custom VJP) against the reference and the correlation.

BANDED_CASES = [
    ((2, 5, 4, D), 'conv', 3, 1),  # one block narrower than B
    ((2, 6, 11, D), 'conv', (5, 7), 2),  # width not a multiple of B; kh != kw
    ((1, 9, 3, D), 'conv', 9, 1),  # scope cropped to the grid
    ((2, 13, D), 'conv', 5, 3),  # sequence
    ((2, 5, 4, D), 'global', 3, 2),
    ((2, 7, D), 'global', 3, 1),
]


@pytest.mark.parametrize('algorithm', ['banded', 'fft'])
@pytest.mark.parametrize('shape,position,scope_size,intra_depth', BANDED_CASES)
def test_banded_and_fft_match_reference(shape, position, scope_size, intra_depth, algorithm):
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      intra_depth=intra_depth,
      position=position,
      scope_size=scope_size,
      position_algorithm=algorithm,
  )
  _assert_matches_reference_in_both_modes(module, _x(shape, seed=31), 7)


@pytest.mark.parametrize('algorithm', ['banded', 'fft'])
@pytest.mark.parametrize('shape,scope_size', [((2, 6, 11, D), (5, 7)), ((2, 13, D), 5)])
def test_banded_and_fft_grad_match_reference_grad(shape, scope_size, algorithm):
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      intra_depth=2,
      position='conv',
      scope_size=scope_size,
      position_algorithm=algorithm,
  )
  x = _x(shape, seed=32)
  variables = _init(module, x, 8)
  _assert_grad_matches_reference(module, variables, x, seed=33)


@pytest.mark.parametrize(
    'values_shape,kernel',
    [
        ((2, 5, 4, 3, 2), (3, 3)),
        ((2, 6, 13, 3, 1), (5, 7)),  # the width unfolded in the backward pass
        ((1, 9, 6, 2, 1), (7, 1)),  # one-column kernel: the plain backward
        ((2, 3, 4, 3, 2), (9, 9)),  # cropped
        ((1, 11, 2, 1), (5,)),  # sequence
        ((0, 3, 3, 2, 1), (3, 3)),  # empty batch
    ],
)
@pytest.mark.parametrize('algorithm', ['banded', 'fft'])
@pytest.mark.sweep
def test_position_lambdas_banded_and_fft_equal_correlation_with_vjp(
    values_shape, kernel, algorithm
):
  """The pure functions agree in float64, values and both cotangents."""
  table_shape = (*kernel, 4, values_shape[-1])
  compute = getattr(lambda_lib, f'position_lambdas_{algorithm}')
  _assert_equals_correlation_with_vjp(compute, values_shape, table_shape, 34)


def test_banded_kernel_is_the_table_on_its_band():
  rng = np.random.default_rng(35)
  kernel = jnp.asarray(rng.normal(size=(3, 5, 2, 1)))
  band = np.asarray(lambda_lib.banded_kernel(kernel, 4)).reshape(3, 8, 1, 4, 2)
  for big_j, j in itertools.product(range(8), range(4)):
    want = kernel[:, big_j - j, :, 0] if 0 <= big_j - j < 5 else np.zeros((3, 2))
    np.testing.assert_array_equal(band[:, big_j, 0, j], want)


@pytest.mark.parametrize('algorithm', ['banded', 'fft'])
def test_banded_and_fft_bfloat16_and_vmap(algorithm):
  module = LambdaLayer(
      key_depth=K,
      heads=HEADS,
      position='conv',
      scope_size=3,
      position_algorithm=algorithm,
      dtype=jnp.bfloat16,
  )
  x = _x(SHAPES['2d'], seed=36)
  variables = _init(module, x, 9)
  y = _apply(module, variables, x)
  assert y.dtype == jnp.bfloat16
  y32 = _apply(module.clone(dtype=None, position_algorithm='correlation'), variables, x)
  scale = float(jnp.abs(y32).max())
  np.testing.assert_allclose(np.asarray(y, np.float32), y32, atol=0.05 * scale)
  xs = jnp.stack([x, -x])
  ys = jax.jit(jax.vmap(lambda z: module.clone(dtype=None).apply(variables, z)))(xs)
  for i in range(xs.shape[0]):
    np.testing.assert_allclose(ys[i], _apply(module.clone(dtype=None), variables, xs[i]), **TOL)
