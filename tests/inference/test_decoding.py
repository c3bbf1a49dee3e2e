"""Incremental decoding: every cache gives the full forward's outputs, step by step.

ContextPool streaming (every variant allowed to be causal), the Transformer
decoder and the LM (standard, local, area attention, ContextPool), greedy and
beam search with and without the cache, cache shapes and dtypes under jit,
bfloat16.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.area_attention import AreaAttention
from contextpool_jax.layers.context_pool import ContextPool

B, N, D = 2, 11, 6
CP_WEIGHTS = ('learned', 'unnormalized', 'uniform', 'nonlocal')
CP_LOCALITIES = ('gaussian', 'none', 'fixed_window', 'adaptive_window', 'random_sparse')
CP_MAPPINGS = ('cnn', 'mlp', 'attention')


def _x(shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def _stream(module, params, x, mask):
  """Outputs ``[batch, n, features]`` of ``module`` (``decode=True``) fed one
  position at a time after the cache-creating call on the whole ``x``."""
  _, state = module.apply(params, x, mask, mutable=['cache'])

  def step(cache, xm):
    xt, mt = xm
    y, state = module.apply({**params, 'cache': cache}, xt[:, None], mt[:, None], mutable=['cache'])
    return state['cache'], y[:, 0]

  _, ys = jax.lax.scan(step, state['cache'], (jnp.swapaxes(x, 0, 1), mask.T))
  return jnp.swapaxes(ys, 0, 1)


# Every weights x locality pair, the mapping cycling so that every weights x mapping
# and every locality x mapping pair is checked too (20 cases instead of the 60 of
# the full product: the three choices are separate stages of the layer).
CP_CASES = [
    (w, l, CP_MAPPINGS[(i + j) % len(CP_MAPPINGS)])
    for i, w in enumerate(CP_WEIGHTS)
    for j, l in enumerate(CP_LOCALITIES)
]


@pytest.mark.parametrize('weights,locality,mapping', CP_CASES)
@pytest.mark.sweep
def test_context_pool_stream_equals_full_forward(weights, locality, mapping):
  x = _x((B, N, D))
  # Padding inside and at the end: padded positions pass through, and never
  # change a real position's output (the cache keeps their validity).
  mask = jnp.ones((B, N), bool).at[0, 3].set(False).at[1, 8:].set(False)
  fields = dict(weights=weights, locality=locality, mapping=mapping, causal=True, window=2)
  fields.update(random_span=4, ratio=0.3, nonlocal_features=4, hidden_features=5)
  full = ContextPool(**fields)
  params = full.init(jax.random.key(1), x, mask)
  params = jax.tree.map(lambda p: 3.0 * p, params)  # varied weights and sizes
  want = full.apply(params, x, mask)
  got = jax.jit(functools.partial(_stream, ContextPool(decode=True, **fields)))(params, x, mask)
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    'fields',
    [
        dict(size_norm='softmax'),
        dict(size_norm='softmax', locality='adaptive_window'),
        dict(residual=True, kernel_size=1),
        dict(kernel_size=5, activation='gelu'),
        dict(gate=True, gate_init=0.5),
        dict(sigma_length=12, size_norm='softmax'),
        dict(sigma_length=5, size_bias_init=-2.0),
    ],
)
@pytest.mark.sweep
def test_context_pool_stream_other_fields(fields):
  x = _x((B, N, D), seed=3)
  mask = jnp.ones((B, N), bool).at[1, 0].set(False)
  full = ContextPool(causal=True, **fields)
  params = jax.tree.map(lambda p: 3.0 * p, full.init(jax.random.key(2), x, mask))
  want = full.apply(params, x, mask)
  got = jax.jit(functools.partial(_stream, ContextPool(decode=True, causal=True, **fields)))(
      params, x, mask
  )
  chex.assert_trees_all_close(got, want, atol=2e-5, rtol=2e-5)


def test_context_pool_decode_needs_causal():
  with pytest.raises(ConfigError, match='decode=True needs causal=True'):
    ContextPool(decode=True).init(jax.random.key(0), _x((1, 4, 3)))


# ----------------------------------------------------------------------------
# The Transformer decoder and the LM: cached steps == the full forward.
# ----------------------------------------------------------------------------

from contextpool_jax.models import transformer as T  # pylint: disable=g-import-not-at-top
from contextpool_jax.inference import decoding  # pylint: disable=g-import-not-at-top
from init_keys import init_key, init_variables  # pylint: disable=g-import-not-at-top

TINY = dict(vocab_size=13, num_layers=2, emb_dim=16, mlp_dim=32, num_heads=2, dropout_rate=0.0)
MODEL_CASES = {
    'standard': dict(),
    'local': dict(attention='local', local_window=2),
    'area_mean': dict(attention='area', max_area_width=3, num_area_layers=1),
    'area_concat': dict(
        attention='area', max_area_width=3, num_area_layers=2, area_key_mode='concat'
    ),
    'area_max_sum': dict(attention='area', max_area_width=2, area_key_mode='max'),
    'area_sample_sum': dict(attention='area', max_area_width=4, area_key_mode='sample_sum'),
    'cp': dict(context_pool={}),
    'cp_output': dict(context_pool={}, context_pool_position='output'),
    'cp_mlp_input': dict(context_pool={}, context_pool_position='mlp_input'),
    'cp_nonlocal_attention_map': dict(
        context_pool=dict(weights='nonlocal', mapping='attention', locality='fixed_window')
    ),
    'cp_area_local_softmax': dict(
        attention='area',
        context_pool=dict(size_norm='softmax', mapping='mlp'),
        max_area_width=2,
        num_area_layers=1,
    ),
    'scan_cp': dict(num_layers=3, scan_layers=True, context_pool={}),
    'cp_split': dict(
        num_layers=3,
        scan_layers=True,
        context_pool=dict(gate=True, sigma_length=16),
        context_pool_first_layer=1,
        context_pool_reads='kv',
        context_pool_heads=1,
    ),
    'cp_below_top': dict(
        num_layers=3, scan_layers=True, context_pool={}, context_pool_last_layer=1
    ),
    'scan_local_remat': dict(num_layers=3, scan_layers=True, remat=True, attention='local'),
    'rotary': dict(positions='rotary'),
    'rotary_scan_local_cp_kv': dict(
        num_layers=3,
        scan_layers=True,
        positions='rotary',
        attention='local',
        local_window=2,
        context_pool={},
        context_pool_reads='kv',
    ),
}
SOURCE = jnp.array([[3, 4, 5, 6, 1, 0, 0], [7, 1, 0, 0, 0, 0, 0]], jnp.int32)  # padded source


def _spread_kernels(params, scale=3.0):
  """Larger kernels, so the untrained model's outputs vary between tokens."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: scale * x if 'kernel' in jax.tree_util.keystr(path) else x, params
  )


def _cached_logits(apply_step, params, cache, tokens):
  """Logits ``[batch, n, vocab]`` of ``apply_step(variables, token [b, 1])`` fed
  ``tokens`` one at a time from ``cache``."""

  def step(c, tok):
    logits, state = apply_step({**params, 'cache': c}, tok[:, None])
    return state['cache'], logits[:, 0]

  _, out = jax.lax.scan(step, cache, tokens.T)
  return jnp.swapaxes(out, 0, 1)


@pytest.mark.parametrize('case', ['cp', *sorted(set(MODEL_CASES) - {'cp'})])  # the paper's first
@pytest.mark.sweep
def test_transformer_cached_decoding_equals_full_forward(case):
  """The decoder fed one token at a time from its cache gives the full forward's
  logits; and (the property segmented decoding relies on, decoding module
  docstring) the cache created for w positions equals the leading slice of the
  cache for more, in shape and value (position tables included). Both on one
  model and one compiled program per case."""
  model = T.Transformer(**{**TINY, **MODEL_CASES[case]})
  dec_in = jax.random.randint(jax.random.key(5), (2, 9), 0, 13)
  params = _spread_kernels(init_variables(model, init_key(1), SOURCE, dec_in))

  @jax.jit
  def run(params):
    encoded = model.apply(params, SOURCE, method=model.encode)
    full = model.apply(params, encoded, SOURCE, dec_in, method=model.decode)
    init = functools.partial(decoding.init_cache, model, params, encoded, SOURCE)
    step = lambda v, tok: model.apply(
        v, encoded, SOURCE, tok, decode=True, method=model.decode, mutable=['cache']
    )
    cache = init(dec_in.shape[1])
    return full, _cached_logits(step, params, cache, dec_in), cache, [init(w) for w in (1, 5)]

  full, cached, cache, smaller = run(params)
  assert float(jnp.std(full)) > 0.1
  chex.assert_trees_all_close(cached, full, atol=5e-5, rtol=5e-5)
  for small in smaller:
    chex.assert_trees_all_equal(decoding.cache_prefix(cache, small), small)
  with pytest.raises(ValueError, match='not a leading slice'):
    decoding.cache_prefix(smaller[1], cache)


@pytest.mark.parametrize(
    'case',
    [
        'standard',
        'local',
        'area_concat',
        'cp',
        'scan_cp',
        'cp_split',
        'cp_below_top',
        'rotary',
        'rotary_scan_local_cp_kv',
    ],
)
@pytest.mark.sweep
def test_lm_cached_decoding_equals_full_forward(case):
  model = T.TransformerLM(**{**TINY, **MODEL_CASES[case]})
  tokens = jax.random.randint(jax.random.key(7), (2, 10), 0, 13)
  params = _spread_kernels(init_variables(model, init_key(2), tokens))

  @jax.jit
  def run(params):
    full = model.apply(params, tokens)
    _, state = model.apply(params, jnp.zeros_like(tokens), decode=True, mutable=['cache'])
    step = lambda v, tok: model.apply(v, tok, decode=True, mutable=['cache'])
    return full, _cached_logits(step, params, state['cache'], tokens)

  full, cached = run(params)
  chex.assert_trees_all_close(cached, full, atol=5e-5, rtol=5e-5)


# ----------------------------------------------------------------------------
# Greedy and beam search: the same ids with and without the cache.
# ----------------------------------------------------------------------------


def _search_model(cls, case):
  """``cls`` (Transformer or TransformerLM) of ``case``, on one layer unless it scans
  layers (a scan traces and compiles one layer whatever their number). What the
  searches and the sampler add to the cached step is their loop over cache segments,
  the same for any number of layers; each layer's cache on top of another's is
  checked against the full forward above, on two and three layers."""
  layers = {} if MODEL_CASES[case].get('scan_layers') else {'num_layers': 1}
  return cls(**{**TINY, **MODEL_CASES[case], **layers})


# ContextPool's cache is searched through ``scan_cp`` (three scanned layers, each pooling):
# the beam search reorders it on the layer axis the scan adds as well.
@pytest.mark.parametrize('case', ['standard', 'area_concat', 'scan_cp'])
@pytest.mark.slow
def test_greedy_and_beam_search_same_ids_with_and_without_cache(case):
  """Slow: six whole searches per case, greedy and beam search each without the cache, with
  it in one segment, and on the cache's leading slices, each a loop over an
  encoder-decoder (one compiled program holds the six).

  One layer unless the case scans layers (:func:`_search_model`)."""
  model = _search_model(T.Transformer, case)
  params = init_variables(model, init_key(10), SOURCE, jnp.ones((2, 4), jnp.int32))
  params = _spread_kernels(params, 5.0)
  searches = (
      functools.partial(decoding.greedy_decode, model, max_len=8, eos_id=1),
      functools.partial(decoding.beam_search, model, beam_size=3, alpha=0.6, max_len=8, eos_id=1),
  )
  # Without the cache; in one segment; in segments 3 / 6 / 8 on the cache's leading slices.
  settings = [dict(cache=False, min_segment=2)] + [
      dict(cache=True, min_segment=m) for m in (None, 3)
  ]

  @jax.jit
  def run(params):
    return [[search(params, SOURCE, **kw) for kw in settings] for search in searches]

  for reference, *cached in run(params):
    assert len(set(np.asarray(reference).ravel().tolist()) - {0, 1}) >= 2  # not trivial
    for ids in cached:
      np.testing.assert_array_equal(ids, reference)


# ----------------------------------------------------------------------------
# Cache shapes and dtypes under jit; bfloat16.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.slow
def test_cache_shapes_and_dtypes_under_jit(dtype):
  cfg = {**TINY, **MODEL_CASES['cp_area_local_softmax'], 'dtype': dtype}
  model = T.Transformer(**cfg)
  params = init_variables(model, init_key(0), SOURCE, jnp.ones((2, 3), jnp.int32))
  max_len, head_dim = 6, TINY['emb_dim'] // TINY['num_heads']

  @jax.jit
  def first_step(params):
    encoded = model.apply(params, SOURCE, method=model.encode)
    cache = decoding.init_cache(model, params, encoded, SOURCE, max_len)
    return cache, decoding._cached_step_logits(
        model, params, encoded, SOURCE, cache, jnp.zeros((2,), jnp.int32)
    )

  cache, (logits, cache1) = first_step(params)
  chex.assert_trees_all_equal_shapes_and_dtypes(cache, cache1)
  chex.assert_shape(logits, (2, TINY['vocab_size']))
  assert logits.dtype == jnp.float32
  chex.assert_tree_all_finite(logits)
  dec = cache['decoder']
  area = dec['layer_0']['self_attention']['area']  # W = 2
  chex.assert_shape(area['cached_key'], (2, TINY['num_heads'], 1 + max_len, head_dim))
  assert 'cached_area_key' not in area  # the basic form steps through the items
  # Cross-attention (area in layer 0, standard in layer 1) caches the source once.
  source_len = SOURCE.shape[1]
  cross_area = dec['layer_0']['cross_attention']['area']['cached_memory_key']
  chex.assert_shape(cross_area, (2, source_len, TINY['num_heads'], head_dim))
  cross_std = dec['layer_1']['cross_attention']['cached_memory_key']
  chex.assert_shape(cross_std, (2, TINY['num_heads'], source_len, head_dim))
  std = dec['layer_1']['self_attention']
  chex.assert_shape(std['cached_key'], (2, TINY['num_heads'], max_len, head_dim))
  pool = dec['layer_0']['context_pool']
  chex.assert_shape(pool['x'], (2, max_len, TINY['emb_dim']))
  chex.assert_shape(pool['size_lse'], (2,))
  for leaf in (area['cached_key'], area['cached_value'], std['cached_value'], pool['x']):
    assert leaf.dtype == dtype
  assert pool['log_w'].dtype == jnp.float32 and pool['valid'].dtype == jnp.bool_
  assert (
      int(std['cache_index']) == 0
      and int(cache1['decoder']['layer_1']['self_attention']['cache_index']) == 1
  )
  chex.assert_shape(
      cache['embedder']['decode_positions']['positions'], (1, max_len, TINY['emb_dim'])
  )


@pytest.mark.parametrize('case', ['standard', 'area_concat', 'cp'])
@pytest.mark.slow
def test_bfloat16_cached_decoding_is_finite(case):
  model = T.Transformer(**{**TINY, **MODEL_CASES[case], 'dtype': jnp.bfloat16})
  params = init_variables(model, init_key(4), SOURCE, jnp.ones((2, 3), jnp.int32))
  params = _spread_kernels(params)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 13)

  @jax.jit
  def run(params):
    encoded = model.apply(params, SOURCE, method=model.encode)
    cache = decoding.init_cache(model, params, encoded, SOURCE, 8)
    step = lambda v, tok: model.apply(
        v, encoded, SOURCE, tok, decode=True, method=model.decode, mutable=['cache']
    )
    ids = decoding.beam_search(model, params, SOURCE, beam_size=2, max_len=8)
    return _cached_logits(step, params, cache, tokens), ids

  logits, ids = run(params)
  chex.assert_tree_all_finite(logits)
  chex.assert_shape(ids, (2, 8))


def test_decode_needs_a_1d_area_memory_and_no_mask():
  model = T.Transformer(**TINY)
  grid = jnp.ones((1, 2, 2, 16))  # causal area decoding runs over a sequence only
  with pytest.raises(ConfigError, match='needs a 1D memory'):
    AreaAttention(num_heads=2, causal=True, decode=True).init(jax.random.key(0), grid)
  with pytest.raises(ValueError, match='mask=None'):
    T.MultiHeadAttention(model.config, causal=True, decode=True).init(
        jax.random.key(0),
        jnp.ones((1, 3, 16)),
        jnp.ones((1, 3, 16)),
        jnp.ones((1, 1, 3, 3), bool),
        True,
    )


# ----------------------------------------------------------------------------
# The LM sampler.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('case', ['standard', 'area_concat', 'cp'])
@pytest.mark.slow
def test_lm_sampler_same_tokens_with_and_without_cache(case):
  from contextpool_jax.inference import sampling  # pylint: disable=g-import-not-at-top

  model = _search_model(T.TransformerLM, case)
  prompt = jnp.array([[3, 4, 5], [6, 7, 8]], jnp.int32)
  params = _spread_kernels(init_variables(model, init_key(6), prompt), 5.0)
  settings = (
      dict(length=6, context=16, temperature=0),  # all inside the context
      dict(length=9, context=5, temperature=0),  # then a sliding window
      dict(length=6, context=16, temperature=1.0, top_k=5, seed=3),
      dict(length=30, context=40, temperature=0),  # cached segments 16 and 32
  )

  @jax.jit
  def run(params):  # one compiled program holds the eight samples
    return [
        [
            sampling.sample_tokens(model, params, prompt, cache=cache, **kw)
            for cache in (True, False)
        ]
        for kw in settings
    ]

  for kw, (cached, reference) in zip(settings, run(params)):
    np.testing.assert_array_equal(cached, reference)
    chex.assert_shape(cached, (2, kw['length']))
