"""The Pallas TPU flash-attention path (``layers/tpu_attention.py``,
``attention_implementation='pallas_tpu'``) against the dense path, on the CPU in Pallas
interpret mode: forward and gradients, causal, padded, and the translation decoder's
cross-attention (other lengths); area attention through the kernel (its areas as the keys;
causal areas grouped by their last item); the models' outputs and parameter gradients; the
causal Jacobian; a local window refused. The kernel compiled for TPU: tests/training/test_aot.py.
"""

import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from contextpool_jax import models
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers import area_attention as area
from contextpool_jax.layers import tpu_attention
from contextpool_jax.models import transformer as tr
from init_keys import init_variables

# The slow tier (the newest stack's whole suite runs it): jax 0.10.2's Pallas TPU interpreter,
# the oldest stack's, hangs here when several of these tests share a process (found in CI).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def interpret():
  with pltpu.force_tpu_interpret_mode():
    yield


def _qkv(rng, batch, q_len, kv_len, heads=2, depth=8, dtype=jnp.float32):
  r = np.random.default_rng(rng)
  make = lambda n: jnp.asarray(r.normal(size=(batch, n, heads, depth)), dtype)
  return make(q_len), make(kv_len), make(kv_len)


def _valid(lengths, n):
  return jnp.arange(n)[None, :] < jnp.asarray(lengths)[:, None]


def _outputs_and_gradients(attend, loss, *args):
  """``attend(*args)`` and the gradient of ``loss(attend, *args)`` in every argument, in
  one jitted program (the interpreted kernel compiles once, not op by op)."""
  argnums = tuple(range(1, len(args) + 1))
  both = lambda *a: (attend(*a), jax.grad(loss, argnums=argnums)(attend, *a))
  return jax.jit(both)(*args)


CASES = {  # (q_len, kv_len, causal, q lengths or None, kv lengths or None)
    'causal': (40, 40, True, None, None),
    'causal, padded': (40, 40, True, [40, 23], [40, 23]),
    'padded': (33, 33, False, [33, 17], [33, 17]),
    'cross-attention': (21, 50, False, [21, 9], [50, 31]),
    'two blocks': (130, 130, True, [130, 100], [130, 100]),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_forward_and_gradients_equal_the_dense_path_on_real_tokens(case):
  q_len, kv_len, causal, q_lengths, kv_lengths = CASES[case]
  q, k, v = _qkv(0, 2, q_len, kv_len)
  padding = None
  q_valid = jnp.ones((2, q_len), bool)
  if q_lengths is not None:
    q_valid = _valid(q_lengths, q_len)
    padding = tr.padding_mask(q_valid, _valid(kv_lengths, kv_len))
  full = padding
  if causal:
    cm = tr.causal_mask(q_len)
    full = cm if padding is None else padding & cm
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
  real = q_valid[:, :, None, None]

  def loss(attend, q, k, v):  # only real queries' outputs count
    return jnp.sum(jnp.where(real, attend(q, k, v) * cotangent, 0.0))

  flash = lambda q, k, v: tpu_attention.flash_attention(q, k, v, causal=causal, mask=padding)
  dense = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=full)
  (got, got_grads), (want, want_grads) = (
      _outputs_and_gradients(f, loss, q, k, v) for f in (flash, dense)
  )
  chex.assert_trees_all_close(jnp.where(real, got, 0), jnp.where(real, want, 0), atol=2e-6)
  chex.assert_trees_all_close(got_grads, want_grads, atol=5e-6)


def test_bfloat16_is_close_to_float32():
  q, k, v = _qkv(2, 2, 64, 64, dtype=jnp.bfloat16)
  out = tpu_attention.flash_attention(q, k, v, causal=True)
  f32 = lambda x: x.astype(jnp.float32)
  want = jax.nn.dot_product_attention(f32(q), f32(k), f32(v), is_causal=True)
  assert out.dtype == jnp.bfloat16
  chex.assert_trees_all_close(f32(out), want, atol=3e-2)


def test_segment_ids_read_the_validity_of_each_side():
  q_valid, kv_valid = _valid([3, 1], 4), _valid([2, 4], 5)
  q_ids, kv_ids = tpu_attention.segment_ids(tr.padding_mask(q_valid, kv_valid), 2, 4, 5)
  np.testing.assert_array_equal(q_ids, q_valid.astype(np.int32))
  np.testing.assert_array_equal(kv_ids, kv_valid.astype(np.int32))


# ---------------------------------------------------------------------------
# Area attention through the kernel.
# ---------------------------------------------------------------------------

AREA_CASES = {  # (q_len, kv_len, causal, q lengths, kv lengths, key mode, value mode)
    'causal, padded, mean keys': (20, 20, True, [20, 13], [20, 13], 'mean', 'sum'),
    'causal, max keys, mean values': (17, 17, True, [17, 17], [17, 17], 'max', 'mean'),
    'padded, mean keys': (19, 19, False, [19, 8], [19, 8], 'mean', 'sum'),
    'cross-attention, max values': (11, 23, False, [11, 5], [23, 16], 'mean', 'max'),
}


@pytest.mark.parametrize('case', sorted(AREA_CASES))
def test_area_attention_through_the_kernel_equals_the_dense_path(case):
  """Forward and gradients (of real queries' outputs) of the kernel path against the
  dense softmax over areas (the function's default path, itself tested against a loop
  over areas in test_area_attention.py), areas up to width 3."""
  q_len, kv_len, causal, q_lengths, kv_lengths, key_mode, value_mode = AREA_CASES[case]
  q, k, v = _qkv(7, 2, q_len, kv_len)
  q_valid = _valid(q_lengths, q_len)
  mask = tr.padding_mask(q_valid, _valid(kv_lengths, kv_len))
  real = q_valid[:, :, None, None]
  cotangent = jnp.asarray(np.random.default_rng(8).normal(size=q.shape), jnp.float32)
  attend = lambda implementation: lambda q, k, v: area.dot_product_area_attention(
      q,
      k,
      v,
      max_area_width=3,
      mask=mask,
      causal=causal,
      key_mode=key_mode,
      value_mode=value_mode,
      implementation=implementation,
  )
  loss = lambda f, q, k, v: jnp.sum(jnp.where(real, f(q, k, v) * cotangent, 0.0))
  (got, got_grads), (want, want_grads) = (
      _outputs_and_gradients(attend(implementation), loss, q, k, v)
      for implementation in ('pallas_tpu', None)
  )
  chex.assert_trees_all_close(jnp.where(real, got, 0), jnp.where(real, want, 0), atol=2e-6)
  chex.assert_trees_all_close(got_grads, want_grads, atol=1e-5)


def test_area_attention_through_the_kernel_cannot_read_the_future():
  """d y_i / d x_j is exactly zero for j > i (causal self-attention, areas up to width 4,
  the areas that would start before the sequence in their slots)."""
  x = jax.random.normal(jax.random.key(9), (1, 12, 2, 8))
  attend = lambda z: area.dot_product_area_attention(
      z, z, z, max_area_width=4, causal=True, implementation='pallas_tpu'
  )
  # Row by row (a vjp per output position): the interpreter cannot batch the kernel (vmap).
  pullback = jax.jit(lambda ct: jax.vjp(attend, x)[1](ct)[0])
  rows = [pullback(jnp.zeros_like(x).at[0, i].set(1.0)) for i in range(12)]
  energy = np.stack([np.asarray(jnp.abs(g[0]).sum(axis=(1, 2))) for g in rows])  # [i, j]
  assert np.all(energy[np.triu_indices(12, k=1)] == 0.0)
  assert np.all(np.diag(energy) > 0.0)


def test_area_attention_through_the_kernel_refuses_a_causal_2d_memory():
  q = jnp.ones((1, 8, 2, 8))
  with pytest.raises(ConfigError, match='needs a 1D self-attention'):
    area.dot_product_area_attention(
        q,
        q,
        q,
        max_area_width=2,
        max_area_height=2,
        memory_height=2,
        causal=True,
        implementation='pallas_tpu',
    )
  with pytest.raises(ConfigError, match="implementation='flash'"):
    area.dot_product_area_attention(q, q, q, implementation='flash')


def test_area_models_through_the_kernel_give_the_dense_outputs():
  """The LM with area attention (causal, learned Eq. 9 keys) and the translation model
  (encoder, decoder and cross-attention over areas, padded source): the kernel path's
  outputs (and the LM's parameter gradients) are the dense path's on real tokens."""
  # One layer each: the area layers are the first two (num_area_layers); one shows the path.
  dense, flash = _pair('transformer_lm', attention='area', area_key_mode='concat', num_layers=1)
  tokens = jnp.asarray(np.random.default_rng(10).integers(1, 61, (2, 16)), jnp.int32)
  _assert_same_outputs_and_gradients(dense, flash, tokens)
  dense, flash = _pair('area_transformer_tiny', max_area_width=3, num_layers=1)
  r = np.random.default_rng(11)
  inputs = jnp.asarray(r.integers(1, 61, (2, 15)), jnp.int32).at[1, 9:].set(0)
  targets = jnp.asarray(r.integers(1, 61, (2, 11)), jnp.int32)
  variables = init_variables(dense, jax.random.key(0), inputs, targets)
  chex.assert_trees_all_close(
      jax.jit(flash.apply)(variables, inputs, targets),
      jax.jit(dense.apply)(variables, inputs, targets),
      atol=2e-5,
  )


# ---------------------------------------------------------------------------
# In the models.
# ---------------------------------------------------------------------------

SMALL = dict(num_layers=2, emb_dim=32, mlp_dim=64, num_heads=2, vocab_size=61)


def _pair(name, **kw):
  fields = {**SMALL, **kw}
  dense = models.create(name, **fields)
  return dense, models.create(name, attention_implementation='pallas_tpu', **fields)


def _assert_same_outputs_and_gradients(dense, flash, inputs):
  """The two models' outputs, and the gradients of a loss of them w.r.t. the (shared)
  parameters, agree."""
  variables = init_variables(dense, jax.random.key(0), inputs)
  loss = lambda apply, p: jnp.mean(apply(p) ** 2)
  (got, got_grads), (want, want_grads) = (
      _outputs_and_gradients(
          lambda p, m=m: m.apply({**variables, 'params': p}, inputs), loss, variables['params']
      )
      for m in (flash, dense)
  )
  chex.assert_trees_all_close(got, want, atol=2e-5)
  chex.assert_trees_all_close(got_grads[0], want_grads[0], atol=2e-5)


def test_the_lm_gives_the_dense_outputs_and_gradients():
  dense, flash = _pair('cp_transformer_lm')
  tokens = jnp.asarray(np.random.default_rng(3).integers(1, 61, (2, 48)), jnp.int32)
  _assert_same_outputs_and_gradients(dense, flash, tokens)


def test_the_lm_cannot_read_the_future():
  """Changing the token at position j leaves every logit before j exactly as it was, for
  every j (the kernel's causal mask; padding blocks included: 24 of 128 are real)."""
  dense, flash = _pair('transformer_lm')
  tokens = jnp.asarray(np.random.default_rng(4).integers(1, 61, (1, 24)), jnp.int32)
  variables = init_variables(dense, jax.random.key(0), tokens)
  apply = jax.jit(lambda t: flash.apply(variables, t))
  before = np.asarray(apply(tokens))
  for j in range(tokens.shape[1]):
    changed = np.asarray(apply(tokens.at[0, j].set(tokens[0, j] % 60 + 1)))
    np.testing.assert_array_equal(changed[:, :j], before[:, :j])
    assert not np.array_equal(changed[:, j:], before[:, j:])


def test_the_translation_model_gives_the_dense_outputs_on_real_tokens():
  dense, flash = _pair('transformer_tiny')
  r = np.random.default_rng(5)
  inputs = jnp.asarray(r.integers(1, 61, (2, 19)), jnp.int32).at[1, 11:].set(0)
  targets = jnp.asarray(r.integers(1, 61, (2, 13)), jnp.int32).at[1, 7:].set(0)
  variables = init_variables(dense, jax.random.key(0), inputs, targets)
  real = (targets > 0)[:, :, None]
  chex.assert_trees_all_close(
      jnp.where(real, jax.jit(flash.apply)(variables, inputs, targets), 0),
      jnp.where(real, jax.jit(dense.apply)(variables, inputs, targets), 0),
      atol=2e-5,
  )


def test_a_local_window_is_refused():
  _, flash = _pair('transformer_lm', attention='local', local_window=4)
  tokens = jnp.ones((1, 16), jnp.int32)
  with pytest.raises(ConfigError, match="'pallas_tpu' has no local window"):
    flash.init(jax.random.key(0), tokens)


def test_the_vit_gives_the_dense_outputs_and_gradients():
  kw = dict(num_layers=2, hidden_size=32, num_heads=2, image_size=32, patch_size=8, num_classes=5)
  dense = models.create('cp_vit_ti16', **kw)
  flash = models.create('cp_vit_ti16', attention_implementation='pallas_tpu', **kw)
  images = jnp.asarray(np.random.default_rng(6).normal(size=(2, 32, 32, 3)), jnp.float32)
  _assert_same_outputs_and_gradients(dense, flash, images)
  with pytest.raises(ConfigError, match="'pallas_tpu' has no attention dropout"):
    models.create(
        'vit_ti16', attention_implementation='pallas_tpu', attention_dropout_rate=0.1, **kw
    ).init(jax.random.key(0), images)


MESH_SCRIPT = r"""
import os
os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'
os.environ['JAX_PLATFORMS'] = 'cpu'
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import tpu as pltpu
from contextpool_jax import models
from contextpool_jax.training import programs, sharding
kw = dict(num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2, vocab_size=61)
dense = models.create('transformer_lm', **kw)
flash = models.create('transformer_lm', attention_implementation='pallas_tpu', **kw)
tokens = jnp.asarray(np.random.default_rng(0).integers(1, 61, (8, 40)), jnp.int32)
variables = jax.jit(dense.init)(jax.random.key(0), tokens)
mesh = sharding.make_mesh()
rows = sharding.batch_sharding(mesh)
apply = lambda m: jax.jit(
    programs.under_mesh(lambda t: m.apply(variables, t), mesh), in_shardings=rows, out_shardings=rows
)
with pltpu.force_tpu_interpret_mode():
  got = apply(flash)(tokens)
want = apply(dense)(tokens)
print(len(jax.devices()), float(jnp.abs(got - want).max()))
"""


def test_on_several_devices_each_runs_the_kernel_on_its_rows():
  """Under the run's mesh (4 CPU devices, the batch split over them) the kernel runs per
  device (shard_map) and gives the dense path's outputs. Slow tier, so the newest stack
  runs it: with jax 0.10.2 (the oldest stack) the interpret mode hangs with several devices
  (found here; jax 0.12 runs it), which says nothing about the TPU kernel itself."""
  out = subprocess.run(
      [sys.executable, '-c', MESH_SCRIPT], capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stderr[-3000:]
  devices, error = out.stdout.split()
  assert devices == '4' and float(error) < 2e-5, out.stdout
