"""Losses and metrics, apart from the data that feeds them.

An :class:`Objective` turns a model's logits on a batch into a weighted loss
and metric sums. Every loss is a *sum* over the batch with a separate total
weight (tokens for language modelling and translation, examples for
classification), so gradient accumulation over micro-batches gives exactly the
gradient of the whole batch: the train step divides by the whole batch's
weight. Metric sums add up over batches, devices and processes; ``finalize``
turns the totals into the reported metrics. Objectives hold only their
settings (label smoothing, mixup), so the train step, the evaluators and the
benchmarks use the same ones without any data.

Batches: language modelling ``{'tokens' [b, n + 1], 'weights' [b, n]}``;
translation ``{'inputs' [b, ls], 'targets' [b, lt]}`` (0 = padding);
classification ``{'image' [b, h, w, 3], 'label' [b]}``, plus ``'mask' [b]``
(False = padding example) in evaluation batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from contextpool_jax.data import mixup

Array = jax.Array
Batch = dict[str, Any]


def cross_entropy(logits: Array, labels: Array, smoothing: float = 0.0) -> Array:
  """Per-position cross-entropy (nats), float32, optional label smoothing."""
  logits = logits.astype(jnp.float32)
  if smoothing == 0.0:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  onehot = jax.nn.one_hot(labels, logits.shape[-1])
  return optax.softmax_cross_entropy(logits, optax.smooth_labels(onehot, smoothing))


def _token_sums(
    logits: Array, labels: Array, w: Array, smoothing: float = 0.0
) -> tuple[Array, dict[str, Array]]:
  """``(trained loss sum, {'loss', 'accuracy', 'weight'} sums)`` over the
  token positions weighted by ``w [b, n]``; the trained loss has the label
  smoothing, the reported ``'loss'`` does not."""
  nll = cross_entropy(logits, labels)
  trained = nll if smoothing == 0.0 else cross_entropy(logits, labels, smoothing)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return jnp.sum(trained * w), {
      'loss': jnp.sum(nll * w),
      'accuracy': jnp.sum(correct * w),
      'weight': jnp.sum(w),
  }


def _token_means(sums: dict[str, float]) -> dict[str, float]:
  """Per-token mean loss (nats) and accuracy from :func:`_token_sums`' totals."""
  w = max(sums['weight'], 1e-9)
  return {'loss': sums['loss'] / w, 'accuracy': sums['accuracy'] / w}


class Objective:
  """Loss and metrics of one kind of experiment (see the module docstring)."""

  def model_args(self, batch: Batch) -> tuple:
    """The positional arguments of ``model.apply`` for a batch."""
    raise NotImplementedError

  def weight(self, batch: Batch) -> Array:
    """The batch's total weight (the denominator of the mean loss)."""
    raise NotImplementedError

  def loss(self, logits: Array, batch: Batch) -> tuple[Array, dict[str, Array]]:
    """``(loss_sum, metric_sums)`` of a training batch."""
    raise NotImplementedError

  def prepare_train_batch(self, batch: Batch, rng: Array) -> Batch:
    """On-device transformation of a training batch (mixup/cutmix); default none."""
    del rng
    return batch

  def eval_sums(self, logits: Array, batch: Batch) -> dict[str, Array]:
    """Metric sums of an evaluation batch (padding excluded); by default the
    metric sums of :meth:`loss`."""
    return self.loss(logits, batch)[1]

  def finalize(self, sums: dict[str, float]) -> dict[str, float]:
    """Reported metrics from the metric sums of a whole split."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class LanguageModelling(Objective):
  """Next-byte cross-entropy; BPC = nats / ln 2 (``weights`` select the scored bytes)."""

  def model_args(self, batch):
    return (batch['tokens'][:, :-1],)

  def weight(self, batch):
    return jnp.sum(batch['weights'])

  def loss(self, logits, batch):
    return _token_sums(logits, batch['tokens'][:, 1:], batch['weights'])

  def finalize(self, sums):
    means = _token_means(sums)
    return {**means, 'bpc': means['loss'] / math.log(2.0)}


@dataclasses.dataclass(frozen=True)
class Translation(Objective):
  """Target-token cross-entropy with label smoothing (trained on); the reported
  loss and perplexity are without smoothing."""

  label_smoothing: float = 0.0

  def model_args(self, batch):
    return (batch['inputs'], batch['targets'])

  def weight(self, batch):
    return jnp.sum(batch['targets'] != 0).astype(jnp.float32)

  def loss(self, logits, batch):
    targets = batch['targets']
    w = (targets != 0).astype(jnp.float32)
    return _token_sums(logits, targets, w, self.label_smoothing)

  def finalize(self, sums):
    means = _token_means(sums)
    return {**means, 'perplexity': math.exp(min(means['loss'], 50.0))}


@dataclasses.dataclass(frozen=True)
class Classification(Objective):
  """Softmax cross-entropy (label smoothing, on-device mixup/cutmix); top-1/top-5."""

  num_classes: int
  label_smoothing: float = 0.0
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  mixup_switch_prob: float = 0.5

  def model_args(self, batch):
    return (batch['image'],)

  def weight(self, batch):
    return jnp.asarray(batch['image'].shape[0], jnp.float32)

  def _targets(self, batch):
    if 'soft_label' in batch:
      return batch['soft_label']
    return jax.nn.one_hot(batch['label'], self.num_classes)

  def prepare_train_batch(self, batch, rng):
    if self.mixup_alpha <= 0 and self.cutmix_alpha <= 0:
      return batch
    onehot = jax.nn.one_hot(batch['label'], self.num_classes)
    images, soft = mixup.mixup_cutmix(
        rng,
        batch['image'],
        onehot,
        mixup_alpha=self.mixup_alpha,
        cutmix_alpha=self.cutmix_alpha,
        switch_prob=self.mixup_switch_prob,
    )
    return dict(batch, image=images, soft_label=soft)

  def loss(self, logits, batch):
    targets = optax.smooth_labels(self._targets(batch), self.label_smoothing)
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
    return {
        'loss': jnp.sum(ce * mask),
        'top1': jnp.sum((top5[:, 0] == labels) * mask),
        'top5': jnp.sum(jnp.any(top5 == labels[:, None], -1) * mask),
        'weight': jnp.sum(mask),
    }

  def finalize(self, sums):
    w = max(sums['weight'], 1e-9)
    return {'loss': sums['loss'] / w, 'top1': sums['top1'] / w, 'top5': sums['top5'] / w}
