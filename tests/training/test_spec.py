"""A run's config is read once: ``spec.read`` turns it into typed specs, section by section.

What is checked: every section of the default config arrives typed, with the config file's
values; a bad field of each section is one ConfigError naming it, raised by ``read`` (before
anything is built); only the section readers read a run's config, and only ``read`` calls them.
"""

import ast
import pathlib

import jax.numpy as jnp
import pytest

from configs import default as default_config
from configs import wmt14 as wmt14_config
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.data import lm_input, translation_input
from contextpool_jax.models import transformer
from contextpool_jax.training import optim, profiling, spec, tasks, writers

PACKAGE = pathlib.Path(spec.__file__).parents[1]


def test_every_section_of_the_default_config_arrives_typed():
  specs = spec.read(default_config.get_config())
  # The values configs/default.py sets.
  assert isinstance(specs.run, spec.RunSpec)
  assert (specs.run.num_train_steps, specs.run.batch_size) == (500, 16)
  assert specs.run.eval_every_steps == 500 and specs.run.checkpoint_every_steps == 250
  assert specs.run.dtype == jnp.float32
  assert isinstance(specs.model, transformer.TransformerLM)
  assert (specs.model.num_layers, specs.model.emb_dim, specs.model.num_heads) == (2, 256, 4)
  assert specs.model.context_pool_reads == 'kv'
  assert dict(specs.model.context_pool)['size_norm'] == 'sigmoid'
  assert isinstance(tasks.KINDS[specs.task.kind], tasks.LanguageModelKind)
  assert specs.task.label_smoothing == 0.0 and specs.task.bleu is None
  assert isinstance(specs.data, lm_input.LMDataSpec)
  assert (specs.data.seq_len, specs.data.eval_context, specs.data.eval_step) == (256, 256, 128)
  assert isinstance(specs.optimizer, optim.OptimizerSpec)
  assert (specs.optimizer.name, specs.optimizer.learning_rate) == ('adamw', 2e-3)
  assert (specs.optimizer.schedule, specs.optimizer.warmup_steps) == ('cosine', 50)
  assert specs.writers == writers.WritersSpec(('jsonl', 'tensorboard'), {})
  assert specs.profile == profiling.ProfileSpec(start_step=10, num_steps=0, all_processes=False)
  # The completed config (what config.json records): every ContextPool field, e.g. ratio.
  assert 'ratio' in specs.config.model.context_pool


def test_a_translation_run_reads_its_bleu_and_label_smoothing_into_the_task_spec():
  config = wmt14_config.get_config('en-de,tiny,cp')
  config.beam_size, config.beam_alpha, config.label_smoothing = 2, 0.5, 0.2
  specs = spec.read(config)
  assert isinstance(specs.data, translation_input.TranslationDataSpec)
  assert isinstance(tasks.KINDS[specs.task.kind], tasks.TranslationKind)
  assert specs.task.label_smoothing == 0.2
  assert specs.task.bleu is not None
  assert (specs.task.bleu.beam_size, specs.task.bleu.alpha) == (2, 0.5)
  objective = tasks.make_objective(specs.task, specs.data, specs.model)
  assert objective.label_smoothing == 0.2


# One bad field per section: (the override, the field the error names).
BAD_FIELDS = [
    ({'batch_size': 0}, 'config.batch_size=0'),
    ({'dtype': 'float8'}, "config.dtype='float8'"),
    ({'model.not_a_field': 1}, 'not_a_field'),
    ({'model.name': 'transformer_lmm'}, "model='transformer_lmm' is not registered"),
    ({'model.attention': 'sparse'}, "TransformerLM.attention='sparse'"),
    ({'model.positions': 'rope'}, "TransformerLM.positions='rope'"),
    ({'task': 'language'}, "config.task='language'"),
    ({'dataset.eval_step': 512}, 'config.dataset.eval_step=512'),
    ({'optimizer.name': 'adafactorz'}, "config.optimizer.name='adafactorz'"),
    ({'writers': ('jsonl', 'tensorbord')}, "'tensorbord' is not a writer"),
    ({'profile.num_steps': -1}, 'config.profile.num_steps=-1'),
    ({'label_smoothing': 1.5}, None),  # an LM run does not read label smoothing: no error
]


@pytest.mark.parametrize('override,named', BAD_FIELDS, ids=[str(o) for o, _ in BAD_FIELDS])
def test_a_bad_field_of_any_section_is_named_by_read(override, named):
  config = default_config.get_config()
  with config.unlocked():
    for path, value in override.items():
      *parents, key = path.split('.')
      node = config
      for parent in parents:
        if parent not in node:
          node[parent] = {}
        node = node[parent]
      node[key] = value
  if named is None:
    spec.read(config)
    return
  with pytest.raises(ConfigError) as error:
    spec.read(config)
  assert named in str(error.value)


def _modules():
  for path in sorted(PACKAGE.rglob('*.py')):
    yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def _imports_config_readers(tree) -> bool:
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == 'contextpool_jax.io':
      if any(a.name == 'config_readers' for a in node.names):
        return True
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [getattr(node, 'module', None) or ''] + [a.name for a in node.names]
      if any(n.endswith('io.config_readers') for n in names):
        return True
  return False


# The section readers (spec.py's table): the only modules that read a run's config.
READERS = {
    'training/spec.py',  # the top level, and read() itself
    'runs/config_fields.py',  # model
    'training/tasks.py',  # task, label smoothing, BLEU
    'data/lm_input.py',  # dataset, per task kind
    'data/translation_input.py',
    'data/image_input.py',
    'training/optim.py',  # optimizer
    'training/writers.py',  # writers, wandb, mlflow
    'training/profiling.py',  # profile
}


def test_only_the_section_readers_read_a_run_config():
  readers = {name for name, tree in _modules() if _imports_config_readers(tree)}
  assert readers == READERS


# Calls of the section readers, and who may make them besides spec.read.
SECTION_READERS = ('read_run', 'build_model', 'resolve_spec', 'read', 'read_data')
CALLERS = {
    'training/spec.py',
    # A loaded run's recorded config: its model (workdirs.load) and a translation run's
    # vocabulary and lengths (inference); not a run being trained.
    'runs/workdirs.py',
    'inference/translation.py',
}
ENTRY_POINTS = {('spec', 'read'), ('spec_lib', 'read')}  # the one reading, not a section's
READER_MODULES = (
    'spec',
    'config_fields',
    'tasks',
    'lm_input',
    'translation_input',
    'image_input',
    'optim',
    'writers',
    'profiling',
    'spec_lib',
)


def _reader_calls(tree):
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      owner = node.func.value
      if node.func.attr in SECTION_READERS and isinstance(owner, ast.Name):
        if owner.id in READER_MODULES and (owner.id, node.func.attr) not in ENTRY_POINTS:
          yield f'{owner.id}.{node.func.attr}'


def test_only_read_calls_the_section_readers():
  calls = {name: sorted(set(_reader_calls(tree))) for name, tree in _modules()}
  outside = {name: c for name, c in calls.items() if c and name not in CALLERS}
  assert not outside, outside
  assert {'config_fields.build_model', 'optim.resolve_spec', 'tasks.read'} <= set(
      calls['training/spec.py']
  )
