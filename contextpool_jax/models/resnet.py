"""ResNets with ContextPool, lambda layers or attention-augmented convolutions.

One :class:`ResNet` module covers every model of this file; the registry names
(``MODELS``) are presets of its fields, each reproducing a paper's table:

* CIFAR ResNets (He et al., CVPR 2016, Sec. 4.2): a 3x3 stem, three stages of
  basic blocks with 16/32/64 channels, ``6n + 2`` weighted layers, global
  average pool, 10-way classifier. ``resnet20/32/44/56`` (n = 3/5/7/9) and
  ``resnet46``; ``cp_*`` with ContextPool (Huang et al., ICML 2022, Appendix A
  and Table S1: ResNet-44 0.66M, CP-ResNet-44 0.68M, CP-ResNet-46 0.70M).
* ImageNet ResNets (He et al. 2016, Table 1): 7x7/2 stem and 3x3/2 max-pool,
  bottleneck blocks ``[3, 4, 6, 3]`` (``resnet50``, 25.6M) and ``[3, 4, 23, 3]``
  (``resnet101``, 44.5M); ``cp_*`` with ContextPool (Table S2).
* ``lambda_resnet50`` (Bello, ICLR 2021, Table "L -> L -> L -> L": 15.0M):
  ResNet-50 with lambda layers in place of the 3x3 convolutions.
* ``aa_resnet34`` / ``aa_resnet50`` (Bello et al., ICCV 2019, Table 3:
  AA-ResNet-34 = 20.7M, AA-ResNet-50 = 25.8M): attention-augmented
  convolutions in place of the 3x3 convolutions of stages 2-4.

Every model is called as ``model(images, train=...)`` with ``images [batch,
height, width, channels]`` and returns float32 logits ``[batch, num_classes]``.
BatchNorm uses its running averages unless ``train=True`` (then
``'batch_stats'`` must be mutable). Every field can be overridden through the
registry, e.g. ``create('cp_resnet50', width=16, context_pool={'size_norm':
'softmax'})``.

Which 3x3 operation each stage uses is the field ``stage_pattern``: one letter
per stage, ``C`` (convolution), ``L`` (lambda layer) or ``A`` (attention-
augmented convolution), e.g. ``'C,C,L,L'`` (the lambda paper's hybrids) or
``'A,A,A,A'``. The choices the papers leave open are fields, listed on
:class:`ResNet` (with the parameter counts that decided the defaults).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.base import checks
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.augmented_conv import DOWNSAMPLES as AA_DOWNSAMPLES
from contextpool_jax.layers.augmented_conv import POSITIONS as AA_POSITIONS
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.context_pool import make_context_pool
from contextpool_jax.layers.lambda_layer import LambdaLayer
from contextpool_jax.layers.lambda_layer import POSITIONS as LAMBDA_POSITIONS
from contextpool_jax.models.common import Fields, bundle, remat, remat_policy

Array = jax.Array
Dtype = Any

_OWNER = 'ResNet'
BLOCKS = ('basic', 'bottleneck')
STEMS = ('cifar', 'imagenet')
SHORTCUTS = ('A', 'B')
# Letters of ``stage_pattern``: the operation replacing each 3x3 convolution.
SPATIAL_OPS = {'C': 'convolution', 'L': 'lambda layer', 'A': 'attention-augmented conv'}
CP_PLACEMENTS = ('stem_pool', 'downsample', 'global_pool')
CONV_INIT_MODES = ('fan_in', 'fan_out')
BOTTLENECK_EXPANSION = 4


# ----------------------------------------------------------------------------
# Small pure helpers.
# ----------------------------------------------------------------------------


def parse_stage_pattern(
    pattern: Optional[Union[str, Sequence[str]]], num_stages: int
) -> tuple[str, ...]:
  """``'C,C,L,L'`` (or ``'CCLL'``, or a sequence of letters) -> one letter per stage.

  None means all convolutions. Raises ValueError for an unknown letter or a
  length different from the number of stages.
  """
  if pattern is None:
    return ('C',) * num_stages
  letters = (
      tuple(p.strip() for p in pattern.replace(',', ' ').split())
      if isinstance(pattern, str)
      else tuple(pattern)
  )
  if len(letters) == 1 and isinstance(pattern, str) and len(letters[0]) > 1:
    letters = tuple(letters[0])  # 'CCLL'
  bad = [p for p in letters if p not in SPATIAL_OPS]
  if bad or len(letters) != num_stages:
    raise ConfigError(
        f'{_OWNER}.stage_pattern={pattern!r} is invalid; expected {num_stages} '
        f'comma-separated letters (one per stage), each one of '
        f'{", ".join(f"{k!r} ({n})" for k, n in SPATIAL_OPS.items())}.'
    )
  return letters


def parse_cp_placement(placement: Union[str, Sequence[str]]) -> tuple[str, ...]:
  """``'stem_pool,downsample'`` (or a sequence of names) -> sorted unique names.

  Raises ValueError for an unknown or empty placement.
  """
  names = (
      tuple(p.strip() for p in placement.split(',') if p.strip())
      if isinstance(placement, str)
      else tuple(placement)
  )
  bad = [p for p in names if p not in CP_PLACEMENTS]
  if bad or not names:
    raise ConfigError(
        f'{_OWNER}.cp_placement={placement!r} is invalid; expected one or more '
        f'(comma-separated) of {", ".join(map(repr, CP_PLACEMENTS))}.'
    )
  return tuple(p for p in CP_PLACEMENTS if p in names)


def round_to_multiple(value: float, multiple: int) -> int:
  """The positive multiple of ``multiple`` nearest to ``value`` (at least ``multiple``)."""
  return max(1, round(value / multiple)) * multiple


def augmented_depths(
    features: int, key_ratio: float, value_ratio: float, heads: int, min_key_depth_per_head: int
) -> tuple[int, int]:
  """(d_k, d_v) of an attention-augmented 3x3 convolution with ``features`` outputs.

  Bello et al. (ICCV 2019, Sec. 4.2) use kappa = 2 nu = 0.2 "and a minimum of
  20 dimensions per head for the keys": ``d_k = max(kappa F, 20 N_h)``,
  ``d_v = nu F``, each rounded to a multiple of ``N_h`` (the paper does not say
  how; we round to the nearest positive multiple).

  Raises:
    ValueError: if d_v would leave the convolution no channel.
  """
  d_k = max(round_to_multiple(key_ratio * features, heads), min_key_depth_per_head * heads)
  d_v = round_to_multiple(value_ratio * features, heads)
  if d_v >= features:
    raise ConfigError(
        f'{_OWNER}.aa_value_ratio={value_ratio!r} is invalid for a layer with '
        f'{features} channels and aa_heads={heads}: d_v = {d_v} leaves the '
        'convolution no channel; lower aa_value_ratio or aa_heads, or raise width.'
    )
  return d_k, d_v


def zero_pad_shortcut(x: Array, features: int, strides: int) -> Array:
  """He et al.'s option-A shortcut: subsample by ``strides``, zero-pad new channels.

  Parameter-free. The subsampled positions ``(s i, s j)`` are the centres of
  the symmetric-padded 3x3/s convolution on the residual branch.
  """
  x = x[:, ::strides, ::strides, :]
  extra = features - x.shape[-1]
  if extra < 0:
    raise ConfigError(
        f"{_OWNER}.shortcut='A' cannot reduce channels "
        f"({x.shape[-1]} -> {features}); use shortcut='B'."
    )
  return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra))) if extra else x


def conv_initializer(mode: str) -> Callable[..., Array]:
  """He et al. (ICCV 2015) initialisation: N(0, 2 / fan), untruncated."""
  fan = cast(Literal['fan_in', 'fan_out'], mode)  # one of CONV_INIT_MODES (ResNetConfig.check)
  return nn.initializers.variance_scaling(2.0, fan, 'normal')


# ----------------------------------------------------------------------------
# The fields, declared once: the ResNet's and every block's.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(unsafe_hash=True, kw_only=True)
class ResNetConfig(Fields):
  """Every field of the ResNet family, declared once.

  :class:`ResNet` has these as its own fields (``ResNet(stage_sizes=...,
  width=16)``, ``model.num_classes``, registry overrides); ``model.config``
  bundles them into this dataclass, which the residual blocks and the
  block helpers read. The choices behind the defaults are on :class:`ResNet`.

  Attributes:
    stage_sizes: residual blocks per stage.
    block: ``'basic'`` or ``'bottleneck'``.
    stem: ``'cifar'`` (3x3 conv, stride 1) or ``'imagenet'`` (7x7/2 conv and a
      3x3/2 max-pool).
    width: channels of the first stage (doubled at each stage; a bottleneck
      outputs 4x): 16 for CIFAR, 64 for ImageNet.
    num_classes: classifier outputs.
    shortcut: ``'A'`` (zero-padding identity) or ``'B'`` (projection).
    stage_pattern: letters ``C``/``L``/``A`` per stage (``'C,C,L,L'``); None =
      all convolutions.
    context_pool: None, or a mapping of ContextPool field overrides.
    cp_placement: where ContextPool goes (see :class:`ResNet`), a
      comma-separated string or a sequence of ``'stem_pool'``,
      ``'downsample'``, ``'global_pool'``.
    lambda_key_depth, lambda_heads, lambda_intra_depth, lambda_position,
      lambda_scope_size: :class:`LambdaLayer` ``|k|``, ``|h|``, ``|u|``, position and scope.
    lambda_pool_size: average-pool window after a strided lambda layer.
    aa_key_ratio, aa_value_ratio, aa_heads, aa_position, aa_downsample:
      :class:`AugmentedConv2D` kappa, nu, N_h, position, attention_downsample.
    aa_min_key_depth_per_head: lower bound on d_k / N_h (0: none).
    zero_init_residual: zero-initialise the last BatchNorm scale of each block.
    conv_init_mode: ``'fan_out'`` or ``'fan_in'`` for the He initialisation.
    bn_momentum, bn_epsilon: BatchNorm running-average decay and epsilon.
    bn_axis_name: mapped axis name for BatchNorm batch statistics in your own
      ``jax.pmap`` / ``shard_map`` loop (every BatchNorm of the network,
      including the lambda layers'); None (default) = the local batch, which is
      right under ``jax.jit`` with sharded arrays (the trainer).
    remat: what each residual block keeps for the backward pass, a name of
      ``models.common.REMAT_POLICIES`` (``'none'``, ``'full'``,
      ``'dots'``, ``'dots_no_batch'``: what each keeps, docs/models.md#memory),
      or a bool of older configs (``models.common.remat_policy``).
    dtype: compute dtype (e.g. ``jnp.bfloat16``); None infers it.
    param_dtype: parameter dtype.
  """

  stage_sizes: Sequence[int]
  block: str = 'bottleneck'
  stem: str = 'imagenet'
  width: int = 64
  num_classes: int = 1000
  shortcut: str = 'B'
  stage_pattern: Optional[Union[str, Sequence[str]]] = None
  context_pool: Optional[Mapping[str, Any]] = None
  cp_placement: Union[str, Sequence[str]] = 'stem_pool,downsample'
  lambda_key_depth: int = 16
  lambda_heads: int = 4
  lambda_intra_depth: int = 1
  lambda_position: str = 'conv'
  lambda_scope_size: int = 23
  lambda_pool_size: int = 3
  aa_key_ratio: float = 0.2
  aa_value_ratio: float = 0.1
  aa_heads: int = 8
  aa_min_key_depth_per_head: int = 20
  aa_position: str = 'relative'
  aa_downsample: str = 'avg_pool'
  zero_init_residual: bool = False
  conv_init_mode: str = 'fan_out'
  bn_momentum: float = 0.9
  bn_epsilon: float = 1e-5
  bn_axis_name: Optional[str] = None
  remat: str | bool = 'none'
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32

  @property
  def cp_at(self) -> tuple[str, ...]:
    """The placements that get a ContextPool: ``cp_placement``, or () without one."""
    return () if self.context_pool is None else parse_cp_placement(self.cp_placement)

  def check(self) -> tuple[str, ...]:
    """Raises ConfigError for any invalid field; returns the stage pattern (a letter per stage)."""
    sizes = self.stage_sizes
    if (
        not isinstance(sizes, (tuple, list))
        or not sizes
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes)
    ):
      raise ConfigError(
          f'{_OWNER}.stage_sizes={sizes!r} is invalid; expected a '
          'non-empty sequence of positive ints.'
      )
    checks.check_choice(_OWNER, 'block', self.block, BLOCKS)
    checks.check_choice(_OWNER, 'stem', self.stem, STEMS)
    checks.check_choice(_OWNER, 'shortcut', self.shortcut, SHORTCUTS)
    checks.check_choice(_OWNER, 'conv_init_mode', self.conv_init_mode, CONV_INIT_MODES)
    checks.check_choice(_OWNER, 'lambda_position', self.lambda_position, LAMBDA_POSITIONS)
    checks.check_choice(_OWNER, 'aa_position', self.aa_position, AA_POSITIONS)
    checks.check_choice(_OWNER, 'aa_downsample', self.aa_downsample, AA_DOWNSAMPLES)
    for name in (
        'width',
        'num_classes',
        'lambda_key_depth',
        'lambda_heads',
        'lambda_intra_depth',
        'lambda_pool_size',
        'aa_heads',
    ):
      checks.check_positive(_OWNER, name, getattr(self, name), integer=True)
    checks.check_positive(
        _OWNER,
        'aa_min_key_depth_per_head',
        self.aa_min_key_depth_per_head,
        integer=True,
        allow_zero=True,
    )
    if (
        self.lambda_scope_size is None
        or not isinstance(self.lambda_scope_size, int)
        or self.lambda_scope_size <= 0
        or self.lambda_scope_size % 2 == 0
    ):
      raise ConfigError(
          f'{_OWNER}.lambda_scope_size={self.lambda_scope_size!r} is '
          'invalid; expected an odd positive int.'
      )
    for name in ('aa_key_ratio', 'aa_value_ratio', 'bn_epsilon'):
      checks.check_positive(_OWNER, name, getattr(self, name))
    checks.check_probability(_OWNER, 'bn_momentum', self.bn_momentum)
    checks.check_choice(_OWNER, 'zero_init_residual', self.zero_init_residual, (True, False))
    remat_policy(_OWNER, self.remat)
    if self.context_pool is not None and not isinstance(self.context_pool, Mapping):
      raise ConfigError(
          f'{_OWNER}.context_pool={self.context_pool!r} is invalid; '
          'expected None or a mapping of ContextPool fields.'
      )
    pattern = parse_stage_pattern(self.stage_pattern, len(sizes))
    placement = parse_cp_placement(self.cp_placement)
    if self.context_pool is not None and 'stem_pool' in placement and self.stem != 'imagenet':
      raise ConfigError(
          f"{_OWNER}.cp_placement={self.cp_placement!r}: 'stem_pool' "
          f"needs stem='imagenet' (stem={self.stem!r} has no pooling); "
          "allowed here: 'downsample', 'global_pool'."
      )
    return pattern


def _norm(
    o: ResNetConfig, train: bool, *, zero: bool = False, name: Optional[str] = None
) -> nn.BatchNorm:
  return nn.BatchNorm(
      use_running_average=not train,
      momentum=o.bn_momentum,
      epsilon=o.bn_epsilon,
      axis_name=o.bn_axis_name,
      dtype=o.dtype,
      param_dtype=o.param_dtype,
      scale_init=nn.initializers.zeros if zero else nn.initializers.ones,
      name=name,
  )


def _conv(
    o: ResNetConfig, features: int, kernel: int, strides: int = 1, *, name: Optional[str] = None
) -> nn.Conv:
  """Bias-free convolution with symmetric ``kernel // 2`` padding (output centres
  at ``(s i, s j)``, as the shortcut and the pooling replacements)."""
  pad = kernel // 2
  return nn.Conv(
      features,
      (kernel, kernel),
      (strides, strides),
      padding=((pad, pad), (pad, pad)),
      use_bias=False,
      kernel_init=conv_initializer(o.conv_init_mode),
      dtype=o.dtype,
      param_dtype=o.param_dtype,
      name=name,
  )


def _context_pool(o: ResNetConfig, strides: int, name: str) -> ContextPool:
  """ContextPool replacing a pooling of stride ``strides`` (centres ``(s i, s j)``)."""
  pool = make_context_pool(
      o.context_pool, dtype=o.dtype, param_dtype=o.param_dtype, name=name, strides=strides
  )
  assert pool is not None  # cp_at names a placement only with a context_pool
  return pool


def spatial_op(
    o: ResNetConfig, kind: str, x: Array, features: int, strides: int, train: bool, name: str
) -> Array:
  """The block's 3x3 operation: ``'C'`` conv, ``'L'`` lambda layer, ``'A'`` AA conv.

  Must be called from a compact method (the submodule binds to the caller).
  A strided lambda block runs the lambda layer at full resolution followed by
  an average pool (``lambda_pool_size`` window, stride ``strides``, symmetric
  padding, padded cells excluded): our reading of the LambdaResNets' strided
  blocks (the slides do not say; the window 3 is our choice). A strided
  attention-augmented convolution follows ``aa_downsample``.
  """
  if kind == 'C':
    return _conv(o, features, 3, strides, name=name)(x)
  if kind == 'L':
    y = LambdaLayer(
        out_features=features,
        key_depth=o.lambda_key_depth,
        heads=o.lambda_heads,
        intra_depth=o.lambda_intra_depth,
        position=o.lambda_position,
        scope_size=o.lambda_scope_size,
        batch_norm_momentum=o.bn_momentum,
        batch_norm_epsilon=o.bn_epsilon,
        bn_axis_name=o.bn_axis_name,
        dtype=o.dtype,
        param_dtype=o.param_dtype,
        name=name,
    )(x, train=train)
    if strides > 1:
      k = o.lambda_pool_size
      pad = (k // 2, k // 2)
      y = nn.avg_pool(
          y,
          (k, k),
          (strides, strides),
          padding=(pad, pad),  # pyright: ignore[reportArgumentType]  # flax: unannotated
          count_include_pad=False,
      )
    return y
  d_k, d_v = augmented_depths(
      features, o.aa_key_ratio, o.aa_value_ratio, o.aa_heads, o.aa_min_key_depth_per_head
  )
  return AugmentedConv2D(
      features,
      (3, 3),
      strides,
      key_ratio=d_k / features,
      value_ratio=d_v / features,
      num_heads=o.aa_heads,
      position=o.aa_position,
      attention_downsample=o.aa_downsample,
      use_bias=False,
      dtype=o.dtype,
      param_dtype=o.param_dtype,
      name=name,
  )(x)


def _shortcut(o: ResNetConfig, x: Array, features: int, strides: int, train: bool) -> Array:
  """Identity, or option A (zero-pad) / option B (1x1 projection + BN) on a change."""
  if strides == 1 and x.shape[-1] == features:
    return x
  if o.shortcut == 'A':
    return zero_pad_shortcut(x, features, strides)
  y = _conv(o, features, 1, strides, name='shortcut_conv')(x)
  return _norm(o, train, name='shortcut_norm')(y)


# ----------------------------------------------------------------------------
# Residual blocks. ``train`` is positional so that ``nn.remat(...,
# static_argnums=(2,))`` can treat it as static.
# ----------------------------------------------------------------------------


class BasicBlock(nn.Module):
  """Two 3x3 operations (He et al. 2016, Fig. 2 left), post-activation.

  With ContextPool at ``'downsample'`` a strided block pools its input with
  ``ContextPool(strides)`` and runs the first 3x3 operation at stride 1; the
  shortcut is unchanged.
  """

  features: int
  strides: int
  kind: str
  config: ResNetConfig

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    o, strides = self.config, self.strides
    y = x
    if strides > 1 and 'downsample' in o.cp_at:
      y = _context_pool(o, strides, 'context_pool')(y, deterministic=not train)
      strides = 1
    y = spatial_op(o, self.kind, y, self.features, strides, train, 'spatial_0')
    y = nn.relu(_norm(o, train, name='norm_0')(y))
    y = spatial_op(o, self.kind, y, self.features, 1, train, 'spatial_1')
    y = _norm(o, train, zero=o.zero_init_residual, name='norm_1')(y)
    return nn.relu(y + _shortcut(o, x, self.features, self.strides, train))


class BottleneckBlock(nn.Module):
  """1x1 -> 3x3 -> 1x1 (x4) bottleneck (He et al. 2016, Fig. 5 right).

  The stride sits on the 3x3 operation (the common "v1.5" layout; He et al.
  put it on the first 1x1, same parameter count). With
  ContextPool at ``'downsample'`` a strided block pools the 1x1-reduced map with
  ``ContextPool(strides)`` in front of the 3x3 operation, which runs at stride
  1; the shortcut (1x1 projection with stride) is unchanged.
  """

  features: int  # bottleneck width; the block outputs 4 * features
  strides: int
  kind: str
  config: ResNetConfig

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    o, strides = self.config, self.strides
    out = BOTTLENECK_EXPANSION * self.features
    y = _conv(o, self.features, 1, name='conv_0')(x)
    y = nn.relu(_norm(o, train, name='norm_0')(y))
    if strides > 1 and 'downsample' in o.cp_at:
      y = _context_pool(o, strides, 'context_pool')(y, deterministic=not train)
      strides = 1
    y = spatial_op(o, self.kind, y, self.features, strides, train, 'spatial_1')
    y = nn.relu(_norm(o, train, name='norm_1')(y))
    y = _conv(o, out, 1, name='conv_2')(y)
    y = _norm(o, train, zero=o.zero_init_residual, name='norm_2')(y)
    return nn.relu(y + _shortcut(o, x, out, self.strides, train))


# ----------------------------------------------------------------------------
# The network.
# ----------------------------------------------------------------------------


class ResNet(ResNetConfig, nn.Module):
  """ResNet (He et al., CVPR 2016) with optional ContextPool, lambda or AA layers.

  ``__call__(images, train=False)``: ``images [batch, height, width, channels]``
  (any fixed size; see ``stage_pattern`` for AA) -> float32 logits
  ``[batch, num_classes]``.

  Decisions where the papers are silent (all fields; the parameter counts
  quoted are this implementation's, paper values in brackets):

  * CIFAR shortcut (``shortcut``): ``'A'`` (He et al.'s option A for CIFAR:
    identity, stride-2 subsampling, zero-padded channels; parameter-free) gives
    ResNet-44 = 0.659M [0.66M]; ``'B'`` (1x1 projection + BN on a change) adds
    2.8K (0.661M). ImageNet presets use ``'B'`` (He et al.'s ResNet-50/101).
  * CIFAR depth 46 (``resnet46``, ``stage_sizes``): 46 is not 6n + 2. "A deeper
    network with CP" that adds 0.02M to CP-ResNet-44: one more basic block (2
    layers) in stage 2, stage sizes (7, 8, 7): 0.696M with CP [0.70M]. An extra
    block in stage 1 gives 0.682M, in stage 3 0.752M.
  * ContextPool placement (``cp_placement``; any comma-separated combination):
    ``'stem_pool'`` replaces the ImageNet stem's 3x3/2 max-pool by
    ``ContextPool(strides=2)``; ``'downsample'`` puts ``ContextPool(strides=2)``
    in front of every stride-2 3x3 operation, which then runs at stride 1 (the
    shortcut keeps its own subsampling) -- in a bottleneck it pools the
    narrow 1x1-reduced map; ``'global_pool'`` applies ``ContextPool(strides=1)``
    before the global average pool. Pooling centres are at ``(2i, 2j)``, the
    centres of the symmetric-padded 3x3/2 convolution and max-pool they replace.
    Defaults, chosen by the paper's parameter counts:

    - CIFAR: ``'global_pool'`` (the only pooling layer of a CIFAR ResNet):
      CP-ResNet-44 0.678M [0.68M], CP-ResNet-46 0.696M [0.70M].
      ``'downsample'`` gives 0.674M (ContextPool on 16 and 32 channels).
    - ImageNet: ``'stem_pool,downsample'``: +0.279M (CP-ResNet-50 25.84M,
      CP-ResNet-101 44.83M), the paper's +0.2M / +0.3M [26.6 -> 26.8M, 45.5 ->
      45.8M]. ``'stem_pool'`` alone adds only 0.019M; ``'global_pool'`` (2048
      channels) adds 0.59M.

    The paper's ResNet-50 / ResNet-101 baselines (Table S2: 26.6M / 45.5M)
    are both 1.0M above the standard networks (25.6M / 44.5M: He et al.; the
    LambdaNetworks and AA papers also quote 25.6M). The offset is the same
    for both depths, so it lies outside the residual stages (the paper does
    not say where; e.g. a different classifier head in the deformable-ConvNets
    code base it compares with). We build the standard networks and
    reproduce the paper's ContextPool increments.
  * ContextPool fields (``context_pool``): None = no ContextPool; a mapping
    (possibly empty) overrides :class:`ContextPool` fields (mapping width,
    ``size_norm``, ...); ``strides`` is set by the placement. ContextPool runs
    with ``deterministic=not train``: a ``dropout_rate`` needs
    ``rngs={'dropout': ...}`` in training.
  * Lambda layers (``stage_pattern`` with ``'L'``): they replace every 3x3
    convolution of the stage; ``|k| = 16``, ``|h| = 4``, ``|u| = 1``, lambda convolution
    with scope 23 (the paper's LambdaResNets); the layer's own BatchNorms use
    the network's momentum. A strided lambda block: lambda layer at full
    resolution, then a ``lambda_pool_size`` x ``lambda_pool_size`` (3) average
    pool with stride 2. ``'L,L,L,L'`` gives 15.0M [15.0M];
    ``'C,C,L,L'`` 15.6M [15.4M].
  * Attention augmentation (``'A'``): replaces every 3x3 convolution of the
    stage; kappa = 2 nu = 0.2, N_h = 8, "a minimum of 20 dimensions per head
    for the keys" (Bello et al. 2019, experimental set-up), d_k and d_v
    rounded to the nearest multiple of N_h, relative positions, no biases
    (BatchNorm follows), strided layers attend on the average-pooled map
    (``aa_downsample``). Stages 2-4
    (``'C,A,A,A'``; the 56x56 first stage's (HW)^2 attention is the costly
    one): AA-ResNet-50 25.78M [25.8M], AA-ResNet-101 45.36M [45.4M];
    ``'A,A,A,A'`` gives 25.84M. The 20-per-head minimum can only add
    parameters at 128/256 channels, so AA-ResNet-34 [20.7M] cannot have used
    it: with it 22.24M, without it (``aa_min_key_depth_per_head=0``, the
    ``aa_resnet34`` preset) 20.97M. Relative tables are sized by the feature
    maps of the first call: an AA model works at any input size, but always
    at the size it was initialised with.
  * Initialisation: He normal (``conv_init_mode='fan_out'``, untruncated),
    BatchNorm scale 1 / bias 0, or scale 0 on each block's last BatchNorm
    with ``zero_init_residual`` (Goyal et al. 2017; off by default, as in He
    et al.); Flax's default (LeCun normal) for the classifier.
  * BatchNorm momentum 0.9 (PyTorch's 0.1), epsilon 1e-5.

  Fields: :class:`ResNetConfig`'s (documented there).
  """

  @property
  def config(self) -> ResNetConfig:
    """This module's fields as one :class:`ResNetConfig`."""
    return bundle(self, ResNetConfig)

  @nn.nowrap
  def check_fields(self) -> tuple[str, ...]:
    """Raises ConfigError for an invalid field (``ResNetConfig.check``; returns the stage
    pattern): the model calls it, and so does a run's config reader, before anything is
    traced."""
    return self.config.check()

  # -- forward ---------------------------------------------------------------

  @nn.compact
  def __call__(self, images: Array, train: bool = False) -> Array:
    o = self.config
    pattern = self.check_fields()
    checks.check_rank(_OWNER, 'images', images, (4,), '[batch, height, width, channels]')
    x = images if o.dtype is None else images.astype(o.dtype)

    if o.stem == 'cifar':
      x = _conv(o, o.width, 3, name='stem_conv')(x)
      x = nn.relu(_norm(o, train, name='stem_norm')(x))
    else:
      x = _conv(o, o.width, 7, 2, name='stem_conv')(x)
      x = nn.relu(_norm(o, train, name='stem_norm')(x))
      if 'stem_pool' in o.cp_at:
        x = _context_pool(o, 2, 'stem_context_pool')(x, deterministic=not train)
      else:
        x = nn.max_pool(
            x,
            (3, 3),
            (2, 2),
            padding=((1, 1), (1, 1)),  # pyright: ignore[reportArgumentType]  # flax: unannotated
        )

    block_cls = BasicBlock if o.block == 'basic' else BottleneckBlock
    block_cls = remat(block_cls, o.remat, _OWNER, static_argnums=(2,))
    for i, (num_blocks, kind) in enumerate(zip(o.stage_sizes, pattern)):
      for j in range(num_blocks):
        strides = 2 if i > 0 and j == 0 else 1
        x = block_cls(o.width * 2**i, strides, kind, o, name=f'stage_{i}_block_{j}')(x, train)

    if 'global_pool' in o.cp_at:
      x = _context_pool(o, 1, 'head_context_pool')(x, deterministic=not train)
    x = jnp.mean(x, axis=(1, 2))
    x = nn.Dense(o.num_classes, dtype=o.dtype, param_dtype=o.param_dtype, name='head')(x)
    return x.astype(jnp.float32)


# ----------------------------------------------------------------------------
# Registry presets.
# ----------------------------------------------------------------------------

_CIFAR = dict(
    block='basic', stem='cifar', width=16, num_classes=10, shortcut='A', cp_placement='global_pool'
)
_IMAGENET = dict(
    block='bottleneck',
    stem='imagenet',
    width=64,
    num_classes=1000,
    shortcut='B',
    cp_placement='stem_pool,downsample',
)

# CIFAR depth -> blocks per stage (6n + 2 layers; 46 = 44 + one stage-2 block).
CIFAR_STAGE_SIZES = {20: (3, 3, 3), 32: (5, 5, 5), 44: (7, 7, 7), 46: (7, 8, 7), 56: (9, 9, 9)}
IMAGENET_STAGE_SIZES = {34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}

MODELS: dict[str, Callable[..., nn.Module]] = {}
for _depth, _sizes in CIFAR_STAGE_SIZES.items():
  MODELS[f'resnet{_depth}'] = functools.partial(ResNet, stage_sizes=_sizes, **_CIFAR)
  MODELS[f'cp_resnet{_depth}'] = functools.partial(
      ResNet, stage_sizes=_sizes, context_pool={}, **_CIFAR
  )
for _depth in (50, 101):
  _sizes = IMAGENET_STAGE_SIZES[_depth]
  MODELS[f'resnet{_depth}'] = functools.partial(ResNet, stage_sizes=_sizes, **_IMAGENET)
  MODELS[f'cp_resnet{_depth}'] = functools.partial(
      ResNet, stage_sizes=_sizes, context_pool={}, **_IMAGENET
  )
MODELS['lambda_resnet50'] = functools.partial(
    ResNet, stage_sizes=IMAGENET_STAGE_SIZES[50], stage_pattern='L,L,L,L', **_IMAGENET
)
# AA-ResNet-34 without the 20-dimensions-per-head minimum: with it the model
# has 22.2M parameters, and the paper's 20.7M is out of reach (see ResNet).
MODELS['aa_resnet34'] = functools.partial(
    ResNet,
    stage_sizes=IMAGENET_STAGE_SIZES[34],
    stage_pattern='C,A,A,A',
    aa_min_key_depth_per_head=0,
    **{**_IMAGENET, 'block': 'basic'},
)
MODELS['aa_resnet50'] = functools.partial(
    ResNet, stage_sizes=IMAGENET_STAGE_SIZES[50], stage_pattern='C,A,A,A', **_IMAGENET
)
del _depth, _sizes
