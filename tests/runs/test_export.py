"""Shareable weights: ``export_params``'s ``model.safetensors`` and model card, loading an
export from either weights file, and from a Hugging Face Hub repo (offline, from a local
cache laid out as the Hub's).

Fast: the trained 2-step LM workdir of ``tests/runs/test_workdirs.py`` (no training here).
"""

import hashlib
import json
import os
import pathlib
import shutil
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from contextpool_jax.runs import hub, model_card, workdirs
from contextpool_jax.base.errors import ArgumentError
from contextpool_jax.runs.export import export_params
from contextpool_jax.runs.workdirs import load, load_variables
from helpers import CORPUS_TEXT, OLD

TOKENS = jnp.asarray(np.frombuffer(CORPUS_TEXT[:16].encode(), np.uint8)[None], jnp.int32)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """An export of the 0.1.0 fixture's step 2 (the workdir is only read)."""
  return export_params(OLD, tmp_path_factory.mktemp('export') / 'out')


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


def test_the_model_card_names_model_config_data_split_and_metrics(exported):
  card = (exported / 'README.md').read_text()
  config = json.loads((OLD / 'config.json').read_text())
  assert card.startswith('---\nlibrary_name: contextpool-jax\n')
  assert '# cp_transformer_lm' in card and '- name: `cp_transformer_lm`' in card
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(load_variables(OLD)[0]['params']))
  assert f'- parameters: {n:,}' in card
  for field in ('num_layers', 'emb_dim', 'mlp_dim', 'num_heads', 'vocab_size'):
    assert f'- {field}: `{config["model"][field]}`' in card
  assert '`config.json` beside this file' in card
  assert '- task: `lm`' in card and '- num_train_steps: `2`' in card
  assert '- dataset: `local_text`' in card and '/tmp/fx/corpus/*.txt' in card
  assert 'split_block_bytes: `4096`, split_seed: `0`' in card
  # The last evaluation of metrics.jsonl, with its step.
  evals = [json.loads(l) for l in (OLD / 'metrics.jsonl').read_text().splitlines()]
  (last,) = [r for r in evals if r['split'] == 'eval_validation']
  assert 'evaluation at step 2:' in card
  assert '| split | accuracy | bpc | loss |' in card
  assert f'| eval_validation | 0 | {last["bpc"]:.6g} | {last["loss"]:.6g} |' in card
  assert 'from contextpool_jax.runs.workdirs import load' in card


def test_the_card_is_huggingface_hubs_model_card_and_the_same_without_it(
    exported, tmp_path, monkeypatch
):
  """huggingface_hub.ModelCard renders the card (its YAML block: the library and the tags);
  an install without huggingface_hub (the core and [train] ones, which export too) writes the
  same text."""
  hub = pytest.importorskip('huggingface_hub')
  card = (exported / 'README.md').read_text()
  assert card.startswith(
      '---\nlibrary_name: contextpool-jax\ntags:\n- jax\n- flax\n- contextpool-jax\n'
      '- cp_transformer_lm\n---\n\n# cp_transformer_lm\n'
  )
  read = hub.ModelCard(card)
  assert read.data.library_name == 'contextpool-jax'
  assert read.data.tags == ['jax', 'flax', 'contextpool-jax', 'cp_transformer_lm']
  assert str(read) == card
  monkeypatch.setitem(sys.modules, 'huggingface_hub', None)  # importing it fails
  with pytest.raises(ImportError):
    import huggingface_hub  # pylint: disable=import-outside-toplevel,unused-import
  without = export_params(OLD, tmp_path / 'without', msgpack=False)
  assert (without / 'README.md').read_text() == card


def test_the_card_takes_the_last_evaluation_up_to_the_exported_step(tmp_path):
  run = tmp_path / 'run'
  shutil.copytree(OLD, run)
  lines = [
      {'step': 1, 'split': 'eval_validation', 'loss': 9.0},
      {'step': 2, 'split': 'train', 'loss': 8.0},
      {'step': 2, 'split': 'eval_validation', 'loss': 7.0},
      {'step': 2, 'split': 'eval_test', 'loss': 7.5},
      {'step': 3, 'split': 'eval_validation', 'loss': 6.0},  # after the exported step
  ]
  (run / 'metrics.jsonl').write_text('\n'.join(json.dumps(l) for l in lines) + '\n{"step": 4, "spl')
  assert model_card.latest_eval(run, 2) == (
      2,
      {'eval_validation': {'loss': 7.0}, 'eval_test': {'loss': 7.5}},
  )
  assert model_card.latest_eval(run, 3) == (3, {'eval_validation': {'loss': 6.0}})
  (run / 'metrics.jsonl').unlink()
  card = (export_params(run, tmp_path / 'out') / 'README.md').read_text()
  assert 'No evaluation metrics' in card


# ----------------------------------------------------------------------------
# The Hugging Face Hub, offline.
# ----------------------------------------------------------------------------

COMMIT = 'a' * 40  # a commit hash of the fake repo


def hub_cache(cache: pathlib.Path, repo_id: str, export: pathlib.Path) -> pathlib.Path:
  """Lays ``export``'s files out as ``huggingface_hub`` caches a downloaded repo:
  ``models--<user>--<repo>/blobs/<sha256>``, ``snapshots/<commit>/<file>`` (relative
  symlinks to the blobs) and ``refs/main`` (the commit). Returns the snapshot."""
  root = cache / ('models--' + repo_id.replace('/', '--'))
  snapshot = root / 'snapshots' / COMMIT
  (root / 'blobs').mkdir(parents=True)
  snapshot.mkdir(parents=True)
  (root / 'refs').mkdir()
  (root / 'refs' / 'main').write_text(COMMIT)
  for path in sorted(export.iterdir()):
    blob = root / 'blobs' / hashlib.sha256(path.read_bytes()).hexdigest()
    shutil.copy(path, blob)
    (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
  return snapshot


def test_load_from_hub_offline_from_the_hub_cache(exported, tmp_path, monkeypatch):
  pytest.importorskip('huggingface_hub')
  snapshot = hub_cache(tmp_path / 'hub', 'someone/tiny-cp-lm', exported)
  # The real snapshot_download, never the network: local_files_only, and the Hub's
  # offline switch for load('hf://...') through the default cache.
  model, variables, config = workdirs.load_from_hub(
      'someone/tiny-cp-lm', cache_dir=tmp_path / 'hub', local_files_only=True
  )
  ref_model, checkpoint, _ = load(OLD)
  chex.assert_trees_all_equal(_np(variables), _np(checkpoint))
  chex.assert_trees_all_equal(
      model.apply(variables, TOKENS, train=False),
      ref_model.apply(checkpoint, TOKENS, train=False),
  )
  assert config.model.name == 'cp_transformer_lm'
  assert hub.hub_snapshot(
      'someone/tiny-cp-lm', 'main', cache_dir=tmp_path / 'hub', local_files_only=True
  ) == pathlib.Path(snapshot)

  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
  import huggingface_hub.constants  # pylint: disable=import-outside-toplevel

  # The constants are read at import; set them as the environment would have.
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
  _, by_url, _ = load('hf://someone/tiny-cp-lm')
  chex.assert_trees_all_equal(_np(by_url), _np(checkpoint))
  _, by_rev, _ = load(f'hf://someone/tiny-cp-lm@{COMMIT}')
  chex.assert_trees_all_equal(_np(by_rev), _np(checkpoint))
  with pytest.raises(Exception, match='Cannot find an appropriate cached snapshot'):
    load('hf://someone/not-there')


def test_without_huggingface_hub_the_error_names_the_extra(monkeypatch):
  import builtins  # pylint: disable=import-outside-toplevel

  real_import = builtins.__import__

  def no_hub(name, *args, **kwargs):
    if name == 'huggingface_hub' or name.startswith('huggingface_hub.'):
      raise ModuleNotFoundError(f"No module named '{name}'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, '__import__', no_hub)
  with pytest.raises(ImportError, match=r"pip install 'contextpool-jax\[hub\]'"):
    load('hf://someone/tiny-cp-lm')
  with pytest.raises(ImportError, match=r"pip install 'contextpool-jax\[hub\]'"):
    workdirs.load_from_hub('someone/tiny-cp-lm')
