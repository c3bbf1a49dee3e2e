"""The small per-task pieces of the one training loop: loss, metrics, evaluation, data.

A task turns a batch into a weighted loss. Every loss is a *sum* over the
batch with a separate total weight (tokens for language modelling and
translation, examples for classification), so gradient accumulation over
micro-batches gives exactly the gradient of the whole batch: the trainer
divides by the whole batch's weight.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from contextpool_jax import models
from contextpool_jax.errors import ConfigError

TASKS = ('lm', 'translation', 'classification')


def _dtype(name: str):
  allowed = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}
  if name not in allowed:
    raise ConfigError(f'config.dtype={name!r} is not supported; allowed values: '
                     f"{', '.join(map(repr, allowed))}.")
  return allowed[name]


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """``models.create(config.model.name, **config.model minus name, dtype, remat)``."""
  overrides = config.model.to_dict()
  name = overrides.pop('name')
  overrides['dtype'] = _dtype(config.dtype)
  overrides['remat'] = bool(config.remat)
  return models.create(name, **overrides)


def cross_entropy(logits: jax.Array, labels: jax.Array, smoothing: float = 0.0) -> jax.Array:
  """Per-position cross-entropy (nats), float32, optional label smoothing."""
  logits = logits.astype(jnp.float32)
  if smoothing == 0.0:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  onehot = jax.nn.one_hot(labels, logits.shape[-1])
  return optax.softmax_cross_entropy(logits, optax.smooth_labels(onehot, smoothing))


class Task:
  """Base class: model, data and metrics of one kind of experiment."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config = config
    self.workdir = workdir
    self.model = build_model(config)

  # -- data ------------------------------------------------------------------
  def prepare(self) -> None:
    """Builds what the processes share through files (a dataset, a vocabulary).

    The trainer calls it on the first process only, before any process reads
    the data, so several processes never write the same files. Default: nothing.
    """

  def train_dataset(self, process_index: int, process_count: int):
    raise NotImplementedError

  def eval_batches(self, split: str, process_index: int, process_count: int) -> Iterable[dict]:
    raise NotImplementedError

  # -- model -----------------------------------------------------------------
  def init_batch(self) -> dict[str, np.ndarray]:
    """A small batch with the right dtypes and trailing shapes, for ``init``."""
    raise NotImplementedError

  def model_args(self, batch: dict) -> tuple:
    raise NotImplementedError

  def weight(self, batch: dict) -> jax.Array:
    """The total weight of a batch (the denominator of the mean loss)."""
    raise NotImplementedError

  def loss(self, logits: jax.Array, batch: dict, rng: Optional[jax.Array]
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(loss_sum, metric_sums)`` of a batch."""
    raise NotImplementedError

  def prepare_train_batch(self, batch: dict, rng: jax.Array) -> dict:
    """On-device transformation of a training batch (mixup/cutmix); default none."""
    del rng
    return batch

  def eval_sums(self, logits: jax.Array, batch: dict) -> dict[str, jax.Array]:
    raise NotImplementedError

  def finalize(self, sums: dict[str, float]) -> dict[str, float]:
    raise NotImplementedError

  def extra_evaluation(self, apply_fn, variables, split: str, data_sharding
                       ) -> dict[str, float]:
    """Metrics that need more than logits (BLEU); default none.

    Every process calls it with the same arguments; ``data_sharding`` splits
    batches over all devices of all processes (as the evaluation steps do).
    """
    return {}


class LanguageModelling(Task):
  """Character/byte LM: cross-entropy of the next byte; BPC = nats / ln 2."""

  def prepare(self):
    from contextpool_jax.data import lm_input
    lm_input.load_split(self.config, 'train')  # prepares every split

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import lm_input
    return lm_input.make_train_dataset(self.config, process_index=process_index,
                                       process_count=process_count)

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import lm_input
    return lm_input.make_eval_batches(self.config, split, process_index=process_index,
                                      process_count=process_count)

  def init_batch(self):
    n = self.config.dataset.seq_len
    return {'tokens': np.zeros((1, n + 1), np.int32), 'weights': np.ones((1, n), np.float32)}

  def model_args(self, batch):
    return (batch['tokens'][:, :-1],)

  def weight(self, batch):
    return jnp.sum(batch['weights'])

  def loss(self, logits, batch, rng):
    del rng
    labels, w = batch['tokens'][:, 1:], batch['weights']
    nll = cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return jnp.sum(nll * w), {'loss': jnp.sum(nll * w), 'accuracy': jnp.sum(correct * w),
                              'weight': jnp.sum(w)}

  def eval_sums(self, logits, batch):
    return self.loss(logits, batch, None)[1]

  def finalize(self, sums):
    w = max(sums['weight'], 1e-9)
    return {'loss': sums['loss'] / w, 'bpc': sums['loss'] / w / math.log(2.0),
            'accuracy': sums['accuracy'] / w}


class Translation(Task):
  """Sequence-to-sequence cross-entropy with label smoothing; BLEU by decoding."""

  def __init__(self, config, workdir):
    super().__init__(config, workdir)
    self._vocab = None

  @property
  def vocab(self):
    if self._vocab is None:
      from contextpool_jax.data import translation_input
      self._vocab = translation_input.get_vocab(self.config, self.workdir)
    return self._vocab

  def prepare(self):
    self.vocab  # trains the SentencePiece model into the workdir if it is not there

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import translation_input
    self.vocab  # trains/loads the SentencePiece model first
    return translation_input.make_train_dataset(self.config, process_index=process_index,
                                                process_count=process_count,
                                                workdir=self.workdir)

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import translation_input
    return translation_input.make_eval_batches(self.config, split, process_index=process_index,
                                               process_count=process_count,
                                               workdir=self.workdir)

  def init_batch(self):
    d = self.config.dataset
    return {'inputs': np.ones((1, d.max_source_len), np.int32),
            'targets': np.ones((1, d.max_target_len), np.int32)}

  def model_args(self, batch):
    return (batch['inputs'], batch['targets'])

  def weight(self, batch):
    return jnp.sum(batch['targets'] != 0).astype(jnp.float32)

  def loss(self, logits, batch, rng):
    del rng
    targets = batch['targets']
    w = (targets != 0).astype(jnp.float32)
    ce = cross_entropy(logits, targets, self.config.label_smoothing)
    nll = cross_entropy(logits, targets)
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
    return jnp.sum(ce * w), {'loss': jnp.sum(nll * w), 'accuracy': jnp.sum(correct * w),
                             'weight': jnp.sum(w)}

  def eval_sums(self, logits, batch):
    return self.loss(logits, batch, None)[1]

  def finalize(self, sums):
    w = max(sums['weight'], 1e-9)
    return {'loss': sums['loss'] / w, 'perplexity': math.exp(min(sums['loss'] / w, 50.0)),
            'accuracy': sums['accuracy'] / w}

  def extra_evaluation(self, apply_fn, variables, split, data_sharding):
    if not self.config.get('eval_bleu', True):
      return {}
    from contextpool_jax.training import bleu
    batches = self.eval_batches(split, jax.process_index(), jax.process_count())
    return bleu.decode_and_score(
        self.model, variables['params'], batches, self.vocab,
        beam_size=self.config.get('beam_size', 4), alpha=self.config.get('beam_alpha', 0.6),
        max_len=self.config.dataset.max_target_len,
        max_batches=self.config.get('eval_bleu_batches', 0), data_sharding=data_sharding)


class Classification(Task):
  """Image classification: softmax cross-entropy (label smoothing, mixup/cutmix); top-1/5."""

  def train_dataset(self, process_index, process_count):
    from contextpool_jax.data import image_input
    return image_input.make_train_dataset(self.config, process_index=process_index,
                                          process_count=process_count)

  def eval_batches(self, split, process_index, process_count):
    from contextpool_jax.data import image_input
    return image_input.make_eval_batches(self.config, split, process_index=process_index,
                                         process_count=process_count)

  def init_batch(self):
    s = self.config.dataset.image_size
    return {'image': np.zeros((2, s, s, 3), np.float32), 'label': np.zeros((2,), np.int32)}

  def model_args(self, batch):
    return (batch['image'],)

  def weight(self, batch):
    return jnp.asarray(batch['image'].shape[0], jnp.float32)

  def _targets(self, batch):
    if 'soft_label' in batch:
      return batch['soft_label']
    return jax.nn.one_hot(batch['label'], self.model.num_classes)

  def prepare_train_batch(self, batch, rng):
    d = self.config.dataset
    if d.get('mixup_alpha', 0.0) <= 0 and d.get('cutmix_alpha', 0.0) <= 0:
      return batch
    from contextpool_jax.data import image_input
    onehot = jax.nn.one_hot(batch['label'], self.model.num_classes)
    images, soft = image_input.mixup_cutmix(
        rng, batch['image'], onehot, mixup_alpha=d.get('mixup_alpha', 0.0),
        cutmix_alpha=d.get('cutmix_alpha', 0.0), switch_prob=d.get('mixup_switch_prob', 0.5))
    return dict(batch, image=images, soft_label=soft)

  def loss(self, logits, batch, rng):
    del rng
    targets = optax.smooth_labels(self._targets(batch), self.config.label_smoothing)
    ce = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)
    hard = jnp.argmax(self._targets(batch), -1)
    correct = (jnp.argmax(logits, -1) == hard).astype(jnp.float32)
    n = jnp.asarray(logits.shape[0], jnp.float32)
    return jnp.sum(ce), {'loss': jnp.sum(ce), 'accuracy': jnp.sum(correct), 'weight': n}

  def eval_sums(self, logits, batch):
    mask = batch.get('mask', jnp.ones(logits.shape[:1], bool)).astype(jnp.float32)
    labels = batch['label']
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
    return {'loss': jnp.sum(ce * mask),
            'top1': jnp.sum((top5[:, 0] == labels) * mask),
            'top5': jnp.sum(jnp.any(top5 == labels[:, None], -1) * mask),
            'weight': jnp.sum(mask)}

  def finalize(self, sums):
    w = max(sums['weight'], 1e-9)
    return {'loss': sums['loss'] / w, 'top1': sums['top1'] / w, 'top5': sums['top5'] / w}


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  classes = {'lm': LanguageModelling, 'translation': Translation,
             'classification': Classification}
  if config.task not in classes:
    raise ConfigError(f'config.task={config.task!r} is not supported; allowed values: '
                     f"{', '.join(map(repr, classes))}.")
  return classes[config.task](config, workdir)
