r"""A config's training and evaluation steps compiled for accelerators you do not have: what
the compile command (``contextpool-compile``, :mod:`contextpool_jax.commands.compile`) runs.

Builds what ``train.py`` would run (the same model, optimizer state, mesh, sharding
of the parameters, remat policy and dtype: ``programs.py``, which the trainer
uses too) on abstract arrays (nothing is allocated or prepared: no dataset is
read), lowers the train and evaluation steps for the abstract devices of a TPU
slice or of NVIDIA GPUs (``jax.experimental.topologies``) and compiles them with
that platform's compiler. Prints per chip (or GPU), for each step: its arguments,
temporaries and outputs against its memory, its FLOPs, and a lower bound on its
time (:data:`CHIPS`, from the vendors' pages). A step that does not fit gets one
message with the numbers and the settings that change them (:func:`memory_settings`).

Topologies, by name (:func:`parse_topology`):

* **TPU** (libtpu: ``pip install 'contextpool-jax[tpu]'``): libtpu's
  ``<chip>:<shape>`` (``v4:2x2x2``, ``v5e:4x4``, ``v5p:2x2x1``, ``v6e:2x2``) or a
  Cloud accelerator type (``v5litepod-16``, ``v5e-16``, ``v6e-8``: chips; ``v4-32``,
  ``v5p-8``: TensorCores, two per chip). One device per chip (v4 and v5p as
  megacore, as JAX shows them on a Cloud TPU VM). The TPU compiler refuses a step
  that does not fit: it decides, whatever the reported memory says
  (:class:`StepCost`). Bound: max(FLOPs / peak FLOP/s, bytes accessed / HBM
  bandwidth), both counted by the TPU compiler.
* **NVIDIA GPU** (the CUDA plugin without CUDA's libraries: ``pip install
  'contextpool-jax[gpu-compile]'``): ``<gpu>[:<count>]`` (``h100``, ``h100:8``,
  ``a100:16``), eight GPUs a host. XLA's GPU compiler gets the GPU's description
  (:meth:`Gpu.target_config`) and compiles without one. It neither refuses a step
  for memory nor counts FLOPs, so: a step fits when its peak (both measures of
  :class:`StepCost`) is within the share of the GPU's memory that JAX allocates
  by default (:data:`GPU_MEMORY_FRACTION`);
  its FLOPs are those of the same step lowered for one CPU device (XLA's count of
  the program before optimization: the FLOPs do not depend on the device), split
  evenly over the GPUs; the bound is FLOPs / peak FLOP/s alone (no count of bytes
  after fusion). The command compiles XLA's attention: cuDNN's
  (``attention_implementation='cudnn'``) is traced only in a process that runs on a
  GPU with cuDNN (JAX looks cuDNN up as it traces), and the command runs JAX on the CPU.

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
class Gpu:
  """What XLA's GPU compiler needs to know of an NVIDIA GPU (its ``GpuTargetConfig``,
  given as text to ``jax.experimental.topologies``): NVIDIA's figures for the part."""

  compute_capability: tuple[int, int]
  cores: int  # streaming multiprocessors
  clock_ghz: float  # boost clock
  shared_memory_per_core: int  # bytes per multiprocessor
  shared_memory_per_block_optin: int  # bytes a block may opt in to
  l2_bytes: int
  name: str  # as CUDA reports the device

  def target_config(self, chip: Chip) -> str:
    """The ``GpuTargetConfigProto`` text of this GPU with ``chip``'s memory."""
    major, minor = self.compute_capability
    info = {
        'threads_per_block_limit': 1024,
        'threads_per_warp': 32,
        'shared_memory_per_block': 48 * 1024,
        'shared_memory_per_core': self.shared_memory_per_core,
        'threads_per_core_limit': 2048,
        'core_count': self.cores,
        'fpus_per_core': 128 if major >= 9 else 64,
        'block_dim_limit_x': 2**31 - 1,
        'block_dim_limit_y': 65535,
        'block_dim_limit_z': 65535,
        'memory_bandwidth': int(chip.hbm_bytes_per_second),
        'l2_cache_size': self.l2_bytes,
        'clock_rate_ghz': self.clock_ghz,
        'device_memory_size': chip.hbm_bytes,
        'shared_memory_per_block_optin': self.shared_memory_per_block_optin,
        'registers_per_core_limit': 65536,
        'registers_per_block_limit': 65536,
    }
    fields = ' '.join(f'{k}: {v}' for k, v in info.items())
    return (
        f'gpu_device_info {{ {fields} cuda_compute_capability {{ major: {major} minor: {minor} }} }}'
        f' platform_name: "CUDA" device_description_str: "{self.name}"'
    )


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator's figures (per chip or GPU, bf16 dense peak), from ``source``."""

  hbm_bytes: int
  peak_flops: float
  hbm_bytes_per_second: float
  source: str
  dims: int  # of a TPU slice's shape: 2 (v5e, v6e) or 3 (v4, v5p); 1 for GPUs
  cores_per_chip: int  # in the Cloud accelerator type's number
  gpu: Optional[Gpu] = None  # an NVIDIA GPU's description for XLA; None for a TPU

  @property
  def platform(self) -> str:
    return 'tpu' if self.gpu is None else 'cuda'

  @property
  def unit(self) -> str:
    return 'chip' if self.gpu is None else 'GPU'

  @property
  def usable_bytes(self) -> int:
    """The memory a step may use: a TPU's HBM (its compiler says what it reserves),
    a GPU's share that JAX allocates by default (:data:`GPU_MEMORY_FRACTION`)."""
    if self.gpu is None:
      return self.hbm_bytes
    return int(GPU_MEMORY_FRACTION * self.hbm_bytes)


# JAX preallocates this share of a GPU's memory for its arrays and programs
# (XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75: JAX's "GPU memory allocation" page).
GPU_MEMORY_FRACTION = 0.75
_NVIDIA = 'https://www.nvidia.com/en-us/data-center'
CHIPS = {
    'v4': Chip(32 * GIB, 275e12, 1200e9, 'https://cloud.google.com/tpu/docs/v4', 3, 2),
    'v5e': Chip(16 * GIB, 197e12, 819e9, 'https://cloud.google.com/tpu/docs/v5e', 2, 1),
    'v5p': Chip(95 * 10**9, 459e12, 2765e9, 'https://cloud.google.com/tpu/docs/v5p', 3, 2),
    'v6e': Chip(32 * 10**9, 918e12, 1638e9, 'https://cloud.google.com/tpu/docs/v6e', 2, 1),
    # SXM parts; dense bf16 (the pages' Tensor Core figures are with sparsity, twice these).
    'a100': Chip(
        80 * GIB,
        312e12,
        2039e9,
        f'{_NVIDIA}/a100/',
        1,
        1,
        Gpu((8, 0), 108, 1.41, 164 * 1024, 163 * 1024, 40 * 2**20, 'NVIDIA A100-SXM4-80GB'),
    ),
    'h100': Chip(
        80 * GIB,
        989e12,
        3350e9,
        f'{_NVIDIA}/h100/',
        1,
        1,
        Gpu((9, 0), 132, 1.98, 228 * 1024, 227 * 1024, 50 * 2**20, 'NVIDIA H100 80GB HBM3'),
    ),
    'h200': Chip(
        141 * 10**9,
        989e12,
        4800e9,
        f'{_NVIDIA}/h200/',
        1,
        1,
        Gpu((9, 0), 132, 1.98, 228 * 1024, 227 * 1024, 50 * 2**20, 'NVIDIA H200'),
    ),
}
TPUS = tuple(name for name, chip in CHIPS.items() if chip.gpu is None)
GPUS = tuple(name for name, chip in CHIPS.items() if chip.gpu is not None)
GPUS_PER_HOST = 8
# JAX's CUDA plugins (jax[cuda12] or jax[cuda13] on a GPU machine; [gpu-compile] elsewhere).
CUDA_PLUGINS = ('jax_plugins.xla_cuda12', 'jax_plugins.xla_cuda13')
# Cloud accelerator type prefixes -> chip (v5litepod is v5e's Cloud name).
_CLOUD_NAMES = {'v4': 'v4', 'v5litepod': 'v5e', 'v5e': 'v5e', 'v5p': 'v5p', 'v6e': 'v6e'}
ACCEPTED = (
    "a TPU slice by libtpu's <chip>:<shape> (v4:2x2x2, v5e:4x4, v5p:2x2x1, v6e:2x2) or a Cloud"
    ' accelerator type (v5litepod-16, v5e-16, v6e-8: chips; v4-32, v5p-8: TensorCores, two per'
    f' chip), chip one of {list(TPUS)}; or NVIDIA GPUs as <gpu>[:<count>] (h100, h100:8,'
    f' a100:16; {GPUS_PER_HOST} a host), gpu one of {list(GPUS)}'
)
STEPS = ('train', 'eval')  # --steps
STEP_NAMES = {'train': 'train step', 'eval': 'evaluation step'}
# What changes a step's memory, per step and platform, for the message of a step that
# does not fit.
_BATCH = {
    'train': '--config.batch_size (the activations scale with it)',
    'eval': '--config.dataset.eval_batch_size (the activations scale with it)',
}
_REMAT = "--config.model.remat ('full': keep only each layer's input for the backward pass)"
_FSDP = {
    'train': '--config.param_sharding=fsdp (parameters and optimizer state split over the {units})',
    'eval': '--config.param_sharding=fsdp (parameters split over the {units})',
}
_PLATFORM_SETTINGS = {
    'tpu': (
        '--config.model.attention_implementation=pallas_tpu (attention memory linear in length)',
        'a larger slice (--topology), for fsdp and fewer rows per chip',
    ),
    'cuda': (
        "--config.model.attention_implementation=cudnn (cuDNN's fused attention, memory linear"
        ' in length: on the GPUs, where cuDNN is; this command compiles XLA attention)',
        f'XLA_PYTHON_CLIENT_MEM_FRACTION (JAX allocates {GPU_MEMORY_FRACTION:.0%} of the GPU'
        ' by default; up to about 0.95)',
        'more GPUs (--topology), for fsdp and fewer rows per GPU',
    ),
}


def memory_settings(step: str, chip: Chip) -> tuple[str, ...]:
  """The settings that change ``step``'s memory (``'train'`` or ``'eval'``) on ``chip``."""
  fsdp = _FSDP[step].format(units=f'{chip.unit}s')
  remat = (_REMAT,) if step == 'train' else ()
  return (_BATCH[step], *remat, fsdp, *_PLATFORM_SETTINGS[chip.platform])


@dataclasses.dataclass(frozen=True)
class Topology:
  """A TPU slice (``shape``: chips along its axes) or NVIDIA GPUs (``shape``: ``(count,)``)."""

  name: str  # libtpu's (v5e:4x4) or <gpu>:<count> (h100:8)
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
  """A :class:`Topology` from libtpu's name, a Cloud accelerator type or ``<gpu>[:<count>]``
  (:data:`ACCEPTED`); ValueError naming the value and what is accepted."""
  text = name.strip().lower()
  libtpu = re.fullmatch(r'(v\w+):(\d+(?:x\d+)+)', text)
  cloud = re.fullmatch(r'(v\w+)-(\d+)', text)
  gpus = re.fullmatch(r'([a-z]\d+)(?::(\d+))?', text)
  try:
    if gpus and gpus.group(1) in GPUS:
      chip_name, count = gpus.group(1), int(gpus.group(2) or 1)
      if count < 1 or (count > GPUS_PER_HOST and count % GPUS_PER_HOST):
        raise ValueError(
            f'{count} GPUs: 1 to {GPUS_PER_HOST} on one host, or whole hosts of {GPUS_PER_HOST}'
        )
      return Topology(f'{chip_name}:{count}', chip_name, (count,))
    if libtpu and libtpu.group(1) in TPUS:
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


def compiler_missing(topology: Topology) -> Optional[str]:
  """The one-line message when the compiler for ``topology`` is not installed, else None."""
  if topology.chip.platform == 'tpu' and importlib.util.find_spec('libtpu') is None:
    return (
        "compiling for a TPU needs libtpu: pip install 'contextpool-jax[tpu]'"
        ' (jax[tpu]; it runs on any machine, no TPU needed).'
    )
  if topology.chip.platform == 'cuda' and not any(map(importlib.util.find_spec, CUDA_PLUGINS)):
    return (
        "compiling for an NVIDIA GPU needs JAX's CUDA plugin: pip install"
        " 'contextpool-jax[gpu-compile]' (jax[cuda12-local]; it runs on any machine, no GPU"
        ' or CUDA needed).'
    )
  return None


def compile_only() -> None:
  """Sets JAX up to compile for other accelerators, before its first backend call: JAX
  runs on the CPU (on a TPU VM or a GPU machine too: the command never takes the
  devices a training run may hold, and the CUDA plugin is not started); libtpu skips
  its one-process lock file (several compiles may run at once, beside a run) and the
  TPU VM metadata it would look for (and log errors about) at start-up."""
  if not os.environ.get('JAX_PLATFORMS'):  # read by jax at import: set the option itself
    import jax  # pylint: disable=g-import-not-at-top

    jax.config.update('jax_platforms', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-1')
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')


def devices(topology: Topology) -> list:
  """The abstract devices of ``topology`` (libtpu or the CUDA plugin; nothing is allocated)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  chip = topology.chip
  if chip.gpu is not None:
    (count,) = topology.shape
    per_host = min(count, GPUS_PER_HOST)
    description = topologies.get_topology_desc(
        topology_name='cuda',
        platform='cuda',
        topology=f'1x{count // per_host}x{per_host}',  # slices x hosts x GPUs a host
        target_config=chip.gpu.target_config(chip),
    )
    return list(description.devices)
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
  """One compiled step, per chip (or GPU): bytes of its arguments, temporaries, outputs
  (and of outputs that alias arguments: a donated state), FLOPs, bytes accessed (None
  where the compiler does not count them: a GPU program), and the compiler's own peak.

  Two measures of the step's memory, which can differ either way: :attr:`peak_bytes`,
  arguments + temporaries + outputs - donated, and ``compiler_peak``, the peak of the
  compiler's buffer assignment (``memory_analysis().peak_memory_in_bytes``; on TPU with
  the layout's padding; None where the compiler gives none). On GPU the two agree to
  about 1%. On TPU the small models of the tests and the default config have compiler's
  peaks 0.77-1.9x their sums, and LambdaResNet-50's train step on v5e:2x4 at batch 1,024 a sum of 20.29 GiB,
  over the chip, that the TPU compiler accepts, its peak 15.24 GiB (docs/compile.md)."""

  name: str
  arguments: int
  temporaries: int
  outputs: int
  aliased: int
  flops: float
  bytes_accessed: Optional[float]
  compiler_peak: Optional[int] = None

  @property
  def peak_bytes(self) -> int:
    return self.arguments + self.temporaries + self.outputs - self.aliased

  @property
  def most_bytes(self) -> int:
    """The larger of the two measures: what a GPU step must fit in."""
    return max(self.peak_bytes, self.compiler_peak or 0)

  def bound_seconds(self, chip: Chip) -> float:
    compute = self.flops / chip.peak_flops
    if self.bytes_accessed is None:
      return compute
    return max(compute, self.bytes_accessed / chip.hbm_bytes_per_second)


def _cost_dict(cost) -> dict:
  """``cost_analysis()``'s dict (some versions return a list of one), or {} for None."""
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return dict(cost or {})


def step_cost(name: str, compiled) -> StepCost:
  """The :class:`StepCost` of a compiled program (``jit(...).lower(...).compile()``);
  FLOPs 0 and bytes accessed None where the compiler counts none (a GPU program)."""
  memory = compiled.memory_analysis()
  cost = _cost_dict(compiled.cost_analysis())
  return StepCost(
      name=name,
      arguments=int(memory.argument_size_in_bytes),
      temporaries=int(memory.temp_size_in_bytes),
      outputs=int(memory.output_size_in_bytes),
      aliased=int(memory.alias_size_in_bytes),
      flops=float(cost.get('flops', 0.0)),
      bytes_accessed=float(cost['bytes accessed']) if 'bytes accessed' in cost else None,
      compiler_peak=int(memory.peak_memory_in_bytes) or None,  # 0: the compiler gave none
  )


class DoesNotFit(Exception):
  """A step that does not fit (refused by the TPU compiler, or over a GPU's usable
  memory); the message says what to change."""


def _gib(n: float) -> str:
  if n >= GIB:
    return f'{n / GIB:.2f} GiB'
  return f'{n / 2**20:.1f} MiB' if n >= 2**20 else f'{n:,} B'


def _seconds(t: float) -> str:
  return f'{t:.3g} s' if t >= 1 else f'{1e3 * t:.3g} ms'


def _memory_phrase(chip: Chip) -> str:
  """``chip``'s memory as the messages and the report give it."""
  if chip.gpu is None:
    return f'{_gib(chip.hbm_bytes)} of HBM'
  return (
      f'{_gib(chip.hbm_bytes)} of HBM, of which JAX allocates {GPU_MEMORY_FRACTION:.0%}:'
      f' {_gib(chip.usable_bytes)}'
  )


def does_not_fit_message(step: str, topology: Topology, error: str) -> str:
  """One message for ``step`` (``'train'`` or ``'eval'``): the compiler's own numbers (or,
  for a GPU, :func:`over_gpu_memory`'s) and the settings that change them."""
  found = re.search(r'(Ran out of memory[^\n]*|exceeds? [^\n]*|RESOURCE_EXHAUSTED[^\n]*)', error)
  detail = found.group(1).split('. HLO module')[0].strip() if found else error.strip()[:300]
  chip = topology.chip
  return (
      f'The {STEP_NAMES[step]} does not fit one {topology.chip_name} {chip.unit} of'
      f' {topology.name} ({_memory_phrase(chip)}): {detail}. What changes it: '
      + '; '.join(memory_settings(step, chip))
      + '.'
  )


def over_gpu_memory(cost: StepCost, chip: Chip) -> Optional[str]:
  """What a GPU step needs beyond ``chip``'s usable memory, as the message's numbers;
  None when it fits. (XLA's GPU compiler does not refuse a program for memory: the
  step would fail when it runs.)"""
  if cost.most_bytes <= chip.usable_bytes:
    return None
  return (
      f'it needs {_gib(cost.most_bytes)} (arguments {_gib(cost.arguments)}, temporaries'
      f' {_gib(cost.temporaries)}, outputs {_gib(cost.outputs)}, less {_gib(cost.aliased)}'
      f" donated: {_gib(cost.peak_bytes)}; the compiler's peak"
      f' {_gib(cost.compiler_peak) if cost.compiler_peak else "not given"}), over the'
      f' {_gib(chip.usable_bytes)} JAX allocates'
  )


def compile_config(
    config, topology: Topology, which: tuple[str, ...] = STEPS, unrolled_flops: bool = True
) -> list[StepCost]:
  """The train and evaluation steps of ``config`` (those of ``which``) compiled for
  ``topology``; their :class:`StepCost` s. Raises :class:`DoesNotFit` for a step that
  does not fit, and the config's own errors (as ``train.py`` would) before compiling.

  XLA's cost analysis counts a loop's body once, so a model whose layers are one
  ``nn.scan`` (``scan_layers=True``) would report one layer's FLOPs: its FLOPs and
  bytes accessed are those of its unrolled twin (``scan_layers=False``, the same
  computation; compiled a second time for a TPU, lowered for the CPU for a GPU, for
  the counts only), its memory the scanned program's (the one that runs).
  ``unrolled_flops=False`` skips the twin: one compile, the memory exact, a scanned
  model's FLOPs one layer's.

  A GPU program's FLOPs are the CPU's count of the same step (:func:`_counted_flops`),
  split evenly over the GPUs."""
  from contextpool_jax.training import spec  # pylint: disable=g-import-not-at-top

  specs = spec.read(config)
  costs = _compile_steps(specs, topology, which)
  if unrolled_flops and getattr(specs.model, 'scan_layers', False):
    counted_specs = dataclasses.replace(specs, model=specs.model.clone(scan_layers=False))
  else:
    counted_specs = None
  if topology.chip.gpu is not None:
    flops = _counted_flops(counted_specs or specs, which)
    return [dataclasses.replace(c, flops=f / topology.chips) for c, f in zip(costs, flops)]
  if counted_specs is None:
    return costs
  counted = _compile_steps(counted_specs, topology, which)
  return [
      dataclasses.replace(c, flops=u.flops, bytes_accessed=u.bytes_accessed)
      for c, u in zip(costs, counted)
  ]


def _lowered_steps(specs, devices: list, which: tuple[str, ...], platform: Optional[str] = None):
  """``(key, lowered)`` for each step of ``which``, as ``train.py`` builds it for read
  ``specs`` (``training.spec.Specs``), lowered for ``devices`` (abstract or real), its
  attention traced as ``platform``'s runs trace it (``transformer.compiling_for``;
  None: the devices' platform)."""
  import jax  # pylint: disable=g-import-not-at-top

  from contextpool_jax.models import transformer  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import optim, programs, sharding, steps, tasks  # pylint: disable=g-import-not-at-top

  if platform is None:
    platform = str(devices[0].platform)
    platform = 'gpu' if platform in ('cuda', 'rocm') else platform

  run = specs.run
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
  for key, step_fn, step, batch in (
      ('train', built.train_step_fn, built.train_step, train_batch),
      ('eval', built.eval_step_fn, built.eval_step, eval_batch),
  ):
    if key in which:
      # The target's attention, not this CPU's, in every trace of the step: abstract_sums
      # traces it first, and lower() reuses that trace.
      with transformer.compiling_for(platform):
        sums = steps.abstract_sums(step_fn, state, batch, replicated)
        lowered = step.lower(state, batch, sums)
      yield key, lowered


def _compile_steps(specs, topology: Topology, which: tuple[str, ...]) -> list[StepCost]:
  """:func:`compile_config`'s steps for read ``specs``, compiled for ``topology``."""
  costs = []
  for key, lowered in _lowered_steps(specs, devices(topology), which):
    try:
      compiled = lowered.compile()
    except Exception as e:  # pylint: disable=broad-except  # the compiler's memory refusal
      text = str(e)
      if 'RESOURCE_EXHAUSTED' in text or 'Ran out of memory' in text:
        raise DoesNotFit(does_not_fit_message(key, topology, text)) from None
      raise
    cost = step_cost(STEP_NAMES[key], compiled)
    over = over_gpu_memory(cost, topology.chip) if topology.chip.gpu is not None else None
    if over:
      raise DoesNotFit(does_not_fit_message(key, topology, over))
    costs.append(cost)
  return costs


def _counted_flops(specs, which: tuple[str, ...]) -> list[float]:
  """Each step's FLOPs, all devices together: XLA's count of a GPU's step lowered for one
  CPU device at the global batch (before optimization; nothing compiled), its attention
  jax's, as a GPU runs it, not this CPU's einsum form."""
  import jax  # pylint: disable=g-import-not-at-top

  one_cpu = jax.devices('cpu')[:1]
  return [
      float(_cost_dict(lowered.cost_analysis()).get('flops', 0.0))
      for _, lowered in _lowered_steps(specs, one_cpu, which, platform='gpu')
  ]


def report(topology: Topology, costs: list[StepCost], batch_size: int) -> str:
  """The table the command prints: per chip (or GPU), per step."""
  chip, unit = topology.chip, topology.chip.unit
  if chip.gpu is None:
    bound = 'max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth)'
  else:
    bound = (
        "FLOPs / peak FLOP/s (FLOPs: the step's count lowered for one CPU device, split over"
        ' the GPUs; XLA counts neither FLOPs nor bytes of a GPU program)'
    )
  lines = [
      f'{topology.name}: {topology.chips} {unit}(s); per {unit} {_memory_phrase(chip)},'
      f' {chip.peak_flops / 1e12:g} TFLOP/s bf16 dense peak,'
      f' {chip.hbm_bytes_per_second / 1e9:g} GB/s HBM ({chip.source}); global batch'
      f' {batch_size}.',
      '',
      f'| step (per {unit}) | arguments | temporaries | outputs | peak (of HBM) |'
      " compiler's peak | GFLOPs | bound |",
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
  ]
  for c in costs:
    compiler = (
        f'{_gib(c.compiler_peak)} ({c.compiler_peak / chip.hbm_bytes:.1%})'
        if c.compiler_peak
        else '-'
    )
    lines.append(
        f'| {c.name} | {_gib(c.arguments)} | {_gib(c.temporaries)} | {_gib(c.outputs)}'
        f' | {_gib(c.peak_bytes)} ({c.peak_bytes / chip.hbm_bytes:.1%}) | {compiler}'
        f' | {c.flops / 1e9:,.1f} | {_seconds(c.bound_seconds(chip))} |'
    )
  lines += [
      '',
      "peak = arguments + temporaries + outputs - donated; compiler's peak = its buffer"
      f" assignment's (the two can differ either way); bound = {bound}, a floor on the"
      ' step time.',
  ]
  return '\n'.join(lines)
