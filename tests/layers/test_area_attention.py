"""Tests for contextpool_jax.layers.area_attention against a brute-force numpy reference."""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import contextpool_jax
import ref_area_attention as ref
from contextpool_jax import layers
from contextpool_jax.layers import area_attention as aa
from contextpool_jax.layers.area_attention import areas
from contextpool_jax.layers.area_attention import masks
from contextpool_jax.layers.area_attention.attend import attend
from contextpool_jax.layers.area_attention.through_items import QUERY_BLOCK
from contextpool_jax.layers.area_attention.through_items import attend_through_items

# (q_len, kv_len, max_area_width, max_area_height, memory_height)
CONFIGS = {
    '1d_self': (7, 7, 3, 1, 1),
    '1d_cross': (4, 9, 4, 1, 1),
    '2d_self': (12, 12, 3, 2, 3),
    '2d_cross': (5, 12, 3, 2, 3),
    '2d_areas_larger_than_grid': (6, 6, 5, 3, 2),
}
B, HEADS, DEPTH, DEPTH_V = 2, 2, 4, 3

# Everything runs under jit: one compilation per case is much cheaper on the CPU
# than compiling every primitive eagerly, and it checks that tracing works.


_STATIC = (
    'max_area_width',
    'max_area_height',
    'memory_height',
    'causal',
    'key_mode',
    'value_mode',
    'scale',
    'dropout_rate',
    'deterministic',
    'std_epsilon',
)
attention = jax.jit(aa.dot_product_area_attention, static_argnames=_STATIC)
features = jax.jit(
    aa.area_features,
    static_argnames=(
        'max_area_width',
        'max_area_height',
        'memory_height',
        'features',
        'std_epsilon',
    ),
)


def random_variables(module, *args, seed=0):
  """Random parameters with the structure ``module.init`` would give.

  Drawn here (normal, std 0.5; biases included) rather than by ``module.init``:
  compiling the initializers is slow on the CPU, and non-zero biases exercise
  more of the module than the default zero init.
  """
  shapes = jax.eval_shape(module.init, jax.random.key(0), *args)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(scale=0.5, size=s.shape), s.dtype), shapes)


def init_apply(module, *args):
  """``random_variables`` then a jitted deterministic apply; returns (variables, output)."""
  variables = random_variables(module, *args)
  return variables, jax.jit(module.apply)(variables, *args)


def _qkv(q_len, kv_len, seed=0, dtype=np.float32):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, q_len, HEADS, DEPTH)).astype(dtype)
  k = rng.normal(size=(B, kv_len, HEADS, DEPTH)).astype(dtype)
  v = rng.normal(size=(B, kv_len, HEADS, DEPTH_V)).astype(dtype)
  return q, k, v


def _mask(kind, q_len, kv_len, seed=1):
  rng = np.random.default_rng(seed)
  if kind is None:
    return None
  if kind == 'padding':  # [batch, 1, 1, kv_len]: the last items of batch 1 are padding.
    lengths = np.array([kv_len, kv_len - 3])
    return (np.arange(kv_len)[None, :] < lengths[:, None])[:, None, None, :]
  if kind == 'random':  # Arbitrary [batch, heads, q_len, kv_len].
    return rng.random((B, HEADS, q_len, kv_len)) > 0.25
  if kind == 'rank2':  # [q_len, kv_len], broadcast over batch and heads.
    return rng.random((q_len, kv_len)) > 0.25
  raise ValueError(kind)


def _area_kwargs(cfg):
  _, _, width, height, memory_height = cfg
  return dict(max_area_width=width, max_area_height=height, memory_height=memory_height)


# ----------------------------------------------------------------------------
# Areas and features.
# ----------------------------------------------------------------------------


def test_public_names_importable_where_they_were():
  """The layout and features live in area_attention/areas.py; every public name is
  also importable from area_attention and the packages, and is the same object."""
  for name in (
      'FEATURE_NAMES',
      'AreaFeatures',
      'AreaLayout',
      'area_features',
      'area_layout',
      'num_areas',
  ):
    assert getattr(aa, name) is getattr(areas, name), name
  for name in aa.__all__:
    assert hasattr(aa, name), name
  for package in (contextpool_jax, layers):
    assert package.area_features is areas.area_features
    assert package.AreaAttention is aa.AreaAttention
    assert package.dot_product_area_attention is aa.dot_product_area_attention


def test_paper_figure_counts():
  # Figure 1: a 4-item memory with maximum area size 3 has 4 + 3 + 2 areas.
  assert aa.num_areas(4, max_area_width=3) == 9
  # Figure 2: a 3x3 grid with areas up to 2x2: 9 + 6 + 6 + 4.
  assert aa.num_areas(9, max_area_width=2, max_area_height=2, memory_height=3) == 25


@pytest.mark.parametrize('n,a', [(7, 1), (7, 3), (5, 5), (4, 6), (1, 2)])
def test_num_areas_closed_form_1d(n, a):
  closed = sum(n - s + 1 for s in range(1, min(a, n) + 1))
  assert aa.num_areas(n, max_area_width=a) == closed
  assert len(ref.enumerate_areas(n, a)) == closed
  # The arrays the layers build have that many areas (shapes only: no compilation).
  feats = jax.eval_shape(
      functools.partial(aa.area_features, max_area_width=a), jnp.zeros((1, n, 2))
  )
  assert feats.mean.shape[1] == feats.max.shape[1] == closed
  area_mask = jax.eval_shape(
      functools.partial(aa.area_attention_mask, q_len=n, kv_len=n, max_area_width=a, causal=True),
      jnp.ones((n, n), bool),
  )
  assert area_mask.shape[-1] == closed


@pytest.mark.parametrize(
    'grid_h,grid_w,max_h,max_w',
    [(3, 3, 2, 2), (3, 4, 2, 3), (2, 5, 3, 2), (4, 2, 4, 4), (1, 6, 2, 3)],
)
def test_num_areas_closed_form_2d(grid_h, grid_w, max_h, max_w):
  closed = sum(
      (grid_h - h + 1) * (grid_w - w + 1)
      for h in range(1, min(max_h, grid_h) + 1)
      for w in range(1, min(max_w, grid_w) + 1)
  )
  n = grid_h * grid_w
  opts = dict(max_area_width=max_w, max_area_height=max_h, memory_height=grid_h)
  assert aa.num_areas(n, **opts) == closed
  assert len(ref.enumerate_areas(n, max_w, max_h, grid_h)) == closed
  feats = jax.eval_shape(functools.partial(aa.area_features, **opts), jnp.zeros((1, n, 2)))
  assert feats.sum.shape[1] == feats.std.shape[1] == feats.max.shape[1] == closed
  area_mask = jax.eval_shape(
      functools.partial(aa.area_attention_mask, q_len=3, kv_len=n, **opts),
      jnp.ones((2, 1, 1, n), bool),
  )
  assert area_mask.shape == (2, 1, 1, closed)


@pytest.mark.parametrize('cfg', list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize('feature_dims', [(HEADS, DEPTH), (5,)], ids=['heads_depth', 'flat'])
def test_features_match_bruteforce(cfg, feature_dims):
  opts = _area_kwargs(CONFIGS[cfg])
  kv_len = CONFIGS[cfg][1]
  x = np.random.default_rng(3).normal(size=(B, kv_len) + feature_dims).astype(np.float32)
  x[0, 1] = x[0, 2]  # A constant area: zero variance.
  feats = features(jnp.asarray(x), **opts)
  want = ref.area_features(x, **opts)
  n = len(want['height'])
  for name in aa.FEATURE_NAMES:
    chex.assert_shape(getattr(feats, name), (B, n) + feature_dims)
  # Float32 rounding; measured at most 9.5e-7 (sums), 4.8e-7 (means), 1.8e-7 (stds).
  chex.assert_trees_all_close(feats.sum, want['sum'], atol=2e-6, rtol=0)
  chex.assert_trees_all_close(feats.mean, want['mean'], atol=1e-6, rtol=0)
  chex.assert_trees_all_close(feats.max, want['max'], atol=0, rtol=0)
  chex.assert_trees_all_close(feats.std, want['std'], atol=5e-7, rtol=0)
  np.testing.assert_array_equal(feats.height, want['height'])
  np.testing.assert_array_equal(feats.width, want['width'])


@pytest.mark.parametrize('memory_height,max_w,max_h', [(1, 5, 1), (64, 3, 3)], ids=['1d', '2d'])
def test_std_is_precise_for_values_with_an_offset(memory_height, max_w, max_h):
  """n = 4096 values 3 + 0.01 N(0, 1): E[x^2] - E[x]^2 over float32 tables was off by
  up to 0.07 on stds of ~0.007; the std must match a float64 reference (on the same
  float32 inputs) to float32 precision, relatively."""
  x = (3.0 + 0.01 * np.random.default_rng(8).normal(size=(1, 4096, 2))).astype(np.float32)
  opts = dict(max_area_width=max_w, max_area_height=max_h, memory_height=memory_height)
  got = features(jnp.asarray(x), features=('std',), std_epsilon=0.0, **opts).std
  want = ref.area_features(x, eps=0.0, **opts)['std']
  # Measured: at most 1.8e-7 relative; single items are exactly 0 on both sides.
  chex.assert_trees_all_close(got, want, rtol=6e-7, atol=0.0)


def test_features_exact_in_float64():
  # The tables are exact up to rounding: in float64 every feature matches tightly.
  opts = _area_kwargs(CONFIGS['2d_self'])
  x = np.random.default_rng(4).normal(size=(B, 12, 3))
  x[1, 4:6] = 0.5
  with jax.enable_x64(True):
    feats = features(jnp.asarray(x, jnp.float64), **opts)
    assert feats.std.dtype == jnp.float64
    want = ref.area_features(x, **opts)
    for name in aa.FEATURE_NAMES:
      np.testing.assert_allclose(getattr(feats, name), want[name], atol=2e-15, rtol=0)


@pytest.mark.parametrize('cfg', list(CONFIGS), ids=list(CONFIGS))
def test_padded_area_sums_and_transpose_match_bruteforce(cfg):
  """Direct window sums in the padded area layout (the item-logit path's item ->
  area map) and their transpose (area -> item) against loops over every area's
  items; the padding drops out in the library's area order."""
  opts = _area_kwargs(CONFIGS[cfg])
  kv_len = CONFIGS[cfg][1]
  layout = aa.area_layout(kv_len, **opts)
  grid_w = kv_len // opts['memory_height']
  rng = np.random.default_rng(21)
  weights = rng.uniform(0.5, 2.0, size=len(layout.shapes))
  x = rng.normal(size=(B, opts['memory_height'], grid_w, 3))
  y = rng.normal(size=(B, layout.num_areas, 3))
  valid = areas.padded_area_valid(layout)
  assert valid.shape == (len(layout.shapes) * kv_len,) and valid.sum() == layout.num_areas

  @jax.jit
  def run(x, y):
    padded_y = areas.pad_areas(y, layout, 1, 0.0)
    return (
        areas.padded_area_sums(x, layout, 1, weights),
        padded_y,
        areas.padded_area_sums_transpose(padded_y, layout, 1, weights),
    )

  sums, padded_y, back = run(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  np.testing.assert_array_equal(padded_y[:, valid], np.asarray(y, np.float32))
  np.testing.assert_array_equal(padded_y[:, ~valid], 0.0)
  flat_x = x.reshape(B, kv_len, 3)
  want_sums = np.zeros_like(y)
  want_back = np.zeros_like(flat_x)
  for a, area in enumerate(ref.enumerate_areas(kv_len, **opts)):
    weight = weights[layout.shapes.index(area[2:])]
    for j in ref.area_items(area, grid_w):
      want_sums[:, a] += weight * flat_x[:, j]
      want_back[:, j] += weight * y[:, a]
  # Float32 rounding of sums of up to 6 weighted items.
  chex.assert_trees_all_close(sums[:, valid], want_sums, atol=3e-6, rtol=0)
  chex.assert_trees_all_close(back.reshape(want_back.shape), want_back, atol=3e-6, rtol=0)


def test_features_subset_and_std_gradient_finite_at_zero_variance():
  x = jnp.ones((1, 6, 2))  # Every area has zero variance.
  feats = features(x, max_area_width=3, features=('std',))
  assert feats.sum is None and feats.mean is None and feats.max is None
  grad = jax.jit(
      jax.grad(lambda x: aa.area_features(x, max_area_width=3, features=('std',)).std.sum())
  )(x)
  chex.assert_tree_all_finite(grad)


# ----------------------------------------------------------------------------
# Attention output vs brute force.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    'key_mode,value_mode,cfg',
    [
        (key_mode, value_mode, cfg)
        for key_mode in ('mean', 'max')
        for value_mode in aa.VALUE_MODES
        for cfg in ('1d_cross', '2d_cross')
    ]
    + [('max', 'max', '2d_areas_larger_than_grid')],
)
def test_modes_match_bruteforce(key_mode, value_mode, cfg):
  q_len, kv_len = CONFIGS[cfg][:2]
  q, k, v = _qkv(q_len, kv_len)
  mask = _mask('random', q_len, kv_len)
  opts = dict(_area_kwargs(CONFIGS[cfg]), mask=mask, key_mode=key_mode, value_mode=value_mode)
  out = attention(q, k, v, **opts)
  chex.assert_shape(out, (B, q_len, HEADS, DEPTH_V))
  chex.assert_trees_all_close(out, ref.area_attention(q, k, v, **opts), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    'cfg', ['1d_self', '1d_cross', '2d_self', '2d_cross', '2d_areas_larger_than_grid']
)
@pytest.mark.parametrize('causal', [False, True])
def test_masks_and_causal_match_bruteforce(cfg, causal):
  q_len, kv_len = CONFIGS[cfg][:2]
  q, k, v = _qkv(q_len, kv_len, seed=5)
  # Full-shape masks share one compilation; broadcast shapes are tested below.
  f = jax.jit(
      functools.partial(aa.dot_product_area_attention, causal=causal, **_area_kwargs(CONFIGS[cfg]))
  )
  for kind in ['all', 'padding', 'random', 'rank2']:
    mask = np.ones((q_len, kv_len), bool) if kind == 'all' else _mask(kind, q_len, kv_len)
    mask = np.broadcast_to(mask, (B, HEADS, q_len, kv_len))
    want = ref.area_attention(q, k, v, mask=mask, causal=causal, **_area_kwargs(CONFIGS[cfg]))
    chex.assert_trees_all_close(f(q, k, v, mask=mask), want, atol=1.5e-6, rtol=0)


@pytest.mark.parametrize('mask_kind', [None, 'padding', 'rank2'])
def test_broadcast_masks_match_bruteforce(mask_kind):
  q_len, kv_len = CONFIGS['2d_cross'][:2]
  q, k, v = _qkv(q_len, kv_len, seed=6)
  opts = dict(_area_kwargs(CONFIGS['2d_cross']), mask=_mask(mask_kind, q_len, kv_len))
  chex.assert_trees_all_close(
      attention(q, k, v, **opts), ref.area_attention(q, k, v, **opts), atol=1e-6, rtol=0
  )


# More queries than one block of the item-logit path (QUERY_BLOCK), not a
# multiple of it.
LONG_CONFIGS = {'1d_long': (70, 9, 4, 1, 1), '2d_long': (45, 12, 3, 2, 3)}


def _area_core_paths(cfg, value_mode, causal, mask_kind, dropout):
  """Outputs and VJPs of the two attention cores on the same inputs: through
  item logits (the basic form's path) and over explicit area features."""
  q_len, kv_len = LONG_CONFIGS.get(cfg, CONFIGS.get(cfg))[:2]
  q, k, v = _qkv(q_len, kv_len, seed=23)
  layout = aa.area_layout(kv_len, **_area_kwargs(LONG_CONFIGS.get(cfg, CONFIGS.get(cfg))))
  area_mask = masks.area_mask(_mask(mask_kind, q_len, kv_len), layout, q_len, causal)
  drop = dict(
      dropout_rate=0.3 if dropout else 0.0, dropout_rng=jax.random.key(3) if dropout else None
  )

  def through_items(q, k, v):
    return attend_through_items(
        q, k, v, area_mask, layout=layout, value_mode=value_mode, scale=None, **drop
    )

  def over_features(q, k, v):
    keys = areas.compute_area_features(k, layout, features=('mean',), std_epsilon=0.0).mean
    values = getattr(
        areas.compute_area_features(v, layout, features=(value_mode,), std_epsilon=0.0),
        value_mode,
    )
    return attend(q, keys, values, area_mask, scale=None, **drop)

  cotangent = np.random.default_rng(24).normal(size=(B, q_len, HEADS, DEPTH_V)).astype(np.float32)

  @jax.jit
  def run(q, k, v):
    results = []
    for f in (through_items, over_features):
      out, vjp = jax.vjp(f, q, k, v)
      results.append((out, vjp(jnp.asarray(cotangent))))
    return results

  return run(q, k, v)


@pytest.mark.parametrize(
    'cfg,value_mode,causal,mask_kind,dropout',
    [
        ('1d_self', 'sum', True, None, False),
        ('1d_cross', 'mean', False, 'random', False),
        ('1d_self', 'sum', False, 'padding', True),
        ('2d_self', 'sum', True, 'rank2', False),
        ('2d_cross', 'mean', True, 'padding', True),
        ('2d_areas_larger_than_grid', 'sum', False, 'random', False),
        ('1d_long', 'sum', True, 'random', True),
        ('1d_long', 'mean', False, 'padding', False),
        ('2d_long', 'sum', True, 'rank2', True),
        ('2d_long', 'mean', False, None, False),
    ],
)
@pytest.mark.sweep
def test_item_logit_path_matches_area_features_path(cfg, value_mode, causal, mask_kind, dropout):
  """Mean keys with sum/mean values run through item logits: outputs and
  gradients equal attention over the explicit area features (same masks, same
  dropout draws), to float32 rounding."""
  (out, grads), (want, want_grads) = _area_core_paths(cfg, value_mode, causal, mask_kind, dropout)
  chex.assert_tree_all_finite((out, grads))
  # Measured: at most 3.6e-7 (outputs) and 6.0e-7 (gradients of up to 5.7).
  chex.assert_trees_all_close(out, want, atol=1e-6, rtol=0)
  chex.assert_trees_all_close(grads, want_grads, atol=2e-6, rtol=0)


def test_basic_form_gradients_match_bruteforce_reference():
  """Gradients of the basic form (the item-logit path) against central
  differences of the float64 numpy reference, for q, k and v."""
  q, k, v = (a[:1, :, :1].astype(np.float64) for a in _qkv(5, 7, seed=25))
  opts = dict(max_area_width=3, causal=True, mask=_mask('rank2', 5, 7))
  cotangent = np.random.default_rng(26).normal(size=(1, 5, 1, DEPTH_V))
  grads = jax.jit(
      jax.grad(
          lambda q, k, v: jnp.sum(aa.dot_product_area_attention(q, k, v, **opts) * cotangent),
          argnums=(0, 1, 2),
      )
  )(*(jnp.asarray(a, jnp.float32) for a in (q, k, v)))
  eps = 1e-4
  for i, arg in enumerate((q, k, v)):
    want = np.zeros_like(arg)
    for idx in np.ndindex(arg.shape):
      plus, minus = [a.copy() for a in (q, k, v)], [a.copy() for a in (q, k, v)]
      plus[i][idx] += eps
      minus[i][idx] -= eps
      diff = ref.area_attention(*plus, **opts) - ref.area_attention(*minus, **opts)
      want[idx] = np.sum(diff * cotangent) / (2 * eps)
    chex.assert_trees_all_close(grads[i], want, atol=2e-5, rtol=0)


@pytest.mark.parametrize('scale', [1.0, 0.3])
def test_scale_matches_bruteforce(scale):
  q, k, v = _qkv(5, 8)
  opts = dict(max_area_width=3, scale=scale)
  chex.assert_trees_all_close(
      attention(q, k, v, **opts), ref.area_attention(q, k, v, **opts), atol=1.5e-6, rtol=0
  )


def test_sample_mode():
  q, k, v = _qkv(5, 12)
  opts = dict(max_area_width=3, max_area_height=2, memory_height=3, causal=True, key_mode='sample')
  # Deterministic: the sample is the mean (the reference without eps).
  chex.assert_trees_all_close(
      attention(q, k, v, **opts), ref.area_attention(q, k, v, **opts), atol=7e-7, rtol=0
  )
  # Stochastic: mean + std * eps with eps = normal(split(rng)[0]), as documented.
  rng = jax.random.key(7)
  out = attention(q, k, v, rng=rng, deterministic=False, **opts)
  n = aa.num_areas(12, max_area_width=3, max_area_height=2, memory_height=3)
  eps = jax.random.normal(jax.random.split(rng)[0], (B, n, HEADS, DEPTH), jnp.float32)
  want = ref.area_attention(q, k, v, sample_eps=np.asarray(eps), **opts)
  chex.assert_trees_all_close(out, want, atol=1.5e-6, rtol=0)


@pytest.mark.parametrize('causal,memory_height', [(False, 1), (True, 2)])
def test_single_item_areas_equal_dot_product_attention(causal, memory_height):
  q, k, v = _qkv(8, 8, seed=2)
  v = np.concatenate([v, v[..., :1]], -1)  # jax.nn needs depth_v == depth.
  mask = _mask('padding', 8, 8)
  out = attention(q, k, v, mask=mask, causal=causal, memory_height=memory_height)
  want = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal)
  chex.assert_trees_all_close(out, want, atol=5e-7, rtol=0)


def test_fully_masked_query_gives_zeros_and_finite_grads():
  q, k, v = _qkv(4, 6)

  @jax.jit
  def out_and_grads(q, k, v, mask):
    f = functools.partial(aa.dot_product_area_attention, max_area_width=3, mask=mask)
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(jnp.cos(out))  # Gradients of sum(sin(out)).

  mask = np.ones((B, HEADS, 4, 6), bool)
  mask[:, :, 1] = False  # Query 1 sees nothing.
  mask[1, 0, 2] = False  # Batch 1, head 0, query 2 sees nothing.
  out, grads = out_and_grads(q, k, v, mask)
  np.testing.assert_array_equal(out[:, 1], 0.0)
  np.testing.assert_array_equal(out[1, 2, 0], 0.0)
  chex.assert_trees_all_close(
      out, ref.area_attention(q, k, v, max_area_width=3, mask=mask), atol=5e-7, rtol=0
  )
  chex.assert_tree_all_finite(grads)
  np.testing.assert_array_equal(grads[0][:, 1], 0.0)  # No gradient to a blind query.

  # Everything masked: zeros everywhere, zero gradients everywhere.
  out, grads = out_and_grads(q, k, v, np.zeros_like(mask))
  chex.assert_trees_all_equal(out, jnp.zeros_like(out))
  chex.assert_trees_all_equal(grads, jax.tree.map(jnp.zeros_like, (q, k, v)))


# ----------------------------------------------------------------------------
# Causality.
# ----------------------------------------------------------------------------


def _assert_causal_jacobian(jac, q_axis, kv_axis):
  """jac[..., i, ..., j, ...] must be exactly zero for j > i and not all zero otherwise."""
  jac = np.moveaxis(np.asarray(jac), (q_axis, kv_axis), (0, 1))
  n_q, n_kv = jac.shape[:2]
  future = np.arange(n_kv)[None, :] > np.arange(n_q)[:, None]
  assert np.all(jac[future] == 0.0), 'output i depends on an item j > i'
  assert np.any(jac[~future] != 0.0)


@pytest.mark.parametrize(
    'cfg,key_mode',
    [('1d_self', 'mean'), ('1d_cross', 'max'), ('2d_self', 'max'), ('2d_cross', 'mean')],
)
def test_causal_jacobian_zero_for_future_items(cfg, key_mode):
  q_len, kv_len = CONFIGS[cfg][:2]
  q, k, v = (a[:1] for a in _qkv(q_len, kv_len, seed=9))
  f = functools.partial(
      aa.dot_product_area_attention,
      causal=True,
      key_mode=key_mode,
      value_mode='max' if key_mode == 'max' else 'sum',
      **_area_kwargs(CONFIGS[cfg]),
  )
  jac_k, jac_v = jax.jit(jax.jacrev(f, argnums=(1, 2)))(q, k, v)
  # out [b, q, h, dv] x key [b, kv, h, d]: the query axis is 1, the item axis 4 + 1.
  _assert_causal_jacobian(jac_k, 1, 5)
  _assert_causal_jacobian(jac_v, 1, 5)


def test_causal_jacobian_zero_for_future_items_across_query_blocks():
  """The basic form processes queries in blocks: still no dependence on future
  keys, values (or other queries) in any block."""
  q, k, v = (a[:1, :, :1] for a in _qkv(70, 70, seed=27))
  f = functools.partial(aa.dot_product_area_attention, causal=True, max_area_width=4)
  assert 70 > QUERY_BLOCK
  jac_q, jac_k, jac_v = jax.jit(jax.jacrev(f, argnums=(0, 1, 2)))(q, k, v)
  _assert_causal_jacobian(jac_k, 1, 5)
  _assert_causal_jacobian(jac_v, 1, 5)
  # Query i's output depends on query i only.
  jac_q = np.moveaxis(np.asarray(jac_q), (1, 5), (0, 1))
  other = ~np.eye(70, dtype=bool)
  assert np.all(jac_q[other] == 0.0)


def test_module_causal_jacobian_zero_for_future_inputs():
  x = np.random.default_rng(0).normal(size=(1, 12, 6)).astype(np.float32)
  m = aa.AreaAttention(
      num_heads=2,
      max_area_width=3,
      max_area_height=2,
      memory_height=3,
      key_mode='sample_concat',
      causal=True,
  )
  variables = random_variables(m, x)
  # deterministic=False: the sample noise must not leak the future either.
  apply = lambda x: m.apply(variables, x, None, None, False, rngs={'dropout': jax.random.key(1)})
  jac = jax.jit(jax.jacrev(apply))(x)  # [1, 12, 6, 1, 12, 6]
  _assert_causal_jacobian(jac, 1, 4)


# ----------------------------------------------------------------------------
# Module.
# ----------------------------------------------------------------------------


MODULE_CASES = {
    '1d_self_causal': dict(
        q=(2, 7, 6), kv=None, width=3, height=1, memory_height=1, mask=None, causal=True
    ),
    '2d_cross_masked': dict(
        q=(2, 5, 6), kv=(2, 12, 5), width=3, height=2, memory_height=3, mask='random', causal=False
    ),
}


@pytest.mark.parametrize(
    'case,key_mode',
    [
        ('1d_self_causal', 'concat'),
        ('2d_cross_masked', 'concat'),
        ('1d_self_causal', 'sum'),
        ('2d_cross_masked', 'max_concat'),
        ('1d_self_causal', 'sample_concat'),
        ('2d_cross_masked', 'sample_sum'),
        ('2d_cross_masked', 'max'),
        ('1d_self_causal', 'mean'),
        ('2d_cross_masked', 'sample'),
        ('1d_self_causal', 'max_std_concat'),
        ('2d_cross_masked', 'sample_std_concat'),
        ('1d_self_causal', 'sample_std_sum'),
    ],
)
def test_module_matches_bruteforce(case, key_mode):
  c = MODULE_CASES[case]
  rng = np.random.default_rng(11)
  xq = rng.normal(size=c['q']).astype(np.float32)
  xkv = None if c['kv'] is None else rng.normal(size=c['kv']).astype(np.float32)
  kv_len = c['q'][1] if c['kv'] is None else c['kv'][1]
  mask = None if c['mask'] is None else rng.random((2, 2, c['q'][1], kv_len)) > 0.25
  m = aa.AreaAttention(
      num_heads=2,
      qkv_features=8,
      out_features=7,
      max_area_width=c['width'],
      max_area_height=c['height'],
      memory_height=c['memory_height'],
      key_mode=key_mode,
      value_mode='sum',
      causal=c['causal'],
  )
  variables, out = init_apply(m, xq, xkv, mask)
  chex.assert_shape(out, c['q'][:2] + (7,))
  want = ref.area_attention_module(
      variables,
      xq,
      xkv,
      num_heads=2,
      mask=mask,
      causal=c['causal'],
      max_area_width=c['width'],
      max_area_height=c['height'],
      memory_height=c['memory_height'],
      key_mode=key_mode,
  )
  chex.assert_trees_all_close(out, want, atol=3e-6, rtol=0)


@pytest.mark.parametrize(
    'key_mode,value_mode', [('concat', 'mean'), ('sum', 'max'), ('max_concat', 'max')]
)
def test_module_per_head_params_and_value_modes(key_mode, value_mode):
  rng = np.random.default_rng(12)
  xq = rng.normal(size=(2, 4, 8)).astype(np.float32)
  xkv = rng.normal(size=(2, 2, 3, 8)).astype(np.float32)  # A [batch, h, w, features] memory.
  m = aa.AreaAttention(
      num_heads=2,
      max_area_width=2,
      max_area_height=2,
      key_mode=key_mode,
      value_mode=value_mode,
      per_head_area_key_params=True,
      area_key_hidden_dim=5,
      area_embedding_dim=None if key_mode == 'sum' else 3,
  )
  variables, out = init_apply(m, xq, xkv)
  assert variables['params']['area_key']['hidden_kernel'].shape[:1] == (2,)
  want = ref.area_attention_module(
      variables,
      xq,
      xkv,
      num_heads=2,
      max_area_width=2,
      max_area_height=2,
      key_mode=key_mode,
      value_mode=value_mode,
      per_head=True,
  )
  chex.assert_trees_all_close(out, want, atol=2e-6, rtol=0)


def test_learned_key_modes_have_tensor2tensor_parameters():
  """tensor2tensor's compute_area_key: height/width embeddings [max_area_*, depth // 2],
  Dense(depth, relu) on concat(mean, std, e) ('concat'), concat(max, e)
  ('max_concat'), concat(sample, e) ('sample_concat'), e + mean + std ('sum') or
  sample + e ('sample_sum'), then Dense(depth). Head depth 4 here: e is 2 + 2 wide."""
  x = jnp.zeros((1, 6, 8))
  d, e = 4, 4  # head depth, [e_h; e_w] width
  inputs = {
      'concat': 2 * d + e,
      'max_concat': d + e,
      'sample_concat': d + e,
      'sum': d,
      'sample_sum': d,
      'max_std_concat': 2 * d + e,
      'sample_std_concat': 2 * d + e,
      'sample_std_sum': d,
  }
  assert set(inputs) == set(aa.LEARNED_KEY_MODES)
  for key_mode, in_dim in inputs.items():
    m = aa.AreaAttention(num_heads=2, max_area_width=3, max_area_height=2, key_mode=key_mode)
    p = jax.eval_shape(m.init, jax.random.key(0), x)['params']['area_key']
    shapes = {k: v.shape for k, v in p.items()}
    assert shapes == {
        'height_embedding': (2, d // 2),
        'width_embedding': (3, d // 2),
        'hidden_kernel': (in_dim, d),
        'hidden_bias': (d,),
        'output_kernel': (d, d),
        'output_bias': (d,),
    }, (key_mode, shapes)


def test_module_2d_layouts_agree():
  rng = np.random.default_rng(13)
  grid = rng.normal(size=(2, 3, 4, 6)).astype(np.float32)
  flat = grid.reshape(2, 12, 6)
  opts = dict(num_heads=3, max_area_width=2, max_area_height=2, key_mode='concat')
  variables, out_flat = init_apply(aa.AreaAttention(memory_height=3, **opts), flat)
  # Grid taken from the shape; the output keeps the query's layout.
  out_grid = jax.jit(aa.AreaAttention(**opts).apply)(variables, grid)
  chex.assert_shape(out_grid, (2, 3, 4, 6))
  chex.assert_trees_all_equal(out_grid.reshape(2, 12, 6), out_flat)


def test_module_single_item_areas_equal_flax_mha():
  x = np.random.default_rng(14).normal(size=(2, 6, 8)).astype(np.float32)
  mask = nn.make_causal_mask(jnp.ones((2, 6)))
  variables, ours = init_apply(aa.AreaAttention(num_heads=2), x, None, mask)
  want = jax.jit(nn.MultiHeadDotProductAttention(num_heads=2).apply)(variables, x, mask=mask)
  chex.assert_trees_all_close(ours, want, atol=3e-6, rtol=0)
  causal = jax.jit(aa.AreaAttention(num_heads=2, causal=True).apply)(variables, x)
  chex.assert_trees_all_close(causal, want, atol=3e-6, rtol=0)


def test_module_dropout_and_sampling():
  x = np.random.default_rng(15).normal(size=(2, 8, 8)).astype(np.float32)
  base = dict(num_heads=2, max_area_width=3)

  def train(module):
    return jax.jit(lambda v, x, r: module.apply(v, x, None, None, False, rngs={'dropout': r}))

  m = aa.AreaAttention(dropout_rate=0.5, **base)
  variables = jax.jit(m.init)(jax.random.key(0), x)  # The module's own initializers.
  chex.assert_tree_all_finite(variables)
  det = jax.jit(m.apply)(variables, x)
  train_m = train(m)
  drop1 = train_m(variables, x, jax.random.key(1))
  drop2 = train_m(variables, x, jax.random.key(2))
  chex.assert_tree_all_finite((drop1, drop2))
  assert not np.allclose(drop1, det) and not np.allclose(drop1, drop2)
  # Sample mode in training: random (its evaluation = mean is checked against the reference).
  ms = aa.AreaAttention(key_mode='sample_sum', **base)
  variables = random_variables(ms, x)
  train_ms = train(ms)
  noisy1 = train_ms(variables, x, jax.random.key(4))
  noisy2 = train_ms(variables, x, jax.random.key(5))
  chex.assert_tree_all_finite((noisy1, noisy2))
  assert not np.allclose(noisy1, noisy2)


@pytest.mark.parametrize('key_mode', ['mean', 'concat'])
def test_empty_batch_gives_empty_outputs_and_gradients(key_mode):
  """Batch size 0 (the end of a sharded evaluation): empty outputs and gradients."""
  m = aa.AreaAttention(num_heads=2, max_area_width=2, max_area_height=2, key_mode=key_mode)
  x, grid = jnp.zeros((0, 5, 8)), jnp.zeros((0, 2, 3, 8))  # 1D queries, a 2D memory
  mask = jnp.ones((0, 1, 5, 6), bool)
  variables = random_variables(m, x, grid, mask)
  out = jax.jit(m.apply)(variables, x, grid, mask)
  chex.assert_shape(out, (0, 5, 8))
  chex.assert_shape(jax.jit(m.apply)(variables, grid), (0, 2, 3, 8))  # grid self-attention
  grads = jax.jit(jax.grad(lambda v, z: jnp.sum(m.apply(v, z, grid, mask)), argnums=(0, 1)))(
      variables, x
  )
  chex.assert_shape(grads[1], x.shape)
  chex.assert_trees_all_equal(grads[0], jax.tree.map(jnp.zeros_like, variables))
  q = jnp.zeros((0, 5, HEADS, DEPTH))
  out = attention(
      q, q, q[..., :DEPTH_V], max_area_width=3, causal=True, mask=jnp.ones((0, 1, 1, 5), bool)
  )
  chex.assert_shape(out, (0, 5, HEADS, DEPTH_V))


# ----------------------------------------------------------------------------
# Transformations and dtypes.
# ----------------------------------------------------------------------------


def test_jit_vmap_grad_pure():
  q, k, v = _qkv(5, 12)
  opts = dict(
      max_area_width=3,
      max_area_height=2,
      memory_height=3,
      causal=True,
      mask=_mask('padding', 5, 12),
  )
  f = functools.partial(aa.dot_product_area_attention, **opts)
  chex.assert_trees_all_close(
      jax.jit(f)(q, k, v), ref.area_attention(q, k, v, **opts), atol=7e-7, rtol=0
  )
  # vmap over an extra leading axis equals the reference on each slice.
  qs, ks, vs = (np.stack([a, 2.0 * a]) for a in (q, k, v))
  batched = jax.jit(jax.vmap(f))(qs, ks, vs)
  for i in range(2):
    chex.assert_trees_all_close(
        batched[i], ref.area_attention(qs[i], ks[i], vs[i], **opts), atol=1.5e-6, rtol=0
    )
  # Reverse-mode gradients agree with finite differences (a smooth mode, no mask).
  small = tuple(a[:1, :, :1] for a in (q, k, v))
  g = jax.jit(functools.partial(f, mask=None))  # check_grads nests it: no compiler_options.
  check_grads(g, small, order=1, modes=('rev',), atol=1e-3, rtol=1e-3, eps=1e-2)


def test_module_jit_grad_remat():
  x = np.random.default_rng(16).normal(size=(2, 6, 8)).astype(np.float32)
  opts = dict(num_heads=2, max_area_width=2, key_mode='max', causal=True)
  m = aa.AreaAttention(**opts)
  variables = random_variables(m, x)
  remat = nn.remat(aa.AreaAttention, static_argnums=(4,))(**opts)

  def loss(module, params, x):
    return jnp.sum(module.apply({'params': params}, x, None, None, True) ** 2)

  grads = jax.jit(jax.grad(functools.partial(loss, m)))(variables['params'], x)
  grads_remat = jax.jit(jax.grad(functools.partial(loss, remat)))(variables['params'], x)
  chex.assert_tree_all_finite(grads)
  chex.assert_trees_all_close(grads_remat, grads, atol=1e-6, rtol=0)


def test_bfloat16_compute():
  x = np.random.default_rng(17).normal(size=(2, 12, 8)).astype(np.float32)
  opts = dict(
      num_heads=2,
      max_area_width=3,
      max_area_height=2,
      memory_height=3,
      key_mode='concat',
      causal=True,
  )
  m16 = aa.AreaAttention(dtype=jnp.bfloat16, **opts)
  variables, out16 = init_apply(m16, x)
  chex.assert_trees_all_equal_dtypes(variables, jax.tree.map(jnp.float32, variables))
  assert out16.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(out16)
  out32 = jax.jit(aa.AreaAttention(**opts).apply)(variables, x)
  # Measured: 0.040 = 1.4 bfloat16 epsilons (2^-8) of max |out| = 7.3.
  bf16_eps = 2.0**-8
  chex.assert_trees_all_close(
      out16.astype(jnp.float32), out32, atol=3 * bf16_eps * float(jnp.max(jnp.abs(out32))), rtol=0
  )
  qkv = _qkv(5, 12)
  opts = dict(max_area_width=3, max_area_height=2, memory_height=3, key_mode='max', causal=True)
  out = attention(*(a.astype(jnp.bfloat16) for a in qkv), **opts)
  assert out.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(out)
  # Measured (bfloat16 inputs too): 0.0060 = 0.5 epsilons of max |out| = 2.9.
  out32 = attention(*qkv, **opts)
  chex.assert_trees_all_close(
      out.astype(jnp.float32), out32, atol=1.5 * bf16_eps * float(jnp.max(jnp.abs(out32))), rtol=0
  )


@pytest.mark.parametrize('value_mode', ['sum', 'mean'])
def test_bfloat16_basic_form(value_mode):
  """The basic form (through item logits) in bfloat16: bfloat16 output, float32
  logits and softmax, as close to float32 as attention over bfloat16 area
  features (measured: both 1.37 / 1.40 bfloat16 epsilons of max |out|)."""
  qkv = _qkv(5, 12)
  opts = dict(max_area_width=4, value_mode=value_mode)
  out = attention(*(a.astype(jnp.bfloat16) for a in qkv), **opts)
  assert out.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(out)
  out32 = attention(*qkv, **opts)
  bf16_eps = 2.0**-8
  chex.assert_trees_all_close(
      out.astype(jnp.float32), out32, atol=2 * bf16_eps * float(jnp.max(jnp.abs(out32))), rtol=0
  )


# ----------------------------------------------------------------------------
# Errors (raised while tracing, before compiling).
# ----------------------------------------------------------------------------


def _pure(**kw):
  q, k, v = _qkv(3, 6)
  args = dict(query=q, key=k, value=v)
  args.update({name: kw.pop(name) for name in ('query', 'key', 'value') if name in kw})
  return lambda: attention(args['query'], args['key'], args['value'], **kw)


PURE_ERRORS = {
    'key_mode': (_pure(key_mode='median'), r"key_mode='median'.*allowed"),
    'learned_key_mode': (_pure(key_mode='concat'), r"key_mode='concat'.*AreaAttention"),
    'value_mode': (_pure(value_mode='std'), r"value_mode='std'.*allowed"),
    'query_rank': (_pure(query=np.zeros((3, 2, 4))), r'query has rank 3'),
    'key_rank': (_pure(key=np.zeros((2, 6, 8))), r'key has rank 3'),
    'kv_not_divisible': (_pure(memory_height=4), r'memory_height=4 does not divide'),
    'mask_shape': (_pure(mask=np.ones((2, 1, 3, 5), bool)), r'mask has shape \(2, 1, 3, 5\)'),
    'mask_rank': (_pure(mask=np.ones((1, 2, 1, 3, 6), bool)), r'mask has shape'),
    'max_area_width': (_pure(max_area_width=0), r'max_area_width=0'),
    'max_area_height': (_pure(max_area_height=-1), r'max_area_height=-1'),
    'max_area_float': (_pure(max_area_width=2.0), r'max_area_width=2.0'),
    'memory_height': (_pure(memory_height=0), r'memory_height=0'),
    'dropout_rate': (_pure(dropout_rate=1.0), r'dropout_rate=1.0'),
    'missing_rng': (_pure(dropout_rate=0.1, deterministic=False), r'rng=None'),
    'key_value_mismatch': (_pure(value=np.zeros((2, 5, 2, 3))), r'value shape'),
    'query_key_depth': (_pure(key=np.zeros((2, 6, 2, 5))), r'key shape'),
    'scale': (_pure(scale=0.0), r'scale=0.0'),
    'causal': (_pure(causal='yes'), r"causal='yes'"),
}


@pytest.mark.parametrize('name', list(PURE_ERRORS), ids=list(PURE_ERRORS))
def test_pure_function_errors(name):
  fn, match = PURE_ERRORS[name]
  with pytest.raises(ValueError, match=match):
    fn()


def test_errors_raise_under_jit():
  q, k, v = _qkv(3, 6)
  with pytest.raises(ValueError, match='memory_height=4'):
    jax.jit(functools.partial(aa.dot_product_area_attention, memory_height=4))(q, k, v)


def _module(x_shape=(2, 6, 8), kv_shape=None, mask=None, **fields):
  fields = dict(dict(num_heads=2), **fields)
  x = jnp.zeros(x_shape)
  kv = None if kv_shape is None else jnp.zeros(kv_shape)
  return lambda: jax.eval_shape(aa.AreaAttention(**fields).init, jax.random.key(0), x, kv, mask)


MODULE_ERRORS = {
    'key_mode': (_module(key_mode='mode'), r"AreaAttention.key_mode='mode'"),
    'value_mode': (_module(value_mode='concat'), r"AreaAttention.value_mode='concat'"),
    'inputs_rank': (_module(x_shape=(6, 8)), r'inputs_q has rank 2'),
    'inputs_kv_rank': (_module(kv_shape=(1, 2, 6, 3, 8)), r'inputs_kv has rank 5'),
    'kv_not_divisible': (_module(memory_height=4), r'memory_height=4 does not divide'),
    'grid_memory_height': (
        _module(kv_shape=(2, 2, 3, 8), memory_height=3),
        r'memory_height=3 conflicts',
    ),
    'heads_divide': (_module(num_heads=3), r'qkv_features=8 is not divisible by num_heads=3'),
    'num_heads': (_module(num_heads=0), r'num_heads=0'),
    'max_area_width': (_module(max_area_width=0), r'max_area_width=0'),
    'max_area_height': (_module(max_area_height=0), r'max_area_height=0'),
    'mask_shape': (_module(mask=jnp.ones((2, 2, 6, 5), bool)), r'mask has shape'),
    'dropout_rate': (_module(dropout_rate=-0.1), r'dropout_rate=-0.1'),
    'embedding_dim_sum': (
        _module(key_mode='sum', area_embedding_dim=3),
        r"area_embedding_dim=3 is invalid for key_mode='sum'.*use None or 2",
    ),
    'sum_odd_depth': (
        _module(key_mode='sample_sum', qkv_features=6),
        r"key_mode='sample_sum' needs an even head depth.*got depth 3",
    ),
    'batch_mismatch': (_module(kv_shape=(3, 6, 8)), r'batch'),
}


@pytest.mark.parametrize('name', list(MODULE_ERRORS), ids=list(MODULE_ERRORS))
def test_module_errors(name):
  fn, match = MODULE_ERRORS[name]
  with pytest.raises(ValueError, match=match):
    fn()


def test_helper_errors():
  with pytest.raises(ValueError, match=r"features='median'"):
    features(jnp.zeros((1, 4, 2)), features=('median',))
  with pytest.raises(ValueError, match=r'x has rank 2'):
    features(jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match=r"AreaKeyEncoder.mode='max'"):
    enc = aa.AreaKeyEncoder(max_area_width=2, mode='max')
    jax.eval_shape(
        enc.init,
        jax.random.key(0),
        jnp.zeros((1, 3, 1, 2)),
        jnp.zeros((1, 3, 1, 2)),
        jnp.ones(3, jnp.int32),
        jnp.ones(3, jnp.int32),
    )
