r"""A config's training and evaluation steps compiled for a TPU slice you do not have: what
the compile command (``contextpool-compile``, :mod:`contextpool_jax.commands.compile`) runs.

Builds what ``train.py`` would run (the same model, optimizer state, mesh, sharding
of the parameters, remat policy and dtype: ``programs.py``, which the trainer
uses too) on abstract arrays (nothing is allocated or prepared: no dataset is
read), lowers the train and evaluation steps for the abstract devices of a TPU
topology (``jax.experimental.topologies``, from libtpu: ``pip install
'contextpool-jax[tpu]'``) and compiles them with the TPU compiler. Prints per
chip, for each step: its arguments, temporaries and outputs against the chip's
HBM, its FLOPs, and a lower bound on its time, the larger of FLOPs / peak FLOP/s
and bytes accessed / HBM bandwidth (:data:`CHIPS`, from the Cloud TPU pages).
A step the TPU compiler refuses for memory gets one message with the numbers and
the settings that change them (:data:`MEMORY_SETTINGS`).

Topologies, by either name (:func:`parse_topology`): libtpu's ``<chip>:<shape>``
(``v4:2x2x2``, ``v5e:4x4``, ``v5p:2x2x1``, ``v6e:2x2``) or a Cloud accelerator
type (``v5litepod-16``, ``v5e-16``, ``v6e-8``: chips; ``v4-32``, ``v5p-8``:
TensorCores, two per chip). One device per chip (v4 and v5p as megacore, as JAX
shows them on a Cloud TPU VM).

The bound is a floor, not a prediction: it assumes every FLOP at peak and every
byte at full bandwidth, without overlap losses, collectives or the host.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from typing import Any, Optional

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip's figures (per chip, bf16 peak), from ``source``."""

  hbm_bytes: int
  peak_flops: float
  hbm_bytes_per_second: float
  source: str
  dims: int  # of the slice's shape: 2 (v5e, v6e) or 3 (v4, v5p)
  cores_per_chip: int  # in the Cloud accelerator type's number


CHIPS = {
    'v4': Chip(32 * GIB, 275e12, 1200e9, 'https://cloud.google.com/tpu/docs/v4', 3, 2),
    'v5e': Chip(16 * GIB, 197e12, 819e9, 'https://cloud.google.com/tpu/docs/v5e', 2, 1),
    'v5p': Chip(95 * 10**9, 459e12, 2765e9, 'https://cloud.google.com/tpu/docs/v5p', 3, 2),
    'v6e': Chip(32 * 10**9, 918e12, 1638e9, 'https://cloud.google.com/tpu/docs/v6e', 2, 1),
}
# Cloud accelerator type prefixes -> chip (v5litepod is v5e's Cloud name).
_CLOUD_NAMES = {'v4': 'v4', 'v5litepod': 'v5e', 'v5e': 'v5e', 'v5p': 'v5p', 'v6e': 'v6e'}
ACCEPTED = (
    "libtpu's <chip>:<shape> (v4:2x2x2, v5e:4x4, v5p:2x2x1, v6e:2x2) or a Cloud accelerator"
    ' type (v5litepod-16, v5e-16, v6e-8: chips; v4-32, v5p-8: TensorCores, two per chip),'
    f' chip one of {sorted(CHIPS)}'
)
STEPS = ('train', 'eval')  # --steps
STEP_NAMES = {'train': 'train step', 'eval': 'evaluation step'}
# What changes a step's memory, per step, for the message of a step that does not fit.
_ATTENTION = (
    '--config.model.attention_implementation=pallas_tpu (attention memory linear in length)'
)
_SLICE = 'a larger slice (--topology), for fsdp and fewer rows per chip'
MEMORY_SETTINGS = {
    'train': (
        '--config.batch_size (the activations scale with it)',
        "--config.model.remat ('full': keep only each layer's input for the backward pass)",
        '--config.param_sharding=fsdp (parameters and optimizer state split over the chips)',
        _ATTENTION,
        _SLICE,
    ),
    'eval': (
        '--config.dataset.eval_batch_size (the activations scale with it)',
        '--config.param_sharding=fsdp (parameters split over the chips)',
        _ATTENTION,
        _SLICE,
    ),
}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str  # libtpu's, e.g. 'v5e:4x4'
  chip_name: str
  shape: tuple[int, ...]

  @property
  def chip(self) -> Chip:
    return CHIPS[self.chip_name]

  @property
  def chips(self) -> int:
    return math.prod(self.shape)


def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
  """The shape Cloud TPU gives ``chips`` chips: from 2x2(x1), doubling the smallest
  axis, the last of equals first (2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...; 2x2, 2x4, 4x4,
  4x8, ...); one chip is 1x1(x1)."""
  if chips == 1:
    return (1,) * dims
  shape = [2, 2] + [1] * (dims - 2)
  if chips < 4 or chips & (chips - 1):
    raise ValueError(f'{chips} chips: a slice of more than one chip has 4, 8, 16, ... chips')
  while math.prod(shape) < chips:
    smallest = min(shape)
    axis = max(i for i, n in enumerate(shape) if n == smallest)
    shape[axis] *= 2
  return tuple(shape)


def parse_topology(name: str) -> Topology:
  """A :class:`Topology` from libtpu's name or a Cloud accelerator type (:data:`ACCEPTED`);
  ValueError naming the value and what is accepted."""
  text = name.strip().lower()
  libtpu = re.fullmatch(r'(v\w+):(\d+(?:x\d+)+)', text)
  cloud = re.fullmatch(r'(v\w+)-(\d+)', text)
  try:
    if libtpu and libtpu.group(1) in CHIPS:
      chip_name = libtpu.group(1)
      shape = tuple(int(n) for n in libtpu.group(2).split('x'))
      if len(shape) != CHIPS[chip_name].dims or min(shape) < 1:
        raise ValueError(f'{chip_name} slices have {CHIPS[chip_name].dims} axes')
    elif cloud and cloud.group(1) in _CLOUD_NAMES:
      chip_name = _CLOUD_NAMES[cloud.group(1)]
      chip = CHIPS[chip_name]
      count = int(cloud.group(2))
      if count % chip.cores_per_chip:
        raise ValueError(f'{count} TensorCores is not a whole number of {chip_name} chips')
      shape = slice_shape(count // chip.cores_per_chip, chip.dims)
    else:
      raise ValueError('not a topology name')
  except ValueError as e:
    raise ValueError(f'--topology={name!r}: {e}; expected {ACCEPTED}.') from None
  return Topology(f'{chip_name}:{"x".join(map(str, shape))}', chip_name, shape)


def libtpu_missing() -> Optional[str]:
  """The one-line message when libtpu is not installed, else None."""
  if importlib.util.find_spec('libtpu') is None:
    return (
        "compiling for a TPU needs libtpu: pip install 'contextpool-jax[tpu]'"
        ' (jax[tpu]; it runs on any machine, no TPU needed).'
    )
  return None


def libtpu_as_compiler() -> None:
  """Sets up libtpu to compile only, before JAX's first backend call: JAX runs on the CPU
  (on a TPU VM too: the command never takes the chips a training run may hold); libtpu
  skips its one-process lock file (several compiles may run at once, beside a run) and
  the TPU VM metadata it would look for (and log errors about) at start-up."""
  if not os.environ.get('JAX_PLATFORMS'):  # read by jax at import: set the option itself
    import jax  # pylint: disable=g-import-not-at-top

    jax.config.update('jax_platforms', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-1')
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')


def tpu_devices(topology: Topology) -> list:
  """The abstract devices of ``topology`` (libtpu; nothing is allocated)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  # Up to 2x2 chips per host, as on a Cloud TPU VM (fewer in a smaller slice); v4 and
  # v5p as megacore: one device per chip.
  shape = topology.shape + (1,) * (3 - len(topology.shape))
  options: dict[str, Any] = dict(
      chips_per_host_bounds=tuple(min(b, n) for b, n in zip((2, 2, 1), shape))
  )
  if topology.chip.dims == 3:
    options['chip_config_name'] = 'megacore'
  description = topologies.get_topology_desc(topology_name=topology.name, platform='tpu', **options)
  return list(description.devices)


@dataclasses.dataclass
class StepCost:
  """One compiled step, per chip: bytes of its arguments, temporaries, outputs
  (and of outputs that alias arguments: a donated state), FLOPs, bytes accessed."""

  name: str
  arguments: int
  temporaries: int
  outputs: int
  aliased: int
  flops: float
  bytes_accessed: float

  @property
  def peak_bytes(self) -> int:
    return self.arguments + self.temporaries + self.outputs - self.aliased

  def bound_seconds(self, chip: Chip) -> float:
    return max(self.flops / chip.peak_flops, self.bytes_accessed / chip.hbm_bytes_per_second)


def step_cost(name: str, compiled) -> StepCost:
  """The :class:`StepCost` of a compiled program (``jit(...).lower(...).compile()``)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return StepCost(
      name=name,
      arguments=int(memory.argument_size_in_bytes),
      temporaries=int(memory.temp_size_in_bytes),
      outputs=int(memory.output_size_in_bytes),
      aliased=int(memory.alias_size_in_bytes),
      flops=float(cost.get('flops', 0.0)),
      bytes_accessed=float(cost.get('bytes accessed', 0.0)),
  )


class DoesNotFit(Exception):
  """A step the TPU compiler refused for memory; the message says what to change."""


def _gib(n: float) -> str:
  if n >= GIB:
    return f'{n / GIB:.2f} GiB'
  return f'{n / 2**20:.1f} MiB' if n >= 2**20 else f'{n:,} B'


def _seconds(t: float) -> str:
  return f'{t:.3g} s' if t >= 1 else f'{1e3 * t:.3g} ms'


def does_not_fit_message(step: str, topology: Topology, error: str) -> str:
  """One message for ``step`` (``'train'`` or ``'eval'``): the compiler's own numbers and
  the settings that change them."""
  found = re.search(r'(Ran out of memory[^\n]*|exceeds? [^\n]*|RESOURCE_EXHAUSTED[^\n]*)', error)
  detail = found.group(1).split('. HLO module')[0].strip() if found else error.strip()[:300]
  return (
      f'The {STEP_NAMES[step]} does not fit one {topology.chip_name} chip of {topology.name}'
      f' ({_gib(topology.chip.hbm_bytes)} of HBM): {detail}. What changes it: '
      + '; '.join(MEMORY_SETTINGS[step])
      + '.'
  )


def compile_config(
    config, topology: Topology, which: tuple[str, ...] = STEPS, unrolled_flops: bool = True
) -> list[StepCost]:
  """The train and evaluation steps of ``config`` (those of ``which``) compiled for
  ``topology``; their :class:`StepCost` s. Raises :class:`DoesNotFit` for a step the compiler refuses
  for memory, and the config's own errors (as ``train.py`` would) before compiling.

  XLA's cost analysis counts a loop's body once, so a model whose layers are one
  ``nn.scan`` (``scan_layers=True``) would report one layer's FLOPs: its FLOPs and
  bytes accessed are those of its unrolled twin (``scan_layers=False``, the same
  computation; compiled a second time, for the counts only), its memory the scanned
  program's (the one that runs). ``unrolled_flops=False`` skips the twin: one compile,
  the memory exact, a scanned model's FLOPs one layer's."""
  from contextpool_jax.training import spec  # pylint: disable=g-import-not-at-top

  specs = spec.read(config)
  costs = _compile_steps(specs, topology, which)
  if not (unrolled_flops and getattr(specs.model, 'scan_layers', False)):
    return costs
  unrolled = dataclasses.replace(specs, model=specs.model.clone(scan_layers=False))
  counted = _compile_steps(unrolled, topology, which)
  return [
      dataclasses.replace(c, flops=u.flops, bytes_accessed=u.bytes_accessed)
      for c, u in zip(costs, counted)
  ]


def _compile_steps(specs, topology: Topology, which: tuple[str, ...]) -> list[StepCost]:
  """:func:`compile_config`'s steps for read ``specs`` (``training.spec.Specs``)."""
  import jax  # pylint: disable=g-import-not-at-top

  from contextpool_jax.training import optim, programs, sharding, steps, tasks  # pylint: disable=g-import-not-at-top

  run = specs.run
  devices = tpu_devices(topology)
  task = tasks.make_task(specs.task, specs.model, specs.data, '')
  tx, schedule = optim.make_optimizer(specs.optimizer, run.num_train_steps)
  mesh = sharding.make_mesh(devices)
  init_rng, train_rng = jax.random.split(jax.random.key(run.seed))
  init_fn = programs.make_init_fn(task, tx, run)
  abstract = programs.abstract_state(init_fn, init_rng)
  shardings = sharding.state_shardings(abstract, mesh, run.param_sharding)
  state = programs.with_shardings(abstract, shardings)
  built = programs.make_programs(task, run, tx, schedule, train_rng, shardings, mesh)
  train_batch, eval_batch = programs.abstract_batches(task, run, sharding.batch_sharding(mesh))
  replicated = sharding.replicated(mesh)
  costs = []
  for key, name, step_fn, step, batch in (
      ('train', STEP_NAMES['train'], built.train_step_fn, built.train_step, train_batch),
      ('eval', STEP_NAMES['eval'], built.eval_step_fn, built.eval_step, eval_batch),
  ):
    if key not in which:
      continue
    sums = steps.abstract_sums(step_fn, state, batch, replicated)
    try:
      compiled = step.lower(state, batch, sums).compile()
    except Exception as e:  # pylint: disable=broad-except  # the compiler's memory refusal
      text = str(e)
      if 'RESOURCE_EXHAUSTED' in text or 'Ran out of memory' in text:
        raise DoesNotFit(does_not_fit_message(key, topology, text)) from None
      raise
    costs.append(step_cost(name, compiled))
  return costs


def report(topology: Topology, costs: list[StepCost], batch_size: int) -> str:
  """The table the command prints: per chip, per step."""
  chip = topology.chip
  lines = [
      f'{topology.name}: {topology.chips} chip(s); per chip {_gib(chip.hbm_bytes)} HBM,'
      f' {chip.peak_flops / 1e12:g} TFLOP/s bf16 peak, {chip.hbm_bytes_per_second / 1e9:g} GB/s'
      f' HBM ({chip.source}); global batch {batch_size}.',
      '',
      '| step (per chip) | arguments | temporaries | outputs | peak (of HBM) | GFLOPs | bound |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for c in costs:
    lines.append(
        f'| {c.name} | {_gib(c.arguments)} | {_gib(c.temporaries)} | {_gib(c.outputs)}'
        f' | {_gib(c.peak_bytes)} ({c.peak_bytes / chip.hbm_bytes:.1%}) | {c.flops / 1e9:,.1f}'
        f' | {_seconds(c.bound_seconds(chip))} |'
    )
  lines += [
      '',
      'peak = arguments + temporaries + outputs - donated; bound = max(FLOPs / peak FLOP/s,'
      ' bytes accessed / HBM bandwidth), a floor on the step time.',
  ]
  return '\n'.join(lines)
