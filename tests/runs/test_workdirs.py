"""Workdirs (contextpool_jax.runs.workdirs): one written by version 0.1.0 (before the modules
moved) still loads and resumes; the saved config is never seen half written.

``tests/fixtures/workdir_0_1_0`` is a 2-step run of the tiny LM config (ContextPool Transformer,
one layer) written by commit c4db9d8, before ``config_fields``, ``workdirs`` and ``storage``
moved to the package root and ``context_pool/config.py`` became ``validate.py``. Its
``config.json`` and ``checkpoints/2`` are kept as that code wrote them.
"""

import json
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default as default_config
from contextpool_jax.runs import config_fields, layout, workdirs
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


def _torn_reads(write, path, rewrites=300):
  """How many of a reader's parses of ``path`` fail while ``write`` rewrites it
  ``rewrites`` times (what another process's resume check sees)."""
  write()
  done, torn, reads = threading.Event(), [0], [0]

  def reader():
    while not done.is_set():
      try:
        json.loads(path.read_text())
      except (json.JSONDecodeError, FileNotFoundError):
        torn[0] += 1
      reads[0] += 1

  thread = threading.Thread(target=reader)
  thread.start()
  for _ in range(rewrites):
    write()
  done.set()
  thread.join()
  assert reads[0] > 0
  return torn[0]


@pytest.mark.slow  # hundreds of rewrites raced by a reader thread
def test_the_saved_config_is_never_seen_half_written(tmp_path):
  # On a resume, process 0 rewrites config.json while the other processes read
  # it in check_resume_config. Under load, a 2-process resume failed that way:
  # process 1 left before the first barrier (as a torn read makes it do), and
  # process 0, still waiting there, failed the shutdown barrier.
  config = default_config.get_config()
  path = tmp_path / layout.CONFIG_FILE
  assert _torn_reads(lambda: workdirs.write_config(tmp_path, config), path) == 0
  assert json.loads(path.read_text()) == json.loads(config.to_json_best_effort())
  assert [p.name for p in tmp_path.iterdir()] == [layout.CONFIG_FILE]  # no temporaries left
  # The probe can fail: a plain rewrite (truncate, then write) is seen torn.
  naive = lambda: path.write_text(config.to_json_best_effort(indent=2))
  assert _torn_reads(naive, path) > 0
