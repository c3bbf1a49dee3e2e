"""Diagnostics of an LM along training (benchmarks/lm_diagnostics.py, issue 27)."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import helpers
from benchmarks import lm_diagnostics as diag
from contextpool_jax.data import lm_input
from contextpool_jax.models import transformer as T
from init_keys import init_key, init_variables

TINY = dict(num_layers=2, emb_dim=16, mlp_dim=32, num_heads=2, vocab_size=256)
N = 16


def _tokens(count, seed=0):
  return np.asarray(jax.random.randint(jax.random.key(seed), (count, N + 1), 0, 256, jnp.int32))


def test_buckets_are_the_quarters_and_the_scored_half():
  assert diag.buckets(256) == ((0, 64), (64, 128), (128, 256))
  assert [diag.bucket_name(*b) for b in diag.buckets(256)] == ['0-63', '64-127', '128-255']


@pytest.mark.slow
def test_per_position_bpc_and_gradient_norms_match_direct_computation():
  model = T.TransformerLM(**TINY, context_pool={})
  valid, train = _tokens(20), _tokens(8, seed=1)
  variables = init_variables(model, init_key(), valid[:1, :-1])
  d = diag.diagnose_step(model, variables, valid, train)
  # Per-position NLL by a log-softmax of the logits, position by position.
  logits = np.asarray(jax.jit(model.apply)(variables, valid[:, :-1]), np.float64)
  nll = np.zeros(N)
  for i in range(N):
    z = logits[:, i]
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    nll[i] = np.mean(lse - z[np.arange(len(valid)), valid[:, i + 1]])
  for lo, hi in diag.buckets(N):
    want = nll[lo:hi].mean() / math.log(2)
    assert abs(d['val_bpc_by_bucket'][diag.bucket_name(lo, hi)] - want) < 1e-4
  # Gradient norms: the groups partition the parameters.
  g = d['grad_norm']
  assert {'embedder', 'layer_0/context_pool', 'layer_1/self_attention', 'layer_0/mlp'} <= set(g)
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
      model.apply({'params': p}, train[:, :-1]), train[:, 1:]
  ).mean()
  total = float(optax.tree.norm(jax.jit(jax.grad(loss))(variables['params'])))
  assert abs(g['total'] - total) < 1e-4 * total
  parts = math.sqrt(sum(v**2 for k, v in g.items() if k != 'total'))
  assert abs(parts - total) < 1e-4 * total


def test_pool_size_statistics_of_a_known_size():
  """With the size channel's kernel zeroed, s = sigmoid(bias) everywhere and
  sigma = r (i + 1) s at position i (causal n): the statistics follow."""
  model = T.TransformerLM(**TINY, context_pool={'size_bias_init': 1.0})
  valid = _tokens(4)
  variables = init_variables(model, init_key(), valid[:1, :-1])
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: jnp.zeros_like(p)
      if 'mapping_conv_1' in jax.tree_util.keystr(path) and 'kernel' in jax.tree_util.keystr(path)
      else p,
      variables['params'],
  )
  d = diag.diagnose_step(model, {'params': params}, valid, valid)
  s = 1 / (1 + math.exp(-1.0))
  for layer in ('layer_0/context_pool', 'layer_1/context_pool'):
    st = d['layers'][layer]
    assert st['all']['share_s_above_half'] == 1.0
    assert abs(st['all']['median_s'] - s) < 1e-6
    lo, hi = diag.buckets(N)[-1]
    want = np.median(0.1 * np.arange(lo + 1, hi + 1) * s)
    assert abs(st[diag.bucket_name(lo, hi)]['median_sigma'] - want) < 1e-5
    assert 0 < st['all']['norm_ratio'] < 2


@pytest.mark.sweep
@pytest.mark.parametrize('position', sorted(diag.POOLED_NORM))
def test_norm_ratio_compares_the_pooled_features_with_what_they_replace(position):
  """|CP(h)| / |h| for the h ContextPool pools: the attention's input norm,
  the feed-forward's, or none (the residual stream is not a norm's output)."""
  model = T.TransformerLM(**TINY, context_pool={}, context_pool_position=position)
  valid = _tokens(4)
  variables = init_variables(model, init_key(), valid[:1, :-1])
  stats = diag.diagnose_step(model, variables, valid, valid)['layers']['layer_1/context_pool']
  norm = {'attention_input': 'self_attention_norm', 'mlp_input': 'mlp_norm'}.get(position)
  if norm is None:
    assert 'norm_ratio' not in stats['all']
    return
  capture = functools.partial(model.apply, capture_intermediates=True, mutable=['intermediates'])
  _, inter = jax.jit(capture)(variables, valid[:, :-1])
  layer = inter['intermediates']['decoder']['layer_1']
  pooled, plain = (np.asarray(layer[k]['__call__'][0]) for k in ('context_pool', norm))
  want = np.mean(np.linalg.norm(pooled, axis=-1) / np.linalg.norm(plain, axis=-1))
  assert abs(stats['all']['norm_ratio'] - want) < 1e-5 * want


def test_a_model_without_context_pool_has_no_layer_statistics():
  model = T.TransformerLM(**TINY)
  valid = _tokens(4)
  variables = init_variables(model, init_key(), valid[:1, :-1])
  d = diag.diagnose_step(model, variables, valid, valid)
  assert d['layers'] == {} and diag.window_of(d['val_bpc_by_bucket']) == N
  chex.assert_tree_all_finite(d['val_bpc_by_bucket'])


def test_report_tables_carry_the_recorded_values():
  grad = {'embedder': 0.3, 'layer_0/context_pool': 0.3, 'layer_1/context_pool': 0.4}
  grad.update({'layer_0/self_attention': 0.6, 'layer_1/self_attention': 0.8, 'total': 1.5})
  stats = {'median_sigma': 1.25, 'norm_ratio': 0.875, 'share_s_above_half': 0.125}
  layer = {'all': stats, **{b: stats for b in ('0-3', '4-7', '8-15')}}
  step = {
      'val_bpc_by_bucket': {'0-3': 2.5, '4-7': 2.25, '8-15': 2.0},
      'layers': {'layer_0/context_pool': layer},
      'grad_norm': grad,
      'copying_bpc': {'first_copy': 6.5, 'second_copy': 0.25},
      'attention': {'layer_1': {'previous_token': [0.125, 0.5], 'induction': [0.75, 0.25]}},
  }
  md = diag.report({'run-a': {'steps': {'500': step}}})
  assert '| run-a | 500 | layer_1 | 0.500 (head 1) | 0.750 (head 0) |' in md
  # Uniform causal attention: 1 / (t + 1) on each earlier byte.
  uniform = [np.mean([1 / (t + 1) for t in ts]) for ts in (range(1, 16), range(8, 16))]
  assert f'over 16 bytes scores {uniform[0]:.3f} and {uniform[1]:.3f}.' in md
  assert '| run-a | 500 | 6.500 | 0.250 | - | - |' in md  # recorded before copying_text_bpc
  assert 'non-overlapping 16-byte windows' in md
  assert '| run-a | 500 | 2.500 | 2.250 | 2.000 |' in md
  assert '| run-a | 500 | layer_0/context_pool | 0.12 | 1.25 | 1.25 | 1.25 | 0.88 | 0.88 |' in md
  # ContextPool and self-attention as the root sum of squares of their layers' norms.
  assert '| run-a | 500 | 1.500 | 0.300 | 1.000 | 0.500 |' in md


def test_copying_windows_repeat_and_the_score_splits_the_copies():
  w = diag.copying_windows(N, count=5)
  chex.assert_shape(w, (5, N + 1))
  # Every target from N/2 + 1 on is the byte N/2 positions back; the first half is printable.
  np.testing.assert_array_equal(w[:, N // 2 + 1 :], w[:, 1 : N // 2 + 1])
  assert w.min() >= 32 and w.max() < 127
  model = T.TransformerLM(**TINY, context_pool={})
  variables = init_variables(model, init_key(), w[:1, :-1])
  got = diag.copying_bpc(model, variables, w)
  z = np.asarray(jax.jit(model.apply)(variables, w[:, :-1]), np.float64)
  logp = z - z.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  bits = -np.take_along_axis(logp, w[:, 1:, None], -1)[..., 0] / math.log(2)  # target t + 1
  assert abs(got['first_copy'] - bits[:, : N // 2 - 1].mean()) < 1e-4
  assert abs(got['second_copy'] - bits[:, N // 2 :].mean()) < 1e-4
  text = diag.repeated_windows(_tokens(3), N)
  np.testing.assert_array_equal(text[:, N // 2 : N], _tokens(3)[:, : N // 2])
  np.testing.assert_array_equal(text[:, N // 2 + 1 :], text[:, 1 : N // 2 + 1])


@pytest.mark.parametrize('heads', [None, 1])  # every head reads the pooled features; a HeadMix
def test_attention_weights_reproduce_the_attention_output(heads):
  """Weights x values through the output projection give the self-attention's
  own output, so the weights are the ones the model uses (scale, mask, heads)."""
  model = T.TransformerLM(**TINY, context_pool={}, context_pool_heads=heads)
  tokens = diag.copying_windows(N, count=3)
  variables = init_variables(model, init_key(), tokens[:1, :-1])
  weights = diag.attention_weights(model, variables, tokens)
  assert set(weights) == {'layer_0', 'layer_1'}
  probed = lambda m, name: name == '__call__' and m.name in ('value', 'self_attention')
  capture = functools.partial(model.apply, mutable=['intermediates'], capture_intermediates=probed)
  _, inter = jax.jit(capture)(variables, tokens[:, :-1])
  for layer, w in weights.items():
    chex.assert_shape(w, (3, 2, N, N))
    assert np.all(np.triu(w, 1) == 0) and np.allclose(w.sum(-1), 1.0)
    got = inter['intermediates']['decoder'][layer]['self_attention']
    v = diag._projection(model, got['value']['__call__'])  # pylint: disable=protected-access
    out = variables['params']['decoder'][layer]['self_attention']['out']
    y = np.einsum('bhqk,bkhd,hdf->bqf', w, v, out['kernel']) + out['bias']
    np.testing.assert_allclose(y, got['__call__'][0], atol=1e-5)


def test_head_scores_of_known_patterns():
  """Head 0 always attends to the previous byte; head 1, in the second copy, to
  the byte after the earlier occurrence (else to itself)."""
  n = 8
  w = np.zeros((2, 2, n, n))
  w[:, 0, 0, 0] = 1.0
  for t in range(1, n):
    w[:, 0, t, t - 1] = 1.0
  for t in range(n):
    w[:, 1, t, t - n // 2 + 1 if t >= n // 2 else t] = 1.0
  got = diag.head_scores(w)
  assert got['previous_token'] == [1.0, 0.0]
  assert got['induction'] == [0.0, 1.0]


@pytest.mark.parametrize('max_bytes', [0, 100])
def test_validation_windows_tile_the_evaluated_prefix(max_bytes, corpus, tmp_path):
  """Every full window of ``seq_len + 1`` bytes at multiples of ``seq_len`` in the first
  ``max_bytes`` of the validation split, or in all of it at 0 (the study's default
  ``eval_max_bytes``, which once gave no window: its long runs' diagnostics crashed)."""
  config = helpers.tiny_config(corpus, tmp_path / 'tfds')
  split = lm_input.load_split(lm_input.resolve_spec(config), 'validation')
  n = config.dataset.seq_len
  usable = len(split) if max_bytes == 0 else max_bytes
  windows = diag.validation_windows(config, max_bytes)
  assert len(windows) == (usable - 1) // n > 0
  for i, window in enumerate(windows):
    np.testing.assert_array_equal(window, split.read(i * n, i * n + n + 1))
