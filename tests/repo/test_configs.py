"""Every config is valid, and every config family trains a few steps at reduced size.

Data: synthetic enwik8/text8 zips in ``manual_dir`` (small split sizes),
``tfds.testing.mock_data`` for cifar10 / imagenet2012, scikit-learn's digits (real, offline), and a mocked WMT'14 data
source with small sentence pairs. Reduced size means the same config with a
small model and batch (set as overrides, like a user would on the command line).
"""

import contextlib
import io
import json
import pathlib
import shutil
import sys
import zipfile

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from contextpool_jax import models
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import command_line, spec, trainer
from helpers import load_config
from conftest import config_cases

REPO = pathlib.Path(__file__).resolve().parents[2]

CONFIGS = config_cases()  # every argument of every config file


@pytest.mark.parametrize('name,arg', CONFIGS)
def test_every_config_is_valid(name, arg):
  config = load_config(name, arg)
  model = spec.read(config).model  # every override is a field of the model
  assert config.model.name in models.available()
  assert type(model).__name__ in ('Transformer', 'TransformerLM', 'ViT', 'ResNet')


@pytest.mark.parametrize(
    'name,arg',
    [
        ('wmt14', 'en-de,huge,cp'),
        ('cifar10_resnet', 'resnet45'),
        ('imagenet_resnet', 'cp_resnet34'),
        ('imagenet_vit', 'vit_l16'),
        ('digits_resnet', 'resnet21'),
        ('default', 'cp'),
    ],
)
def test_bad_config_argument_is_a_clear_error(name, arg):
  """The message names the file and the argument (and what is allowed)."""
  with pytest.raises(ConfigError, match=f'configs/{name}.py.*{arg!r}') as e:
    load_config(name, arg)
  assert 'expected' in str(e.value) or 'allowed values' in str(e.value)


def test_a_copied_config_directory_loads_its_own_common(tmp_path, monkeypatch):
  """A config file in a package directory imports its siblings relatively (``from . import
  common``): a copy of configs/ under another name, edited, reads its own common.py; a file
  outside any package loads on its own."""
  mine = tmp_path / 'my_configs'
  shutil.copytree(REPO / 'configs', mine, ignore=shutil.ignore_patterns('__pycache__'))
  common = (mine / 'common.py').read_text()
  (mine / 'common.py').write_text(common.replace('c.seed = 0', 'c.seed = 7', 1))
  monkeypatch.chdir(tmp_path)
  try:
    config = command_line.load_config_file('my_configs/default.py:baseline')
  finally:  # the package it imported, from a directory that goes with tmp_path
    for name in [m for m in sys.modules if m.split('.')[0] == 'my_configs']:
      del sys.modules[name]
  assert config.seed == 7 and config.model.name == 'transformer_lm'
  assert load_config('default', '').seed == 0  # the checkout's configs/ are untouched
  (tmp_path / 'alone.py').write_text(
      'import ml_collections\n\ndef get_config():\n'
      '  return ml_collections.ConfigDict(dict(model=dict(name="transformer_lm")))\n'
  )
  assert command_line.load_config_file('alone.py').model.name == 'transformer_lm'


def test_a_config_name_is_a_module_of_the_configs_package(monkeypatch):
  """``--config default:baseline`` imports ``<CONFIGS_PACKAGE>.default`` (installed, that is
  ``contextpool_jax.configs``; here the checkout's ``configs`` stands in); an unknown name
  lists the names."""
  monkeypatch.setattr(command_line, 'CONFIGS_PACKAGE', 'configs')
  assert 'default' in command_line.config_names() and 'common' not in command_line.config_names()
  assert command_line.load_config_file('default:baseline') == load_config('default', 'baseline')
  with pytest.raises(ConfigError, match='config defaults: not a config of configs .*wmt14'):
    command_line.load_config_file('defaults')
  monkeypatch.setattr(command_line, 'CONFIGS_PACKAGE', 'contextpool_jax.no_configs')
  with pytest.raises(ConfigError, match='is not installed.*configs/default.py'):
    command_line.load_config_file('default')


def _shrink(config, workdir_steps=3):
  config.num_train_steps = workdir_steps
  config.log_every_steps = 1
  config.eval_every_steps = workdir_steps
  config.checkpoint_every_steps = workdir_steps
  config.progress_bar = False
  config.async_checkpointing = False
  config.dtype = 'float32'
  config.remat = False
  return config


def _run(config, tmp_path):
  result = trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert result['step'] == config.num_train_steps
  losses = [h['loss'] for h in result['train_history']]
  assert all(np.isfinite(losses))
  evals = [v for k, v in result.items() if k.startswith('eval_')]
  assert evals and all(np.isfinite(x) for e in evals for x in e.values())
  return result


@pytest.mark.slow
@pytest.mark.parametrize('name', ['enwik8', 'text8'])
def test_char_lm_config_trains_on_a_small_corpus(name, tmp_path):
  manual = tmp_path / 'manual'
  manual.mkdir()
  rng = np.random.default_rng(0)
  alphabet = (
      np.frombuffer(b'abcdefghij klmnop\n<>', np.uint8)
      if name == 'enwik8'
      else np.frombuffer(b'abcdefghijklmnopqrstuvwxyz ', np.uint8)
  )
  data = alphabet[rng.integers(0, len(alphabet), 30_000)].tobytes()
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, 'w') as z:
    z.writestr(name, data)
  (manual / f'{name}.zip').write_bytes(buf.getvalue())
  config = _shrink(load_config(name, 'stage1'))
  config.dtype, config.remat = 'bfloat16', True  # the paper configs' compute settings
  config.batch_size = 4
  config.model.update(num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2)
  config.dataset.update(
      data_dir=str(tmp_path / 'data'),
      manual_dir=str(manual),
      seq_len=64,
      eval_context=64,
      eval_step=32,
      eval_batch_size=4,
      eval_max_bytes=512,
      download=False,
  )
  with config.unlocked():
    config.dataset.split_bytes = (27_000, 1_500, 1_500)
  result = _run(config, tmp_path)
  assert result['eval_validation']['bpc'] > 0


EN = 'the a house cat dog is small big green red sees runs and old new'.split()
DE = 'das ein haus katze hund ist klein gross gruen rot sieht laeuft und alt neu'.split()


@contextlib.contextmanager
def _mock_wmt(n=200):
  rng = np.random.default_rng(0)
  records = []
  for _ in range(n):
    w = rng.integers(0, len(EN), int(rng.integers(2, 9)))
    records.append({'en': ' '.join(EN[j] for j in w), 'de': ' '.join(DE[j] for j in w)})

  def as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
    del self, decoders, deserialize_method, kwargs
    return records if split == 'train' else records[:16]

  with tfds.testing.mock_data(
      policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=as_data_source
  ):
    yield


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['cp', 'area'])
def test_wmt14_config_trains_and_reports_bleu(kind, tmp_path):
  config = _shrink(load_config('wmt14', f'en-de,tiny,{kind}'))
  config.batch_size = 8
  config.model.update(vocab_size=48, num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2)
  config.dataset.update(vocab_size=48, max_source_len=16, max_target_len=16, eval_batch_size=8)
  config.eval_bleu_batches = 1
  config.beam_size = 2
  with _mock_wmt():
    result = _run(config, tmp_path)
  assert 0.0 <= result['eval_validation']['bleu'] <= 100.0


def _mock_images():
  return tfds.testing.mock_data(num_examples=16, policy=tfds.testing.MockPolicy.USE_CODE)


@pytest.mark.slow
def test_cifar10_resnet_config_trains(tmp_path):
  config = _shrink(load_config('cifar10_resnet', 'cp_resnet20'))
  config.batch_size = 4
  config.dataset.update(eval_batch_size=8)
  with config.unlocked():
    config.model.update(stage_sizes=(1, 1, 1))
  with _mock_images():
    result = _run(config, tmp_path)
  assert 0.0 <= result['eval_test']['top1'] <= 1.0


@pytest.mark.slow
def test_digits_resnet_config_trains_on_the_real_data(tmp_path):
  # The real digits (offline, inside scikit-learn), prepared on first use in data_dir.
  config = _shrink(load_config('digits_resnet', 'cp_resnet20'))
  config.batch_size = 8
  config.dataset.data_dir = str(tmp_path / 'tfds')
  with config.unlocked():
    config.model.update(stage_sizes=(1, 1, 1))
  result = _run(config, tmp_path)
  assert 0.0 <= result['eval_validation']['top1'] <= 1.0
  assert 0.0 <= result['eval_test']['top1'] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    'arg,overrides',
    [
        ('cp_vit_b16', dict(image_size=32, num_layers=2, hidden_size=32, num_heads=2, mlp_dim=64)),
        ('cp_resnet50', dict(stage_sizes=(1, 1, 1, 1), width=8)),
        ('lambda_resnet50', dict(stage_sizes=(1, 1, 1, 1), width=16, lambda_scope_size=3)),
        (
            'aa_resnet50',
            dict(stage_sizes=(1, 1, 1, 1), width=16, aa_heads=2, aa_min_key_depth_per_head=0),
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else '',
)
def test_imagenet_configs_train(arg, overrides, tmp_path):
  family = 'imagenet_vit' if 'vit' in arg else 'imagenet_resnet'
  config = _shrink(load_config(family, arg))
  config.batch_size = 4
  config.model.update(num_classes=1000)
  with config.unlocked():
    config.model.update(overrides)
  config.dataset.update(image_size=32, eval_batch_size=8)
  if 'randaugment_num_ops' in config.dataset:
    config.dataset.update(randaugment_num_ops=1)
  with _mock_images():
    result = _run(config, tmp_path)
  assert 0.0 <= result['eval_validation']['top5'] <= 1.0


def _pool_size_lines(workdir):
  lines = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [l for l in lines if l['split'] == 'pool_sigma_mean']


@pytest.mark.slow
def test_preset_context_pool_model_logs_pool_sizes(tmp_path):
  """A ContextPool model chosen by its preset name (``cp_resnet20``: the config's
  model section names no ``context_pool``) logs the Fig. 4 pooling sizes: the hook
  asks the built model whether it has ContextPool, not the config."""
  config = _shrink(load_config('cifar10_resnet', 'cp_resnet20'))
  config.batch_size = 4
  config.dataset.update(eval_batch_size=8)
  with config.unlocked():
    config.model = ml_collections.ConfigDict(
        dict(name='cp_resnet20', num_classes=10, stage_sizes=(1, 1, 1))
    )
  with _mock_images():
    _run(config, tmp_path)
  logged = _pool_size_lines(tmp_path / 'run')
  assert [l['step'] for l in logged] == [1, 2, 3]
  sizes = {k: v for k, v in logged[-1].items() if k not in ('step', 'split')}
  assert sizes and all(np.isfinite(v) and v > 0 for v in sizes.values())
  events = list((tmp_path / 'run' / 'tensorboard').iterdir())
  assert any(b'pool_sigma/' in p.read_bytes() for p in events)  # the histograms
