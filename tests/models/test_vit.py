"""ViT / CP-ViT: presets, parameter counts, ContextPool placement, scan, dropout, bf16."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.models import vit
from contextpool_jax.models.common import count_params

NAMES = ('vit_ti16', 'vit_s16', 'vit_b16', 'cp_vit_ti16', 'cp_vit_s16', 'cp_vit_b16')
# A reduced model: 32 x 32 images, 8 x 8 patches -> a 4 x 4 grid.
SMALL = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2, num_classes=5)


def _key(seed):
  # 'rbg' keys: XLA's RngBitGenerator compiles several times faster on the CPU
  # than the default threefry, which dominates compiling Flax initialisers.
  return jax.random.key(seed, impl='rbg')


def _images(shape=(2, 32, 32, 3), seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


def _shapes(model, x):
  return jax.eval_shape(model.init, jax.random.key(0), x)


def _random_params(model, x, seed=0, scale=0.3):
  """Random variables with the model's shapes, without compiling its initialisers."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = rng.normal(0.0, scale, leaf.shape)
    if jax.tree_util.keystr(path).endswith("['scale']"):
      noise = 1.0 + noise
    return jnp.asarray(noise, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, _shapes(model, x))


def _apply(model, params, x, train=False, rng=None, mutable=False):
  rngs = {} if rng is None else {'dropout': rng}
  fn = lambda p, x, r: model.apply(p, x, train=train, rngs=r, mutable=mutable)
  return jax.jit(fn)(params, x, rngs)


def _drop_context_pool(tree):
  """The same pytree without the ContextPool sub-trees (the shared ViT params)."""
  if not isinstance(tree, dict):
    return tree
  return {k: _drop_context_pool(v) for k, v in tree.items() if k != 'context_pool'}


# ----------------------------------------------------------------------------
# Presets, shapes, parameter counts.
# ----------------------------------------------------------------------------


def test_registry_presets():
  assert set(vit.MODELS) == set(NAMES)
  widths = {'ti': (192, 3), 's': (384, 6), 'b': (768, 12)}
  for name in NAMES:
    model = vit.MODELS[name]()
    size = name.split('_')[-1][:-2]
    assert (model.hidden_size, model.num_heads) == widths[size]
    assert (model.num_layers, model.patch_size, model.num_classes) == (12, 16, 1000)
    assert (model.context_pool is not None) == name.startswith('cp_')
  assert vit.MODELS['cp_vit_b16'](num_layers=10).num_layers == 10


@pytest.mark.parametrize('name', NAMES)
@pytest.mark.sweep
def test_forward_shapes_reduced(name):
  # The preset's width and heads, 2 layers, 32 x 32 images, patch 16 (a 2 x 2 grid).
  model = vit.MODELS[name](image_size=32, num_layers=2, num_classes=7)
  x = _images((2, 32, 32, 3))
  params = _random_params(model, x)
  y = _apply(model, params, x)
  assert y.shape == (2, 7) and y.dtype == jnp.float32
  assert np.all(np.isfinite(y))


@functools.lru_cache(maxsize=None)
def _full_size(name, **fields):
  """``(logits, variables)`` shapes of a preset on two 224 x 224 images, traced once
  for the tests that read them (a ViT-B trace takes about a second)."""
  model = vit.MODELS[name](**fields)
  x = jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.float32)
  return jax.eval_shape(lambda x: model.init_with_output(jax.random.key(0), x), x)


def test_forward_shapes_full_size():
  for name in NAMES:
    assert _full_size(name)[0].shape == (2, 1000)


def _cp_params_per_module(d, k=3, hidden=32):
  """ContextPool's cnn mapping: conv d -> hidden, conv hidden -> 2 (w and s)."""
  return (k * k * d * hidden + hidden) + (k * k * hidden * 2 + 2)


@pytest.mark.slow
def test_parameter_counts():
  count = lambda name, **kw: count_params(_full_size(name, **kw)[1]['params'])
  # Exactly the reference ViT / DeiT models (e.g. timm's vit_*_patch16_224).
  want = {'vit_ti16': 5_717_416, 'vit_s16': 22_050_664, 'vit_b16': 86_567_656}
  for name, n in want.items():
    assert count(name) == n
    d = vit.MODELS[name]().hidden_size
    assert count('cp_' + name) == n + 11 * _cp_params_per_module(d)
  assert abs(count('vit_b16') / 86e6 - 1) < 0.05  # Table 6: 86M
  assert count('cp_vit_b16') / count('vit_b16') - 1 < 0.05  # Table 6: 88M (+2.8% here)
  assert abs(count('cp_vit_b16', num_layers=10) / 75e6 - 1) < 0.05  # Table 6: 75M
  assert count('cp_vit_b16', context_pool_last=True) == (
      want['vit_b16'] + 12 * _cp_params_per_module(768)
  )


def test_parameter_dtypes_and_layout():
  model = vit.ViT(**dict(SMALL, num_layers=3), context_pool={}, dtype=jnp.bfloat16)
  shapes = _shapes(model, _images())['params']
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(shapes))
  assert shapes['pos_embedding'].shape == (1, 1 + 16, 32)
  assert shapes['cls'].shape == (1, 1, 32)
  assert 'context_pool' in shapes['block_0'] and 'context_pool' in shapes['block_1']
  assert 'context_pool' not in shapes['block_2']  # no attention block follows it
  gap = _shapes(vit.ViT(**SMALL, classifier='gap'), _images())['params']
  assert 'cls' not in gap and gap['pos_embedding'].shape == (1, 16, 32)


# ----------------------------------------------------------------------------
# ContextPool placement and the class token.
# ----------------------------------------------------------------------------


def test_pool_patch_tokens_passes_class_token_through():
  b, grid, d = 2, (3, 4), 5
  x = _images((b, 1 + 12, d))
  pool = ContextPool(weights='uniform', locality='none')  # every output = grid mean
  apply_pool = lambda g, deterministic: pool.apply({}, g, deterministic=deterministic)
  out = jax.jit(lambda x: vit.pool_patch_tokens(apply_pool, x, grid, 1, True))(x)
  chex.assert_trees_all_close(out[:, 0], x[:, 0], atol=0, rtol=0)
  mean = jnp.mean(x[:, 1:], axis=1, keepdims=True)
  chex.assert_trees_all_close(out[:, 1:], jnp.broadcast_to(mean, (b, 12, d)), atol=1e-6)


@pytest.mark.parametrize('position', ['block', 'attention'])
def test_identity_context_pool_gives_the_plain_vit(position):
  # With its mapping zeroed, ContextPool's sizes are uniform: sigma = r * (h + w)/2
  # / n = 0.0125 tokens on the 4 x 4 grid, so each token pools only itself.
  x = _images()
  cp = vit.ViT(**SMALL, context_pool={}, context_pool_position=position)
  params = _random_params(cp, x)
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: p * 0 if 'context_pool' in jax.tree_util.keystr(path) else p, params
  )
  plain = vit.ViT(**SMALL)
  chex.assert_trees_all_close(
      _apply(cp, params, x), _apply(plain, _drop_context_pool(params), x), atol=1e-5, rtol=1e-5
  )


def test_pooling_changes_the_output_and_position_matters():
  x = _images()
  cfg = dict(SMALL, context_pool={'weights': 'uniform', 'locality': 'none'})
  block = vit.ViT(**cfg)
  params = _random_params(block, x)
  out_block = _apply(block, params, x)
  out_attn = _apply(vit.ViT(**cfg, context_pool_position='attention'), params, x)
  out_plain = _apply(vit.ViT(**SMALL), params, x)
  assert not np.allclose(out_block, out_plain, atol=1e-3)
  assert not np.allclose(out_block, out_attn, atol=1e-3)


@pytest.mark.parametrize('scan', [False, True])
def test_context_pool_intermediates_are_sown(scan):
  x = _images()
  model = vit.ViT(**dict(SMALL, num_layers=3), context_pool={}, scan_layers=scan)
  params = _random_params(model, x)
  _, state = _apply(model, params, x, mutable=['intermediates'])
  inter = state['intermediates']
  if scan:
    (w,), (s,) = (inter['blocks']['context_pool'][k] for k in ('pool_weights', 'pool_sigma'))
    assert w.shape == s.shape == (2, 2, 4, 4)  # [scanned layers, batch, h, w]
    assert set(inter) == {'blocks'}
  else:
    assert set(inter) == {'block_0', 'block_1'}
    (w,) = inter['block_1']['context_pool']['pool_weights']
    assert w.shape == (2, 4, 4)  # the patch grid only: no class token
  np.testing.assert_allclose(np.sum(w, axis=(-2, -1)), 1.0, atol=1e-5)


# ----------------------------------------------------------------------------
# Scan, remat, dropout, dtype, image sizes.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('layers,cp,last,remat', [(3, {}, False, True), (2, {}, True, False)])
def test_scan_matches_unscanned(layers, cp, last, remat):
  x = _images()
  cfg = dict(SMALL, num_layers=layers, context_pool=cp, context_pool_last=last)
  plain = vit.ViT(**cfg)
  scanned = vit.ViT(**cfg, scan_layers=True, remat=remat)
  n_scan = vit.num_scanned_layers(layers, cp, last)
  assert n_scan == (layers - 1 if cp is not None and not last else layers)
  params = _random_params(plain, x)
  stacked = {'params': vit.stack_block_params(params['params'], layers, n_scan)}
  chex.assert_trees_all_equal_shapes_and_dtypes(stacked, _shapes(scanned, x))
  chex.assert_trees_all_close(
      _apply(scanned, stacked, x), _apply(plain, params, x), atol=1e-5, rtol=1e-5
  )
  back = vit.unstack_block_params(stacked['params'], layers, n_scan)
  chex.assert_trees_all_equal(back, params['params'])


@pytest.mark.parametrize('scan', [False, True])
def test_dropout_train_vs_eval(scan):
  x = _images()
  model = vit.ViT(
      **SMALL,
      context_pool={'dropout_rate': 0.1},
      dropout_rate=0.1,
      attention_dropout_rate=0.1,
      scan_layers=scan,
      remat=scan,
      context_pool_last=scan,
  )
  params = _random_params(model, x)
  run = jax.jit(
      lambda p, x, r, train: model.apply(p, x, train=train, rngs={'dropout': r}), static_argnums=3
  )
  eval1 = run(params, x, _key(1), False)
  chex.assert_trees_all_close(eval1, run(params, x, _key(2), False))
  train1 = run(params, x, _key(1), True)
  assert not np.allclose(train1, eval1, atol=1e-4)
  assert not np.allclose(train1, run(params, x, _key(2), True), atol=1e-4)
  chex.assert_trees_all_close(train1, run(params, x, _key(1), True))


def test_bfloat16_forward_is_finite_and_close():
  x = _images()
  model32 = vit.ViT(**SMALL, context_pool={})
  model16 = vit.ViT(**SMALL, context_pool={}, dtype=jnp.bfloat16)
  params = _random_params(model32, x, scale=0.1)
  y16, y32 = _apply(model16, params, x), _apply(model32, params, x)
  assert y16.dtype == jnp.float32 and np.all(np.isfinite(y16))
  np.testing.assert_allclose(y16, y32, atol=0.05 * float(np.max(np.abs(y32))) + 1e-3)


def test_other_image_sizes():
  model = vit.ViT(**SMALL, context_pool={})  # position embeddings for a 4 x 4 grid
  x = _images((1, 48, 40, 3))  # a 6 x 5 grid
  params = _random_params(model, _images())
  _, state = _apply(model, params, x, mutable=['intermediates'])
  assert state['intermediates']['block_0']['context_pool']['pool_weights'][0].shape == (1, 6, 5)
  with pytest.raises(ValueError, match='posemb_resize'):
    _shapes(vit.ViT(**SMALL, posemb_resize=None), x)
  with pytest.raises(ValueError, match='multiples of patch_size=8'):
    _shapes(model, _images((1, 36, 32, 3)))
  # Resizing keeps the class token's row and a constant grid constant.
  pe = jnp.concatenate([jnp.full((1, 1, 3), 7.0), jnp.ones((1, 16, 3))], axis=1)
  out = vit.resize_posemb(pe, (4, 4), (6, 5), 1, 'bilinear')
  assert out.shape == (1, 31, 3)
  np.testing.assert_allclose(out[0, 0], 7.0)
  np.testing.assert_allclose(out[0, 1:], 1.0, atol=1e-6)
  assert vit.resize_posemb(pe, (4, 4), (4, 4), 1, 'bilinear') is pe


@pytest.mark.parametrize(
    'override,match',
    [
        (dict(classifier='mean'), "classifier='mean'"),
        (dict(context_pool_position='mlp'), "context_pool_position='mlp'"),
        (dict(num_heads=3), 'num_heads=3'),
        (dict(image_size=36), 'image_size=36'),
        (dict(dropout_rate=1.5), 'dropout_rate=1.5'),
        (dict(attention_dropout_rate=-0.1), 'attention_dropout_rate=-0.1'),
        (dict(posemb_resize='spline'), "posemb_resize='spline'"),
        (dict(context_pool={'bogus': 1}), 'bogus'),
        (dict(context_pool={}, num_layers=1), 'num_layers=1'),
        (dict(context_pool=3), 'context_pool=3'),
        (dict(remat=1), 'remat=1'),
        (dict(num_layers=0), 'num_layers=0'),
    ],
)
def test_bad_options_raise(override, match):
  with pytest.raises(ValueError, match=match):
    _shapes(vit.ViT(**{**SMALL, **override}), _images())


def test_bad_input_rank_raises():
  with pytest.raises(ValueError, match='rank 3'):
    _shapes(vit.ViT(**SMALL), _images((32, 32, 3)))


# ----------------------------------------------------------------------------
# Initialisation and a tiny training run.
# ----------------------------------------------------------------------------

TINY = dict(
    image_size=16,
    patch_size=4,
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    num_classes=4,
    context_pool={},
)


@pytest.fixture(scope='module')
def tiny_init():
  model = vit.ViT(**TINY)
  x = _images((8, 16, 16, 3), seed=3)
  return model, x, jax.jit(model.init)(_key(0), x)


@pytest.mark.slow
def test_initialisation(tiny_init):
  _, _, variables = tiny_init
  p = variables['params']
  assert not np.any(p['head']['kernel']) and not np.any(p['head']['bias'])
  assert not np.any(p['cls'])
  assert 0.01 < float(jnp.std(p['pos_embedding'])) < 0.03
  kernel = p['block_0']['mlp']['dense_0']['kernel']  # xavier-uniform: |k| <= bound
  bound = math.sqrt(6 / sum(kernel.shape))
  assert float(jnp.max(jnp.abs(kernel))) <= bound
  assert float(jnp.max(jnp.abs(kernel))) > 0.8 * bound


@pytest.mark.slow
def test_tiny_cp_vit_overfits_one_batch(tiny_init):
  _, x, variables = tiny_init
  model = vit.ViT(**TINY, remat=True)  # also trains through nn.remat (train static)
  labels = jnp.arange(8) % 4
  tx = optax.adam(3e-3)

  def loss_fn(params):
    logits = model.apply(params, x, train=True, rngs={'dropout': _key(0)})
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  @jax.jit
  def train(params):
    def step(carry, _):
      params, opt = carry
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt = tx.update(grads, opt, params)
      return (optax.apply_updates(params, updates), opt), loss

    _, losses = jax.lax.scan(step, (params, tx.init(params)), length=40)
    return losses

  losses = train(variables)
  assert np.all(np.isfinite(losses))
  assert losses[0] == pytest.approx(math.log(4), abs=1e-4)  # zero-initialised head
  assert losses[-1] < 0.1 * losses[0], losses
