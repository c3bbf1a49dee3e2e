"""The benchmark tables: which models, at which shapes, against which paper numbers.

Every table has a baseline row; every other row is the same workload (same
shapes, loss and optimizer) with one change. Tables:

* ``contextpool_nmt``: ContextPool Tables 1 and 3 (EN-DE column):
  Transformer-Base vs CP-Base and every ablation of the pooling weights,
  locality prior and mapping m(X). Paper: memory (GB) and speed (steps/s) on
  a V100.
* ``contextpool_vit``: Tables 2 and 3 (ImageNet column): ViT-B/16 vs
  CP-ViT-B/16 and the same ablations. Paper: FLOPs (G) and throughput (img/s).
* ``contextpool_resnet``: Table 3 (CIFAR-10 column) and Table S1: ResNet-44 vs
  CP-ResNet-44, its mappings and weightings, CP-ResNet-46. Paper: FLOPs (G)
  and size.
* ``area``: area attention paper, Sec. 4.1: Transformer-Base with regular,
  basic (Eq. 3-4) and rich (Eq. 9 and 4) area attention, whose training steps
  took 0.4 / 0.5 / 0.8 s on 8 P100s; CP-Base for comparison.
* ``lambda``: LambdaNetworks Table 4 (memory): global self-attention vs
  lambda layers (global and convolution) vs AugmentedConv2D, one layer on
  56x56x64 feature maps.

Sizes come from :class:`Sizes` (``--quick`` or the papers' shapes).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from configs import common
from contextpool_jax import models
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.context_pool import IMPLEMENTATIONS
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.lambda_layer import LambdaLayer
from contextpool_jax.training import objectives
from contextpool_jax.training.optim import make_optimizer, resolve_spec

from benchmarks.harness import PaperColumn
from benchmarks.harness import Workload
from benchmarks.lambda_memory import GlobalMHA

DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


# ----------------------------------------------------------------------------
# Sizes.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Shapes of every table (the model widths are always the papers')."""

  nmt_batch: int
  nmt_length: int  # source = target length
  nmt_layers: int  # encoder and decoder layers each (Base: 6)
  vit_batch: int
  vit_image: int
  vit_layers: int  # ViT-B: 12
  resnet_batch: int
  lambda_batch: int
  lambda_size: int
  lambda_channels: int
  dtype: str = 'float32'

  def replace(self, overrides: str) -> 'Sizes':
    """``'nmt_batch=4,vit_layers=12'`` -> a copy with those fields changed."""
    if not overrides:
      return self
    changes: dict[str, Any] = {}
    fields = {f.name: f.type for f in dataclasses.fields(self)}
    for item in overrides.split(','):
      key, _, value = item.partition('=')
      key = key.strip()
      if key not in fields or not value:
        raise ValueError(
            f'--sizes: {item!r} is not "<field>=<value>"; fields: {", ".join(fields)}.'
        )
      changes[key] = value.strip() if key == 'dtype' else int(value)
    if changes.get('dtype', self.dtype) not in DTYPES:
      raise ValueError(f'--sizes: dtype={changes["dtype"]!r}; allowed: {", ".join(DTYPES)}.')
    return dataclasses.replace(self, **changes)


# The papers' shapes, per device: NMT batches of ~32k tokens were spread over 8
# GPUs (Li et al., 2019: "approximately 32,000 source and target tokens" on 8
# P100s; tensor2tensor's transformer_base: 4096 tokens per GPU), so 16 x 256
# here (``--sizes=nmt_batch=128`` for the whole 32k on one device: ~57 GiB);
# ViT-B/16 at 224, batch 64 per device; CIFAR batch 128 (He et al.); the lambda
# table's batch 128 of 56x56x64 maps (global self-attention needs ~75 GiB
# there: the paper's "OOM"; such rows are compiled, not run).
FULL = Sizes(
    nmt_batch=16,
    nmt_length=256,
    nmt_layers=6,
    vit_batch=64,
    vit_image=224,
    vit_layers=12,
    resnet_batch=128,
    lambda_batch=128,
    lambda_size=56,
    lambda_channels=64,
)
# CPU-sized: every width, head count, vocabulary, patch and image size is the
# paper's; batch, sequence length and depth shrink.
QUICK = Sizes(
    nmt_batch=2,
    nmt_length=64,
    nmt_layers=2,
    vit_batch=1,
    vit_image=224,
    vit_layers=2,
    resnet_batch=8,
    lambda_batch=1,
    lambda_size=56,
    lambda_channels=64,
)


# ----------------------------------------------------------------------------
# Rows and tables.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Row:
  """One variant: ``build()`` makes its workload; ``key`` identifies the workload
  across tables (a row measured once is reused); ``paper`` the reported numbers;
  ``quick``: also run with ``--quick`` (otherwise only with ``--all_rows`` there)."""

  variant: str
  build: Callable[[], Workload]
  key: tuple
  paper: Mapping[str, float] = dataclasses.field(default_factory=dict)
  quick: bool = True


@dataclasses.dataclass(frozen=True)
class Target:
  """``column`` of ``variant`` should be <= ``limit`` (the paper measured ``paper``)."""

  variant: str
  column: str
  limit: float
  paper: Optional[float]
  label: str


@dataclasses.dataclass(frozen=True)
class Table:
  name: str
  title: str
  shapes: str
  baseline: str
  rows: tuple[Row, ...]
  paper_columns: tuple[PaperColumn, ...] = ()
  paper_note: str = ''
  targets: tuple[Target, ...] = ()


# ----------------------------------------------------------------------------
# Workloads.
# ----------------------------------------------------------------------------


def _optimizer(**fields) -> tuple[optax.GradientTransformation, Callable]:
  """The project's optimizer builder: ``configs/common.py``'s optimizer with ``fields``."""
  cfg = common.base_config().optimizer
  cfg.update(dict(schedule='constant', warmup_steps=0), **fields)
  return make_optimizer(resolve_spec(cfg), num_train_steps=1000)


def _with_cp_defaults(
    context_pool: Optional[Mapping[str, Any]], cp_defaults: Mapping[str, Any]
) -> Optional[dict[str, Any]]:
  return None if context_pool is None else {**cp_defaults, **context_pool}


def num_area_layers(s: Sizes) -> int:
  """Area attention layers: the paper's first 2 of 6, the same share of fewer layers."""
  return max(1, round(2 * s.nmt_layers / 6))


def nmt_workload(
    s: Sizes,
    *,
    attention: str = 'standard',
    rich_area: bool = False,
    context_pool: Optional[Mapping[str, Any]] = None,
) -> Workload:
  """Transformer-Base (EN-DE: 32k shared vocabulary, dropout 0.1) on random token
  pairs; label-smoothed (0.1) cross-entropy per target token; Adam (0.9, 0.98,
  1e-9) as ``configs/wmt14.py``."""
  model = models.create(
      'transformer_base',
      vocab_size=32000,
      dropout_rate=0.1,
      num_layers=s.nmt_layers,
      attention=attention,
      num_area_layers=num_area_layers(s),
      area_key_mode='concat' if rich_area else 'mean',
      context_pool=context_pool,
      dtype=DTYPES[s.dtype],
  )
  shape = (s.nmt_batch, s.nmt_length)

  def make_batch(key):
    k1, k2 = jax.random.split(key)
    return {
        'inputs': jax.random.randint(k1, shape, 1, 32000, jnp.int32),
        'targets': jax.random.randint(k2, shape, 1, 32000, jnp.int32),
    }

  return Workload(
      module=model,
      objective=objectives.Translation(label_smoothing=0.1),
      make_batch=make_batch,
      optimizer=_optimizer(name='adam', learning_rate=1e-3, b1=0.9, b2=0.98, eps=1e-9),
  )


def _classification(
    model, batch: int, image: int, num_classes: int, smoothing: float, optimizer: tuple
) -> Workload:
  def make_batch(key):
    k1, k2 = jax.random.split(key)
    return {
        'image': jax.random.normal(k1, (batch, image, image, 3), jnp.float32),
        'label': jax.random.randint(k2, (batch,), 0, num_classes, jnp.int32),
    }

  objective = objectives.Classification(num_classes=num_classes, label_smoothing=smoothing)
  return Workload(module=model, objective=objective, make_batch=make_batch, optimizer=optimizer)


def vit_workload(s: Sizes, *, context_pool: Optional[Mapping[str, Any]] = None) -> Workload:
  """ViT-B/16, 1000 classes; cross-entropy with label smoothing 0.1; AdamW
  (weight decay 0.05, clipping 1.0) as ``configs/imagenet_vit.py``."""
  model = models.create(
      'vit_b16',
      num_layers=s.vit_layers,
      image_size=s.vit_image,
      num_classes=1000,
      context_pool=context_pool,
      dtype=DTYPES[s.dtype],
  )
  tx = _optimizer(name='adamw', learning_rate=1e-3, weight_decay=0.05, grad_clip_norm=1.0)
  return _classification(model, s.vit_batch, s.vit_image, 1000, 0.1, tx)


def resnet_workload(
    s: Sizes, *, name: str = 'resnet44', context_pool: Optional[Mapping[str, Any]] = None
) -> Workload:
  """CIFAR ResNet on 32x32 images; cross-entropy; SGD (momentum 0.9, L2 1e-4)
  as ``configs/cifar10_resnet.py``."""
  overrides = {} if context_pool is None else {'context_pool': context_pool}
  model = models.create(name, dtype=DTYPES[s.dtype], **overrides)
  tx = _optimizer(name='sgd', learning_rate=0.1, momentum=0.9, weight_decay=1e-4)
  return _classification(model, s.resnet_batch, 32, 10, 0.0, tx)


class SquaredOutput(objectives.Objective):
  """A layer benchmark's objective: ``sum(y^2)`` per example of ``batch['x']``."""

  def model_args(self, batch):
    return (batch['x'],)

  def weight(self, batch):
    return jnp.asarray(batch['x'].shape[0], jnp.float32)

  def loss(self, y, batch):
    total = jnp.sum(jnp.square(y.astype(jnp.float32)))
    return total, {'loss': total, 'weight': self.weight(batch)}


class WithTrainArgument(nn.Module):
  """Calls ``layer(x)`` for ``(x, train)``: a layer without a ``train`` argument
  called like the registry's models."""

  layer: nn.Module

  def __call__(self, x, train: bool = False):
    del train
    return self.layer(x)


def layer_workload(s: Sizes, make_layer: Callable[[], Any], *, train_kwarg: bool) -> Workload:
  """One layer on ``[batch, size, size, channels]`` maps; loss ``sum(y^2)`` per
  example; Adam."""
  shape = (s.lambda_batch, s.lambda_size, s.lambda_size, s.lambda_channels)
  layer = make_layer()
  return Workload(
      module=layer if train_kwarg else WithTrainArgument(layer),
      objective=SquaredOutput(),
      make_batch=lambda key: {'x': jax.random.normal(key, shape, DTYPES[s.dtype])},
      optimizer=_optimizer(name='adam', learning_rate=1e-3),
  )


# ----------------------------------------------------------------------------
# The ContextPool ablations (Tables 1-3), paper numbers per task.
# ----------------------------------------------------------------------------

# (variant, ContextPool overrides; None = the baseline without ContextPool).
CP_ABLATIONS: tuple[tuple[str, Optional[dict[str, Any]]], ...] = (
    ('baseline', None),
    ('CP (w * g)', {}),
    ('unnormalized weights', {'weights': 'unnormalized'}),
    ('uniform weights', {'weights': 'uniform'}),
    ('NL weights', {'weights': 'nonlocal'}),
    ('no locality prior', {'locality': 'none'}),
    ('fixed window', {'locality': 'fixed_window'}),
    ('adaptive window', {'locality': 'adaptive_window'}),
    ('random sparse', {'locality': 'random_sparse'}),
    ('MLP-based CP', {'mapping': 'mlp'}),
    ('self-attention-based CP', {'mapping': 'attention'}),
)

# Table 1 (+ Table 3 mappings): memory (G), speed (steps/s), V100, EN-DE Base.
PAPER_NMT = {
    'baseline': (17.2, 1.20),
    'CP (w * g)': (17.6, 1.12),
    'unnormalized weights': (17.6, 1.13),
    'uniform weights': (17.4, 1.16),
    'NL weights': (21.3, 0.84),
    'no locality prior': (17.4, 1.15),
    'fixed window': (17.4, 1.15),
    'adaptive window': (17.6, 1.12),
    'random sparse': (17.4, 1.15),
    'MLP-based CP': (17.3, 1.17),
    'self-attention-based CP': (21.3, 0.84),
}
# Table 2 (+ Table 3): FLOPs (G), throughput (images/s), V100, ViT-B/16.
PAPER_VIT = {
    'baseline': (55.4, 85.9),
    'CP (w * g)': (56.7, 84.1),
    'unnormalized weights': (56.6, 84.2),
    'uniform weights': (56.1, 84.8),
    'NL weights': (68.8, 69.2),
    'no locality prior': (56.0, 85.1),
    'fixed window': (56.0, 85.1),
    'adaptive window': (56.7, 84.1),
    'random sparse': (56.0, 85.1),
    'MLP-based CP': (56.5, 85.2),
    'self-attention-based CP': (68.8, 69.2),
}


def _cp_rows(
    prefix: str,
    baseline: str,
    build: Callable[[Optional[dict]], Workload],
    key: tuple,
    paper: Mapping[str, tuple[float, float]],
    paper_keys: Sequence[str],
    cp_defaults: Mapping[str, Any],
    quick_ablations: bool,
) -> tuple[Row, ...]:
  rows = []
  for variant, cp in CP_ABLATIONS:
    core = cp is None or variant == 'CP (w * g)'
    cp = _with_cp_defaults(cp, cp_defaults)
    name = (
        baseline
        if cp is None
        else (f'CP-{prefix}' if variant == 'CP (w * g)' else f'CP-{prefix}: {variant}')
    )
    rows.append(
        Row(
            name,
            functools.partial(build, cp),
            key + (None if cp is None else tuple(sorted(cp.items())),),
            dict(zip(paper_keys, paper[variant])),
            quick=core or quick_ablations,
        )
    )
  return tuple(rows)


def contextpool_nmt(s: Sizes, cp_defaults: Mapping[str, Any]) -> Table:
  rows = _cp_rows(
      'Base',
      'Transformer-Base',
      lambda cp: nmt_workload(s, context_pool=cp),
      ('nmt', s, 'standard'),
      PAPER_NMT,
      ('paper_memory_gb', 'paper_steps_per_s'),
      cp_defaults,
      quick_ablations=True,
  )
  return Table(
      name='contextpool_nmt',
      title='ContextPool Tables 1 and 3: Transformer-Base, EN-DE translation',
      shapes=(
          f'batch {s.nmt_batch} x {s.nmt_length} source and {s.nmt_length} target tokens, '
          f'{s.nmt_layers}+{s.nmt_layers} layers (Base: 6+6), d 512, ff 2048, 8 heads, '
          f'vocabulary 32000, dropout 0.1, {s.dtype}; Adam'
          f'{cp_implementation_note(cp_defaults, s.nmt_length)}'
      ),
      baseline='Transformer-Base',
      rows=rows,
      paper_columns=(
          PaperColumn('paper_memory_gb', 'paper memory (GB)', '{:.1f}'),
          PaperColumn('paper_steps_per_s', 'paper steps/s', '{:.2f}', 'inverse', 'paper time rel'),
      ),
      paper_note='Paper: one V100, 6+6 layers, ~32k-token batches (per-GPU share not stated).',
      targets=(
          Target('CP-Base', 'step_ms_rel', 1.05, 1.20 / 1.12, 'CP-Base step time'),
          Target('CP-Base', 'temp_mib_rel', 1.03, 17.6 / 17.2, 'CP-Base temp memory'),
          Target('CP-Base', 'total_mib_rel', 1.03, 17.6 / 17.2, 'CP-Base total memory'),
      ),
  )


def contextpool_vit(s: Sizes, cp_defaults: Mapping[str, Any]) -> Table:
  rows = _cp_rows(
      'ViT-B/16',
      'ViT-B/16',
      lambda cp: vit_workload(s, context_pool=cp),
      ('vit', s),
      PAPER_VIT,
      ('paper_gflops', 'paper_images_per_s'),
      cp_defaults,
      quick_ablations=False,
  )
  return Table(
      name='contextpool_vit',
      title='ContextPool Tables 2 and 3: ViT-B/16, ImageNet classification',
      shapes=(
          f'batch {s.vit_batch} of {s.vit_image}x{s.vit_image}x3 images, patch 16, '
          f'{s.vit_layers} layers (B: 12), d 768, 12 heads, 1000 classes, {s.dtype}; '
          f'AdamW{cp_implementation_note(cp_defaults, (s.vit_image // 16) ** 2)}'
      ),
      baseline='ViT-B/16',
      rows=rows,
      paper_columns=(
          PaperColumn('paper_gflops', 'paper GFLOPs', '{:.1f}'),
          PaperColumn('paper_images_per_s', 'paper img/s', '{:.1f}', 'inverse', 'paper time rel'),
      ),
      paper_note='Paper: V100, 224x224, 12 layers; our GFLOPs are per training step '
      '(forward + backward + update) of the whole batch.',
      targets=(Target('CP-ViT-B/16', 'gflops_rel', 1.03, 56.7 / 55.4, 'CP-ViT FLOPs'),),
  )


def contextpool_resnet(s: Sizes, cp_defaults: Mapping[str, Any]) -> Table:
  def row(variant, name, cp, paper_gflops, paper_params, quick=True):
    cp = _with_cp_defaults(cp, cp_defaults)
    paper = {'paper_params_m': paper_params}
    if paper_gflops is not None:
      paper['paper_gflops'] = paper_gflops
    return Row(
        variant,
        functools.partial(resnet_workload, s, name=name, context_pool=cp),
        ('resnet', s, name, None if cp is None else tuple(sorted(cp.items()))),
        paper,
        quick=quick,
    )

  rows = (  # Table 3 (quick too), then Table S1's variants
      row('ResNet-44', 'resnet44', None, 3.7, 0.66),
      row('CP-ResNet-44', 'resnet44', {}, 3.9, 0.68),
      row('CP-ResNet-44: MLP-based CP', 'resnet44', {'mapping': 'mlp'}, 3.8, 0.67),
      row('CP-ResNet-44: self-attention-based CP', 'resnet44', {'mapping': 'attention'}, 4.4, 0.67),
      row(
          'CP-ResNet-44: learn pooling size only',
          'resnet44',
          {'weights': 'uniform'},
          None,
          0.67,
          quick=False,
      ),
      row(
          'CP-ResNet-44: weights by feature similarity',
          'resnet44',
          {'weights': 'nonlocal'},
          None,
          0.67,
          quick=False,
      ),
      row('CP-ResNet-46', 'resnet46', {}, None, 0.70, quick=False),
  )
  return Table(
      name='contextpool_resnet',
      title='ContextPool Table 3 and Table S1: ResNet-44, CIFAR-10',
      shapes=(
          f'batch {s.resnet_batch} of 32x32x3 images, ResNet-44 (16/32/64 channels, '
          f'ContextPool before the global pool), {s.dtype}; SGD momentum'
          f'{cp_implementation_note(cp_defaults, 8 * 8)}'
      ),
      baseline='ResNet-44',
      rows=rows,
      paper_columns=(
          PaperColumn('paper_gflops', 'paper GFLOPs', '{:.1f}'),
          PaperColumn('paper_params_m', 'paper params (M)', '{:.2f}'),
      ),
      paper_note='Paper: Table 3 FLOPs and sizes, Table S1 sizes.',
  )


def area(s: Sizes, cp_defaults: Mapping[str, Any]) -> Table:
  def row(variant, attention, rich, cp, paper_s):
    cp = _with_cp_defaults(cp, cp_defaults)
    return Row(
        variant,
        functools.partial(nmt_workload, s, attention=attention, rich_area=rich, context_pool=cp),
        (
            'nmt',
            s,
            attention + ('-rich' if rich else ''),
            None if cp is None else tuple(sorted(cp.items())),
        ),
        {} if paper_s is None else {'paper_step_s': paper_s},
    )

  rows = (
      row('Transformer-Base', 'standard', False, None, 0.4),
      row('area attention, basic (Eq. 3-4)', 'area', False, None, 0.5),
      row('area attention, rich (Eq. 9, 4)', 'area', True, None, 0.8),
      row('CP-Base', 'standard', False, {}, None),
  )
  return Table(
      name='area',
      title='Area attention (Li et al., 2019): Transformer-Base step time',
      shapes=(
          f'batch {s.nmt_batch} x {s.nmt_length} source and {s.nmt_length} target tokens, '
          f'{s.nmt_layers}+{s.nmt_layers} layers, area attention (max area 5) in the first '
          f'{num_area_layers(s)} layer(s) of encoder and decoder (self and '
          f'encoder-decoder attention; paper: 2 of 6), {s.dtype}; Adam'
      ),
      baseline='Transformer-Base',
      rows=rows,
      paper_columns=(PaperColumn('paper_step_s', 'paper step (s)', '{:.1f}'),),
      paper_note='Paper: 8 P100 GPUs, ~32k tokens per batch (~4k per GPU), 6+6 layers.',
      targets=(
          Target(
              'area attention, basic (Eq. 3-4)',
              'step_ms_rel',
              1.15,
              1.25,
              'basic area attention step time',
          ),
          Target(
              'area attention, rich (Eq. 9, 4)',
              'step_ms_rel',
              1.5,
              2.0,
              'rich area attention step time',
          ),
      ),
  )


def lambda_table(s: Sizes, cp_defaults: Mapping[str, Any]) -> Table:
  del cp_defaults
  c = s.lambda_channels
  dtype = DTYPES[s.dtype]

  def row(variant, make, train_kwarg, paper_gb):
    return Row(
        variant,
        functools.partial(layer_workload, s, make, train_kwarg=train_kwarg),
        ('lambda', s, variant),
        {} if paper_gb is None else {'paper_memory_gb': paper_gb},
    )

  rows = (
      row('global self-attention (4 heads)', lambda: GlobalMHA(heads=4, dtype=dtype), True, 120.0),
      row('LambdaLayer global', lambda: LambdaLayer(position='global', dtype=dtype), True, 1.9),
      row(
          'LambdaLayer conv (scope 23)',
          lambda: LambdaLayer(position='conv', scope_size=23, dtype=dtype),
          True,
          None,
      ),
      row(
          'AugmentedConv2D (3x3, kappa=2nu=0.2, 8 heads)',
          lambda: AugmentedConv2D(
              c,
              (3, 3),
              key_ratio=0.2,
              value_ratio=0.1,
              num_heads=8,
              depth_rounding='nearest',
              dtype=dtype,
          ),
          False,
          None,
      ),
  )
  return Table(
      name='lambda',
      title='LambdaNetworks Table 4: one layer on 56x56 feature maps',
      shapes=(
          f'batch {s.lambda_batch} of {s.lambda_size}x{s.lambda_size}x{c} maps, '
          f'|k|=16 |h|=4 |u|=1, {s.dtype}; loss sum(y^2), Adam'
      ),
      baseline='global self-attention (4 heads)',
      rows=rows,
      paper_columns=(PaperColumn('paper_memory_gb', 'paper memory (GB)', '{:.1f}'),),
      paper_note=(
          'Paper: memory of a whole ResNet-50-like network at batch 128 '
          '(global self-attention: 120 GB, OOM); ours: the one layer.'
      ),
  )


TABLES: dict[str, Callable[[Sizes, Mapping[str, Any]], Table]] = {
    'contextpool_nmt': contextpool_nmt,
    'contextpool_vit': contextpool_vit,
    'contextpool_resnet': contextpool_resnet,
    'area': area,
    'lambda': lambda_table,
}
# Names accepted by --tables besides the table names.
GROUPS = {'contextpool': ('contextpool_nmt', 'contextpool_vit', 'contextpool_resnet')}


def resolve(names: Sequence[str]) -> list[str]:
  """``['contextpool', 'area']`` -> table names, in TABLES order, no repeats."""
  wanted = set()
  for n in names:
    n = n.strip()
    if n in GROUPS:
      wanted.update(GROUPS[n])
    elif n in TABLES:
      wanted.add(n)
    else:
      raise ValueError(f'--tables: unknown table {n!r}; allowed: {", ".join([*GROUPS, *TABLES])}.')
  return [n for n in TABLES if n in wanted]


def cp_implementation_note(cp_defaults: Mapping[str, Any], num_inputs: int) -> str:
  """``'; ContextPool implementation dense'`` -- what CP rows use for n inputs."""
  resolved = ContextPool(**dict(cp_defaults)).resolved_implementation(num_inputs)
  return f'; ContextPool implementation {resolved}'


def cp_implementation_defaults(implementation: str) -> dict[str, Any]:
  """ContextPool overrides for ``--cp_implementation`` ('' = the layer's default)."""
  if not implementation:
    return {}
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f'--cp_implementation={implementation!r}; allowed: '
        f'{", ".join(IMPLEMENTATIONS)} (or empty: the layer default).'
    )
  return {'implementation': implementation}
