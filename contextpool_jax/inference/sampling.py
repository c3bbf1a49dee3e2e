"""Sampling text from a trained byte-level language model.

The command line (``python -m contextpool_jax.commands.sample``) is
:mod:`contextpool_jax.commands.sample`; translation is
:mod:`contextpool_jax.inference.translation`.

Language models (byte-level: the prompt is UTF-8 encoded,
the continuation decoded with replacement characters for incomplete sequences):
:func:`sample_tokens` generates ``length`` tokens after the prompt by ancestral
sampling (``temperature`` > 0, optionally restricted to the ``top_k`` most likely
tokens) or greedily (``temperature == 0``), reproducibly for a ``seed``. The model
sees at most the last ``context`` tokens (the trained ``config.dataset.seq_len``:
sinusoidal positions do not extrapolate), a sliding window once the text is longer.

With ``cache=True`` (default) generation is incremental: the model's ``'cache'``
(``model.apply(..., decode=True, mutable=['cache'])``: attention keys and values,
area features, ContextPool's streaming state) holds the first ``context``
positions, and each step feeds one token (:func:`cached_next_token_logits`),
the prompt included. Beyond ``context`` tokens the window slides, which a cache
of absolute positions cannot do (every kept token would move to a new position):
the remaining steps fall back to the uncached step, so the output is exactly
the uncached sampler's, only faster for the first ``context`` positions.
:func:`next_token_logits` is the uncached step (``cache=False``): it re-runs the
model on the whole window.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from contextpool_jax.base.byte_text import decode_bytes, encode_bytes
from contextpool_jax.base.checks import check_argument, is_int
from contextpool_jax.inference import decoding

Array = jax.Array


def is_language_model(model) -> bool:
  """Whether ``model`` is a language model these samplers continue: a token model
  (``vocab_size``) without an encoder, called on the tokens alone (``TransformerLM``)."""
  return hasattr(model, 'vocab_size') and not decoding.is_encoder_decoder(model)


def next_token_logits(model, variables: dict, window: Array, position: Array) -> Array:
  """float32 logits ``[batch, vocab]`` predicting the token after ``window[:, position]``.

  ``window``: int32 ``[batch, width]`` token ids; entries after ``position`` are
  ignored (the LM is causal). Recomputes the whole window: the one function a KV
  cache replaces.
  """
  logits = model.apply(variables, window, train=False)
  return lax.dynamic_index_in_dim(logits, position, axis=1, keepdims=False).astype(jnp.float32)


def cached_next_token_logits(model, variables: dict, cache, token: Array):
  """float32 logits ``[batch, vocab]`` predicting the token after ``token [batch]``,
  fed at the cache's next position, and the updated cache."""
  logits, state = model.apply(
      {**variables, 'cache': cache}, token[:, None], train=False, decode=True, mutable=['cache']
  )
  return logits[:, 0].astype(jnp.float32), state['cache']


def choose_tokens(logits: Array, rng: Array, *, temperature: float, top_k: int) -> Array:
  """int32 ``[batch]``: argmax for ``temperature == 0``, else a sample of
  ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits
  (``top_k=0``: all). ``logits``: float32 ``[batch, vocab]``."""
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if top_k > logits.shape[-1]:
    raise ValueError(
        f'top_k={top_k} is not allowed; expected at most the vocabulary size '
        f'{logits.shape[-1]} (or 0 for all tokens).'
    )
  logits = logits / temperature
  if top_k:
    kth = lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


def _sample(
    model, variables, prompt, rng, *, length, context, temperature, top_k, logits_fn, cache
):
  """The generation loops (compiled ``fori_loop``s); ``[batch, length]``."""
  batch, prompt_len = prompt.shape
  total = prompt_len + length
  width = min(context, total)
  tokens = jnp.zeros((batch, total), jnp.int32).at[:, :prompt_len].set(prompt)
  first = prompt_len  # the first token the uncached loop generates
  if cache:
    # Feed positions 0 .. end - 1 (the prompt, then each new token) into a cache
    # of `width` positions: tokens up to index `end` (the token at index t
    # always comes from the logits of position t - 1).
    # Steps run in decoding's segments, each on the cache's leading slice.
    end = min(width, total - 1)
    new_cache = lambda w: model.apply(
        variables, jnp.zeros((batch, w), jnp.int32), decode=True, mutable=['cache']
    )[1]['cache']

    def cached_step(s, _):
      t = s['t']
      logits, c = cached_next_token_logits(model, variables, s['cache'], s['tokens'][:, t])
      key = jax.random.fold_in(rng, t + 1)
      token = choose_tokens(logits, key, temperature=temperature, top_k=top_k)
      token = jnp.where(t + 1 < prompt_len, s['tokens'][:, t + 1], token)  # keep the prompt
      tokens = lax.dynamic_update_index_in_dim(s['tokens'], token, t + 1, axis=1)
      return dict(s, t=t + 1, tokens=tokens, cache=c)

    state = dict(
        t=jnp.int32(0), tokens=tokens, done=jnp.zeros((batch,), bool), cache=new_cache(width)
    )
    cache_for = decoding.cache_shapes(state['cache'], width, new_cache)
    tokens = decoding.segmented_loop(state, cached_step, end, decoding.MIN_SEGMENT, cache_for)[
        'tokens'
    ]
    first = max(prompt_len, end + 1)

  def step(t, tokens):
    start = jnp.maximum(t - width, 0)  # sliding window of the last `width` tokens
    window = lax.dynamic_slice_in_dim(tokens, start, width, axis=1)
    logits = logits_fn(model, variables, window, t - 1 - start)
    token = choose_tokens(logits, jax.random.fold_in(rng, t), temperature=temperature, top_k=top_k)
    return lax.dynamic_update_index_in_dim(tokens, token, t, axis=1)

  tokens = lax.fori_loop(first, total, step, tokens)
  return tokens[:, prompt_len:]


def sample_tokens(
    model,
    variables: dict,
    prompt: Array,
    *,
    length: int,
    context: int,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    logits_fn: Callable[..., Array] = next_token_logits,
    cache: bool = True,
) -> Array:
  """Generates ``length`` tokens after ``prompt``: int32 ``[batch, length]``.

  Args:
    model: a causal LM, ``model.apply(variables, tokens [b, n], train=False) ->
      logits [b, n, vocab]``.
    variables: its variables (``{'params': ...}``).
    prompt: int ``[batch, prompt_len]`` token ids, ``prompt_len >= 1``.
    length: tokens to generate (> 0).
    context: the most tokens the model reads at once (> 0): the last ``context``.
    temperature: 0 (greedy) or > 0.
    top_k: 0 (no restriction) or the number of most likely tokens to sample from.
    seed: the sample is a function of (model, prompt, arguments, seed).
    logits_fn: the uncached step, :func:`next_token_logits` or a drop-in
      replacement (with ``cache``: only beyond ``context`` tokens).
    cache: incremental decoding for the first ``context`` positions (module
      docstring); the same tokens as ``cache=False``.
  """
  prompt = jnp.asarray(prompt)
  check_argument(
      'prompt',
      prompt.shape,
      prompt.ndim == 2 and prompt.shape[1] >= 1,
      'expected int token ids [batch, prompt_len] with prompt_len >= 1',
  )
  check_argument('length', length, isinstance(length, int) and length > 0, 'a positive int')
  check_argument('context', context, isinstance(context, int) and context > 0, 'a positive int')
  check_argument('temperature', temperature, temperature >= 0, '0 (greedy) or a positive float')
  check_argument(
      'top_k', top_k, isinstance(top_k, int) and top_k >= 0, '0 (all tokens) or a positive int'
  )
  # A closure, not static arguments: modules with dict fields are not hashable.
  fn = jax.jit(
      functools.partial(
          _sample,
          model,
          length=length,
          context=context,
          temperature=float(temperature),
          top_k=top_k,
          logits_fn=logits_fn,
          cache=cache,
      )
  )
  return fn(variables, prompt.astype(jnp.int32), jax.random.key(seed))


def trained_context(config) -> int:
  """The window a model of ``config`` was trained on (``config.dataset.seq_len``), or
  0 when the config has none (an export of a config without a dataset section).
  Read alone: sampling needs no other data setting (and no data module)."""
  seq_len = (config.get('dataset') or {}).get('seq_len') or 0
  check_argument('config.dataset.seq_len', seq_len, is_int(seq_len) and seq_len >= 0, 'an int >= 0')
  return int(seq_len)


def sample_text(
    model,
    variables: dict,
    config,
    prompt: str,
    *,
    length: int = 200,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
) -> str:
  """The ``length``-byte continuation of ``prompt`` by a byte-level LM (``load``'s
  output), with the context the model was trained at (:func:`trained_context`)."""
  check_argument('prompt', prompt, bool(prompt), 'a non-empty string (the LM has no start token)')
  ids = encode_bytes(prompt, model.vocab_size)
  context = trained_context(config) or len(ids) + length
  out = sample_tokens(
      model,
      variables,
      jnp.asarray([ids], jnp.int32),
      length=length,
      context=context,
      temperature=temperature,
      top_k=top_k,
      seed=seed,
  )
  return decode_bytes(jax.device_get(out[0]))
