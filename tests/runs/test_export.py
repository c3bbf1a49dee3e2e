"""Shareable weights: ``export_params``'s ``model.safetensors`` (and model card:
tests/runs/test_model_card.py), loading an export from either weights file (from a Hugging Face
Hub repo: tests/runs/test_hub.py).

Fast: the trained 2-step LM workdir of ``tests/runs/test_workdirs.py`` (no training here).
"""

import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from contextpool_jax.runs import workdirs
from contextpool_jax.base.errors import ArgumentError
from contextpool_jax.runs.export import export_params
from contextpool_jax.runs.workdirs import load, load_variables
from helpers import CORPUS_TEXT, OLD
from helpers import exported  # pylint: disable=unused-import  # a fixture

TOKENS = jnp.asarray(np.frombuffer(CORPUS_TEXT[:16].encode(), np.uint8)[None], jnp.int32)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


def test_export_writes_safetensors_msgpack_config_and_card(exported):
  assert sorted(p.name for p in exported.iterdir()) == [
      'README.md',
      'config.json',
      'model.safetensors',
      'variables.msgpack',
  ]
  assert not list(exported.glob('.*'))  # no temporary file left


def test_safetensors_round_trips_to_the_checkpoints_variables(exported):
  checkpoint, step = load_variables(OLD)
  assert step == 2
  flat = safetensors.numpy.load_file(exported / 'model.safetensors')
  # The keys are the nested paths of the variables dict joined with '/'.
  paths = {
      '/'.join(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(checkpoint)
  }
  assert set(flat) == paths
  assert 'params/decoder/layer_0/context_pool/mapping_conv_0/kernel' in flat
  assert all(k.startswith('params/') for k in flat)
  # Exactly the checkpoint's arrays: values, shapes, dtypes and tree.
  chex.assert_trees_all_equal(workdirs.unflatten_variables(flat), _np(checkpoint))
  chex.assert_trees_all_equal_shapes_and_dtypes(workdirs.unflatten_variables(flat), checkpoint)


def test_flatten_refuses_a_key_that_would_not_read_back():
  with pytest.raises(ArgumentError, match="'a/b' at params cannot be a safetensors path"):
    workdirs.flatten_variables({'params': {'a/b': np.zeros(2)}})
  tree = {'params': {'x': {'kernel': np.ones((2, 3))}}, 'batch_stats': {'mean': np.zeros(3)}}
  flat = workdirs.flatten_variables(tree)
  assert sorted(flat) == ['batch_stats/mean', 'params/x/kernel']
  chex.assert_trees_all_equal(workdirs.unflatten_variables(flat), tree)


@pytest.mark.parametrize('keep', ['model.safetensors', 'variables.msgpack'])
def test_an_export_with_one_weights_file_loads_to_the_same_model(exported, tmp_path, keep):
  only = tmp_path / 'only'
  only.mkdir()
  for name in ('config.json', keep):
    shutil.copy(exported / name, only / name)
  model, variables, config = load(only)
  ref_model, checkpoint, ref_config = load(OLD)
  assert config.to_dict() == ref_config.to_dict()
  chex.assert_trees_all_equal(_np(variables), _np(checkpoint))
  chex.assert_trees_all_equal(
      model.apply(variables, TOKENS, train=False),
      ref_model.apply(checkpoint, TOKENS, train=False),
  )


def test_export_without_msgpack_and_no_overwrite(tmp_path):
  out = export_params(OLD, tmp_path / 'st', msgpack=False)
  assert sorted(p.name for p in out.iterdir()) == ['README.md', 'config.json', 'model.safetensors']
  chex.assert_trees_all_equal(_np(load_variables(out)[0]), _np(load_variables(OLD)[0]))
  with pytest.raises(FileExistsError, match='model.safetensors exists'):
    export_params(OLD, out)
  # An export of an export: the same weights, step -1, no metrics to report.
  again = export_params(out, tmp_path / 'again')
  chex.assert_trees_all_equal(_np(load_variables(again)[0]), _np(load_variables(OLD)[0]))
  assert 'No evaluation metrics' in (again / 'README.md').read_text()
