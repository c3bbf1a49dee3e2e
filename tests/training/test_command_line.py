"""Every model field is a command-line override; a mistyped one is a one-line error.

Overrides go through the real path: ``config_flags.DEFINE_config_file`` on a
command line like ``train.py``'s (flags of their own, so nothing is global),
then the checks look at what the built model and its module tree received
(``spec.read``'s model, and ``jax.eval_shape`` of the trainer's init with every
module call intercepted: no compile, no data).
"""

import importlib
import inspect
import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from configs import default as default_config
from contextpool_jax import models
from contextpool_jax.runs import config_fields, layout
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.area_attention import AreaAttention
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.lambda_layer import LambdaLayer
from contextpool_jax.training import checkpoints, command_line, optim, spec, steps, tasks, trainer
from conftest import REPO, config_cases

# Every config file and its variants (test_every_config_file_is_listed keeps it whole).
CASES = config_cases()  # every argument of every config file


def _config_file(name, arg):
  return f'configs/{name}.py' + (f':{arg}' if arg else '')


def _parse(config_file, overrides=()):
  """The config ``train.py`` gets for ``--config=config_file`` and ``--config.<k>=<v>``."""
  argv = ['train.py', f'--config={config_file}', *(f'--config.{k}={v}' for k, v in overrides)]
  flag_values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file('config', flag_values=flag_values, sys_argv=argv)
  flag_values['config'].parser = command_line.ConfigFileParser()
  flag_values(argv)
  return holder.value


def _text(value):
  """A value as typed on the command line."""
  return value if isinstance(value, str) else repr(value)


def _representative_overrides(config):
  """``{path: value}``: one or more fields of each module field family the config
  builds, none of them set by the config file (the defaults of the module)."""
  model = config.model
  kind = type(models.create(model.name)).__name__
  out = {'keep_checkpoint_period': 7, 'remat': 'dots_no_batch'}  # top-level fields
  if kind in ('Transformer', 'TransformerLM'):
    out.update(
        {
            'model.attention_dropout_rate': 0.05,
            'model.local_window': 17,
            'model.attention_implementation': 'xla',
        }
    )
    if model.attention == 'area':  # area attention's sizes and key / value modes
      out.update(
          {
              'model.max_area_width': 3,
              'model.num_area_layers': 1,
              'model.area_key_mode': 'max',
              'model.area_value_mode': 'mean',
          }
      )
    if model.context_pool is not None:  # where ContextPool sits and what reads it
      out.update(
          {
              'model.context_pool_first_layer': 1,
              'model.context_pool_last_layer': 1,
              'model.context_pool_reads': 'kv',
              'model.context_pool_heads': 1,
          }
      )
  elif kind == 'ViT':
    out.update({'model.attention_dropout_rate': 0.05, 'model.classifier': 'gap'})
    if model.context_pool is not None:
      out['model.context_pool_last'] = True
  else:
    out.update({'model.bn_epsilon': 2e-5, 'model.zero_init_residual': True})
    if 'L' in str(model.stage_pattern):
      out.update({'model.lambda_key_depth': 8, 'model.lambda_heads': 2})
    if 'A' in str(model.stage_pattern):
      out.update({'model.aa_heads': 4, 'model.aa_position': 'none'})
  if model.context_pool is not None:
    out.update(
        {
            'model.context_pool.ratio': 0.025,  # None by default: any literal
            'model.context_pool.kernel_size': 5,
            'model.context_pool.gate': True,
            'model.context_pool.size_bias_init': -1.5,
            'model.context_pool.implementation': 'dense',
            'model.context_pool.gaussian_skip_nats': None,  # back to None
        }
    )
    if kind != 'ResNet' and kind != 'ViT':
      out['model.context_pool.sigma_length'] = 64  # sequences only
  return out


def _lookup(tree, path):
  for key in path.split('.'):
    tree = tree[key]
  return tree


@pytest.mark.parametrize('name,arg', CASES)
def test_every_config_takes_an_override_of_each_model_field_family(name, arg):
  config_file = _config_file(name, arg)
  wanted = _representative_overrides(_parse(config_file))
  config = _parse(config_file, [(k, _text(v)) for k, v in wanted.items()])
  for path, value in wanted.items():
    assert _lookup(config, path) == value, path
  specs = spec.read(config)
  assert specs.run.keep_checkpoint_period == 7
  model = specs.model  # what the model received
  assert model.remat == 'dots_no_batch'  # the run's config.remat
  for path, value in wanted.items():
    if path.startswith('model.context_pool.'):
      assert model.context_pool[path.split('.')[-1]] == value, path
    elif path.startswith('model.'):
      assert getattr(model, path.split('.')[-1]) == value, path


# Reduced sizes where the size is not what is tested (they are overrides too).
SMALL = {
    'enwik8': {'model.num_layers': 2},
    'imagenet_vit': {'model.num_layers': 2},
    'imagenet_resnet': {'model.stage_sizes': (1, 1, 1, 1)},
}
TREE_CASES = [
    ('default', ''),
    ('enwik8', 'stage1'),  # nn.scan over the layers
    ('wmt14', 'en-de,tiny,area'),
    ('wmt14', 'en-de,tiny,cp'),
    ('imagenet_vit', 'cp_vit_ti16'),
    ('digits_resnet', 'cp_resnet20'),
    ('imagenet_resnet', 'lambda_resnet50'),
    ('imagenet_resnet', 'aa_resnet34'),
]
LAYER_FIELDS = {  # the module tree's layer: {its field: the model field that sets it}
    AreaAttention: {
        'max_area_width': 'model.max_area_width',
        'key_mode': 'model.area_key_mode',
        'value_mode': 'model.area_value_mode',
    },
    LambdaLayer: {'key_depth': 'model.lambda_key_depth', 'heads': 'model.lambda_heads'},
    AugmentedConv2D: {'num_heads': 'model.aa_heads', 'position': 'model.aa_position'},
}


def _modules_built(config, workdir):
  """Every module called while the trainer's init is traced (``jax.eval_shape``)."""
  specs = spec.read(config)
  task = tasks.make_task(specs.task, specs.model, specs.data, str(workdir))
  tx, _ = optim.make_optimizer(specs.optimizer, specs.run.num_train_steps)
  init_fn = steps.make_init_fn(task.model, task.objective, task.data.init_batch(), tx)
  seen = []

  def record(next_fun, args, kwargs, context):
    seen.append(context.module)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(init_fn, jax.random.key(0))
  return seen


@pytest.mark.parametrize('name,arg', TREE_CASES)
def test_the_module_tree_receives_the_overrides(name, arg, tmp_path):
  config_file = _config_file(name, arg)
  wanted = _representative_overrides(_parse(config_file))
  small = SMALL.get(name, {})
  config = _parse(config_file, [(k, _text(v)) for k, v in {**small, **wanted}.items()])
  seen = _modules_built(config, tmp_path)
  pools = [m for m in seen if isinstance(m, ContextPool)]
  assert bool(pools) == (config.model.context_pool is not None)
  for pool in pools:
    for path, value in wanted.items():
      if path.startswith('model.context_pool.'):
        assert getattr(pool, path.split('.')[-1]) == value, path
  checked = 0
  for layer_type, fields in LAYER_FIELDS.items():
    layers = [m for m in seen if isinstance(m, layer_type)]
    for field, path in fields.items():
      if path in wanted:
        assert layers, f'no {layer_type.__name__} in the tree of {config_file}'
        assert {getattr(m, field) for m in layers} == {wanted[path]}, path
        checked += 1
  if name == 'wmt14' and arg.endswith('area'):
    assert checked == 3
  if arg.startswith(('lambda', 'aa')):
    assert checked == 2
  # The fields the model sets itself are still the model's: causal decoder pools.
  if name in ('default', 'enwik8'):
    assert all(p.causal for p in pools)
  if name == 'wmt14' and arg.endswith('cp'):
    assert {p.causal for p in pools} == {False, True}  # encoder, decoder
  if name == 'digits_resnet':
    assert {p.strides for p in pools} == {1}  # CIFAR placement: before the global pool


def test_every_config_file_lists_its_arguments_and_its_default_is_one():
  """``ARGS`` (what the tests parametrize over) holds each file's default argument."""
  files = {p.stem for p in (REPO / 'configs').glob('*.py') if 'def get_config' in p.read_text()}
  assert files == {name for name, _ in CASES}
  for name in files:
    module = importlib.import_module(f'configs.{name}')
    default = inspect.signature(module.get_config).parameters
    (parameter,) = default.values()
    assert parameter.default in module.ARGS, (name, parameter.default)


# ----------------------------------------------------------------------------
# Mistyped overrides and bad values.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    'config_file,override,message',
    [
        (
            'configs/default.py',
            'model.context_pool.sizenorm',
            'unknown override --config.model.context_pool.sizenorm; did you mean: size_norm?',
        ),
        (
            'configs/default.py',
            'num_train_stepz',
            'unknown override --config.num_train_stepz; did you mean: num_train_steps?',
        ),
        (
            'configs/wmt14.py:en-de,base,area',
            'model.area_value_mod',
            'unknown override --config.model.area_value_mod; did you mean: area_value_mode',
        ),
        (
            'configs/cifar10_resnet.py:cp_resnet44',
            'model.context_pool.kernelsize',
            'unknown override --config.model.context_pool.kernelsize; did you mean: kernel_size?',
        ),
        (
            'configs/imagenet_vit.py:cp_vit_b16',
            'optimizer.learning_rat',
            'unknown override --config.optimizer.learning_rat; did you mean: learning_rate, ',
        ),
        (
            'configs/default.py',
            'model.xyzzy',
            'unknown override --config.model.xyzzy; config.model has: area_key_mode, ',
        ),
        (
            'configs/default.py',
            'model.remat',
            "override --config.model.remat is not offered: set from the run's config.remat.",
        ),
        (
            'configs/default.py',
            'model.context_pool.causal',
            'override --config.model.context_pool.causal is not offered: the model that inserts '
            'ContextPool sets it',
        ),
        (
            'configs/default.py:baseline',
            'model.context_pool.ratio',
            'override --config.model.context_pool.ratio: config.model.context_pool is None in '
            'this config (off)',
        ),
        (
            'configs/default.py',
            'model.num_layers.deep',
            'unknown override --config.model.num_layers.deep: config.model.num_layers is 2, '
            'not a section',
        ),
    ],
)
def test_an_override_the_config_lacks_is_one_line_naming_file_key_and_close_keys(
    config_file, override, message
):
  argv = ['train.py', '--workdir', '/tmp/w', '--config', config_file, f'--config.{override}=1']
  error = command_line.override_error(argv)
  assert error.startswith(f'config file {config_file}: {message}')
  assert '\n' not in error
  # ... and config_flags itself does fail on it (so train.py reaches the message).
  with pytest.raises((AttributeError, KeyError, ValueError)):
    _parse(config_file, [(override, '1')])


def test_valid_overrides_are_not_reported():
  argv = ['train.py', '--config=configs/default.py', '--config.model.context_pool.ratio=0.1']
  assert command_line.override_error(argv) is None
  argv = ['train.py', '--config=configs/default.py', '--config.model.num_layers=3']
  assert command_line.model_name_error(argv, {'model.num_layers': 3}) is None


def test_changing_the_model_name_is_refused():
  argv = ['train.py', '--config=configs/wmt14.py:en-de,base,cp', '--config.model.name=x']
  assert command_line.model_name_error(argv, {'model.name': 'cp_transformer_base'}) is None
  error = command_line.model_name_error(argv, {'model.name': 'cp_transformer_big'})
  assert error.startswith(
      'config file configs/wmt14.py:en-de,base,cp: override '
      '--config.model.name=cp_transformer_big is not allowed'
  )
  assert "fields of 'cp_transformer_base'" in error and '\n' not in error


def _train_py(*args):
  return subprocess.run(
      [sys.executable, 'train.py', *args], capture_output=True, text=True, timeout=300, cwd=REPO
  )


@pytest.mark.slow
def test_train_py_answers_a_mistyped_override_in_one_line_before_any_work(tmp_path):
  workdir = tmp_path / 'run'
  out = _train_py(
      '--config',
      'configs/default.py',
      '--workdir',
      str(workdir),
      '--config.model.context_pool.sizenorm=softmax',
  )
  assert out.returncode == 1
  assert out.stderr.strip() == (
      'error: config file configs/default.py: unknown override '
      '--config.model.context_pool.sizenorm; did you mean: size_norm?'
  )
  assert not workdir.exists()  # main never ran: nothing prepared or compiled


@pytest.mark.slow
def test_a_bad_value_gets_the_modules_check_before_the_data_is_prepared(tmp_path):
  config = _parse(
      'configs/default.py',
      [('model.context_pool.size_norm', 'softmx'), ('dataset.data_dir', str(tmp_path / 'tfds'))],
  )
  with pytest.raises(
      ConfigError,
      match=r"^ContextPool\.size_norm='softmx' is not supported; allowed values: 'softmax', "
      r"'sigmoid'\.",
  ) as error:
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  assert '\n' not in str(error.value)  # train.py prints it as one line
  assert not (tmp_path / 'tfds').exists()  # the corpus was not prepared


@pytest.mark.slow
def test_the_saved_config_records_every_field_of_a_config_built_in_code(tmp_path):
  config = default_config.get_config()
  with config.unlocked():  # an incomplete model section, as code may build it
    config.model = ml_collections.ConfigDict(
        dict(name='cp_transformer_lm', num_layers=1, context_pool=dict(size_norm='softmx'))
    )
  config.dataset.data_dir = str(tmp_path / 'tfds')
  with pytest.raises(ConfigError, match='softmx'):
    trainer.train_and_evaluate(config, str(tmp_path / 'run'))
  saved = json.loads((tmp_path / 'run' / layout.CONFIG_FILE).read_text())['model']
  assert set(saved) == set(config_fields.model_fields('cp_transformer_lm')) | {'name'}
  assert set(saved['context_pool']) == set(config_fields.context_pool_fields())
  assert saved['num_layers'] == 1 and saved['num_heads'] == 8  # given; the preset's
  assert saved['context_pool']['size_norm'] == 'softmx' and saved['context_pool']['ratio'] is None


# The model section configs/default.py had before its fields were filled in: what the
# config.json of a run started then holds.
_OLD_DEFAULT_MODEL = dict(
    name='cp_transformer_lm',
    num_layers=2,
    emb_dim=256,
    mlp_dim=1024,
    num_heads=4,
    dropout_rate=0.0,
    context_pool_position='attention_input',
    context_pool=dict(
        size_norm='sigmoid', residual=False, weights='learned', locality='gaussian', mapping='cnn'
    ),
)


@pytest.mark.slow
def test_a_workdir_saved_before_the_fields_were_filled_in_resumes(tmp_path):
  # The old default model read pooled queries, keys and values (the model's default).
  old = [('model.context_pool_reads', 'qkv')]
  config = default_config.get_config()
  config.model.context_pool_reads = 'qkv'
  config = config_fields.complete(config)  # as the trainer has it
  saved = json.loads(config.to_json_best_effort())
  saved['model'] = _OLD_DEFAULT_MODEL
  (tmp_path / layout.CONFIG_FILE).write_text(json.dumps(saved))
  checkpoints.check_resume_config(tmp_path, config)  # the same run: no error
  checkpoints.check_resume_config(tmp_path, _parse('configs/default.py', old))  # from the CLI
  # Today's default reads 'kv': that run cannot resume from the old one's checkpoints.
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model\.context_pool_reads: saved 'qkv', now 'kv'"
  ):
    checkpoints.check_resume_config(tmp_path, _parse('configs/default.py'))
  # A field the old config did not list still counts at its default value.
  changed = _parse('configs/default.py', old + [('model.context_pool.ratio', '0.025')])
  with pytest.raises(
      checkpoints.CheckpointError, match=r'model\.context_pool\.ratio: saved None, now 0\.025'
  ):
    checkpoints.check_resume_config(tmp_path, changed)
  changed = _parse('configs/default.py', old + [('model.context_pool_heads', '2')])
  with pytest.raises(checkpoints.CheckpointError, match=r'model\.context_pool_heads: saved None'):
    checkpoints.check_resume_config(tmp_path, changed)
