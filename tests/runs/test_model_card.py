"""The model card an export writes (contextpool_jax.runs.model_card): the model, config, data,
split and the last evaluation up to the exported step; huggingface_hub's ModelCard, and the same
text without it."""

import json
import shutil
import sys

import jax
import numpy as np
import pytest

from contextpool_jax.runs import model_card
from contextpool_jax.runs.export import export_params
from contextpool_jax.runs.workdirs import load_variables
from helpers import OLD
from helpers import exported  # pylint: disable=unused-import  # a fixture


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
