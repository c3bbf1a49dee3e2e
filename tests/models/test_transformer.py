"""Transformer encoder-decoder and character LM: shapes, causality, padding, overfitting."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from contextpool_jax.models import transformer as T
from contextpool_jax.layers.context_pool import make_context_pool
from contextpool_jax.models.common import count_params
from init_keys import init_key, init_variables

TINY = dict(num_layers=2, emb_dim=32, mlp_dim=64, num_heads=2, vocab_size=50)
KINDS = ('standard', 'local', 'area')


def _tokens(shape, seed=0, low=1, high=50):
  return jax.random.randint(jax.random.key(seed), shape, low, high, jnp.int32)


def _init(model, *args):
  return init_variables(model, init_key(), *args)


@pytest.mark.sweep
@pytest.mark.parametrize('name', sorted(T.MODELS))
def test_every_registered_transformer_builds_with_correct_shapes(name):
  is_lm = name.endswith('_lm')
  model = T.MODELS[name](num_layers=2, emb_dim=32, mlp_dim=64, num_heads=2, vocab_size=40)
  if is_lm:
    args = (_tokens((2, 12), high=40),)
    want = (2, 12, 40)
  else:
    args = (_tokens((2, 9), high=40), _tokens((2, 7), high=40))
    want = (2, 7, 40)
  out = jax.eval_shape(lambda: model.apply(model.init(jax.random.key(0), *args), *args))
  chex.assert_shape(out, want)


def test_presets_match_the_area_attention_paper():
  for size, (layers, hidden, filt, heads) in {
      'tiny': (2, 128, 512, 4),
      'small': (2, 256, 1024, 4),
      'base': (6, 512, 2048, 8),
      'big': (6, 1024, 4096, 16),
  }.items():
    m = T.MODELS[f'transformer_{size}']()
    assert (m.num_layers, m.emb_dim, m.mlp_dim, m.num_heads) == (layers, hidden, filt, heads)
  assert T.MODELS['area_transformer_base']().max_area_width == 5
  assert T.MODELS['area_transformer_base']().num_area_layers == 2


def test_cp_transformer_lm_has_the_papers_39m_parameters():
  shapes = jax.eval_shape(
      T.MODELS['cp_transformer_lm']().init, jax.random.key(0), jnp.ones((1, 8), jnp.int32)
  )
  n = count_params(shapes['params'])
  base = count_params(
      jax.eval_shape(
          T.MODELS['transformer_lm']().init, jax.random.key(0), jnp.ones((1, 8), jnp.int32)
      )['params']
  )
  print(
      f'cp_transformer_lm: {n / 1e6:.2f}M parameters (transformer_lm {base / 1e6:.2f}M; '
      'paper: 39M)'
  )
  assert abs(n - 39e6) / 39e6 < 0.05
  assert n > base


def test_rich_area_keys_add_the_eq9_parameters_only_to_area_layers():
  args = (_tokens((1, 6)), _tokens((1, 5)))
  count = lambda **kw: count_params(
      jax.eval_shape(
          T.Transformer(**TINY, attention='area', num_area_layers=1, **kw).init,
          jax.random.key(0),
          *args,
      )['params']
  )
  basic, rich = count(), count(area_key_mode='concat')
  assert count(area_key_mode='mean') == basic < rich
  # Eq. 9 is per attention, so two (self + cross) in each of encoder layer 0 and
  # decoder layer 0; the other layers are standard attention and do not change.
  plain = count_params(
      jax.eval_shape(T.Transformer(**TINY).init, jax.random.key(0), *args)['params']
  )
  assert basic == plain


CAUSAL_CASES = [dict(attention=k) for k in KINDS] + [
    dict(context_pool={}),
    dict(context_pool={'size_norm': 'softmax'}, attention='area'),
    dict(context_pool={'weights': 'nonlocal', 'mapping': 'attention'}),
    dict(context_pool={'size_norm': 'softmax'}, context_pool_position='output'),
    dict(attention='area', area_key_mode='concat'),
    dict(attention='area', area_value_mode='max'),
    dict(context_pool={}, context_pool_first_layer=1),
    dict(context_pool={}, context_pool_last_layer=0),
    dict(context_pool={'sigma_length': 12}, context_pool_reads='kv'),
    dict(context_pool={'gate': True}, context_pool_reads='q'),
    dict(context_pool={}, context_pool_heads=1, attention='local'),
    dict(context_pool={}, context_pool_position='mlp_input'),
    dict(positions='rotary'),
    dict(positions='rotary', attention='local', context_pool={}, context_pool_reads='kv'),
]


def _case_id(case):
  return '-'.join(f'{k}={v}' for k, v in case.items()) or 'standard'


@pytest.mark.parametrize('case', CAUSAL_CASES, ids=_case_id)
@pytest.mark.sweep
def test_lm_changing_token_j_never_changes_earlier_outputs(case):
  model = T.TransformerLM(**TINY, local_window=3, **case)
  tokens = _tokens((1, 12))
  params = _init(model, tokens)
  apply = jax.jit(model.apply)
  base = apply(params, tokens)
  for j in (3, 7, 11):
    changed = apply(params, tokens.at[:, j].set((tokens[0, j] % 49) + 1))
    np.testing.assert_array_equal(np.asarray(changed[:, :j]), np.asarray(base[:, :j]))
    assert not np.allclose(changed[:, j], base[:, j])  # position j does read token j


@pytest.mark.parametrize('case', CAUSAL_CASES, ids=_case_id)
@pytest.mark.sweep
def test_decoder_is_causal_and_encoder_padding_never_changes_real_outputs(case):
  """Two properties of the encoder-decoder, checked on one model and one compiled program
  per case:

  * changing target j never changes the logits at positions <= j (teacher
    forcing: logits[t] reads targets[< t]), and does change position j + 1;
  * padding the inputs (id 0) never changes the real positions' encodings, nor
    the logits.

  The targets changed at each j go through the same compiled loop body as the unchanged
  ones (``lax.map``), so equal means equal to the bit: rows of one batch need not be (the
  CPU compiler may round a row by where it lies)."""
  model = T.Transformer(**TINY, local_window=3, **case)
  inputs, targets = _tokens((2, 6)), _tokens((2, 10), seed=1)
  padded = jnp.pad(inputs, ((0, 0), (0, 5)))  # id 0 = padding
  params = _init(model, padded, targets)
  js = (2, 6)
  variants = jnp.stack([targets] + [targets.at[:, j].set((targets[:, j] % 49) + 1) for j in js])

  @jax.jit
  def run(params):
    encode = functools.partial(model.apply, params, method=model.encode)
    logits = jax.lax.map(lambda t: model.apply(params, padded, t), variants)
    return encode(padded), encode(inputs), logits, model.apply(params, inputs, targets)

  encoded_padded, encoded, (base, *changed), unpadded = run(params)
  chex.assert_trees_all_close(encoded_padded[:, :6], encoded, atol=1e-5)
  chex.assert_trees_all_close(base, unpadded, atol=1e-5)
  for logits, j in zip(changed, js, strict=True):
    np.testing.assert_array_equal(np.asarray(logits[:, : j + 1]), np.asarray(base[:, : j + 1]))
    assert not np.allclose(logits[:, j + 1], base[:, j + 1])


@pytest.mark.parametrize(
    'case',
    [dict(positions='rotary'), dict(positions='rotary', context_pool={}, attention='local')],
    ids=_case_id,
)
def test_causal_stack_jacobian_is_exactly_zero_above_the_diagonal(case):
  """d y_i / d x_j = 0 exactly for every j > i: a causal stack with rotary positions
  (the rotation is per position, so it cannot mix the future in)."""
  config = T.TransformerConfig(**TINY, local_window=3, **case)
  stack = T.TransformerStack(config, causal=True)
  x = jax.random.normal(jax.random.key(3), (1, 7, TINY['emb_dim']))
  valid = jnp.ones((1, 7), bool)
  params = _init(stack, x, valid)
  jac = jax.jit(jax.jacrev(lambda z: stack.apply(params, z, valid)[0]))(x)[:, :, 0]  # [n,d,n,d]
  energy = np.asarray(jnp.abs(jac).sum(axis=(1, 3)))  # [i, j]
  assert np.all(energy[np.triu_indices(7, k=1)] == 0.0)
  assert np.all(energy[np.tril_indices(7)] > 0.0)  # every earlier position is read


def test_rotary_positions_rotate_self_attention_only():
  """With rotary positions the embeddings carry no position (the same token at two
  places embeds the same), the self-attentions rotate, the cross-attention does not:
  permuting the encoder output's positions (with its mask) leaves the decoder unchanged."""
  model = T.Transformer(**TINY, positions='rotary')
  inputs, targets = _tokens((1, 6)), _tokens((1, 5), seed=1)
  params = _init(model, inputs, targets)
  same = jnp.full((1, 2), 7, jnp.int32)
  embedded = model.apply(params, same, method=lambda m, t: m.embedder(t))
  chex.assert_trees_all_equal(embedded[:, 0], embedded[:, 1])
  encoded = model.apply(params, inputs, method=model.encode)
  perm = jnp.array([3, 1, 5, 0, 2, 4])
  decode = lambda e, i: model.apply(params, e, i, targets, method=model.decode)
  chex.assert_trees_all_close(
      decode(encoded[:, perm], inputs[:, perm]), decode(encoded, inputs), atol=1e-5
  )
  sinusoidal = T.Transformer(**TINY)
  assert not np.allclose(
      sinusoidal.apply(params, inputs, targets), model.apply(params, inputs, targets), atol=1e-3
  )


def _ref_attention(p, q_in, kv_in):
  """Causal multi-head attention by loops (float64): head h's query reads
  ``q_in[h]`` and its key and value ``kv_in[h]`` (``[length, features]`` each)."""
  n, num_heads = q_in[0].shape[0], len(q_in)
  proj = lambda z, name, h: z @ np.asarray(p[name]['kernel'][:, h]) + np.asarray(p[name]['bias'][h])
  out = []
  for h in range(num_heads):
    q, k, v = proj(q_in[h], 'query', h), proj(kv_in[h], 'key', h), proj(kv_in[h], 'value', h)
    o = np.zeros_like(q)
    for i in range(n):
      logits = np.array([q[i] @ k[j] / np.sqrt(q.shape[-1]) for j in range(i + 1)])
      w = np.exp(logits - logits.max())
      o[i] = (w / w.sum()) @ v[: i + 1]
    out.append(o)
  y = np.stack(out, 1)  # [n, heads, head_dim]
  return np.einsum('nhd,hdf->nf', y, np.asarray(p['out']['kernel'])) + np.asarray(p['out']['bias'])


@pytest.mark.parametrize('reads', T.CONTEXT_POOL_READS)
@pytest.mark.parametrize('heads', [None, 1])
@pytest.mark.sweep
def test_attention_reads_pooled_features_as_configured(reads, heads):
  """context_pool_reads / _heads: a head's query (key and value) projects the
  pooled LN x where it reads pooled features, else LN x (numpy reference)."""
  cfg = T.TransformerConfig(
      **dict(TINY, num_heads=2), context_pool={}, context_pool_reads=reads, context_pool_heads=heads
  )
  layer = T.TransformerLayer(cfg, causal=True)
  x = jax.random.normal(jax.random.key(0), (1, 6, 32))
  valid = jnp.ones((1, 6), bool)
  params = _spread(layer.init(jax.random.key(1), x, valid))
  _, inter = layer.apply(params, x, valid, capture_intermediates=True, mutable=['intermediates'])
  got = lambda name: np.asarray(inter['intermediates'][name]['__call__'][0][0], np.float64)
  plain, pooled = got('self_attention_norm'), got('context_pool')
  assert not np.allclose(plain, pooled)
  pooled_head = [heads is None or h < heads for h in range(2)]
  q_in = [pooled if 'q' in reads and pooled_head[h] else plain for h in range(2)]
  kv_in = [pooled if 'kv' in reads and pooled_head[h] else plain for h in range(2)]
  want = _ref_attention(params['params']['self_attention'], q_in, kv_in)
  # float32 against float64: 1e-6 of the largest output.
  chex.assert_trees_all_close(got('self_attention'), want, atol=1e-6 * np.abs(want).max(), rtol=0)


def test_mlp_input_pools_what_the_feed_forward_reads_and_leaves_attention_exact():
  """context_pool_position='mlp_input': x' = x + Attn(LN x) (the layer
  without ContextPool's attention), then x' + FFN(CP(LN x'))."""
  cfg = T.TransformerConfig(**TINY, context_pool={}, context_pool_position='mlp_input')
  x = jax.random.normal(jax.random.key(0), (2, 6, 16))
  valid = jnp.ones((2, 6), bool)
  layer = T.TransformerLayer(cfg, causal=True)
  params = _spread(layer.init(jax.random.key(1), x, valid))['params']
  capture = lambda m, p: m.apply(
      {'params': p}, x, valid, capture_intermediates=True, mutable=['intermediates']
  )
  y, inter = capture(layer, params)
  got = lambda name: inter['intermediates'][name]['__call__'][0]
  plain = T.TransformerLayer(dataclasses.replace(cfg, context_pool=None), causal=True)
  exact = {k: v for k, v in params.items() if k != 'context_pool'}
  _, plain_inter = capture(plain, exact)
  attention = plain_inter['intermediates']['self_attention']['__call__'][0]
  chex.assert_trees_all_close(got('self_attention'), attention, atol=1e-6)
  pool = make_context_pool({}, dtype=None, param_dtype=jnp.float32, causal=True)
  pooled = pool.apply({'params': params['context_pool']}, got('mlp_norm'), valid, True)
  chex.assert_trees_all_close(got('context_pool'), pooled, atol=1e-6)
  assert not np.allclose(pooled, got('mlp_norm'), atol=1e-3)
  ffn = T.FeedForward(cfg).apply({'params': params['mlp']}, pooled)
  chex.assert_trees_all_close(y, x + attention + ffn, atol=1e-5)


def _spread(params, scale=3.0):
  return jax.tree.map(lambda p: p * scale, params)


@pytest.mark.slow
def test_context_pool_first_layer_leaves_the_first_layers_without_it():
  """context_pool_first_layer=1 (Sec. 3: pooled "for use in the next attention
  block"): layer 0 has no ContextPool and computes what the baseline's layer 0
  does with the same parameters."""
  tokens = _tokens((2, 10))
  model = T.TransformerLM(**TINY, context_pool={}, context_pool_first_layer=1)
  params = _init(model, tokens)['params']['decoder']
  assert 'context_pool' not in params['layer_0'] and 'context_pool' in params['layer_1']
  base = T.TransformerLM(**TINY)
  bparams = _init(base, tokens)
  chex.assert_trees_all_equal_shapes(params['layer_0'], bparams['params']['decoder']['layer_0'])
  capture = lambda m, p: m.apply(p, tokens, capture_intermediates=True, mutable=['intermediates'])
  p = {'params': dict(bparams['params'], decoder=params)}
  without_cp = {k: v for k, v in params['layer_1'].items() if k != 'context_pool'}
  p_base = {'params': dict(bparams['params'], decoder=dict(params, layer_1=without_cp))}
  layer_0 = lambda m, p: capture(m, p)[1]['intermediates']['decoder']['layer_0']['__call__'][0]
  chex.assert_trees_all_equal(layer_0(model, p), layer_0(base, p_base))


@pytest.mark.slow
def test_context_pool_last_layer_leaves_the_layers_after_it_without_it():
  """context_pool_last_layer=0 of 2 layers: layer 1 has no ContextPool and
  computes, from layer 0's output, what a layer without ContextPool does."""
  tokens = _tokens((2, 10))
  model = T.TransformerLM(**TINY, context_pool={}, context_pool_last_layer=0)
  assert model.config.context_pool_layers() == range(1)
  variables = _init(model, tokens)
  params = variables['params']['decoder']
  assert 'context_pool' in params['layer_0'] and 'context_pool' not in params['layer_1']
  _, inter = model.apply(variables, tokens, capture_intermediates=True, mutable=['intermediates'])
  outputs = inter['intermediates']['decoder']
  plain = T.TransformerLayer(dataclasses.replace(model.config, context_pool=None), causal=True)
  valid = jnp.ones(tokens.shape, bool)
  want = plain.apply({'params': params['layer_1']}, outputs['layer_0']['__call__'][0], valid)
  chex.assert_trees_all_close(outputs['layer_1']['__call__'][0], want, atol=1e-6)


@pytest.mark.parametrize(
    'fields,message',
    [
        (dict(context_pool_first_layer=2), 'context_pool_first_layer=2 leaves no layer'),
        (dict(context_pool_last_layer=2), 'context_pool_last_layer=2 is outside'),
        (
            dict(context_pool_first_layer=1, context_pool_last_layer=0),
            'context_pool_last_layer=0 is outside context_pool_first_layer=1',
        ),
        (dict(context_pool_heads=3), 'context_pool_heads=3 exceeds num_heads=2'),
        (
            dict(context_pool_reads='kv', context_pool_position='output'),
            "needs context_pool_position='attention_input'",
        ),
        (
            dict(context_pool_heads=1, attention='area'),
            "context_pool_heads=1 is not supported with attention='area'",
        ),
    ],
)
def test_bad_context_pool_placement_raises(fields, message):
  with pytest.raises(ValueError, match=message):
    T.TransformerLM(**TINY, context_pool={}, **fields).init(jax.random.key(0), _tokens((1, 4)))


@pytest.mark.slow
def test_encode_decode_equals_call():
  model = T.Transformer(**TINY, context_pool={})
  inputs, targets = _tokens((2, 6)), _tokens((2, 5), seed=1)
  params = _init(model, inputs, targets)
  encoded = model.apply(params, inputs, method=model.encode)
  decoder_inputs = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  logits = model.apply(params, encoded, inputs, decoder_inputs, method=model.decode)
  chex.assert_trees_all_close(logits, model.apply(params, inputs, targets), atol=1e-6)


def _restack(params, prefix_layers, num_layers):
  """Unscanned {'layer_i': p} -> scanned {'scanned_layers': {'layer': stacked}}."""
  out = {k: v for k, v in params.items() if not k.startswith('layer_')}
  for i in range(prefix_layers):
    out[f'layer_{i}'] = params[f'layer_{i}']
  stacked = [params[f'layer_{i}'] for i in range(prefix_layers, num_layers)]
  out['scanned_layers'] = {'layer': jax.tree.map(lambda *a: jnp.stack(a), *stacked)}
  return out


@pytest.mark.parametrize(
    'case',
    [dict(), dict(context_pool={}, remat=True), dict(attention='area', num_area_layers=1)],
    ids=_case_id,
)
@pytest.mark.sweep
def test_scan_layers_matches_unrolled(case):
  cfg = dict(TINY, num_layers=3)
  tokens = _tokens((2, 10))
  plain = T.TransformerLM(**cfg, **case)
  scanned = T.TransformerLM(**cfg, scan_layers=True, **case)
  params = _init(plain, tokens)['params']
  prefix = 1 if case.get('attention') == 'area' else 0
  sparams = dict(params, decoder=_restack(params['decoder'], prefix, 3))
  chex.assert_trees_all_equal_shapes(sparams, _init(scanned, tokens)['params'])
  chex.assert_trees_all_close(
      scanned.apply({'params': sparams}, tokens), plain.apply({'params': params}, tokens), atol=1e-5
  )


def test_dropout_only_in_training():
  model = T.TransformerLM(**TINY, dropout_rate=0.3, context_pool={})
  tokens = _tokens((2, 10))
  params = _init(model, tokens)
  a = model.apply(params, tokens, train=True, rngs={'dropout': jax.random.key(1)})
  b = model.apply(params, tokens, train=True, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(a, b)
  chex.assert_trees_all_close(model.apply(params, tokens), model.apply(params, tokens))


@pytest.mark.slow
def test_bfloat16_compute_float32_params():
  model = T.Transformer(**TINY, context_pool={}, attention='area', dtype=jnp.bfloat16)
  inputs, targets = _tokens((2, 6)), _tokens((2, 5), seed=1)
  params = _init(model, inputs, targets)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
  logits = jax.jit(model.apply)(params, inputs, targets)
  assert logits.dtype == jnp.float32
  chex.assert_tree_all_finite(logits)


def _overfit(model, batch, loss_fn, steps=40, lr=3e-3):
  params = _init(model, *batch)
  tx = optax.adam(lr)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(model.apply(p, *batch), batch))(params)
    updates, opt = tx.update(grads, opt)
    return optax.apply_updates(params, updates), opt, loss

  losses = []
  for _ in range(steps):
    params, opt, loss = step(params, opt)
    losses.append(float(loss))
  return losses


@pytest.mark.parametrize(
    'name', ['cp_transformer_lm', 'area_transformer_tiny', 'cp_transformer_tiny']
)
@pytest.mark.slow
def test_overfits_one_batch(name):
  model = T.MODELS[name](**TINY)
  if name.endswith('_lm'):
    tokens = _tokens((4, 16))
    batch = (tokens,)
    loss_fn = lambda logits, b: optax.softmax_cross_entropy_with_integer_labels(
        logits[:, :-1], b[0][:, 1:]
    ).mean()
  else:
    batch = (_tokens((4, 8)), _tokens((4, 8), seed=1))
    loss_fn = lambda logits, b: optax.softmax_cross_entropy_with_integer_labels(logits, b[1]).mean()
  losses = _overfit(model, batch, loss_fn)
  assert losses[-1] < 0.25 * losses[0], losses


@pytest.mark.parametrize(
    'field,value',
    [
        ('attention', 'sparse'),
        ('num_layers', 0),
        ('num_heads', 3),
        ('dropout_rate', 1.5),
        ('num_area_layers', -1),
        ('local_window', 0),
        ('context_pool_position', 'before'),
        ('area_key_mode', 'rich'),
        ('area_value_mode', 'median'),
        ('context_pool_reads', 'k'),
        ('context_pool_heads', 0),
        ('context_pool_first_layer', -1),
        ('context_pool_last_layer', -1),
        ('positions', 'learned'),
    ],
)
def test_bad_options_raise(field, value):
  with pytest.raises(ValueError, match=field):
    T.TransformerLM(**dict(TINY, **{field: value})).init(jax.random.key(0), _tokens((1, 4)))


@pytest.mark.parametrize(
    'fields,message',
    [
        (dict(attention='area'), r"positions='rotary' is not supported with attention='area'"),
        (dict(emb_dim=30, num_heads=2), r'head size emb_dim / num_heads = 30 / 2 = 15 is odd'),
    ],
)
def test_rotary_positions_refuse_what_they_cannot_rotate(fields, message):
  with pytest.raises(ValueError, match=message):
    T.TransformerLM(**{**TINY, **fields}, positions='rotary').init(
        jax.random.key(0), _tokens((1, 4))
    )


def test_bad_context_pool_override_raises():
  with pytest.raises(ValueError, match='context_pool.causal=False conflicts'):
    T.TransformerLM(**TINY, context_pool={'causal': False}).init(jax.random.key(0), _tokens((1, 4)))
  with pytest.raises(ValueError, match='unknown field'):
    T.TransformerLM(**TINY, context_pool={'sigma': 1}).init(jax.random.key(0), _tokens((1, 4)))


def test_float_tokens_raise():
  with pytest.raises(ValueError, match='integer token ids'):
    T.TransformerLM(**TINY).init(jax.random.key(0), jnp.ones((1, 4)))


@pytest.mark.slow
def test_cp_lm_train_step_at_8192_compiles_within_24_gb():
  """enwik8's last stage: the 12-layer CP LM AdamW step (remat, nn.scan), batch 1,
  n = 8192, with ContextPool's default implementation ('auto' -> blockwise).
  Compiled only; XLA's planned peak = temp + arguments + outputs - donated."""
  from benchmarks.contextpool_memory import compile_lm_train_step

  assert T.MODELS['cp_transformer_lm']().num_layers == 12
  row = compile_lm_train_step(8192, batch=1, scan_layers=True)
  assert row['total_mib'] < 24 * 2**10, row['total_mib'] / 2**10
