"""The models' ``remat`` policies and the Transformer's ``attention_implementation``.

* Every policy of ``models.common.REMAT_POLICIES`` gives the loss and the gradients of no
  remat, for each family (Transformer LM, ViT scanned and unrolled, ResNet with BatchNorm in
  training); the policies keep different residuals for the backward pass
  (``jax.ad_checkpoint.print_saved_residuals``): ``'dots'`` keeps the batched attention
  matmuls that ``'dots_no_batch'`` recomputes, ``'full'`` keeps no matmul; the old booleans
  keep the residuals of the policies they name (``True``: ``'full'``, ``False``: ``'none'``).
* The run's ``config.remat`` (a ``config.json`` written before the policies holds a bool) and
  a bad value: a ConfigError naming the field, the value and the choices.
* ``attention_implementation``: ``'xla'`` gives the outputs of None on CPU, both the einsum form
  of jax.nn.dot_product_attention (its outputs and gradients to rounding; programs lowered for a
  TPU or GPU take jax's own); ``'cudnn'`` on CPU and an unknown value raise ConfigErrors before
  XLA compiles.
"""

import contextlib
import functools
import io

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax import ad_checkpoint

from contextpool_jax import models
from contextpool_jax.runs import config_fields
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.models.common import REMAT_POLICIES
from init_keys import init_key, init_variables

LM = dict(num_layers=2, emb_dim=32, mlp_dim=64, num_heads=2, vocab_size=50)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 12)), jnp.int32)
VIT = dict(image_size=16, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, num_classes=4)
RESNET = dict(stage_sizes=(1, 1, 1), width=8, num_classes=4)
IMAGES = jnp.asarray(np.random.default_rng(1).normal(size=(2, 16, 16, 3)), jnp.float32)


def _loss_fn(model, x, variables):
  """``params -> (loss, new batch_stats)``: a training-mode forward pass (BatchNorm's
  statistics of this batch; no dropout in these models)."""
  rest = {k: v for k, v in variables.items() if k != 'params'}

  def loss(params):
    if rest:
      logits, state = model.apply({'params': params, **rest}, x, train=True, mutable=list(rest))
    else:
      logits, state = model.apply({'params': params}, x, train=True), {}
    return jnp.mean(jnp.sin(logits.astype(jnp.float32))), state

  return loss


def _init(model, x):
  return init_variables(model, init_key(), x, train=False)


def _loss_and_grads(model, x, variables):
  loss = _loss_fn(model, x, variables)
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(variables['params'])


CASES = {
    'lm': ('cp_transformer_lm', TOKENS, dict(LM, dropout_rate=0.0)),
    'lm_scan': ('cp_transformer_lm', TOKENS, dict(LM, dropout_rate=0.0, scan_layers=True)),
    'vit_scan': ('cp_vit_s16', IMAGES, dict(VIT, scan_layers=True, context_pool={})),
    'vit': ('vit_s16', IMAGES, VIT),
    'resnet': ('cp_resnet20', IMAGES, RESNET),
}
# Not the old boolean True: it builds 'full' (the same saved residuals, pinned by
# test_the_policies_save_different_residuals).
POLICIES = [p for p in REMAT_POLICIES if p != 'none']


@pytest.mark.sweep  # one family in the fast tier (each compiles its model once per policy)
@pytest.mark.parametrize('case', sorted(CASES))
def test_every_remat_policy_gives_the_loss_and_gradients_of_none(case):
  name, x, fields = CASES[case]
  policies = POLICIES if case == 'lm' else ['full', 'dots']
  model = models.create(name, **fields, remat='none')
  variables = jax.jit(functools.partial(_init, model))(x)
  (loss, state), grads = _loss_and_grads(model, x, variables)
  for policy in policies:
    remat = models.create(name, **fields, remat=policy)
    # A policy changes how the blocks are differentiated, not their variables: its init,
    # traced, has the same tree; the gradients are taken at the same values.
    chex.assert_trees_all_equal_shapes_and_dtypes(
        jax.eval_shape(functools.partial(_init, remat), x), variables
    )
    (loss_p, state_p), grads_p = _loss_and_grads(remat, x, variables)
    np.testing.assert_allclose(loss_p, loss, rtol=1e-6, err_msg=str(policy))
    chex.assert_trees_all_close(grads_p, grads, rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(state_p, state, rtol=1e-6)


def _saved_residuals(remat) -> list[str]:
  """``print_saved_residuals`` of the LM's loss, one line per residual (traced at the
  parameters' shapes: which residuals are kept does not depend on their values)."""
  model = models.create('cp_transformer_lm', **LM, remat=remat)
  params = jax.eval_shape(model.init, jax.random.key(0), TOKENS)['params']
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    ad_checkpoint.print_saved_residuals(lambda p: model.apply({'params': p}, TOKENS).sum(), params)
  return out.getvalue().splitlines()


def test_the_policies_save_different_residuals():
  saved = {p: _saved_residuals(p) for p in REMAT_POLICIES}
  dots = {p: sum('dot_general' in line for line in lines) for p, lines in saved.items()}
  # 'none' keeps what the backward pass needs where it is computed (no dot is "saved" by a
  # policy); 'full' keeps the blocks' inputs; the dots policies add matmul outputs, and
  # 'dots' also the batched ones (attention logits, attention-weighted values).
  assert dots['none'] == dots['full'] == 0, dots
  assert 0 < dots['dots_no_batch'] < dots['dots'], dots
  sizes = {p: len(lines) for p, lines in saved.items()}
  assert sizes['full'] < sizes['dots_no_batch'] < sizes['dots'] < sizes['none'], sizes
  assert _saved_residuals(True) == saved['full'] and _saved_residuals(False) == saved['none']


@pytest.mark.parametrize(
    'value,policy', [(False, 'none'), (True, 'full'), ('dots', 'dots'), ('none', 'none')]
)
def test_the_runs_remat_old_booleans_and_policies(value, policy):
  config = ml_collections.ConfigDict(dict(dtype='float32', remat=value))
  assert config_fields.model_settings(config) == (jnp.float32, policy)


@pytest.mark.parametrize(
    'where,value',
    [('config', 'dot'), ('config', 1), ('config', None), ('model', 'everything'), ('model', 0)],
)
def test_a_bad_remat_names_the_field_the_value_and_the_choices(where, value):
  if where == 'config':
    config = ml_collections.ConfigDict(dict(dtype='float32'))
    config.remat = ml_collections.FieldReference(value, field_type=object)
    call = lambda: config_fields.model_settings(config)
    field = 'config.remat' if value is not None else 'config.remat is missing'
  else:
    call = lambda: models.create('vit_s16', **VIT, remat=value).init(
        jax.random.key(0), IMAGES, train=False
    )
    field = 'ViT.remat'
  with pytest.raises(ConfigError) as info:
    call()
  assert field in str(info.value)
  if value is not None:
    assert repr(value) in str(info.value) and "'dots_no_batch'" in str(info.value)


# ----------------------------------------------------------------------------
# attention_implementation.
# ----------------------------------------------------------------------------


def _lm_apply(implementation, **fields):
  model = models.create(
      'cp_transformer_lm', **LM, attention_implementation=implementation, **fields
  )
  variables = init_variables(model, init_key(), TOKENS)
  return jax.jit(lambda v: model.apply(v, TOKENS))(variables)


@pytest.mark.parametrize('attention', ['standard', 'local'])
def test_xla_attention_is_what_none_chooses_on_cpu(attention):
  assert jax.default_backend() == 'cpu'
  fields = dict(attention=attention, local_window=4)
  chex.assert_trees_all_equal(_lm_apply('xla', **fields), _lm_apply(None, **fields))


# name -> (query length, key length, bool mask [batch, 1, queries, keys] or None, local window)
def _attention_cases():
  t, s = 12, 9
  causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
  valid_q = jnp.arange(t)[None, :] < jnp.array([[t], [7]])  # row 1: 5 padding queries
  valid_k = jnp.arange(s)[None, :] < jnp.array([[s], [4]])
  padded = valid_q[:, None, :, None] & valid_k[:, None, None, :]  # padding rows: all masked
  return {
      'causal': (t, t, causal, None),
      'causal_padded': (
          t,
          t,
          causal & (valid_q[:, None, :, None] & valid_q[:, None, None, :]),
          None,
      ),
      'cross_padded': (t, s, padded, None),
      'local': (t, t, None, (3, 2)),
      'local_causal': (t, t, causal, (3, 0)),
  }


@pytest.mark.parametrize('case', sorted(_attention_cases()))
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_the_cpu_attention_is_jaxs_xla_attention(case, dtype):
  """On the CPU, None / 'xla' run the einsum form of jax.nn.dot_product_attention's XLA path
  (without its group axis): the same outputs and gradients to float32 rounding, and to
  bfloat16's and float16's in those dtypes (padding rows included)."""
  from contextpool_jax.models import transformer as tr  # pylint: disable=g-import-not-at-top

  t, s, mask, window = _attention_cases()[case]
  q, k, v, ct = (
      jax.random.normal(key, shape, jnp.float32)
      for key, shape in zip(
          jax.random.split(jax.random.key(3), 4),
          [(2, t, 3, 8), (2, s, 3, 8), (2, s, 3, 8), (2, t, 3, 8)],
      )
  )
  cast = lambda a: a.astype(dtype)
  ours = lambda q, k, v: tr._dot_product_attention(
      q, k, v, 'xla', mask=mask, local_window_size=window
  )
  up = (lambda a: a.astype(jnp.float32)) if dtype == jnp.float16 else (lambda a: a)
  jaxs = lambda q, k, v: jax.nn.dot_product_attention(
      up(q), up(k), up(v), mask=mask, local_window_size=window, implementation='xla'
  ).astype(q.dtype)
  loss = lambda f: jax.jit(
      jax.value_and_grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * ct), argnums=(0, 1, 2))
  )
  inputs = (cast(q), cast(k), cast(v))
  out, out_jax = (jax.jit(f)(*inputs) for f in (ours, jaxs))
  (got, got_grads), (want, want_grads) = (loss(f)(*inputs) for f in (ours, jaxs))
  assert out.dtype == dtype
  tol = dict(rtol=1e-5, atol=1e-6) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
  f32 = lambda tree: jax.tree.map(lambda a: a.astype(jnp.float32), tree)
  chex.assert_trees_all_close(f32((out, got, got_grads)), f32((out_jax, want, want_grads)), **tol)
  if dtype == jnp.float32:
    chex.assert_trees_all_close(got, want, rtol=1e-6)  # the loss, summed over every output


def test_a_program_lowered_for_a_tpu_or_gpu_traces_jaxs_attention(monkeypatch):
  """The compile command lowers for other devices from this CPU process
  (``transformer.compiling_for``): those programs take jax.nn.dot_product_attention, as
  the target's own runs do; this process's programs take the einsum form."""
  from contextpool_jax.models import transformer as tr  # pylint: disable=g-import-not-at-top

  calls = []
  attention = jax.nn.dot_product_attention
  monkeypatch.setattr(
      jax.nn, 'dot_product_attention', lambda *a, **kw: calls.append(kw) or attention(*a, **kw)
  )
  jax.eval_shape(lambda: _lm_apply('xla'))
  assert calls == []
  for platform in ('tpu', 'gpu'):
    with tr.compiling_for(platform):
      jax.eval_shape(lambda: _lm_apply('xla'))
    assert calls and all(kw['implementation'] == 'xla' for kw in calls)
    calls.clear()


def test_cudnn_attention_on_cpu_raises_before_compiling():
  with pytest.raises(ConfigError, match=r"attention_implementation='cudnn' needs an NVIDIA GPU"):
    jax.eval_shape(lambda: _lm_apply('cudnn'))  # traced only: the error comes before XLA


@pytest.mark.parametrize('value', ['flash', 'XLA', True])
def test_a_bad_attention_implementation_names_the_choices(value):
  with pytest.raises(ConfigError) as info:
    _lm_apply(value)
  message = str(info.value)
  assert f'attention_implementation={value!r}' in message
  assert "None, 'xla', 'cudnn'" in message
