"""The settings area attention's entry points share (:class:`AreaSettings`: the
function's arguments, the module's fields) and the checks of those entry points:
the function (:func:`~.core.dot_product_area_attention`), the mask helper and the
modules.

Settings and memories are checked by the same functions everywhere
(:func:`check_config`, :func:`check_memory`); each raises a
:class:`~contextpool_jax.base.errors.ConfigError` (a ValueError) naming the field,
the value and what is allowed, or a ValueError for a bad array.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

from contextpool_jax.base import checks
from contextpool_jax.base.errors import ConfigError
from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import area_layout
from contextpool_jax.layers.area_attention.areas import check_area_options
from contextpool_jax.layers.area_attention.areas import check_memory_length
from contextpool_jax.layers.area_attention.keys import KEY_MODES
from contextpool_jax.layers.area_attention.keys import LEARNED_KEYS
from contextpool_jax.layers.area_attention.keys import LEARNED_KEY_MODES
from contextpool_jax.layers.area_attention.keys import PARAMETER_FREE_KEY_MODES
from contextpool_jax.layers.area_attention.keys import VALUE_MODES

Array = jax.Array
# AreaSettings.implementation: the dense softmax (None) or the Pallas TPU kernel.
IMPLEMENTATIONS = (None, 'pallas_tpu')


class AreaSettings(NamedTuple):
  """What areas exist and how they are attended (checked by :func:`check_config`).

  Attributes:
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of the memory grid (stored row-major).
    key_mode: one of ``KEY_MODES`` (:mod:`.keys`).
    value_mode: ``'sum'``, ``'mean'`` or ``'max'``.
    causal: also mask items ``j > i`` (raster order in 2D, top-left aligned).
    dropout_rate: dropout on the attention probabilities.
    std_epsilon: variance floor inside the area std.
    implementation: one of :data:`IMPLEMENTATIONS`: None, the dense softmax over
      every query's areas (``[batch, heads, q_len, num_areas]`` probabilities), or
      ``'pallas_tpu'``, jax's Pallas TPU flash-attention kernel over the area keys
      and values, memory linear in the length (:func:`~.core.area_attention`).
  """

  max_area_width: Any
  max_area_height: Any
  memory_height: Any
  key_mode: Any
  value_mode: Any
  causal: Any
  dropout_rate: Any
  std_epsilon: Any
  implementation: Any = None

  def layout(self, kv_len: int) -> AreaLayout:
    """The areas of a memory of ``kv_len`` items (:func:`area_layout`)."""
    return area_layout(
        kv_len,
        max_area_width=self.max_area_width,
        max_area_height=self.max_area_height,
        memory_height=self.memory_height,
    )


def check_config(owner: str, settings: AreaSettings) -> None:
  """Raises ConfigError for an invalid area attention setting."""
  checks.check_choice(owner, 'key_mode', settings.key_mode, KEY_MODES)
  checks.check_choice(owner, 'value_mode', settings.value_mode, VALUE_MODES)
  check_area_options(
      owner, settings.max_area_width, settings.max_area_height, settings.memory_height
  )
  checks.check_probability(owner, 'dropout_rate', settings.dropout_rate)
  checks.check_choice(owner, 'causal', settings.causal, (False, True))
  checks.check_positive(owner, 'std_epsilon', settings.std_epsilon, allow_zero=True)
  checks.check_choice(owner, 'implementation', settings.implementation, IMPLEMENTATIONS)


def check_memory(
    owner: str,
    *,
    kv_len: int,
    memory_height: int,
    what: str,
    mask: Any,
    attention_shape: tuple[int, ...],
) -> None:
  """Raises ConfigError unless ``memory_height`` divides the memory's ``kv_len``
  items (``what`` names the memory), and ValueError unless ``mask`` is None or
  broadcastable to ``attention_shape = (batch, heads, q_len, kv_len)``."""
  check_memory_length(owner, kv_len, memory_height, what)
  if mask is not None:
    check_mask(owner, mask, attention_shape)


def check_mask(owner: str, mask: Any, target: tuple[int, ...]) -> None:
  """Raises ValueError unless ``mask`` is an item mask broadcastable to ``target``."""
  shape = getattr(mask, 'shape', None)
  ok = False
  if shape is not None and len(shape) <= 4:
    try:
      ok = tuple(np.broadcast_shapes(tuple(shape), target)) == tuple(target)
    except ValueError:
      ok = False
  if not ok:
    raise ValueError(
        f'{owner}: mask has shape {shape}; expected an item-level mask '
        f'broadcastable to [batch, heads, q_len, kv_len] = {list(target)}.'
    )


def check_embedding_dim(
    owner: str,
    field: str,
    embedding_dim: int | None,
    mode_field: str,
    mode: str,
    combine: str,
    depth: int,
) -> None:
  """A ``'sum'`` key adds ``[e_h; e_w]`` (each ``embedding_dim``, default
  ``depth // 2``) to depth-``depth`` features: both must fit."""
  if combine != 'sum':
    return
  if depth % 2:
    raise ConfigError(
        f'{owner}.{mode_field}={mode!r} needs an even head depth: its height and width '
        f'embeddings (depth // 2 each, as in tensor2tensor) are concatenated and added '
        f"to the key features; got depth {depth}. Use an even depth or a 'concat' mode."
    )
  if embedding_dim not in (None, depth // 2):
    raise ConfigError(
        f'{owner}.{field}={embedding_dim!r} is invalid for {mode_field}={mode!r}, whose '
        f'[e_h; e_w] is added to the depth-{depth} key features; use None or {depth // 2}.'
    )


def needs_rng(deterministic: bool, dropout_rate: float, key_mode: str) -> bool:
  """Whether a call draws randomness: dropout, or the noise of ``'sample'`` keys."""
  return not deterministic and (dropout_rate > 0.0 or key_mode == 'sample')


def check_function_call(
    owner: str,
    settings: AreaSettings,
    query: Any,
    key: Any,
    value: Any,
    mask: Any,
    scale: Any,
    rng: Any,
    deterministic: bool,
) -> None:
  """Raises for an invalid call of the parameter-free function: its settings
  (a learned key mode included), ranks, the shapes of query, key and value,
  the memory and mask, and a missing ``rng`` where randomness is needed."""
  check_config(owner, settings)
  key_mode, dropout_rate = settings.key_mode, settings.dropout_rate
  if key_mode in LEARNED_KEY_MODES:
    raise ConfigError(
        f'{owner}.key_mode={key_mode!r} has learned parameters (Eq. 9); use '
        'contextpool_jax.AreaAttention, or compute keys with AreaKeyEncoder on '
        f'area_features(...) and call attend_to_areas. Parameter-free key modes: '
        f'{", ".join(repr(m) for m in PARAMETER_FREE_KEY_MODES)}.'
    )
  if scale is not None:
    checks.check_positive(owner, 'scale', scale)
  _check_query_key_value(owner, query, key, value)
  b, q_len, heads, _ = query.shape
  kv_len = key.shape[1]
  check_memory(
      owner,
      kv_len=kv_len,
      memory_height=settings.memory_height,
      what='key/value',
      mask=mask,
      attention_shape=(b, heads, q_len, kv_len),
  )
  if needs_rng(deterministic, dropout_rate, key_mode) and rng is None:
    raise ValueError(
        f'{owner}: rng=None but deterministic=False with '
        f'dropout_rate={dropout_rate!r}, key_mode={key_mode!r} needs '
        'randomness; pass rng= or deterministic=True.'
    )


def _check_query_key_value(owner: str, query: Any, key: Any, value: Any) -> None:
  checks.check_rank(owner, 'query', query, (4,), '[batch, q_len, heads, depth]')
  checks.check_rank(owner, 'key', key, (4,), '[batch, kv_len, heads, depth]')
  checks.check_rank(owner, 'value', value, (4,), '[batch, kv_len, heads, depth_v]')
  b, _, heads, depth = query.shape
  if (key.shape[0], key.shape[2], key.shape[3]) != (b, heads, depth):
    raise ValueError(
        f'{owner}: key shape {key.shape} does not match query shape '
        f'{query.shape}; expected [batch={b}, kv_len, heads={heads}, '
        f'depth={depth}].'
    )
  if value.shape[:3] != key.shape[:3]:
    raise ValueError(
        f'{owner}: value shape {value.shape} does not match key shape '
        f'{key.shape} in [batch, kv_len, heads].'
    )


def check_module_fields(owner: str, module: Any) -> None:
  """Raises for an invalid field of an :class:`~.module.AreaAttention`."""
  check_config(owner, module.area_settings())
  checks.check_positive(owner, 'num_heads', module.num_heads, integer=True)
  checks.check_positive(owner, 'qkv_features', module.qkv_features, allow_none=True, integer=True)
  checks.check_positive(owner, 'out_features', module.out_features, allow_none=True, integer=True)
  checks.check_positive(
      owner, 'area_key_hidden_dim', module.area_key_hidden_dim, allow_none=True, integer=True
  )
  checks.check_positive(
      owner, 'area_embedding_dim', module.area_embedding_dim, allow_none=True, integer=True
  )


def check_module_inputs(owner: str, module: Any, inputs_q: Any, inputs_kv: Any, mask: Any) -> int:
  """Raises for invalid inputs of an :class:`~.module.AreaAttention` call
  (ranks, batches, the memory grid, the mask); returns the memory's height:
  ``memory_height``, or the height of a ``[batch, height, width, features]``
  memory."""
  layouts = '[batch, length, features] or [batch, height, width, features]'
  checks.check_rank(owner, 'inputs_q', inputs_q, (3, 4), layouts)
  checks.check_rank(owner, 'inputs_kv', inputs_kv, (3, 4), layouts)
  if inputs_kv.shape[0] != inputs_q.shape[0]:
    raise ValueError(
        f'{owner}: inputs_q batch {inputs_q.shape[0]} != inputs_kv batch {inputs_kv.shape[0]}.'
    )
  memory_height = module.memory_height
  if inputs_kv.ndim == 4:
    if memory_height not in (1, inputs_kv.shape[1]):
      raise ConfigError(
          f'{owner}.memory_height={memory_height!r} conflicts with the 2D memory '
          f'inputs_kv of shape {inputs_kv.shape} (height {inputs_kv.shape[1]}); use '
          f'memory_height=1 or {inputs_kv.shape[1]}.'
      )
    memory_height = inputs_kv.shape[1]
  kv_len = math.prod(inputs_kv.shape[1:-1])
  check_memory(
      owner,
      kv_len=kv_len,
      memory_height=memory_height,
      what='inputs_kv',
      mask=mask,
      attention_shape=(
          inputs_q.shape[0],
          module.num_heads,
          math.prod(inputs_q.shape[1:-1]),
          kv_len,
      ),
  )
  return memory_height


def check_head_dim(owner: str, module: Any, features: int) -> int:
  """Raises unless the heads split ``features`` (and a learned ``'sum'`` key
  fits the head dim); returns the head dim."""
  if features % module.num_heads:
    raise ConfigError(
        f'{owner}.qkv_features={features!r} is not divisible by num_heads={module.num_heads!r}.'
    )
  head_dim = features // module.num_heads
  learned = LEARNED_KEYS.get(module.key_mode)
  if learned is not None:
    check_embedding_dim(
        owner,
        'area_embedding_dim',
        module.area_embedding_dim,
        'key_mode',
        module.key_mode,
        learned.combine,
        head_dim,
    )
  return head_dim


def check_decode(
    owner: str, module: Any, x_q: Any, x_kv: Any, memory_height: int, mask: Any, deterministic: bool
) -> None:
  """Raises unless a ``decode=True`` causal call of ``module`` is 1D
  self-attention at inference."""
  if memory_height != 1 or module.max_area_height != 1:
    raise ConfigError(
        f'{owner}.decode=True with causal=True needs a 1D memory (memory_height=1, '
        f'max_area_height=1); got memory_height={memory_height!r}, '
        f'max_area_height={module.max_area_height!r}.'
    )
  if mask is not None or not deterministic or x_q.shape[1] != x_kv.shape[1]:
    raise ValueError(
        f'{owner}: decode=True is self-attention at inference: mask=None, '
        f'deterministic=True and as many queries as keys; got mask '
        f'{None if mask is None else np.shape(mask)}, deterministic={deterministic!r}, '
        f'{x_q.shape[1]} queries and {x_kv.shape[1]} keys.'
    )
