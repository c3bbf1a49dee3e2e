"""Evaluators and log hooks: what the loop runs besides training.

The loop knows only the two interfaces:

* an :class:`Evaluator` runs every ``config.eval_every_steps`` steps (and at the
  end) and returns metrics for one split (``metrics.jsonl`` / TensorBoard
  prefix ``eval_<split>``): :class:`SplitMetrics` (the objective's metrics over
  a whole split, e.g. BPC, loss, top-1) for every ``config.eval_splits`` entry,
  and :class:`Bleu` for translation with ``config.eval_bleu``;
* a :class:`LogHook` runs at every log step: :class:`PoolSizes` (the
  ContextPool pooling sizes per layer, the paper's Fig. 4) with
  ``config.log_pool_sizes``, logging when the model has ContextPool.

Which of them a run gets is the task kind's decision (the registry,
:mod:`contextpool_jax.training.tasks`: ``Task.evaluators`` and ``Task.hooks``);
a new kind of evaluation is a class here and a line there, not a change to the loop.
Every evaluator is called by every process at the same point (they read
global values through :func:`sharding.fetch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

from flax import traverse_util
import jax
import numpy as np

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import bleu, sharding, steps

POOL_SIGMA = 'pool_sigma'  # what ContextPool sows: its pooling size per position


@dataclasses.dataclass(frozen=True)
class Devices:
  """Where evaluation runs: the jitted steps and the shardings the loop built."""

  state_shardings: Any
  data_sharding: Any
  eval_step_fn: Callable  # jit(steps.make_eval_step(...)): (state, batch) -> metric sums
  eval_step: Callable  # jit(summing(eval_step_fn))

  @property
  def replicated(self):
    return sharding.replicated(self.data_sharding.mesh)


class Evaluator(Protocol):
  split: str

  def __call__(self, state: steps.TrainState) -> dict[str, float]:
    ...


class LogHook(Protocol):

  def __call__(self, step: int, state: steps.TrainState, batch: dict, writer) -> None:
    ...


# ----------------------------------------------------------------------------
# Evaluators.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class SplitMetrics:
  """The objective's metrics over a whole split (metric sums on the devices)."""

  task: Any  # tasks.Task (model, objective, data)
  devices: Devices
  split: str

  def __call__(self, state):
    sums, in_flight = None, sharding.InFlight()
    for batch in self.task.data.eval_batches(self.split, jax.process_index(), jax.process_count()):
      batch = sharding.put_batch(batch, self.devices.data_sharding)
      if sums is None:
        sums = steps.zero_sums(self.devices.eval_step_fn, state, batch, self.devices.replicated)
      sums = self.devices.eval_step(state, batch, sums)
      in_flight.add(sums)
    if sums is None:
      raise ConfigError(
          f'config.eval_splits: split {self.split!r} produced no evaluation ' 'batches.'
      )
    return self.task.objective.finalize({k: float(v) for k, v in sharding.fetch(sums).items()})


@dataclasses.dataclass
class Bleu:
  """sacreBLEU of greedy or beam decoding of a whole split (translation)."""

  task: Any  # tasks.Task (model, objective, data)
  devices: Devices
  split: str
  beam_size: int
  alpha: float
  max_batches: int
  max_len: int  # decoded target tokens

  def __call__(self, state):
    data = self.task.data
    batches = data.eval_batches(self.split, jax.process_index(), jax.process_count())
    return bleu.decode_and_score(
        self.task.model,
        {'params': state.params},
        batches,
        data.vocab,
        beam_size=self.beam_size,
        alpha=self.alpha,
        max_len=self.max_len,
        max_batches=self.max_batches,
        data_sharding=self.devices.data_sharding,
    )


# ----------------------------------------------------------------------------
# Log hooks.
# ----------------------------------------------------------------------------


def make_pool_size_probe(model, objective):
  """``(state, batch) -> {layer: sigma [batch, ...]}``: the sown ContextPool
  pooling sizes of every layer on a batch."""

  def probe(state, batch):
    variables = {'params': state.params, **state.model_state}
    _, inter = model.apply(
        variables, *objective.model_args(batch), train=False, mutable=['intermediates']
    )
    flat: dict[str, Any] = traverse_util.flatten_dict(inter.get('intermediates', {}), sep='/')
    suffix = '/' + POOL_SIGMA
    return {k[: -len(suffix)]: val[0] for k, val in flat.items() if k.endswith(suffix)}

  return probe


@dataclasses.dataclass
class PoolSizes:
  """Histograms and means of ContextPool's pooling sizes per layer (Fig. 4), when the
  model has ContextPool (:meth:`sows`); otherwise the hook logs and compiles nothing."""

  probe: Callable  # jit(make_pool_size_probe(...)) with the loop's shardings
  sown: Optional[bool] = None  # sows(...) on the first call

  def sows(self, state, batch) -> bool:
    """Whether the built model sows pooling sizes: the probe traced abstractly
    (``jax.eval_shape``, nothing computed; its jitted call reuses this trace). Asks
    the module tree, not the config, so preset models (``cp_resnet44``,
    ``cp_vit_b16``, ...) count."""
    return bool(jax.eval_shape(self.probe, state, batch))

  def __call__(self, step, state, batch, writer):
    if self.sown is None:
      self.sown = self.sows(state, batch)
    if not self.sown:
      return
    sizes = sharding.fetch(self.probe(state, batch))
    writer.histograms(step, sizes, POOL_SIGMA)
    writer.scalars(step, {k: float(np.mean(s)) for k, s in sizes.items()}, f'{POOL_SIGMA}_mean')
