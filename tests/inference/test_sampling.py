"""Sampling from a language model (``inference/sampling.py``): reproducible by seed, greedy equal
to a step-by-step reference over a sliding window, bad arguments named. The model is a small
CP-Transformer LM at its initial parameters (sampling does not depend on training; the sampling
command line on a trained workdir: tests/commands/test_sample.py)."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from contextpool_jax import models
from contextpool_jax.inference import sampling

TOKENS = jnp.asarray(np.frombuffer(b'def load(workdir, step=None):\n  ', np.uint8)[None], jnp.int32)


@pytest.fixture(scope='module')
def lm():
  """``(model, variables, config)`` as ``workdirs.load`` returns them: a 1-layer CP-LM trained
  on 32-byte windows (``config.dataset.seq_len``), at its initial parameters."""
  model = models.create('cp_transformer_lm', num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2)
  variables = model.init(jax.random.key(0), TOKENS[:, :32])
  config = ml_collections.ConfigDict({'dataset': {'seq_len': 32}})
  return model, variables, config


def test_sample_has_the_requested_length_and_is_reproducible(lm):
  model, variables, config = lm
  kw = dict(length=40, temperature=1.0, top_k=0)
  a = sampling.sample_text(model, variables, config, 'def ', seed=0, **kw)
  b = sampling.sample_text(model, variables, config, 'def ', seed=0, **kw)
  c = sampling.sample_text(model, variables, config, 'def ', seed=1, **kw)
  assert a == b and a != c
  ids = sampling.sample_tokens(
      model, variables, jnp.asarray([[100, 101, 102]]), length=40, context=32, seed=0
  )
  assert ids.shape == (1, 40) and ids.dtype == jnp.int32
  # top_k=1 is greedy whatever the seed.
  greedy = sampling.sample_tokens(model, variables, TOKENS, length=5, context=32, temperature=0)
  top1 = sampling.sample_tokens(model, variables, TOKENS, length=5, context=32, top_k=1, seed=7)
  chex.assert_trees_all_equal(greedy, top1)


def test_greedy_sampling_matches_a_step_by_step_reference_with_a_sliding_window(lm):
  """The prompt (33 bytes) is longer than the context (32): every step slides the window."""
  model, variables, _ = lm
  got = sampling.sample_tokens(model, variables, TOKENS, length=4, context=32, temperature=0)
  tokens = list(np.asarray(TOKENS[0]))
  for _ in range(4):
    logits = model.apply(variables, jnp.asarray([tokens[-32:]], jnp.int32))
    tokens.append(int(jnp.argmax(logits[0, -1])))
  chex.assert_trees_all_equal(np.asarray(got[0]), np.asarray(tokens[-4:], np.int32))


def test_sampling_rejects_bad_arguments(lm):
  model, variables, config = lm
  with pytest.raises(ValueError, match='length=0 is not allowed; expected a positive int'):
    sampling.sample_tokens(model, variables, TOKENS, length=0, context=32)
  with pytest.raises(ValueError, match='temperature=-1.0 is not allowed'):
    sampling.sample_tokens(model, variables, TOKENS, length=2, context=32, temperature=-1.0)
  with pytest.raises(
      ValueError, match='top_k=300 is not allowed; expected at most the ' 'vocabulary size 256'
  ):
    sampling.sample_tokens(model, variables, TOKENS, length=2, context=32, top_k=300)
  with pytest.raises(ValueError, match="prompt='' is not allowed"):
    sampling.sample_text(model, variables, config, '')
