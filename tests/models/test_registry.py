"""The model registry: every name builds; errors name what is wrong."""

import dataclasses
import importlib
import re

import flax.linen as nn
import pytest

from contextpool_jax import models
from conftest import REPO


def test_available_is_every_model_files_models():
  """A new model file's ``MODELS`` cannot be left out of the registry (nor its tests,
  which iterate ``available()``); the configs' names are checked in test_configs.py."""
  names = models.available()
  assert names == sorted(names)
  files = [
      p
      for p in (REPO / 'contextpool_jax' / 'models').glob('*.py')
      if re.search(r'^MODELS\b', p.read_text(), re.M)
  ]
  assert files
  registered = set()
  for path in files:
    registered |= set(importlib.import_module(f'contextpool_jax.models.{path.stem}').MODELS)
  assert set(names) == registered


def test_create_applies_overrides():
  model = models.create('cp_transformer_lm', num_layers=3)
  assert model.num_layers == 3 and model.context_pool == {}
  assert models.create('transformer_lm').context_pool is None


def test_every_model_passes_its_fields_down_as_one_frozen_config():
  """Each family declares its fields once (a frozen config dataclass); the top
  module's fields are exactly those, and ``model.config`` carries their values."""
  for name in models.available():
    model = models.create(name)
    config = model.config
    assert isinstance(
        config, (models.TransformerConfig, models.ResNetConfig, models.ViTConfig)
    ), name
    with pytest.raises(dataclasses.FrozenInstanceError):
      config.dtype = None
    names = [f.name for f in dataclasses.fields(config)]
    assert names == [
        f.name for f in dataclasses.fields(model) if f.name not in ('parent', 'name')
    ], name
    assert all(getattr(config, n) is getattr(model, n) for n in names), name


def test_no_config_field_hides_a_module_attribute():
  """The top modules subclass their config dataclass: a field named like an attribute of
  ``nn.Module`` (``apply``, ``scope``, ...) or ``config`` would replace it."""
  for config_cls in (models.TransformerConfig, models.ResNetConfig, models.ViTConfig):
    names = {f.name for f in dataclasses.fields(config_cls)}
    taken = {n for n in names if hasattr(nn.Module, n)} | (names & {'parent', 'name', 'config'})
    assert not taken, (config_cls.__name__, taken)


def test_unknown_name_suggests_close_matches():
  with pytest.raises(
      ValueError,
      match=r"model='cp_transfomer_lm' is not registered\. " r"Did you mean 'cp_transformer_lm'",
  ):
    models.create('cp_transfomer_lm')


def test_unknown_override_is_an_error():
  with pytest.raises(ValueError, match="model='vit_b16': invalid override"):
    models.create('vit_b16', num_layerz=3)
