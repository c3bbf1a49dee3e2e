"""Tests for contextpool_jax.layers.augmented_conv (attention-augmented conv)."""

import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.layers import augmented_conv as aac
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.augmented_conv import relative_logits_2d
import ref_augmented_conv as ref

# features=20, key_ratio=0.2, value_ratio=0.4, 2 heads -> d_k=4, d_v=8.
SMALL = dict(features=20, key_ratio=0.2, value_ratio=0.4, num_heads=2)


def _init(model, x, seed=0):
  """Random parameters with the layer's own shapes and dtypes.

  Shapes come from ``eval_shape(model.init)``; values are drawn with NumPy
  (kernels ~ N(0, 1/fan_in), biases and relative tables ~ N(0, 0.5^2)) because
  compiling the real initialisers costs seconds per configuration on a shared
  CPU. ``test_real_init`` covers ``model.init`` itself.
  """
  shapes = jax.eval_shape(model.init, jax.random.key(0), x)
  rng = np.random.default_rng(seed)

  def draw(leaf):
    scale = 1 / math.sqrt(math.prod(leaf.shape[:-1])) if len(leaf.shape) == 4 else 0.5
    return jnp.asarray(rng.normal(0.0, scale, leaf.shape), leaf.dtype)

  return jax.tree_util.tree_map(draw, shapes)


def _apply(model, params, x):
  return jax.jit(model.apply)(params, x)


def _randn(shape, seed=0):
  # NumPy, not jax.random: compiling a sampler per shape is slow on a busy CPU.
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


# ----------------------------------------------------------- relative logits


@pytest.mark.parametrize(
    'height,width,q_strides,per_head',
    [
        (3, 5, (1, 1), False),
        (4, 2, (1, 1), True),
        (5, 7, (2, 3), False),
        (4, 5, (2, 2), True),
    ],
)
def test_relative_logits_match_direct_loop(height, width, q_strides, per_head):
  heads, depth, batch = 3, 4, 2
  q_h = -(-height // q_strides[0])
  q_w = -(-width // q_strides[1])
  q = _randn((batch, q_h, q_w, heads, depth), 1)
  lead = (heads,) if per_head else ()
  rel_w = _randn(lead + (2 * width - 1, depth), 2)
  rel_h = _randn(lead + (2 * height - 1, depth), 3)
  got = jax.jit(relative_logits_2d, static_argnums=3)(q, rel_w, rel_h, q_strides)
  want = ref.direct_relative_logits(q, rel_w, rel_h, q_strides)
  chex.assert_shape(got, (batch, heads, q_h, q_w, height, width))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_relative_logits_depend_only_on_offsets():
  # S^rel_W[i, j] depends on (j_x - i_x) only: shifting query and key together
  # along x leaves the width part unchanged when q is the same at both queries.
  depth = 4
  q = jnp.broadcast_to(_randn((depth,), 4), (1, 1, 6, 1, depth))
  rel_w = _randn((11, depth), 5)
  rel_h = jnp.zeros((1, depth))
  logits = jax.jit(relative_logits_2d)(q, rel_w, rel_h)[0, 0, 0, :, 0, :]  # [6, 6]
  np.testing.assert_allclose(logits[1:, 1:], logits[:-1, :-1], atol=1e-6)


def test_relative_logits_memory_is_linear_in_depth():
  # The naive [HW, HW, d] embedding tensor would be (HW)^2 * d floats; the
  # relative part must need far less temporary memory than that.
  size, depth = 16, 64
  q = jax.ShapeDtypeStruct((1, size, size, 1, depth), jnp.float32)
  rel = jax.ShapeDtypeStruct((2 * size - 1, depth), jnp.float32)
  compiled = jax.jit(relative_logits_2d).lower(q, rel, rel).compile()
  stats = compiled.memory_analysis()
  assert stats is not None, 'memory_analysis() is not available on this backend'
  naive_bytes = (size * size) ** 2 * depth * 4
  logits_bytes = (size * size) ** 2 * 4
  assert stats.temp_size_in_bytes < naive_bytes / 16
  assert stats.temp_size_in_bytes <= 4 * logits_bytes


# ---------------------------------------------------- module vs reference


@pytest.mark.parametrize('position', aac.POSITIONS)
@pytest.mark.parametrize(
    'strides,downsample',
    [
        ((1, 1), 'avg_pool'),
        ((2, 2), 'avg_pool'),
        ((2, 1), 'subsample'),
        ((2, 2), 'query_subsample'),
    ],
)
def test_module_matches_slow_reference(position, strides, downsample):
  model = AugmentedConv2D(
      **SMALL, strides=strides, position=position, attention_downsample=downsample
  )
  x = _randn((2, 5, 4, 3), 7)
  params = _init(model, x)
  got = _apply(model, params, x)
  want = ref.augmented_conv(
      params['params'],
      x,
      d_k=4,
      d_v=8,
      num_heads=2,
      strides=strides,
      position=position,
      attention_downsample=downsample,
  )
  chex.assert_shape(got, want.shape)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_relative_per_head_matches_reference():
  model = AugmentedConv2D(**SMALL, relative_per_head=True)
  x = _randn((1, 3, 4, 3), 8)
  params = _init(model, x)
  assert params['params']['rel_width'].shape == (2, 7, 2)
  got = _apply(model, params, x)
  want = ref.augmented_conv(
      params['params'],
      x,
      d_k=4,
      d_v=8,
      num_heads=2,
      strides=(1, 1),
      position='relative',
      attention_downsample='avg_pool',
  )
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_downsample_modes_coincide_at_stride_one():
  x = _randn((2, 5, 6, 3), 9)
  params = _init(AugmentedConv2D(**SMALL), x)
  outs = [
      _apply(AugmentedConv2D(**SMALL, attention_downsample=mode), params, x)
      for mode in aac.DOWNSAMPLES
  ]
  for out in outs[1:]:
    chex.assert_trees_all_close(out, outs[0], atol=1e-6)


def test_position_encodings_match_their_definition():
  np.testing.assert_allclose(aac.sine_encoding_2d(4, 3, 7), ref.sine_2d(4, 3, 7), atol=1e-12)
  np.testing.assert_allclose(aac.coord_channels(1, 4), ref.coords(1, 4))
  np.testing.assert_allclose(aac.coord_channels(5, 3), ref.coords(5, 3))


# ------------------------------------------------------------------ shapes


@pytest.mark.parametrize('height,width', [(8, 8), (7, 5), (5, 9), (1, 3)])
@pytest.mark.parametrize('stride', [1, 2, 3])
@pytest.mark.parametrize('downsample', aac.DOWNSAMPLES)
def test_output_shapes(height, width, stride, downsample):
  model = AugmentedConv2D(**SMALL, strides=stride, attention_downsample=downsample)
  x = jax.ShapeDtypeStruct((2, height, width, 3), jnp.float32)
  out, params = jax.eval_shape(lambda x: model.init_with_output(jax.random.key(0), x), x)
  chex.assert_shape(out, (2, math.ceil(height / stride), math.ceil(width / stride), 20))
  key_h, key_w = (
      (height, width)
      if downsample == 'query_subsample'
      else (math.ceil(height / stride), math.ceil(width / stride))
  )
  p = params['params']
  assert p['rel_width'].shape == (2 * key_w - 1, 2)
  assert p['rel_height'].shape == (2 * key_h - 1, 2)
  # Paper (parameter count, Eq. 5): q/k/v by a 1x1 conv F_in -> 2 d_k + d_v, heads mixed by a
  # 1x1 conv d_v -> d_v, the convolution keeps F_out - d_v filters.
  assert p['qkv']['kernel'].shape == (1, 1, 3, 2 * 4 + 8)
  assert p['attn_out']['kernel'].shape == (1, 1, 8, 8)
  assert p['conv']['kernel'].shape == (3, 3, 3, 20 - 8)


def test_coordconv_adds_two_input_channels():
  x = jnp.ones((1, 4, 4, 3))
  params = _init(AugmentedConv2D(**SMALL, position='coordconv'), x)
  assert params['params']['qkv']['kernel'].shape[2] == 3 + 2
  assert 'rel_width' not in params['params']


def test_nearest_rounding():
  # kappa * F = 12.8 and nu * F = 6.4 with 8 heads: nearest multiples of 8.
  model = AugmentedConv2D(64, key_ratio=0.2, value_ratio=0.1, num_heads=8, depth_rounding='nearest')
  x = jnp.ones((1, 3, 3, 4))
  p = jax.eval_shape(lambda x: model.init(jax.random.key(0), x), x)['params']
  d_k, d_v = 16, 8
  assert p['qkv']['kernel'].shape[-1] == 2 * d_k + d_v
  assert p['conv']['kernel'].shape[-1] == 64 - d_v


# ------------------------------------------------------------- transforms


def test_jit_grad_vmap():
  model = AugmentedConv2D(**SMALL, strides=2)
  x = _randn((2, 5, 6, 3), 10)
  params = _init(model, x)
  apply = jax.jit(model.apply)

  def loss(params, x):
    return jnp.sum(model.apply(params, x) ** 2)

  g_params, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
  chex.assert_tree_all_finite((g_params, g_x))
  for path, leaf in jax.tree_util.tree_leaves_with_path(g_params):
    assert np.any(np.asarray(leaf) != 0), jax.tree_util.keystr(path)
  assert np.any(np.asarray(g_x) != 0)

  xs = jnp.stack([x, 2 * x, -x])
  batched = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))(params, xs)
  looped = jnp.stack([apply(params, xi) for xi in xs])
  chex.assert_trees_all_close(batched, looped, atol=1e-5)


def test_remat():
  x = _randn((1, 4, 5, 3), 11)
  plain = AugmentedConv2D(**SMALL)
  params = _init(plain, x)
  remat = nn.remat(AugmentedConv2D)(**SMALL)

  def forward_and_grads(model):
    def loss(p):
      out = model.apply(p, x)
      return jnp.sum(jnp.sin(out)), out

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (_, out_remat), g_remat = forward_and_grads(remat)
  (_, out_plain), g_plain = forward_and_grads(plain)
  chex.assert_trees_all_close(out_remat, out_plain, atol=1e-6)
  chex.assert_trees_all_close(g_remat, g_plain, atol=1e-5)


def test_bfloat16_compute():
  x = _randn((2, 6, 5, 3), 12)
  f32 = AugmentedConv2D(**SMALL)
  params = _init(f32, x)
  bf16 = AugmentedConv2D(**SMALL, dtype=jnp.bfloat16)
  out = _apply(bf16, params, x)
  assert out.dtype == jnp.bfloat16
  chex.assert_tree_all_finite(out)
  np.testing.assert_allclose(
      np.asarray(out, np.float32), np.asarray(_apply(f32, params, x)), atol=0.1, rtol=0.05
  )


def test_real_init():
  # model.init itself, with bf16 parameters and compute.
  x = _randn((1, 4, 3, 3), 13)
  model = AugmentedConv2D(**SMALL, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  out, params = jax.jit(model.init_with_output)(
      jax.random.key(0, impl='rbg'), x
  )  # rbg: cheaper to compile
  assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree_util.tree_leaves(params))
  assert out.dtype == jnp.bfloat16
  chex.assert_shape(out, (1, 4, 3, 20))
  chex.assert_tree_all_finite((out, params))
  # Relative tables start at N(0, 1/d_k^h): not all zero, not huge.
  rel = np.asarray(params['params']['rel_width'], np.float32)
  assert 0 < np.abs(rel).max() < 10


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    'kwargs,needles',
    [
        (dict(position='learned'), ['position', "'learned'", "'relative'"]),
        (
            dict(attention_downsample='max_pool'),
            ['attention_downsample', "'max_pool'", "'avg_pool'"],
        ),
        (dict(depth_rounding='up'), ['depth_rounding', "'up'", "'nearest'"]),
        (dict(key_ratio=0.15), ['key_ratio', '0.15', 'num_heads=2']),
        (dict(key_ratio=0.05), ['key_ratio', '0.05', 'divisible']),
        (dict(value_ratio=-0.1), ['value_ratio', '-0.1']),
        (dict(value_ratio=1.0), ['value_ratio', 'features=20']),
        (dict(features=0), ['features', '0']),
        (dict(num_heads=0), ['num_heads', '0']),
        (dict(kernel_size=(3, 3, 3)), ['kernel_size', '(3, 3, 3)']),
        (dict(strides=0), ['strides', '0']),
    ],
)
def test_bad_options_raise(kwargs, needles):
  config = dict(SMALL, **kwargs)
  model = AugmentedConv2D(**config)
  x = jax.ShapeDtypeStruct((1, 4, 4, 3), jnp.float32)
  with pytest.raises(ValueError) as err:
    jax.eval_shape(lambda x: model.init(jax.random.key(0), x), x)
  for needle in needles:
    assert needle in str(err.value), (needle, str(err.value))


@pytest.mark.parametrize('shape', [(4, 4, 3), (1, 2, 4, 4, 3)])
def test_bad_rank_raises(shape):
  model = AugmentedConv2D(**SMALL)
  x = jax.ShapeDtypeStruct(shape, jnp.float32)
  with pytest.raises(ValueError, match='rank'):
    jax.eval_shape(model.init, jax.random.key(0), x)


def test_other_spatial_size_after_init_raises():
  model = AugmentedConv2D(**SMALL)
  params = _init(model, jnp.ones((1, 4, 4, 3)))
  with pytest.raises(ValueError, match='rel_'):
    jax.eval_shape(model.apply, params, jnp.ones((1, 5, 4, 3)))


def test_relative_logits_bad_inputs_raise():
  q = jax.ShapeDtypeStruct((1, 3, 3, 1, 2), jnp.float32)
  q4 = jax.ShapeDtypeStruct((3, 3, 1, 2), jnp.float32)
  r4, r5 = (jax.ShapeDtypeStruct((n, 2), jnp.float32) for n in (4, 5))
  logits = jax.jit(relative_logits_2d, static_argnums=3)
  with pytest.raises(ValueError, match='rows'):
    jax.eval_shape(logits, q, r4, r5)
  with pytest.raises(ValueError, match='rank'):
    jax.eval_shape(logits, q4, r5, r5)
  with pytest.raises(ValueError, match='rows'):  # stride 2 needs 5 keys
    jax.eval_shape(logits, q, r5, r5, (2, 2))
  per_head = jax.ShapeDtypeStruct((2, 5, 2), jnp.float32)
  with pytest.raises(ValueError, match='per-head'):
    jax.eval_shape(logits, q, per_head, r5)


def test_empty_batch_gives_empty_outputs_and_zero_gradients():
  """Batch 0 (the end of a sharded evaluation)."""
  module = AugmentedConv2D(features=8, key_ratio=0.5, value_ratio=0.5, num_heads=2, strides=2)
  variables = module.init(jax.random.key(0), jnp.ones((2, 6, 6, 4)))
  empty = jnp.zeros((0, 6, 6, 4))
  chex.assert_shape(module.apply(variables, empty), (0, 3, 3, 8))
  grads = jax.grad(lambda p: module.apply({'params': p}, empty).sum())(variables['params'])
  chex.assert_trees_all_equal(grads, jax.tree.map(jnp.zeros_like, grads))
