"""The task registry: each kind of experiment (``config.task``) and everything it decides.

:func:`read` reads ``config.task`` and the fields its kind has (label smoothing, BLEU)
into a :class:`TaskSpec` (``training.spec.read`` calls it, with the kind's data
module's reader of ``config.dataset``: :meth:`TaskKind.read_data`).
``make_task(task_spec, model, data_spec, workdir)`` returns a :class:`Task`: the
model, the :class:`TaskKind` of the spec and what that kind builds from the specs:

* ``objective``: loss and metrics (:mod:`contextpool_jax.training.objectives`),
  which never see the data pipeline;
* ``data``: a :class:`DataPipeline` (prepare, training and evaluation batches,
  an init batch) over the kind's resolved data spec, which never sees the model;
* ``evaluators(devices, splits)`` and ``hooks(devices, log_pool_sizes)``: what
  the loop runs besides training (:mod:`contextpool_jax.training.evaluators`).

This module is the one place that tells the kinds apart (:data:`KINDS`,
keyed by ``config.task``, :attr:`TaskSpec.kind`); nothing else in the repository decides by
``config.task`` (``tests/repo/test_code_shape.py``). A new kind of experiment is a
:class:`TaskKind` here (an objective, a pipeline over its data module, its
evaluators), not a change to the loop. Log hooks ask the
built model what it contains (:meth:`evaluators.PoolSizes.sows`), never the config.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Optional

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from contextpool_jax.io import config_readers
from contextpool_jax.data import image_input, lm_input, translation_input
from contextpool_jax.inference import decoding
from contextpool_jax.training import evaluators, objectives

# ----------------------------------------------------------------------------
# Data pipelines: one per kind, over the kind's data module and resolved spec.
# ----------------------------------------------------------------------------


class DataPipeline:
  """The data of one kind of experiment (batches: see :mod:`.objectives`).

  ``spec``: the data module's resolved ``config.dataset`` (:meth:`TaskKind.read_data`).
  """

  data_module: Any = None  # the module with resolve_spec / make_train_dataset / ...

  def __init__(self, spec: Any, workdir: str):
    self.spec = spec
    self.workdir = workdir

  def prepare(self) -> None:
    """Builds what the processes share through files (a dataset, a vocabulary).

    The trainer calls it on the first process only, before any process reads
    the data, so several processes never write the same files. Default: nothing.
    """

  def train_dataset(self, process_index: int, process_count: int):
    """This process's infinite training batches (a grain dataset with state)."""
    return self.data_module.make_train_dataset(
        self.spec, process_index=process_index, process_count=process_count
    )

  def eval_batches(self, split: str, process_index: int, process_count: int) -> Iterable[dict]:
    """This process's evaluation batches of ``split`` (padded, the same number on
    every process)."""
    return self.data_module.make_eval_batches(
        self.spec, split, process_index=process_index, process_count=process_count
    )

  def init_batch(self) -> dict[str, np.ndarray]:
    """A small batch with the right dtypes and trailing shapes, for ``init``."""
    raise NotImplementedError

  def batch_shapes(self, batch_size: int) -> tuple[dict, dict]:
    """``(train, evaluation)``: each global batch as ``{key: (shape, dtype)}``, what
    ``train_dataset`` and ``eval_batches`` yield over all processes (the compile
    command's abstract batches; ``batch_size``: ``config.batch_size``)."""
    raise NotImplementedError


class LanguageModelData(DataPipeline):
  """Byte-level corpora (:mod:`contextpool_jax.data.lm_input`)."""

  data_module = lm_input

  def prepare(self):
    lm_input.load_split(self.spec, 'train')  # prepares and checks every split

  def init_batch(self):
    n = self.spec.seq_len
    return {'tokens': np.zeros((1, n + 1), np.int32), 'weights': np.ones((1, n), np.float32)}

  def batch_shapes(self, batch_size):
    shapes = lambda b, n: {'tokens': ((b, n + 1), np.int32), 'weights': ((b, n), np.float32)}
    spec = self.spec
    return shapes(batch_size, spec.seq_len), shapes(spec.eval_batch_size, spec.eval_context)


class TranslationData(DataPipeline):
  """Sentence pairs and a SentencePiece vocabulary stored in the workdir
  (:mod:`contextpool_jax.data.translation_input`)."""

  data_module = translation_input

  @functools.cached_property
  def vocab(self):
    return translation_input.get_vocab(self.spec, self.workdir)

  def prepare(self):
    self.vocab  # trains the SentencePiece model into the workdir if it is not there

  def train_dataset(self, process_index, process_count):
    return translation_input.make_train_dataset(
        self.spec,
        process_index=process_index,
        process_count=process_count,
        vocab=self.vocab,
        workdir=self.workdir,
    )

  def eval_batches(self, split, process_index, process_count):
    return translation_input.make_eval_batches(
        self.spec,
        split,
        process_index=process_index,
        process_count=process_count,
        vocab=self.vocab,
        workdir=self.workdir,
    )

  def init_batch(self):
    return {
        'inputs': np.ones((1, self.spec.max_source_len), np.int32),
        'targets': np.ones((1, self.spec.max_target_len), np.int32),
    }

  def batch_shapes(self, batch_size):
    spec = self.spec
    shapes = lambda b: {
        'inputs': ((b, spec.max_source_len), np.int32),
        'targets': ((b, spec.max_target_len), np.int32),
    }
    return shapes(batch_size), shapes(spec.eval_batch_size or batch_size)


class ImageData(DataPipeline):
  """Labelled images (:mod:`contextpool_jax.data.image_input`)."""

  data_module = image_input

  def init_batch(self):
    s = self.spec.image_size
    return {'image': np.zeros((2, s, s, 3), np.float32), 'label': np.zeros((2,), np.int32)}

  def batch_shapes(self, batch_size):
    s, b = self.spec.image_size, self.spec.eval_batch_size
    shapes = lambda b: {'image': ((b, s, s, 3), np.float32), 'label': ((b,), np.int32)}
    return shapes(batch_size), {**shapes(b), 'mask': ((b,), np.bool_)}


# ----------------------------------------------------------------------------
# The kinds.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BleuSpec:
  """The BLEU evaluation of a translation run (top-level ``eval_bleu``, ``beam_size``,
  ``beam_alpha``, ``eval_bleu_batches``)."""

  enabled: bool = True
  beam_size: int = decoding.BEAM_SIZE
  alpha: float = decoding.BEAM_ALPHA
  max_batches: int = 0  # 0: the whole split


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """``config.task`` and the top-level fields its kind reads (:meth:`TaskKind.read`)."""

  kind: str  # a key of KINDS
  label_smoothing: float = 0.0  # translation, classification
  bleu: Optional[BleuSpec] = None  # translation


def _read_bleu(config: ml_collections.ConfigDict) -> BleuSpec:
  return BleuSpec(
      enabled=config_readers.read_bool(config, 'eval_bleu', default=BleuSpec.enabled),
      beam_size=config_readers.read_int(config, 'beam_size', minimum=1, default=BleuSpec.beam_size),
      alpha=config_readers.read_float(config, 'beam_alpha', lo=0.0, default=BleuSpec.alpha),
      max_batches=config_readers.read_int(
          config, 'eval_bleu_batches', default=BleuSpec.max_batches
      ),
  )


def _label_smoothing(config: ml_collections.ConfigDict) -> float:
  return config_readers.read_float(config, 'label_smoothing', lo=0.0, hi=1.0, default=0.0)


class TaskKind:
  """One kind of experiment: its data pipeline, objective, evaluators and hooks."""

  name: str
  pipeline: type[DataPipeline]

  def read(self, config: ml_collections.ConfigDict) -> TaskSpec:
    """The kind's own top-level fields (default: none)."""
    del config
    return TaskSpec(self.name)

  def read_data(self, config: ml_collections.ConfigDict) -> Any:
    """``config.dataset`` (and the top-level fields the data uses), by the kind's data module."""
    return self.pipeline.data_module.resolve_spec(config)

  def objective(self, spec: TaskSpec, data: Any, model: Optional[nn.Module]):
    """The objective; ``data``: the data spec."""
    raise NotImplementedError

  def evaluators(self, task: Task, devices: evaluators.Devices, splits) -> list:
    """The evaluators of a run, in the order they run: the objective's metrics per split."""
    return [evaluators.SplitMetrics(task, devices, split) for split in splits]

  def hooks(self, task: Task, devices: evaluators.Devices, log_pool_sizes: bool) -> list:
    """The log-step hooks: ContextPool's pooling sizes (logged when the model has
    ContextPool: :meth:`evaluators.PoolSizes.sows`)."""
    if not log_pool_sizes:
      return []
    probe = jax.jit(
        evaluators.make_pool_size_probe(task.model, task.objective),
        in_shardings=(devices.state_shardings, devices.data_sharding),
    )
    return [evaluators.PoolSizes(probe)]


class LanguageModelKind(TaskKind):
  name, pipeline = 'lm', LanguageModelData

  def objective(self, spec, data, model):
    return objectives.LanguageModelling()


class TranslationKind(TaskKind):
  name, pipeline = 'translation', TranslationData

  def read(self, config):
    return TaskSpec(self.name, label_smoothing=_label_smoothing(config), bleu=_read_bleu(config))

  def objective(self, spec, data, model):
    return objectives.Translation(label_smoothing=spec.label_smoothing)

  def evaluators(self, task, devices, splits):
    assert task.spec is not None and task.spec.bleu is not None  # a Task of make_task
    bleu = task.spec.bleu
    out = []
    for split in splits:
      out.append(evaluators.SplitMetrics(task, devices, split))
      if bleu.enabled:
        out.append(
            evaluators.Bleu(
                task,
                devices,
                split,
                beam_size=bleu.beam_size,
                alpha=bleu.alpha,
                max_batches=bleu.max_batches,
                max_len=task.data.spec.max_target_len,
            )
        )
    return out


class ClassificationKind(TaskKind):
  name, pipeline = 'classification', ImageData

  def read(self, config):
    return TaskSpec(self.name, label_smoothing=_label_smoothing(config))

  def objective(self, spec, data, model):
    mix = data
    num_classes = getattr(model, 'num_classes', None)
    assert num_classes is not None  # every classification model has the field
    return objectives.Classification(
        num_classes=num_classes,
        label_smoothing=spec.label_smoothing,
        mixup_alpha=mix.mixup_alpha,
        cutmix_alpha=mix.cutmix_alpha,
        mixup_switch_prob=mix.mixup_switch_prob,
    )


KINDS: dict[str, TaskKind] = {
    k.name: k for k in (LanguageModelKind(), TranslationKind(), ClassificationKind())
}


def read(config: ml_collections.ConfigDict) -> TaskSpec:
  """``config.task`` (ConfigError naming the kinds for an unknown one) and its kind's fields."""
  return KINDS[config_readers.read_choice(config, 'task', KINDS)].read(config)


@dataclasses.dataclass
class Task:
  """A model, its objective and its data, and the kind that built them: everything
  the loop is given."""

  model: nn.Module
  objective: objectives.Objective
  data: DataPipeline
  kind: Optional[TaskKind] = None
  spec: Optional[TaskSpec] = None

  def evaluators(self, devices: evaluators.Devices, splits) -> list:
    assert self.kind is not None  # a Task of make_task
    return self.kind.evaluators(self, devices, splits)

  def hooks(self, devices: evaluators.Devices, log_pool_sizes: bool) -> list:
    assert self.kind is not None  # a Task of make_task
    return self.kind.hooks(self, devices, log_pool_sizes)


def make_task(spec: TaskSpec, model: nn.Module, data: Any, workdir: str) -> Task:
  """The task of ``spec``: its kind's pipeline over ``data`` (the data spec) and its
  objective around ``model``."""
  kind = KINDS[spec.kind]
  pipeline = kind.pipeline(data, workdir)
  objective = kind.objective(spec, data, model)
  return Task(model=model, objective=objective, data=pipeline, kind=kind, spec=spec)


def make_objective(spec: TaskSpec, data: Any, model: Optional[nn.Module] = None):
  """The objective of ``spec`` (no data pipeline, no workdir)."""
  return KINDS[spec.kind].objective(spec, data, model)
