"""Vision Transformers (ViT) with and without ContextPool.

ViT (Dosovitskiy et al., ICLR 2021, "An image is worth 16x16 words"), with the
DeiT model sizes (Touvron et al., ICML 2021): non-overlapping p x p patches
embedded by a strided convolution, a learned class token, learned position
embeddings, pre-LN encoder blocks (multi-head self-attention, GELU MLP of width
``mlp_dim``), a final LayerNorm and a linear head on the class token.

CP-ViT (Huang et al., ICML 2022, Sec. 3.2 and Fig. 2(c)): a ContextPool module
"placed after each attention block, whose output token features are pooled to
the same number of features for use in the next attention block". The patch
tokens are pooled as the 2D ``h x w`` grid they came from (Eq. 6, r = 0.05 for
grids); the class token is not part of the grid and is passed through unchanged.
Where exactly the module sits is a field (:attr:`ViT.context_pool_position`); see
the :class:`ViT` docstring for every choice the paper leaves open.

Registry names (``MODELS``): ``vit_ti16``, ``vit_s16``, ``vit_b16`` and
``cp_vit_ti16``, ``cp_vit_s16``, ``cp_vit_b16``. Every field of :class:`ViT`
can be overridden, e.g. ``MODELS['cp_vit_b16'](num_layers=10)`` (Table 6's
10-layer CP-ViT-B/16) or ``context_pool={'size_norm': 'softmax'}``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.base import checks
from contextpool_jax.layers.context_pool import make_context_pool
from contextpool_jax.layers import tpu_attention
from contextpool_jax.models.common import Fields, bundle, remat, remat_policy

Array = jax.Array
Dtype = Any

CLASSIFIERS = ('token', 'gap')
POOL_POSITIONS = ('block', 'attention')
# ViTConfig.attention_implementation: flax's attention, or the Pallas TPU kernel.
ATTENTION_IMPLEMENTATIONS = (None, 'pallas_tpu')
POSEMB_RESIZE_METHODS = (
    None,
    'nearest',
    'linear',
    'bilinear',
    'cubic',
    'bicubic',
    'lanczos3',
    'lanczos5',
)

_OWNER = 'ViT'
# Name of the stacked (nn.scan) parameters of the identical blocks.
SCAN_NAME = 'blocks'

# Initialisers as in the reference ViT implementation.
_dense_init = nn.initializers.xavier_uniform()
_mlp_bias_init = nn.initializers.normal(stddev=1e-6)
_posemb_init = nn.initializers.normal(stddev=0.02)


def block_name(i: int) -> str:
  """Parameter name of (unscanned) encoder block ``i``."""
  return f'block_{i}'


# ----------------------------------------------------------------------------
# Small pure helpers.
# ----------------------------------------------------------------------------


def num_pooled_layers(
    num_layers: int, context_pool: Optional[Mapping[str, Any]], context_pool_last: bool
) -> int:
  """How many blocks (the first ones) carry a ContextPool.

  Every block that is followed by another attention block (the paper's "for
  use in the next attention block"), plus the last one if
  ``context_pool_last``; 0 without ContextPool.
  """
  if context_pool is None:
    return 0
  return num_layers if context_pool_last else num_layers - 1


def num_scanned_layers(
    num_layers: int, context_pool: Optional[Mapping[str, Any]], context_pool_last: bool
) -> int:
  """How many leading blocks ``scan_layers=True`` stacks into one ``nn.scan``.

  All blocks are identical without ContextPool (or with ``context_pool_last``);
  otherwise the first ``num_layers - 1`` are, and the last block, which has no
  ContextPool, is applied on its own.
  """
  pooled = num_pooled_layers(num_layers, context_pool, context_pool_last)
  return num_layers if pooled in (0, num_layers) else pooled


def resize_posemb(
    posemb: Array,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix: int,
    method: str,
) -> Array:
  """Resizes learned position embeddings to another patch grid.

  Args:
    posemb: ``[1, num_prefix + gh * gw, d]``; the first ``num_prefix`` rows (the
      class token's) are kept as they are.
    old_grid: ``(gh, gw)`` the embeddings were learned for.
    new_grid: the target grid.
    num_prefix: number of non-grid tokens in front (1 with a class token).
    method: a ``jax.image.resize`` method (e.g. ``'bilinear'``).

  Returns:
    ``[1, num_prefix + new_h * new_w, d]``.
  """
  if tuple(old_grid) == tuple(new_grid):
    return posemb
  prefix, grid = posemb[:, :num_prefix], posemb[:, num_prefix:]
  d = grid.shape[-1]
  grid = grid.reshape(1, *old_grid, d)
  grid = jax.image.resize(grid.astype(jnp.float32), (1, *new_grid, d), method=method)
  grid = grid.astype(posemb.dtype).reshape(1, new_grid[0] * new_grid[1], d)
  return jnp.concatenate([prefix, grid], axis=1)


def pool_patch_tokens(
    pool: Callable[..., Array],
    x: Array,
    grid: tuple[int, int],
    num_prefix: int,
    deterministic: bool,
) -> Array:
  """Applies ContextPool to the patch tokens as a 2D grid; prefix tokens pass through.

  Args:
    pool: a ContextPool (called as ``pool(x_grid, deterministic=...)``).
    x: tokens ``[batch, num_prefix + h * w, d]`` (class token first, if any).
    grid: ``(h, w)``.
    num_prefix: number of tokens in front that are not on the grid.
    deterministic: False enables the ContextPool's own dropout.

  Returns:
    ``x``'s shape: the prefix tokens unchanged, the patch tokens pooled.
  """
  prefix, patches = x[:, :num_prefix], x[:, num_prefix:]
  batch, _, d = patches.shape
  pooled = pool(patches.reshape(batch, *grid, d), deterministic=deterministic)
  pooled = pooled.reshape(batch, grid[0] * grid[1], d).astype(x.dtype)
  return jnp.concatenate([prefix, pooled], axis=1)


def stack_block_params(
    params: Mapping[str, Any], num_layers: int, num_scanned: int
) -> dict[str, Any]:
  """Unscanned parameters (``block_0 .. block_{L-1}``) -> ``scan_layers`` layout.

  The first ``num_scanned`` blocks are stacked along a new leading axis under
  ``'blocks'`` (see :func:`num_scanned_layers`); the others keep their names.
  Works on any collection with the same layout (e.g. ``variables['params']``).
  """
  params = dict(params)
  blocks = [params.pop(block_name(i)) for i in range(num_scanned)]
  params[SCAN_NAME] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return params


def unstack_block_params(
    params: Mapping[str, Any], num_layers: int, num_scanned: int
) -> dict[str, Any]:
  """Inverse of :func:`stack_block_params`."""
  params = dict(params)
  stacked = params.pop(SCAN_NAME)
  for i in range(num_scanned):
    params[block_name(i)] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return params


# ----------------------------------------------------------------------------
# The fields, declared once: the ViT's and every block's.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(unsafe_hash=True, kw_only=True)
class ViTConfig(Fields):
  """Every field of the ViT family, declared once.

  :class:`ViT` has these as its own fields (``ViT(num_layers=3)``,
  ``model.hidden_size``, registry overrides); ``model.config`` bundles them
  into this dataclass, which the encoder blocks and their MLPs read.
  The choices behind the defaults are on :class:`ViT`.

  Attributes:
    num_classes: output classes.
    image_size: image height = width the position embeddings are sized for.
    patch_size: patch height = width (p).
    hidden_size: token width d.
    num_layers: encoder blocks.
    num_heads: attention heads.
    mlp_dim: MLP hidden width; None means ``4 * hidden_size``
      (:attr:`mlp_width`).
    classifier: ``'token'`` (head on the class token, ViT/DeiT) or ``'gap'``
      (no class token; head on the mean of the patch tokens).
    dropout_rate: dropout after the position embeddings, the attention
      sub-layer and in the MLP.
    attention_dropout_rate: dropout on the attention weights.
    attention_implementation: None (flax's attention) or ``'pallas_tpu'``
      (jax's Pallas TPU flash-attention kernel, memory linear in the number of
      tokens: :mod:`~contextpool_jax.layers.tpu_attention`; no attention dropout).
    context_pool: None: plain ViT; a mapping (possibly empty): CP-ViT with
      these ContextPool field overrides.
    context_pool_position: ``'block' | 'attention'`` (see :class:`ViT`).
    context_pool_last: also pool after the last block (see :class:`ViT`).
    posemb_resize: ``jax.image.resize`` method for other image sizes, or None
      to raise.
    remat: what each block keeps for the backward pass, a name of
      ``models.common.REMAT_POLICIES`` (``'none'``, ``'full'``,
      ``'dots'``, ``'dots_no_batch'``: what each keeps, docs/models.md#memory),
      or a bool of older configs (``models.common.remat_policy``).
    scan_layers: apply the identical blocks with one ``nn.scan`` (compiles one
      block instead of ``num_layers``). Parameters are then stacked under
      ``'blocks'``; with ContextPool but not ``context_pool_last``, the first
      ``num_layers - 1`` blocks are scanned and ``block_{L-1}`` is separate
      (:func:`stack_block_params` / :func:`unstack_block_params` convert).
    dtype: compute dtype (e.g. ``jnp.bfloat16``).
    param_dtype: parameter dtype.
  """

  num_classes: int = 1000
  image_size: int = 224
  patch_size: int = 16
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: Optional[int] = None
  classifier: str = 'token'
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  attention_implementation: Optional[str] = None
  context_pool: Optional[Mapping[str, Any]] = None
  context_pool_position: str = 'block'
  context_pool_last: bool = False
  posemb_resize: Optional[str] = 'bilinear'
  remat: str | bool = 'none'
  scan_layers: bool = False
  dtype: Optional[Dtype] = jnp.float32
  param_dtype: Dtype = jnp.float32

  @property
  def mlp_width(self) -> int:
    """The MLP hidden width: ``mlp_dim``, or ``4 * hidden_size`` when it is None."""
    return self.mlp_dim or 4 * self.hidden_size

  def check(self) -> None:
    """Raises ConfigError for any invalid field (called by ``ViT.__call__``)."""
    for name in (
        'num_classes',
        'image_size',
        'patch_size',
        'hidden_size',
        'num_layers',
        'num_heads',
    ):
      checks.check_positive(_OWNER, name, getattr(self, name), integer=True)
    checks.check_positive(_OWNER, 'mlp_dim', self.mlp_dim, integer=True, allow_none=True)
    checks.check_choice(_OWNER, 'classifier', self.classifier, CLASSIFIERS)
    checks.check_choice(_OWNER, 'context_pool_position', self.context_pool_position, POOL_POSITIONS)
    checks.check_choice(_OWNER, 'posemb_resize', self.posemb_resize, POSEMB_RESIZE_METHODS)
    checks.check_probability(_OWNER, 'dropout_rate', self.dropout_rate)
    checks.check_probability(_OWNER, 'attention_dropout_rate', self.attention_dropout_rate)
    checks.check_choice(
        _OWNER, 'attention_implementation', self.attention_implementation, ATTENTION_IMPLEMENTATIONS
    )
    if self.attention_implementation == 'pallas_tpu' and self.attention_dropout_rate:
      raise ConfigError(
          f"{_OWNER}.attention_implementation='pallas_tpu' has no attention dropout; got"
          f' attention_dropout_rate={self.attention_dropout_rate}.'
      )
    remat_policy(_OWNER, self.remat)
    for name in ('context_pool_last', 'scan_layers'):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(
            f'{_OWNER}.{name}={getattr(self, name)!r} is invalid; ' 'expected True or False.'
        )
    if self.image_size % self.patch_size:
      raise ConfigError(
          f'{_OWNER}.image_size={self.image_size} is invalid; expected '
          f'a multiple of patch_size={self.patch_size}.'
      )
    if self.hidden_size % self.num_heads:
      raise ConfigError(
          f'{_OWNER}.num_heads={self.num_heads} is invalid; expected a '
          f'divisor of hidden_size={self.hidden_size}.'
      )
    if self.context_pool is not None and not isinstance(self.context_pool, Mapping):
      raise ConfigError(
          f'{_OWNER}.context_pool={self.context_pool!r} is invalid; '
          'expected None or a mapping of ContextPool fields.'
      )
    if self.context_pool is not None and self.num_layers == 1 and not self.context_pool_last:
      raise ConfigError(
          f'{_OWNER}.num_layers=1 with context_pool and '
          'context_pool_last=False would insert no ContextPool; use '
          'num_layers >= 2 or context_pool_last=True.'
      )
    # Unknown or conflicting ContextPool fields raise here, before tracing.
    make_context_pool(self.context_pool, dtype=self.dtype, param_dtype=self.param_dtype)


# ----------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------


class MlpBlock(nn.Module):
  """Transformer MLP: Dense -> GELU -> Dropout -> Dense -> Dropout (ViT, Eq. 3).

  Attributes:
    config: ``mlp_width`` (hidden width), ``dropout_rate`` (after the
      activation and after the output), dtypes.
  """

  config: ViTConfig

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Array:
    cfg = self.config
    dense = functools.partial(
        nn.Dense,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_dense_init,
        bias_init=_mlp_bias_init,
    )
    d = x.shape[-1]
    y = nn.gelu(dense(cfg.mlp_width, name='dense_0')(x))
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=not train)
    y = dense(d, name='dense_1')(y)
    return nn.Dropout(cfg.dropout_rate)(y, deterministic=not train)


class EncoderBlock(nn.Module):
  """Pre-LN ViT encoder block, optionally followed by ContextPool.

  ``x = x + Dropout(MHSA(LN(x))); x = x + MLP(LN(x))`` (ViT, Eq. 2-3). With
  ``pooled``, the patch tokens are pooled by a ContextPool built from
  ``config.context_pool`` as the ``grid`` (the class token passes through,
  :func:`pool_patch_tokens`) either after the attention sub-layer's residual
  add (``context_pool_position='attention'``) or after the whole block
  (``'block'``).

  ``__call__(x, train)``: ``x [batch, num_prefix + h * w, d]`` -> same shape.
  ``train`` is positional so that ``nn.remat`` can mark it static.

  Attributes:
    config: the model's :class:`ViTConfig`.
    grid: ``(h, w)`` patch grid of the tokens after the prefix.
    num_prefix: 1 with a class token, else 0.
    pooled: this block carries a ContextPool (:func:`num_pooled_layers`).
    scan_carry: return ``(x, None)`` (the ``nn.scan`` body convention).
  """

  config: ViTConfig
  grid: tuple[int, int]
  num_prefix: int = 1
  pooled: bool = False
  scan_carry: bool = False

  @nn.compact
  def __call__(self, x: Array, train: bool = False) -> Any:
    cfg = self.config
    pool = make_context_pool(
        cfg.context_pool if self.pooled else None,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name='context_pool',
    )
    apply_pool = lambda h: (
        h
        if pool is None
        else pool_patch_tokens(pool, h, self.grid, self.num_prefix, deterministic=not train)
    )
    norm = functools.partial(nn.LayerNorm, dtype=cfg.dtype, param_dtype=cfg.param_dtype)

    y = norm(name='norm_0')(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=cfg.num_heads,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        kernel_init=_dense_init,
        broadcast_dropout=False,
        dropout_rate=cfg.attention_dropout_rate,
        attention_fn=(
            tpu_attention.flax_attention_fn
            if cfg.attention_implementation == 'pallas_tpu'
            else nn.dot_product_attention
        ),
        name='attention',
    )(y, y, deterministic=not train)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=not train)
    x = x + y
    if cfg.context_pool_position == 'attention':
      x = apply_pool(x)
    y = norm(name='norm_1')(x)
    y = MlpBlock(cfg, name='mlp')(y, train)
    x = x + y
    if cfg.context_pool_position == 'block':
      x = apply_pool(x)
    return (x, None) if self.scan_carry else x


class ViT(ViTConfig, nn.Module):
  """Vision Transformer (Dosovitskiy et al., 2021), optionally with ContextPool.

  ``__call__(images, train=False)``: ``images [batch, height, width, channels]``
  (float; height and width multiples of ``patch_size``) -> float32 logits
  ``[batch, num_classes]``. ``train=True`` enables dropout (rng ``'dropout'``).

  Choices the papers leave open (each a field; docs/models.md):

  * Where ContextPool sits (``context_pool_position``): ``'block'`` (default):
    after the whole encoder block (attention + MLP), so that the pooled tokens
    are exactly what the next block's attention reads (Sec. 3.2: "after each
    attention block, we take its outputs ... for use in the next attention
    block"; an encoder block is the ViT "attention block");
    ``'attention'``: right after the attention sub-layer's residual add, so the
    MLP of the same block reads the pooled tokens.
  * How many: after every block that is followed by another attention block,
    i.e. ``num_layers - 1`` modules. With the class-token head a ContextPool
    after the last block could not change the logits (the head reads only the
    class token, which ContextPool passes through), so its parameters would get
    no gradient. ``context_pool_last=True`` adds it (useful with
    ``classifier='gap'``).
  * The class token is not part of the 2D patch grid: it is passed through
    ContextPool unchanged (it is still updated by every attention block).
  * Image sizes other than ``image_size``: the learned position embeddings (a
    parameter sized for ``image_size``) are resized to the new patch grid with
    ``jax.image.resize(method=posemb_resize)`` (default ``'bilinear'``, as ViT
    does when fine-tuning at a higher resolution, e.g. 224 -> 384 in the
    paper); ``posemb_resize=None`` raises a ValueError instead.
  * ContextPool keeps its own defaults (``ContextPool`` fields; r = 0.05 for
    grids); ``context_pool`` overrides any of them. The model's dropout rates do
    not apply to ContextPool (use ``context_pool={'dropout_rate': ...}``).
  * Logits are returned in float32 whatever ``dtype`` is. The MLP uses Flax's
    ``nn.gelu`` (tanh approximation), as the JAX reference ViT does.
  * ContextPool intermediates (``apply(..., mutable=['intermediates'])``) are
    under ``block_i/context_pool/{pool_weights, pool_sigma}``, each a 1-tuple of
    ``[batch, h, w]``; with ``scan_layers`` under ``blocks/context_pool/...``
    stacked to ``[num_scanned, batch, h, w]``.

  Fields: :class:`ViTConfig`'s (documented there).
  """

  # -- configuration ---------------------------------------------------------

  def _grid(self, images: Array) -> tuple[int, int]:
    checks.check_rank(_OWNER, 'images', images, (4,), '[batch, height, width, channels]')
    h, w = images.shape[1:3]
    if h % self.patch_size or w % self.patch_size:
      raise ValueError(
          f'{_OWNER}: images have height x width {h} x {w}; expected '
          f'multiples of patch_size={self.patch_size}.'
      )
    grid = (h // self.patch_size, w // self.patch_size)
    if (h, w) != (self.image_size,) * 2 and self.posemb_resize is None:
      raise ValueError(
          f'{_OWNER}: images are {h} x {w} but image_size='
          f'{self.image_size} and posemb_resize=None; set '
          "posemb_resize (e.g. 'bilinear') to resize the position "
          'embeddings, or image_size to the input size.'
      )
    return grid

  @property
  def config(self) -> ViTConfig:
    """This module's fields as one :class:`ViTConfig`."""
    return bundle(self, ViTConfig)

  @nn.nowrap
  def check_fields(self) -> None:
    """Raises ConfigError for an invalid field (``ViTConfig.check``): the model calls it,
    and so does a run's config reader, before anything is traced."""
    self.config.check()

  # -- forward ---------------------------------------------------------------

  @nn.compact
  def __call__(self, images: Array, train: bool = False) -> Array:
    self.check_fields()
    grid = self._grid(images)
    d, p = self.hidden_size, self.patch_size
    x = nn.Conv(
        d,
        (p, p),
        strides=(p, p),
        padding='VALID',
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='embedding',
    )(images.astype(self.dtype))
    batch = x.shape[0]
    x = x.reshape(batch, grid[0] * grid[1], d)

    num_prefix = int(self.classifier == 'token')
    if num_prefix:
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), self.param_dtype)
      x = jnp.concatenate([jnp.broadcast_to(cls.astype(x.dtype), (batch, 1, d)), x], axis=1)
    base_grid = (self.image_size // p, self.image_size // p)
    posemb = self.param(
        'pos_embedding',
        _posemb_init,
        (1, num_prefix + base_grid[0] * base_grid[1], d),
        self.param_dtype,
    )
    if grid != base_grid:
      assert self.posemb_resize is not None  # else _grid refused the size
      posemb = resize_posemb(posemb, base_grid, grid, num_prefix, self.posemb_resize)
    x = x + posemb.astype(x.dtype)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)

    x = self._encoder(x, grid, num_prefix, train)

    x = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name='encoder_norm')(x)
    x = x[:, 0] if num_prefix else jnp.mean(x, axis=1)
    logits = nn.Dense(
        self.num_classes,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=nn.initializers.zeros,
        name='head',
    )(x)
    return logits.astype(jnp.float32)

  def _encoder(self, x: Array, grid: tuple[int, int], num_prefix: int, train: bool) -> Array:
    """The ``num_layers`` blocks, unscanned or with ``nn.scan`` (same maths)."""
    cfg = self.config
    num_pooled = num_pooled_layers(cfg.num_layers, cfg.context_pool, cfg.context_pool_last)
    start = 0
    if cfg.scan_layers:
      start = num_scanned_layers(cfg.num_layers, cfg.context_pool, cfg.context_pool_last)
      body = remat(EncoderBlock, cfg.remat, _OWNER, static_argnums=(2,), prevent_cse=False)
      stack = nn.scan(
          body,
          variable_axes={'params': 0, 'intermediates': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=nn.broadcast,  # pyright: ignore[reportArgumentType]  # flax: unannotated
          length=start,
      )
      x, _ = stack(cfg, grid, num_prefix, pooled=num_pooled > 0, scan_carry=True, name=SCAN_NAME)(
          x, train
      )
    block = remat(EncoderBlock, cfg.remat, _OWNER, static_argnums=(2,))
    for i in range(start, cfg.num_layers):
      x = block(cfg, grid, num_prefix, pooled=i < num_pooled, name=block_name(i))(x, train)
    return x


# ----------------------------------------------------------------------------
# Registry presets (ViT / DeiT sizes, patch 16, mlp 4x).
# ----------------------------------------------------------------------------

_SIZES = {
    'ti': dict(hidden_size=192, num_layers=12, num_heads=3),
    's': dict(hidden_size=384, num_layers=12, num_heads=6),
    'b': dict(hidden_size=768, num_layers=12, num_heads=12),
}

MODELS: dict[str, Callable[..., nn.Module]] = {}
for _size, _cfg in _SIZES.items():
  MODELS[f'vit_{_size}16'] = functools.partial(ViT, patch_size=16, **_cfg)
  MODELS[f'cp_vit_{_size}16'] = functools.partial(ViT, patch_size=16, context_pool={}, **_cfg)
del _size, _cfg
