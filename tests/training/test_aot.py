"""The compile command (``training/aot.py``): topologies by their names, costs, the
message of a step that does not fit, and every task's steps compiled for a TPU slice
and for NVIDIA GPUs.

Compiling for TPU needs libtpu (the ``[tpu]`` extra), for GPUs the CUDA plugin (the
``[gpu-compile]`` extra); both pinned stacks install both. Those tests are ``slow``
(seconds each). The rest reads neither.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from configs import default as default_config
from contextpool_jax.training import aot, command_line, sharding, spec, tasks

# ---------------------------------------------------------------------------
# Topologies.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    'name,libtpu,chips',
    [
        ('v5e:2x2', 'v5e:2x2', 4),
        ('v4:2x2x2', 'v4:2x2x2', 8),
        ('v5p:2x2x1', 'v5p:2x2x1', 4),
        ('v6e:2x2', 'v6e:2x2', 4),
        # Cloud accelerator types: chips for v5e/v6e, TensorCores (2 per chip) for v4/v5p.
        ('v5litepod-16', 'v5e:4x4', 16),
        ('v5e-1', 'v5e:1x1', 1),
        ('v6e-8', 'v6e:2x4', 8),
        ('v4-32', 'v4:2x2x4', 16),
        ('v4-8', 'v4:2x2x1', 4),
        ('v5p-128', 'v5p:4x4x4', 64),
        ('V5LITEPOD-256', 'v5e:16x16', 256),
        # NVIDIA GPUs: <gpu>[:<count>], eight a host.
        ('h100', 'h100:1', 1),
        ('h100:8', 'h100:8', 8),
        ('A100:4', 'a100:4', 4),
        ('h200:16', 'h200:16', 16),
    ],
)
def test_topologies_by_either_name(name, libtpu, chips):
  topology = aot.parse_topology(name)
  assert (topology.name, topology.chips) == (libtpu, chips)


def test_cloud_slice_shapes_are_the_documented_ones():
  """The shapes the Cloud TPU pages list for v4/v5p (3D) and v5e/v6e (2D) slices."""
  three = ['2x2x1', '2x2x2', '2x2x4', '2x4x4', '4x4x4', '4x4x8', '4x8x8', '8x8x8', '8x8x16']
  two = ['2x2', '2x4', '4x4', '4x8', '8x8', '8x16', '16x16']
  for shapes, dims in ((three, 3), (two, 2)):
    for shape in shapes:
      chips = int(np.prod([int(n) for n in shape.split('x')]))
      assert 'x'.join(map(str, aot.slice_shape(chips, dims))) == shape


@pytest.mark.parametrize(
    'name,why',
    [
        ('v9:2x2', 'not a topology name'),
        ('v4:2x2', 'v4 slices have 3 axes'),
        ('v5e:2x2x1', 'v5e slices have 2 axes'),
        ('v4-7', '7 TensorCores is not a whole number of v4 chips'),
        ('v5litepod-12', '12 chips: a slice of more than one chip has 4, 8, 16'),
        ('banana', 'not a topology name'),
        ('b200:8', 'not a topology name'),
        ('h100:12', '12 GPUs: 1 to 8 on one host, or whole hosts of 8'),
        ('h100:0', '0 GPUs: 1 to 8 on one host'),
    ],
)
def test_a_bad_topology_names_itself_and_what_is_accepted(name, why):
  with pytest.raises(ValueError) as e:
    aot.parse_topology(name)
  assert f'--topology={name!r}: {why}' in str(e.value)
  assert aot.ACCEPTED in str(e.value)


# ---------------------------------------------------------------------------
# Costs and messages.
# ---------------------------------------------------------------------------


def test_the_bound_is_the_slower_of_compute_and_memory_traffic():
  chip = aot.CHIPS['v5e']
  compute = aot.StepCost('s', 10, 20, 5, 5, flops=197e12, bytes_accessed=819e9 / 2)
  assert compute.peak_bytes == 30 and compute.bound_seconds(chip) == pytest.approx(1.0)
  traffic = aot.StepCost('s', 0, 0, 0, 0, flops=197e12 / 4, bytes_accessed=3 * 819e9)
  assert traffic.bound_seconds(chip) == pytest.approx(3.0)
  text = aot.report(aot.parse_topology('v5e:2x2'), [compute], 16)
  assert (
      'per chip 16.00 GiB of HBM, 197 TFLOP/s bf16 dense peak, 819 GB/s HBM'
      ' (https://cloud.google.com/tpu/docs/v5e)' in text
  )
  assert '| s | 10 B | 20 B | 5 B | 30 B (0.0%) | - | 197,000.0 | 1 s |' in text


def test_the_compilers_peak_is_reported_beside_the_sum_and_a_gpu_step_fits_both():
  """Two measures of a step's memory: arguments + temporaries + outputs - donated, and the
  compiler's own peak (``peak_memory_in_bytes``, None where it gives 0). They can differ
  either way; a GPU step must fit the larger."""
  gib = 2**30
  summed = aot.StepCost('s', gib, 51 * gib, gib, gib, 1.0, None)  # 52 GiB by the sum
  h100 = aot.CHIPS['h100']  # 60 GiB usable
  assert summed.peak_bytes == summed.most_bytes == 52 * gib
  assert aot.over_gpu_memory(summed, h100) is None
  over = dataclasses.replace(summed, compiler_peak=62 * gib)
  assert over.peak_bytes == 52 * gib and over.most_bytes == 62 * gib
  assert aot.over_gpu_memory(over, h100).startswith(
      'it needs 62.00 GiB (arguments 1.00 GiB, temporaries 51.00 GiB, outputs 1.00 GiB, less'
      " 1.00 GiB donated: 52.00 GiB; the compiler's peak 62.00 GiB)"
  )
  under = dataclasses.replace(summed, temporaries=70 * gib, compiler_peak=40 * gib)
  assert aot.over_gpu_memory(under, h100).startswith('it needs 71.00 GiB')
  text = aot.report(aot.parse_topology('h100'), [over, summed], 8)
  assert '| 52.00 GiB (65.0%) | 62.00 GiB (77.5%) |' in text
  assert '| 52.00 GiB (65.0%) | - |' in text

  def compiled(peak):
    stats = dict(
        argument_size_in_bytes=10,
        temp_size_in_bytes=20,
        output_size_in_bytes=5,
        alias_size_in_bytes=5,
        peak_memory_in_bytes=peak,
    )
    return type('Compiled', (), dict(memory_analysis=type('Stats', (), stats), cost_analysis=dict))

  assert aot.step_cost('s', compiled(0)).compiler_peak is None
  read = aot.step_cost('s', compiled(45))
  assert (read.peak_bytes, read.compiler_peak) == (30, 45)


def check_peaks(cost: aot.StepCost) -> None:
  """A compiled step's two measures: the compiler gives its peak on both stacks (TPU and GPU),
  at least what is live at the start and the end (arguments, outputs less donated)."""
  assert cost.compiler_peak is not None
  assert cost.compiler_peak >= cost.arguments + cost.outputs - cost.aliased


def test_a_gpu_bound_is_compute_alone_and_its_memory_is_what_jax_allocates():
  """XLA counts no bytes of a GPU program: the bound is FLOPs / peak; a step fits in the
  75% of the GPU's memory that JAX preallocates."""
  h100 = aot.CHIPS['h100']
  cost = aot.StepCost('s', 0, 0, 0, 0, flops=2 * 989e12, bytes_accessed=None)
  assert cost.bound_seconds(h100) == pytest.approx(2.0)
  assert h100.usable_bytes == 60 * 2**30  # 0.75 of 80 GiB
  text = aot.report(aot.parse_topology('h100:8'), [cost], 64)
  assert text.startswith('h100:8: 8 GPU(s); per GPU 80.00 GiB of HBM, of which JAX allocates')
  assert '| step (per GPU) |' in text and 'bound = FLOPs / peak FLOP/s' in text
  fits = aot.StepCost('s', 20 * 2**30, 40 * 2**30, 20 * 2**30, 20 * 2**30, 1.0, None)
  assert aot.over_gpu_memory(fits, h100) is None  # 60 GiB: all of the share
  over = dataclasses.replace(fits, temporaries=41 * 2**30)
  assert aot.over_gpu_memory(over, h100).startswith('it needs 61.00 GiB (arguments 20.00 GiB')


def test_a_step_that_does_not_fit_gets_one_message_with_the_numbers_and_the_settings():
  error = (
      'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory'
      ' required for HLO temporaries (48.86G) exceeds available HBM (15.75G). HLO module:'
      ' jit_summed.\nmore lines'
  )
  message = aot.does_not_fit_message('train', aot.parse_topology('v5e-4'), error)
  assert '\n' not in message
  assert message.startswith('The train step does not fit one v5e chip of v5e:2x2 (16.00 GiB')
  assert 'HLO temporaries (48.86G) exceeds available HBM (15.75G)' in message
  assert 'HLO module' not in message
  for setting in ('batch_size', 'model.remat', 'param_sharding=fsdp', 'model.attention_impl'):
    assert f'--config.{setting}' in message
  evaluation = aot.does_not_fit_message('eval', aot.parse_topology('v5e-4'), error)
  assert evaluation.startswith('The evaluation step does not fit')
  assert '--config.dataset.eval_batch_size' in evaluation and 'remat' not in evaluation
  gpu = aot.does_not_fit_message('train', aot.parse_topology('h100'), 'it needs 61.00 GiB')
  assert gpu.startswith(
      'The train step does not fit one h100 GPU of h100:1 (80.00 GiB of HBM, of which JAX'
      ' allocates 75%: 60.00 GiB): it needs 61.00 GiB. What changes it: --config.batch_size'
  )
  for setting in ('attention_implementation=cudnn', 'XLA_PYTHON_CLIENT_MEM_FRACTION', 'GPUs'):
    assert setting in gpu
  assert 'pallas_tpu' not in gpu


# ---------------------------------------------------------------------------
# Compiled for TPU (libtpu).
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def v5e_2x2():
  aot.compile_only()
  return aot.parse_topology('v5e:2x2')


@pytest.mark.slow
def test_the_flops_of_a_matmul_are_the_count_by_hand(v5e_2x2):
  """2 M K N FLOPs for x [M, K] @ w [K, N], the rows split over 4 chips: a quarter each."""
  devices = aot.devices(v5e_2x2)
  mesh = sharding.make_mesh(devices)
  m, k, n = 1024, 512, 256
  x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=NamedSharding(mesh, P('data')))
  w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  cost = aot.step_cost('matmul', jax.jit(lambda x, w: x @ w).lower(x, w).compile())
  assert cost.flops == 2 * m * k * n / 4
  assert cost.arguments == (m // 4) * k * 2 + k * n * 2 and cost.outputs == (m // 4) * n * 2


# A small config of every task, as the command would get it: one example per chip of the
# v5e:2x2 slice and short sequences (the TPU compiler's time grows with the shapes: the LM's
# train step at batch 8 x 256 took 6.6 s to compile, at 4 x 64 3.6 s, side by side, loaded).
SMALL_CONFIGS = {
    'lm': (
        'default',
        {
            'batch_size': 4,
            'dataset.seq_len': 64,
            'dataset.eval_context': 64,
            'dataset.eval_step': 32,
            'dataset.eval_batch_size': 4,
            'model.num_layers': 1,
        },
    ),
    'translation': (
        'wmt14:en-de,tiny,cp',
        {
            'batch_size': 4,
            'dataset.eval_batch_size': 4,
            'dataset.max_source_len': 16,
            'dataset.max_target_len': 16,
            'model.num_layers': 1,
        },
    ),
    'vit': (
        'imagenet_vit:cp_vit_ti16',
        {
            'batch_size': 4,
            'dataset.eval_batch_size': 4,
            'dataset.image_size': 32,
            'model.num_layers': 2,
        },
    ),
    'resnet': (
        'cifar10_resnet:cp_resnet20',
        {'batch_size': 4, 'dataset.eval_batch_size': 4, 'model.stage_sizes': (1, 1, 1)},
    ),
}


# The Pallas TPU attention kernel in each model with attention (the LM's: the 32k test below).
KERNEL = {'model.attention_implementation': 'pallas_tpu'}
SMALL_CONFIGS['translation, pallas_tpu'] = (
    SMALL_CONFIGS['translation'][0],
    {**SMALL_CONFIGS['translation'][1], **KERNEL},
)
SMALL_CONFIGS['vit, pallas_tpu'] = (SMALL_CONFIGS['vit'][0], {**SMALL_CONFIGS['vit'][1], **KERNEL})
# Area attention through the kernel: the LM's causal self-attention (areas grouped by their
# last item), the translation model's encoder, decoder and cross-attention.
SMALL_CONFIGS['lm, area, pallas_tpu'] = (
    'default:baseline',
    {**SMALL_CONFIGS['lm'][1], 'model.attention': 'area', 'model.num_layers': 1, **KERNEL},
)
SMALL_CONFIGS['translation, area, pallas_tpu'] = (
    'wmt14:en-de,tiny,area',
    {**SMALL_CONFIGS['translation'][1], **KERNEL},
)


@pytest.mark.slow
@pytest.mark.parametrize('task', sorted(SMALL_CONFIGS))
def test_every_task_compiles_for_a_tpu_slice(task, v5e_2x2):
  costs = aot.compile_config(_small_config(task), v5e_2x2)
  assert [c.name for c in costs] == ['train step', 'evaluation step']
  for c in costs:
    assert c.flops > 0 and c.arguments > 0 and 0 < c.peak_bytes < aot.CHIPS['v5e'].hbm_bytes
    check_peaks(c)
  # The train step: its state donated (outputs alias arguments).
  assert costs[0].aliased > 0


@pytest.mark.slow
def test_a_scanned_model_counts_every_layer(v5e_2x2, monkeypatch):
  """XLA counts a loop's body once: the scanned program alone reports fewer FLOPs than
  its layers do; compile_config reports the unrolled twin's count (and the scanned
  program's memory); ``unrolled_flops=False`` (``--nounrolled_flops``) compiles once."""

  def config():
    c = command_line.load_config_file('default')
    with c.unlocked():
      c.update_from_flattened_dict(SMALL_CONFIGS['lm'][1])
      c.model.update(num_layers=3, emb_dim=64, mlp_dim=128, scan_layers=True)
    return c

  compiled = []  # (model's scan_layers, its cost): the two compiles compile_config makes
  compile_steps = aot._compile_steps

  done = {}  # a program asked for again (the same model, topology and steps) is not recompiled

  def recording(specs, *args):
    key = (specs.model.scan_layers, *args)
    if key not in done:
      done[key] = compile_steps(specs, *args)
    costs = done[key]
    compiled.append((specs.model.scan_layers, costs[0]))
    return costs

  monkeypatch.setattr(aot, '_compile_steps', recording)
  (reported,) = aot.compile_config(config(), v5e_2x2, ('train',))
  (_, loop_once), (twin_scanned, twin) = compiled
  assert twin_scanned is False and reported.flops == twin.flops > 0
  assert loop_once.flops < 0.6 * twin.flops  # 1 of the 3 layers counted
  assert reported.peak_bytes == loop_once.peak_bytes  # the memory is the scanned program's
  assert aot.compile_config(config(), v5e_2x2, ('train',), unrolled_flops=False) == [loop_once]
  assert len(compiled) == 3  # --nounrolled_flops: one compile


@pytest.mark.slow
def test_a_model_too_large_for_a_chip_gets_the_message(v5e_2x2):
  config = command_line.load_config_file('default')
  with config.unlocked():
    config.model.update(num_layers=1, emb_dim=16384, mlp_dim=65536, num_heads=16)
  with pytest.raises(aot.DoesNotFit) as e:
    aot.compile_config(config, aot.parse_topology('v5e:1x1'))
  message = str(e.value)
  assert message.startswith('The train step does not fit one v5e chip of v5e:1x1')
  assert 'exceeds available HBM' in message and '--config.param_sharding=fsdp' in message


@pytest.mark.slow
def test_the_paper_lm_evaluates_32k_bytes_on_one_v5e_chip_with_the_kernel(v5e_2x2):
  """The CP-Transformer(12) of configs/enwik8.py, its evaluation step at the paper's 32k
  bytes of context (one row): the dense attention's temporaries are refused by the TPU
  compiler (33 GiB); the Pallas kernel's step fits, ContextPool on its memory-linear path."""
  config = command_line.load_config_file('enwik8:stage1')
  with config.unlocked():
    config.dataset.update(eval_context=32768, eval_batch_size=1)
  one_chip = aot.parse_topology('v5e:1x1')
  with pytest.raises(aot.DoesNotFit, match='evaluation step does not fit'):
    aot.compile_config(config, one_chip, ('eval',))
  config.model.attention_implementation = 'pallas_tpu'
  (cost,) = aot.compile_config(config, one_chip, ('eval',), unrolled_flops=False)  # memory only
  assert cost.peak_bytes < 2**30  # under 1 GiB of the 16


# ---------------------------------------------------------------------------
# Compiled for NVIDIA GPUs (the CUDA plugin).
# ---------------------------------------------------------------------------


@pytest.fixture(scope='module')
def h100_8():
  aot.compile_only()
  return aot.parse_topology('h100:8')


def _small_config(task, **more):
  name, overrides = SMALL_CONFIGS[task]
  config = command_line.load_config_file(name)
  with config.unlocked():
    config.update_from_flattened_dict({**overrides, **more})
  return config


# One example per GPU of h100:8.
EIGHT = {'batch_size': 8, 'dataset.eval_batch_size': 8}


# The GPU path is the TPU path's (the programs above) with another compiler, other memory and
# FLOP accounting: a sequence model and a ConvNet exercise it; the papers' configs all compile
# for GPUs in benchmarks/paper_scale.py.
@pytest.mark.slow
@pytest.mark.parametrize('task', ['lm', 'resnet'])
def test_tasks_compile_for_eight_gpus(task, h100_8):
  costs = aot.compile_config(_small_config(task, **EIGHT), h100_8)
  assert [c.name for c in costs] == ['train step', 'evaluation step']
  for c in costs:
    assert c.flops > 0 and c.arguments > 0 and 0 < c.peak_bytes < aot.CHIPS['h100'].usable_bytes
    assert c.bytes_accessed is None  # XLA counts none for a GPU program
    check_peaks(c)
  assert costs[0].aliased > 0  # the train step's state donated


@pytest.mark.slow
def test_a_gpu_steps_flops_are_the_tpu_compilers_count_split_over_the_gpus(v5e_2x2):
  """What the GPU path reports (the step lowered for one CPU device, split over the GPUs)
  against the TPU compiler's count for one chip (its matmuls by hand above; a sharded TPU
  program also counts what its collectives add)."""
  del v5e_2x2  # sets libtpu up
  config = _small_config('lm')
  (counted,) = aot._counted_flops(spec.read(config), ('train',))
  (tpu,) = aot.compile_config(config, aot.parse_topology('v5e:1x1'), ('train',))
  assert counted == pytest.approx(tpu.flops, rel=0.01)


@pytest.mark.slow
def test_programs_for_a_tpu_or_gpu_trace_the_attention_those_devices_run(monkeypatch, v5e_2x2):
  """The command runs JAX on this CPU, whose Transformers compute attention as an einsum
  (``transformer.compiling_for``); a step lowered for TPU devices, and a GPU step lowered
  for a CPU device to count its FLOPs, trace jax.nn.dot_product_attention, as those devices'
  runs do. (abstract_sums traces the step before lower() reuses that trace: both must see
  the target.)"""
  calls = []
  attention = jax.nn.dot_product_attention
  monkeypatch.setattr(
      jax.nn, 'dot_product_attention', lambda *a, **kw: calls.append(kw) or attention(*a, **kw)
  )
  specs = spec.read(_small_config('lm'))
  list(aot._lowered_steps(specs, jax.devices('cpu')[:1], ('eval',)))
  assert calls == []  # this process's own program
  list(aot._lowered_steps(specs, aot.devices(v5e_2x2), ('eval',)))
  assert calls
  calls.clear()
  (counted,) = aot._counted_flops(specs, ('eval',))
  assert counted > 0 and calls


@pytest.mark.slow
def test_a_step_over_the_memory_jax_allocates_on_a_gpu_gets_the_message(monkeypatch):
  """The GPU compiler does not refuse a program for memory: the command does, against
  the share JAX allocates (here shrunk so that a one-layer LM's step is over it)."""
  monkeypatch.setattr(aot, 'GPU_MEMORY_FRACTION', 2**20 / aot.CHIPS['h100'].hbm_bytes)  # 1 MiB
  config = _small_config(
      'lm',
      **{'batch_size': 1, 'model.num_layers': 1, 'model.emb_dim': 64, 'model.mlp_dim': 128},
  )
  aot.compile_only()
  with pytest.raises(aot.DoesNotFit) as e:
    aot.compile_config(config, aot.parse_topology('h100'), ('train',))
  message = str(e.value)
  assert message.startswith('The train step does not fit one h100 GPU of h100:1')
  assert 'over the 1.0 MiB JAX allocates' in message and 'XLA_PYTHON_CLIENT_MEM' in message
