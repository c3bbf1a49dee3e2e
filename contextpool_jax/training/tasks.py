"""What a config trains: a model, its objective (loss and metrics) and its data.

``make_task(config, workdir)`` returns a :class:`Task` of three separate parts:

* ``model``: the Flax module from the registry (:func:`build_model`);
* ``objective``: loss and metrics (:mod:`contextpool_jax.training.objectives`),
  which never see the data pipeline;
* ``data``: a :class:`DataPipeline` (prepare, training and evaluation batches,
  an init batch), which never sees the model.

The training loop only talks to these three interfaces, so a new kind of
experiment is a new objective and a new pipeline, not a change to the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import flax.linen as nn
import ml_collections
import numpy as np

from contextpool_jax import checks, models
from contextpool_jax.training import objectives, spec as spec_lib


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """``models.create(config.model.name, **config.model minus name, dtype, remat)``."""
  dtype, remat = spec_lib.model_settings(config)
  overrides = config.model.to_dict()
  name = overrides.pop('name')
  return models.create(name, **overrides, dtype=dtype, remat=remat)


class DataPipeline:
  """The data of one kind of experiment (batches: see :mod:`.objectives`)."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config = config
    self.workdir = workdir

  def prepare(self) -> None:
    """Builds what the processes share through files (a dataset, a vocabulary).

    The trainer calls it on the first process only, before any process reads
    the data, so several processes never write the same files. Default: nothing.
    """

  def train_dataset(self, process_index: int, process_count: int):
    """This process's infinite training batches (a grain dataset with state)."""
    raise NotImplementedError

  def eval_batches(self, split: str, process_index: int, process_count: int) -> Iterable[dict]:
    """This process's evaluation batches of ``split`` (padded, the same number on
    every process)."""
    raise NotImplementedError

  def init_batch(self) -> dict[str, np.ndarray]:
    """A small batch with the right dtypes and trailing shapes, for ``init``."""
    raise NotImplementedError


class LanguageModelData(DataPipeline):
  """Byte-level corpora (:mod:`contextpool_jax.data.lm_input`)."""

  def prepare(self):
    from contextpool_jax.data import lm_input  # pylint: disable=g-import-not-at-top

    lm_input.load_split(self.config, 'train')  # prepares and checks every split

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import lm_input  # pylint: disable=g-import-not-at-top

    return lm_input.make_train_dataset(
        self.config, process_index=process_index, process_count=process_count
    )

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import lm_input  # pylint: disable=g-import-not-at-top

    return lm_input.make_eval_batches(
        self.config, split, process_index=process_index, process_count=process_count
    )

  def init_batch(self):
    n = self.config.dataset.seq_len
    return {'tokens': np.zeros((1, n + 1), np.int32), 'weights': np.ones((1, n), np.float32)}


class TranslationData(DataPipeline):
  """Sentence pairs and a SentencePiece vocabulary stored in the workdir
  (:mod:`contextpool_jax.data.translation_input`)."""

  def __init__(self, config, workdir):
    super().__init__(config, workdir)
    self._vocab = None

  @property
  def vocab(self):
    if self._vocab is None:
      from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

      self._vocab = translation_input.get_vocab(self.config, self.workdir)
    return self._vocab

  def prepare(self):
    self.vocab  # trains the SentencePiece model into the workdir if it is not there

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

    return translation_input.make_train_dataset(
        self.config,
        process_index=process_index,
        process_count=process_count,
        vocab=self.vocab,
        workdir=self.workdir,
    )

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

    return translation_input.make_eval_batches(
        self.config,
        split,
        process_index=process_index,
        process_count=process_count,
        vocab=self.vocab,
        workdir=self.workdir,
    )

  def init_batch(self):
    d = self.config.dataset
    return {
        'inputs': np.ones((1, d.max_source_len), np.int32),
        'targets': np.ones((1, d.max_target_len), np.int32),
    }


class ImageData(DataPipeline):
  """Labelled images (:mod:`contextpool_jax.data.image_input`)."""

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import image_input  # pylint: disable=g-import-not-at-top

    return image_input.make_train_dataset(
        self.config, process_index=process_index, process_count=process_count
    )

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import image_input  # pylint: disable=g-import-not-at-top

    return image_input.make_eval_batches(
        self.config, split, process_index=process_index, process_count=process_count
    )

  def init_batch(self):
    s = self.config.dataset.image_size
    return {'image': np.zeros((2, s, s, 3), np.float32), 'label': np.zeros((2,), np.int32)}


_DATA = {'lm': LanguageModelData, 'translation': TranslationData, 'classification': ImageData}


@dataclasses.dataclass
class Task:
  """A model, its objective and its data: everything the loop is given."""

  model: nn.Module
  objective: objectives.Objective
  data: DataPipeline


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  task = checks.read_choice(config, 'task', spec_lib.TASKS)
  model = build_model(config)
  objective = objectives.make_objective(config, getattr(model, 'num_classes', None))
  return Task(model=model, objective=objective, data=_DATA[task](config, workdir))
