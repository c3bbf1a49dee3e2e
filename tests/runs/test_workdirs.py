"""A workdir written by version 0.1.0 (before the modules moved) still loads and resumes.

``tests/fixtures/workdir_0_1_0`` is a 2-step run of the tiny LM config (ContextPool Transformer,
one layer) written by commit c4db9d8, before ``config_fields``, ``workdirs`` and ``storage``
moved to the package root and ``context_pool/config.py`` became ``validate.py``. Its
``config.json`` and ``checkpoints/2`` are kept as that code wrote them.
"""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.runs import config_fields
from contextpool_jax.training import trainer
from contextpool_jax.runs.workdirs import load, read_config
from helpers import CORPUS_TEXT, OLD, old_workdir_copy


def test_old_workdir_loads_into_the_model_the_new_code_builds():
  model, variables, config = load(OLD)
  fresh = config_fields.build_model(config).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 16), jnp.int32), train=False
  )
  # Same parameter tree and shapes as the new code's model of that config.
  chex.assert_trees_all_equal_shapes_and_dtypes(variables['params'], fresh['params'])
  tokens = jnp.asarray(np.frombuffer(CORPUS_TEXT[:16].encode(), np.uint8)[None], jnp.int32)
  logits = model.apply(variables, tokens, train=False)
  chex.assert_shape(logits, (1, 16, config.model.vocab_size))
  chex.assert_tree_all_finite(logits)
  # The checkpoint's parameters are the trained ones, not a fresh init.
  trained, initial = jax.tree.leaves(variables['params']), jax.tree.leaves(fresh['params'])
  assert any(not np.allclose(a, b) for a, b in zip(trained, initial))


@pytest.mark.slow  # trains two more steps of the tiny model (one compile)
def test_old_workdir_resumes_training(tmp_path):
  workdir = old_workdir_copy(tmp_path)
  config = read_config(workdir)
  config.num_train_steps = 4
  trainer.train_and_evaluate(config, str(workdir))
  steps = [
      json.loads(line)['step'] for line in (workdir / 'metrics.jsonl').read_text().splitlines()
  ]
  assert max(steps) == 4
  assert (workdir / 'checkpoints' / '4').is_dir()
