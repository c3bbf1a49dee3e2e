"""``config.model``'s fields (``runs/config_fields.py``): every field of the model a config
names is an entry, with the module's default, unless the trainer or the model sets it."""

import dataclasses

import pytest

from helpers import load_config
from conftest import config_cases
from contextpool_jax import models
from contextpool_jax.layers.context_pool import CONTEXT_POOL_MODEL_FIELDS
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.runs import config_fields

CASES = config_cases()  # every argument of every config file


@pytest.mark.parametrize('name,arg', CASES)
def test_configs_hold_every_offered_field_and_none_the_model_sets(name, arg):
  config = load_config(name, arg)
  fields = config_fields.model_fields(config.model.name)
  assert set(config.model) == set(fields) | {'name'}
  assert not set(config.model) & set(config_fields.NOT_OFFERED)
  assert config_fields.complete(config).to_dict() == config.to_dict()  # idempotent
  pool = config.model.context_pool
  assert (pool is None) == (not config.model.name.startswith('cp_'))  # None: no fields
  if pool is not None:
    assert set(pool) == set(config_fields.context_pool_fields())
    assert not set(pool) & set(CONTEXT_POOL_MODEL_FIELDS)


@pytest.mark.parametrize(
    'name', ['cp_transformer_lm', 'cp_transformer_base', 'cp_vit_b16', 'cp_resnet50']
)
def test_a_field_is_offered_unless_the_trainer_or_the_model_sets_it(name):
  """Each module field is a config entry or has a stated reason not to be: a new
  field with a default that is not a plain value fails here, not silently."""
  model = models.create(name)
  all_fields = {f.name for f in dataclasses.fields(model)} - {'parent', 'name'}
  offered = set(config_fields.model_fields(name))
  assert all_fields - offered == all_fields & set(config_fields.NOT_OFFERED)
  pool_fields = {f.name for f in dataclasses.fields(ContextPool)} - {'parent', 'name'}
  offered = set(config_fields.context_pool_fields())
  assert pool_fields - offered == set(CONTEXT_POOL_MODEL_FIELDS)


def test_defaults_come_from_the_modules():
  config = load_config('default', '')
  pool_defaults = ContextPool()
  for field in config_fields.context_pool_fields():
    assert config.model.context_pool[field] == getattr(pool_defaults, field), field
  lm = models.create('cp_transformer_lm')
  listed = {'name', 'num_layers', 'emb_dim', 'mlp_dim', 'num_heads', 'dropout_rate'}
  listed |= {'context_pool_position', 'context_pool_reads', 'context_pool'}
  for field in set(config_fields.model_fields('cp_transformer_lm')) - listed:
    assert config.model[field] == getattr(lm, field), field
  # A preset's values, not the class defaults: the base NMT Transformer's sizes.
  big = load_config('wmt14', 'en-de,big,standard')
  assert (big.model.num_layers, big.model.emb_dim, big.model.num_heads) == (6, 1024, 16)
