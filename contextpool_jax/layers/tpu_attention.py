"""Attention through jax's Pallas TPU flash-attention kernel: memory linear in the length.

``attention_implementation='pallas_tpu'`` (``TransformerConfig``) computes softmax
attention with ``jax.experimental.pallas.ops.tpu.flash_attention`` (Dao et al.'s
online softmax over blocks of 128 keys, on the TPU's vector memory): no
``[batch, heads, q_len, kv_len]`` logits are ever stored, in the forward pass or
in its backward kernels. It is what lets a 32k-byte context fit a TPU chip (one
v5e chip: 33 GiB of temporaries for ``jax.nn.dot_product_attention`` at batch 1,
8 heads of 64, bfloat16, against 192 MiB: issue 67).

The kernel masks by two things only, and :func:`flash_attention` maps the model's
masks onto them:

* **causal**: query ``i`` reads keys ``j <= i``;
* **padding**, as segment ids: a query reads a key when both are real tokens (id
  1) or both padding (id 0). The model's padding mask is the outer product of
  query and key validity (``transformer.padding_mask``), so each side's validity
  is read back from it (``any`` along the other axis). Padding queries' outputs are
  not the dense path's (those rows are never used); real tokens' are.

Lengths are padded up to a multiple of :data:`BLOCK` (the kernel's block), the
added keys as padding. Local windows are not a mask this kernel has (raise).
XLA cannot partition a Pallas kernel over several devices: under a mesh (the one
the run's steps trace under: ``training/programs.py``) each device runs it on its
own rows of the batch (``jax.shard_map``).

On a CPU the kernel runs in Pallas interpret mode only
(``jax.experimental.pallas.tpu.force_tpu_interpret_mode()``): that is how the
tests check it against the dense path; ``contextpool-compile`` compiles it for
TPU from any machine.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import flash_attention as tpu_flash
from jax.sharding import PartitionSpec as P

Array = jax.Array
BLOCK = 128  # the kernel's default block along both lengths


def _pad_to_block(x: Array, axis: int) -> Array:
  extra = -x.shape[axis] % BLOCK
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def segment_ids(mask: Optional[Array], batch: int, q_len: int, kv_len: int):
  """``(q ids [batch, q_len], kv ids [batch, kv_len])``, int32, 1 for a real token and
  0 for padding, read from a padding ``mask`` (bool, broadcastable to ``[batch, 1,
  q_len, kv_len]``: an outer product of validities); every token real for None."""
  if mask is None:
    return jnp.ones((batch, q_len), jnp.int32), jnp.ones((batch, kv_len), jnp.int32)
  mask = jnp.broadcast_to(mask, (batch, 1, q_len, kv_len))[:, 0]
  return mask.any(axis=2).astype(jnp.int32), mask.any(axis=1).astype(jnp.int32)


def flash_attention(
    q: Array, k: Array, v: Array, *, causal: bool, mask: Optional[Array] = None
) -> Array:
  """Softmax attention of ``q`` ``[batch, q_len, heads, head_dim]`` over ``k`` / ``v``
  ``[batch, kv_len, heads, head_dim]`` by the Pallas TPU kernel; ``mask``: the padding
  mask (without the causal part: ``causal`` says that); output like ``q``."""
  batch, q_len, _, _ = q.shape
  kv_len = k.shape[1]
  if causal and q_len != kv_len:
    raise ValueError(f'causal flash attention needs q_len == kv_len, got {q_len} and {kv_len}.')
  q_ids, kv_ids = segment_ids(mask, batch, q_len, kv_len)
  return _flash(q, k, v, q_ids, kv_ids, causal=causal, scale=None)


def flash_attention_over_groups(
    q: Array,
    k: Array,
    v: Array,
    *,
    q_valid: Array,
    kv_valid: Array,
    causal: bool,
    keys_per_position: int = 1,
    scale: Optional[float] = None,
) -> Array:
  """Flash attention with each side's validity given (``q_valid`` ``[batch, q_len]``,
  ``kv_valid`` ``[batch, kv_len]``, bool) instead of a mask, and, for ``causal``, keys
  in groups: key ``a`` belongs to position ``a // keys_per_position`` and query ``i``
  reads the keys of positions ``<= i`` (``kv_len = q_len * keys_per_position``). Area
  attention's path (:mod:`~contextpool_jax.layers.area_attention.core`): its areas
  ordered by their last item, ``keys_per_position`` areas ending at each position.

  The kernel's causal mask compares a query's and a key's index, so each query is
  placed at the last slot of its group in a sequence of ``kv_len`` queries (the other
  slots zero, their outputs dropped): the memory stays linear in the length, the
  attention's FLOPs grow ``keys_per_position`` times. ``scale``: the logits' (None:
  ``1 / sqrt(head_dim)``)."""
  g = keys_per_position
  batch, q_len, heads, depth = q.shape
  q_ids, kv_ids = q_valid.astype(jnp.int32), kv_valid.astype(jnp.int32)
  if not causal or g == 1:
    return _flash(q, k, v, q_ids, kv_ids, causal=causal, scale=scale)
  if k.shape[1] != q_len * g:
    raise ValueError(
        f'grouped causal flash attention needs kv_len = q_len * keys_per_position = '
        f'{q_len} * {g}; got kv_len {k.shape[1]}.'
    )
  slots = jnp.zeros((batch, q_len, g, heads, depth), q.dtype).at[:, :, -1].set(q)
  ids = jnp.repeat(q_ids, g, axis=1)
  out = _flash(slots.reshape(batch, q_len * g, heads, depth), k, v, ids, kv_ids, True, scale)
  return out.reshape(batch, q_len, g, heads, -1)[:, :, -1]


def _flash(
    q: Array,
    k: Array,
    v: Array,
    q_ids: Array,
    kv_ids: Array,
    causal: bool,
    scale: Optional[float],
) -> Array:
  """The kernel on ``[batch, len, heads, head_dim]`` inputs and int32 segment ids
  ``[batch, len]``, padded to :data:`BLOCK`, per device under a mesh."""
  q_len, head_dim = q.shape[1], q.shape[-1]
  heads_major = lambda x: _pad_to_block(jnp.swapaxes(x, 1, 2), 2)  # [b, h, len, d]

  def kernel(q, k, v, q_ids, kv_ids):
    return tpu_flash.flash_attention(
        q,
        k,
        v,
        segment_ids=tpu_flash.SegmentIds(q_ids, kv_ids),
        causal=causal,
        sm_scale=1.0 / math.sqrt(head_dim) if scale is None else scale,
    )

  args = (
      heads_major(q),
      heads_major(k),
      heads_major(v),
      _pad_to_block(q_ids, 1),
      _pad_to_block(kv_ids, 1),
  )
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.size > 1:
    # XLA cannot partition a Pallas kernel: each device runs it on its rows of the
    # batch, which the run splits over every axis of its mesh.
    rows = P(tuple(mesh.axis_names))
    kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(rows,) * 5, out_specs=rows, check_vma=False)
  return jnp.swapaxes(kernel(*args)[:, :, :q_len], 1, 2)


def flax_attention_fn(query, key, value, bias=None, mask=None, **unused) -> Array:
  """``flax.linen.MultiHeadDotProductAttention``'s ``attention_fn`` through the kernel
  (the ViT's: no bias, a padding ``mask`` or none, no dropout, which the model checks)."""
  if bias is not None:
    raise ValueError('the Pallas TPU flash-attention path takes no attention bias.')
  return flash_attention(query, key, value, causal=False, mask=mask)
