"""Autoregressive decoding (greedy, beam search) for the encoder-decoder Transformer.

* :func:`greedy_decode` -- argmax at every step.
* :func:`beam_search` -- beam search with the GNMT length penalty
  ``lp(Y) = ((5 + |Y|) / 6) ** alpha`` (Wu et al., 2016; used by Vaswani et al.,
  2017 with beam 4, alpha 0.6), ``|Y|`` counting the generated tokens including EOS.

Both return int32 ids ``[batch, max_len]``: the tokens up to and including
EOS, then 0. A sequence that has no EOS after ``max_len`` tokens is returned
as it is (``max_len`` tokens, no EOS).

The model is used only through ``model.apply(params, inputs, method=model.encode)``
and ``model.apply(params, encoded, inputs, decoder_inputs, method=model.decode)``
(logits ``[b, len, vocab]`` for every decoder input position; position 0
reads the BOS id 0). Any object with ``apply``, ``encode`` and ``decode`` works,
e.g. a toy Flax module in tests; ``encoded`` may be any pytree with a leading
batch axis.

Two ways to get the logits of step t (argument ``cache``), with identical
results up to float rounding (tests/inference/test_decoding.py):

* ``cache=True`` (default): incremental decoding, Flax's usual form.
  :func:`init_cache` creates the model's ``'cache'`` collection for
  ``max_len`` positions (``decode(..., decode=True)`` on a ``[n, max_len]``
  dummy), then every step feeds one token, ``decode(encoded, inputs, token
  [n, 1], decode=True)`` with ``mutable=['cache']`` (attention, local
  attention, area attention and ContextPool all keep what they need, see
  :mod:`contextpool_jax.models.transformer`). The model's ``decode`` method
  must take ``decode=``; a model without a cache (a toy) may simply ignore
  it. Beam search reorders the cache rows with the beams. Steps run in the
  same segments as the reference (below), each on the cache's leading slice
  for the segment's width (:func:`cache_prefix`): a step before ``width``
  reads ``width`` cached positions, not ``max_len``, so the whole decode
  reads about 2/3 of what one ``max_len`` segment would (a decision,
  measured in ``benchmarks/results/decoding_speed_cpu.md``). This needs the one
  property every cache here has: the cache for ``w`` positions is the
  leading slice of the cache for ``max_len >= w`` (positions stored at their
  index, tables computed per row); tests/inference/test_decoding.py checks it.
* ``cache=False``: the reference, no cache. Step ``t`` re-runs ``decode`` on
  the decoded prefix padded to a static width and reads the logits at
  position ``t``. That is exact because the decoder is causal (position t
  only sees decoder inputs 0..t), so zeros after t change nothing. To save
  work the steps run in segments of static width ``min_segment, 2 *
  min_segment, ...`` (step t uses the smallest width > t); ``min_segment=None``
  uses one width ``max_len``.

Each segment (the cached path: one) is a ``lax.while_loop`` that stops as soon
as every sequence has finished. Everything has static shapes: wrap in
``jax.jit`` with ``model``, ``max_len``, ``beam_size``, ``alpha``, ``eos_id``,
``cache`` static (e.g. via ``functools.partial``).

Beam search (a decision): each step scores all ``k * vocab`` extensions of
the ``k`` live hypotheses and takes the best ``2k``. Those among the best ``k``
that end in EOS are finished, scored ``logp / lp(len)`` (as in fairseq); the
best ``k`` that do not end in EOS stay live. A sentence stops when it has ``k``
finished hypotheses and none of its live ones, were it to end now, would score
above the worst of them (``max live logp / lp(t) <= k-th finished score``, the
same kind of test as Hugging Face transformers' beam search with
``early_stopping=False``), or at ``max_len``, where the best ``k`` candidates
are finished as they are. The result is the best finished hypothesis. With
``alpha = 0`` the rule is exact (log-probabilities only fall); with
``alpha > 0`` a longer continuation could still have won, a usual
approximation (tensor2tensor's bound ``logp / lp(max_len)`` is exact but
stops later). Because EOS only
finishes from the best ``k`` and the stop test compares equal lengths,
``beam_size=1`` is exactly greedy decoding for every ``alpha``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax

from contextpool_jax.base.numerics import NEG_INF

Array = jax.Array

# The first segment's width (module docstring): short outputs compile one small
# loop; longer ones double the width, so a step reads under twice its position.
MIN_SEGMENT = 16
# The beam search defaults everywhere (Vaswani et al., 2017: beam 4, length penalty 0.6).
BEAM_SIZE = 4
BEAM_ALPHA = 0.6


def is_encoder_decoder(model) -> bool:
  """Whether ``model`` has the interface these decoders use: ``encode`` and ``decode``
  methods (the translation Transformer)."""
  return callable(getattr(model, 'encode', None)) and callable(getattr(model, 'decode', None))


def length_penalty(length, alpha: float):
  """GNMT length penalty ``((5 + length) / 6) ** alpha``."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _segments(max_len: int, min_segment: Optional[int]) -> list[tuple[int, int]]:
  """``[(end, width)]``: steps ``t < end`` (after the previous end) use width ``width``."""
  if max_len <= 0:
    raise ValueError(f'max_len={max_len} must be positive.')
  if min_segment is None or min_segment >= max_len:
    return [(max_len, max_len)]
  if min_segment <= 0:
    raise ValueError(f'min_segment={min_segment} must be positive or None.')
  out, width = [], min_segment
  while True:
    end = min(width, max_len)
    out.append((end, end))
    if end == max_len:
      return out
    width *= 2


def _shift_right(x: Array, width: int) -> Array:
  """Decoder inputs of width ``width``: BOS (0) then ``x[:, :width - 1]``."""
  return jnp.pad(x[:, : width - 1], ((0, 0), (1, 0)))


def _step_logits(model, params, encoded, inputs, tokens: Array, t: Array, width: int) -> Array:
  """float32 logits ``[n, vocab]`` for output position ``t`` given ``tokens[:, :t]``."""
  logits = model.apply(params, encoded, inputs, _shift_right(tokens, width), method=model.decode)
  return lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False).astype(jnp.float32)


def init_cache(model, params, encoded, inputs: Array, max_len: int) -> Any:
  """The model's ``'cache'`` collection for ``inputs.shape[0]`` rows and ``max_len``
  decoded tokens: ``decode(encoded, inputs, zeros [n, max_len], decode=True)``
  with ``mutable=['cache']`` (the cache-creating call; under ``jax.jit`` only
  the cache's initial values are computed). ``{}`` for a model without one."""
  n = inputs.shape[0]
  dummy = jnp.zeros((n, max_len), jnp.int32)
  _, state = model.apply(
      params, encoded, inputs, dummy, decode=True, method=model.decode, mutable=['cache']
  )
  return state.get('cache', {})


def _cached_step_logits(model, params, encoded, inputs, cache, token: Array):
  """float32 logits ``[n, vocab]`` after feeding ``token [n]`` at the cache's next
  position, and the updated cache."""
  logits, state = model.apply(
      {**params, 'cache': cache},
      encoded,
      inputs,
      token[:, None],
      decode=True,
      method=model.decode,
      mutable=['cache'],
  )
  return logits[:, 0].astype(jnp.float32), state.get('cache', {})


def cache_prefix(cache: Any, shapes: Any) -> Any:
  """The leading slice of every leaf of ``cache`` with the shape of the same
  leaf of ``shapes`` (e.g. ``jax.eval_shape`` of :func:`init_cache` for fewer
  positions): the cache of the first positions only (module docstring)."""

  def prefix(x, s):
    if len(s.shape) != x.ndim or any(a > b for a, b in zip(s.shape, x.shape)):
      raise ValueError(
          f'cache_prefix: a cache leaf of shape {s.shape} is not a leading slice '
          f'of the full cache leaf {x.shape}.'
      )
    return x[tuple(slice(0, a) for a in s.shape)]

  return jax.tree.map(prefix, cache, shapes)


def put_cache_prefix(cache: Any, prefix: Any) -> Any:
  """``cache`` with its leading slice replaced by ``prefix`` (:func:`cache_prefix`)."""
  return jax.tree.map(lambda x, p: lax.dynamic_update_slice(x, p, (0,) * x.ndim), cache, prefix)


def segmented_loop(
    state: dict, step, max_len: int, min_segment: Optional[int], cache_for=None
) -> dict:
  """The decoding loop: ``state = step(state, width)`` while ``state['t'] <
  max_len`` and some ``state['done']`` is False, as one ``lax.while_loop``
  per segment ``(end, width)`` of static width ``min_segment, 2 *
  min_segment, ..., max_len`` (module docstring; None: one segment).
  ``cache_for(width)``: the shapes of the cache for ``width`` positions; then
  ``state['cache']`` holds the full cache and each segment runs on its
  leading slice (:func:`cache_prefix`), written back after the segment."""
  for end, width in _segments(max_len, min_segment):
    full = None
    if cache_for is not None:
      full = state['cache']
      state = dict(state, cache=cache_prefix(full, cache_for(width)))
    state = lax.while_loop(
        lambda s, end=end: (s['t'] < end) & ~jnp.all(s['done']),
        lambda s, width=width: step(s, width),
        state,
    )
    if full is not None:
      state['cache'] = put_cache_prefix(full, state['cache'])
  return state


def _shapes(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def cache_shapes(cache: Any, width: int, make: Callable[[int], Any]) -> Callable[[int], Any]:
  """``w -> `` the shapes of ``make(w)``, the cache for ``w`` positions (for
  :func:`segmented_loop`): ``cache``'s own at ``width``, the width it was made for;
  else ``jax.eval_shape`` (a trace, nothing computed)."""
  return lambda w: _shapes(cache) if w == width else jax.eval_shape(lambda: make(w))


def _previous_token(tokens: Array, t: Array) -> Array:
  """The decoder input of step t, ``[n]``: BOS (0) at t = 0, else ``tokens[:, t - 1]``."""
  prev = lax.dynamic_index_in_dim(tokens, jnp.maximum(t - 1, 0), axis=1, keepdims=False)
  return jnp.where(t == 0, 0, prev)


def cache_row_axes(model, params, encoded, inputs: Array, cache: Any, max_len: int) -> Any:
  """The row (batch) axis of every leaf of ``cache`` (:func:`init_cache`'s cache for
  ``inputs`` and ``max_len``), -1 for a leaf without one (step counters, the shared
  position table): the axis whose size follows the number of rows, found against
  the cache's shapes for ``n + 1`` rows (``jax.eval_shape``: nothing is computed).
  Layers scanned with ``scan_layers`` put their layer axis first, so this is not
  always axis 0."""
  grow = lambda x: jax.ShapeDtypeStruct((x.shape[0] + 1,) + x.shape[1:], x.dtype)
  more = jax.eval_shape(
      lambda e, i: init_cache(model, params, e, i, max_len),
      jax.tree.map(grow, encoded),
      grow(inputs),
  )

  def axis(a, b):
    return next((i for i, (p, q) in enumerate(zip(a.shape, b.shape)) if p != q), -1)

  return jax.tree.map(axis, _shapes(cache), more)


def reorder_cache(cache: Any, rows: Array, row_axes: Any) -> Any:
  """The cache of the rows ``rows [n]`` (int), in that order, along each leaf's
  row axis (:func:`cache_row_axes`; leaves without one are kept)."""
  return jax.tree.map(
      lambda x, axis: x if axis < 0 else jnp.take(x, rows, axis=axis), cache, row_axes
  )


def _check(inputs, max_len):
  if inputs.ndim != 2:
    raise ValueError(f'inputs must be [batch, source_len] token ids; got shape {inputs.shape}.')
  if not isinstance(max_len, int) or max_len <= 0:
    raise ValueError(f'max_len={max_len!r} must be a positive Python int (a static size).')


def greedy_decode(
    model,
    params,
    inputs: Array,
    *,
    max_len: int,
    eos_id: int = 1,
    min_segment: Optional[int] = MIN_SEGMENT,
    cache: bool = True,
) -> Array:
  """Greedy decoding: int32 ``[batch, max_len]``, 0 after the first EOS.

  ``cache``: incremental decoding (module docstring); False: the uncached
  reference. Both run in segments from ``min_segment`` (None: one segment).
  """
  _check(inputs, max_len)
  inputs = jnp.asarray(inputs)
  batch = inputs.shape[0]
  encoded = model.apply(params, inputs, method=model.encode)
  state = dict(
      t=jnp.int32(0),
      tokens=jnp.zeros((batch, max_len), jnp.int32),
      done=jnp.zeros((batch,), bool),
  )

  def step(s, width):
    t, tokens = s['t'], s['tokens']
    out = {}
    if cache:
      logits, out['cache'] = _cached_step_logits(
          model, params, encoded, inputs, s['cache'], _previous_token(tokens, t)
      )
    else:
      logits = _step_logits(model, params, encoded, inputs, tokens, t, width)
    tok = jnp.where(s['done'], 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
    tokens = lax.dynamic_update_index_in_dim(tokens, tok, t, axis=1)
    return dict(out, t=t + 1, tokens=tokens, done=s['done'] | (tok == eos_id))

  cache_for = None
  if cache:
    make = lambda w: init_cache(model, params, encoded, inputs, w)
    state['cache'] = make(max_len)
    cache_for = cache_shapes(state['cache'], max_len, make)
  return segmented_loop(state, step, max_len, min_segment, cache_for)['tokens']


def beam_search(
    model,
    params,
    inputs: Array,
    *,
    beam_size: int = BEAM_SIZE,
    alpha: float = BEAM_ALPHA,
    max_len: int,
    eos_id: int = 1,
    min_segment: Optional[int] = MIN_SEGMENT,
    cache: bool = True,
) -> Array:
  """Beam search (module docstring): the best hypothesis, int32 ``[batch, max_len]``."""
  seqs, _ = beam_search_all(
      model,
      params,
      inputs,
      beam_size=beam_size,
      alpha=alpha,
      max_len=max_len,
      eos_id=eos_id,
      min_segment=min_segment,
      cache=cache,
  )
  return seqs[:, 0]


def decoder(
    model,
    *,
    max_len: int,
    beam_size: Optional[int] = BEAM_SIZE,
    alpha: float = BEAM_ALPHA,
    eos_id: int = 1,
    min_segment: Optional[int] = MIN_SEGMENT,
    cache: bool = True,
) -> Callable[[Any, Array], Array]:
  """``(params, inputs) -> ids [batch, max_len]``, not jitted: :func:`beam_search`
  with ``beam_size`` beams and length penalty ``alpha``, or :func:`greedy_decode`
  if ``beam_size`` is None."""
  common = dict(max_len=max_len, eos_id=eos_id, min_segment=min_segment, cache=cache)
  if beam_size is None:
    return functools.partial(greedy_decode, model, **common)
  return functools.partial(beam_search, model, beam_size=beam_size, alpha=alpha, **common)


def _gather_beams(x: Array, idx: Array) -> Array:
  """``x [b, n, ...]``, ``idx [b, m]`` -> ``[b, m, ...]``."""
  return jax.vmap(lambda xb, ib: xb[ib])(x, idx)


def _tile(tree: Any, k: int) -> Any:
  """Repeats every leaf's batch rows k times: ``[b, ...] -> [b * k, ...]`` (row-major)."""
  return jax.tree.map(lambda x: jnp.repeat(x, k, axis=0), tree)


def _initial_beams(b: int, k: int, max_len: int) -> dict:
  """The beam search state before step 0: only beam 0 live, nothing finished."""
  return dict(
      t=jnp.int32(0),
      alive_seq=jnp.zeros((b, k, max_len), jnp.int32),
      # Only beam 0 is live at the start, so the first step expands one hypothesis.
      alive_logp=jnp.tile(jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)[None], (b, 1)),
      fin_seq=jnp.zeros((b, k, max_len), jnp.int32),
      fin_score=jnp.full((b, k), NEG_INF, jnp.float32),
      num_fin=jnp.zeros((b,), jnp.int32),
      done=jnp.zeros((b,), bool),
  )


def _advance_beams(s: dict, logits: Array, *, eos_id: int, alpha: float) -> tuple[dict, Array]:
  """One beam search step from the logits ``[b * k, vocab]`` of the live hypotheses
  (module docstring): the next state (without ``'cache'``) and, per new live beam
  ``[b, k]``, the old beam it continues."""
  t = s['t']
  b, k, max_len = s['alive_seq'].shape
  vocab = logits.shape[-1]
  if vocab < 2:
    raise ValueError(f'beam search needs a vocabulary of at least 2 ids; got {vocab}.')
  logp = jax.nn.log_softmax(logits).reshape(b, k, vocab)
  cand = (s['alive_logp'][:, :, None] + logp).reshape(b, k * vocab)
  top_logp, top_idx = lax.top_k(cand, 2 * k)  # [b, 2k], best first
  tok = (top_idx % vocab).astype(jnp.int32)
  seq = _gather_beams(s['alive_seq'], top_idx // vocab)  # [b, 2k, max_len]
  seq = jax.vmap(lambda x, v: lax.dynamic_update_index_in_dim(x, v, t, axis=1))(seq, tok)
  real = top_logp > NEG_INF / 2
  rank = jnp.arange(2 * k)
  finish = (rank < k) & real & ((tok == eos_id) | (t == max_len - 1)) & ~s['done'][:, None]
  # Finished: merge the new ones into the k best so far (earlier ones win ties).
  new_score = jnp.where(finish, top_logp / length_penalty(t + 1, alpha), NEG_INF)
  fin_score, fin_idx = lax.top_k(jnp.concatenate([s['fin_score'], new_score], 1), k)
  fin_seq = _gather_beams(jnp.concatenate([s['fin_seq'], seq], 1), fin_idx)
  # Alive: the k best candidates that do not end in EOS.
  alive_logp, alive_idx = lax.top_k(jnp.where(tok == eos_id, NEG_INF, top_logp), k)
  alive_logp = jnp.maximum(alive_logp, NEG_INF)
  num_fin = s['num_fin'] + jnp.sum(finish, axis=1, dtype=jnp.int32)
  # Stop test at equal length t + 1; sticky, so a stopped sentence stays frozen.
  done = s['done'] | (
      (num_fin >= k) & (fin_score[:, -1] >= alive_logp[:, 0] / length_penalty(t + 1, alpha))
  )
  state = dict(
      t=t + 1,
      alive_seq=_gather_beams(seq, alive_idx),
      alive_logp=alive_logp,
      fin_seq=fin_seq,
      fin_score=fin_score,
      num_fin=num_fin,
      done=done,
  )
  return state, _gather_beams(top_idx // vocab, alive_idx)


def beam_search_all(
    model,
    params,
    inputs: Array,
    *,
    beam_size: int = BEAM_SIZE,
    alpha: float = BEAM_ALPHA,
    max_len: int,
    eos_id: int = 1,
    min_segment: Optional[int] = MIN_SEGMENT,
    cache: bool = True,
) -> tuple[Array, Array]:
  """All finished hypotheses: ids ``[batch, beam_size, max_len]`` and scores
  ``[batch, beam_size]`` (``logp / lp``), best first; empty slots score ``NEG_INF``.

  ``cache``: incremental decoding, the ``b * beam_size`` cache rows reordered
  with the surviving hypotheses at every step (module docstring); False: the
  uncached reference. Both run in segments from ``min_segment``."""
  _check(inputs, max_len)
  if not isinstance(beam_size, int) or beam_size < 1:
    raise ValueError(f'beam_size={beam_size!r} must be a positive int.')
  inputs = jnp.asarray(inputs)
  b, k = inputs.shape[0], beam_size
  encoded = _tile(model.apply(params, inputs, method=model.encode), k)
  tiled_inputs = _tile(inputs, k)
  state = _initial_beams(b, k, max_len)

  def step(s, width):
    flat_seq = s['alive_seq'].reshape(b * k, max_len)
    if cache:
      logits, new_cache = _cached_step_logits(
          model, params, encoded, tiled_inputs, s['cache'], _previous_token(flat_seq, s['t'])
      )
    else:
      logits = _step_logits(model, params, encoded, tiled_inputs, flat_seq, s['t'], width)
    out, parent = _advance_beams(s, logits, eos_id=eos_id, alpha=alpha)
    if cache:  # row (i, j) continues the hypothesis of old beam parent[i, j]
      rows = (jnp.arange(b)[:, None] * k + parent).reshape(b * k)
      out['cache'] = reorder_cache(new_cache, rows, row_axes)
    return out

  cache_for = None
  if cache:
    make = lambda w: init_cache(model, params, encoded, tiled_inputs, w)
    state['cache'] = make(max_len)
    row_axes = cache_row_axes(model, params, encoded, tiled_inputs, state['cache'], max_len)
    cache_for = cache_shapes(state['cache'], max_len, make)
  state = segmented_loop(state, step, max_len, min_segment, cache_for)
  return state['fin_seq'], state['fin_score']
