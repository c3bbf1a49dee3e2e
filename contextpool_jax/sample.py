r"""Sample text from a trained LM workdir, or translate with a translation workdir.

  python -m contextpool_jax.sample --workdir /tmp/cp --prompt "def " --length 200 \
      --temperature 0.8 --top_k 40 --seed 0
  python -m contextpool_jax.sample --workdir /tmp/wmt --sentence "A small house." --beam_size 4

Other flags: ``--step N`` (a checkpoint; default the latest); translation: ``--sentence`` once
per sentence, ``--alpha 0.6`` (length penalty), ``--max_len 0`` (0: the config's).

Language models (``config.task == 'lm'``, byte-level: the prompt is UTF-8 encoded,
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

Translation (``config.task == 'translation'``): :func:`translate` encodes the
sentences with the workdir's SentencePiece model and decodes with
:mod:`contextpool_jax.training.decoding` (beam search, or greedy for
``beam_size=1``).
"""

from __future__ import annotations

import functools
import pathlib
import sys
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def _check(name: str, value: Any, ok: bool, allowed: str) -> None:
  if not ok:
    raise ValueError(f'{name}={value!r} is not allowed; expected {allowed}.')


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
    from contextpool_jax.training import decoding  # pylint: disable=g-import-not-at-top

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
    cache_for = lambda w: jax.eval_shape(lambda: new_cache(w))
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
  _check(
      'prompt',
      prompt.shape,
      prompt.ndim == 2 and prompt.shape[1] >= 1,
      'expected int token ids [batch, prompt_len] with prompt_len >= 1',
  )
  _check('length', length, isinstance(length, int) and length > 0, 'a positive int')
  _check('context', context, isinstance(context, int) and context > 0, 'a positive int')
  _check('temperature', temperature, temperature >= 0, '0 (greedy) or a positive float')
  _check('top_k', top_k, isinstance(top_k, int) and top_k >= 0, '0 (all tokens) or a positive int')
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


def encode_bytes(text: str, vocab_size: int) -> list[int]:
  """UTF-8 bytes of ``text`` as token ids (the byte-level LMs' vocabulary)."""
  ids = list(text.encode('utf-8'))
  bad = sorted({i for i in ids if i >= vocab_size})
  if bad:
    raise ValueError(
        f'prompt={text!r} has bytes {bad[:5]} outside the model vocabulary '
        f'of {vocab_size} tokens.'
    )
  return ids


def decode_bytes(ids: Sequence[int]) -> str:
  """Token ids as UTF-8 bytes, decoded (U+FFFD for invalid or cut-off sequences)."""
  return bytes(int(i) for i in ids).decode('utf-8', errors='replace')


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
  output), with the context the model was trained at (``config.dataset.seq_len``)."""
  _check('prompt', prompt, bool(prompt), 'a non-empty string (the LM has no start token)')
  ids = encode_bytes(prompt, model.vocab_size)
  context = int(config.dataset.get('seq_len', 0) or len(ids) + length)
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


# ----------------------------------------------------------------------------
# Translation.
# ----------------------------------------------------------------------------


def load_vocab(workdir, config):
  """The SentencePiece model a translation workdir trained with (never trains one).

  ``config.dataset.vocab_path`` if set, else ``<workdir>/<vocab_filename(config)>``.
  For an export (``export_params``) pass ``vocab_path`` in the config or copy the
  ``.model`` file next to it.
  """
  from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

  explicit = config.dataset.get('vocab_path', None)
  path = (
      pathlib.Path(explicit)
      if explicit
      else pathlib.Path(workdir) / translation_input.vocab_filename(config)
  )
  if not path.is_file():
    raise FileNotFoundError(
        f'no SentencePiece model at {path}: train.py writes it to the '
        'workdir on first use (or set config.dataset.vocab_path).'
    )
  return translation_input.SentencePieceVocab.load(path)


def encode_sentences(vocab, sentences: Sequence[str], max_len: int) -> Array:
  """int32 ``[len(sentences), longest]``: each sentence's ids + EOS, at most ``max_len``
  (truncated, keeping the EOS), 0-padded."""
  rows = [vocab.encode(s)[: max_len - 1] + [vocab.eos_id] for s in sentences]
  width = max(len(r) for r in rows)
  return jnp.asarray([r + [vocab.pad_id] * (width - len(r)) for r in rows], jnp.int32)


def translate(
    model,
    variables: dict,
    config,
    vocab,
    sentences: Sequence[str],
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int = 0,
) -> list[str]:
  """Translations of ``sentences`` (detokenised strings, in order).

  Beam search with the GNMT length penalty ``alpha`` (``beam_size=1``: greedy),
  at most ``max_len`` target tokens (0: ``config.dataset.max_target_len``).
  """
  from contextpool_jax.training import decoding  # pylint: disable=g-import-not-at-top

  _check(
      'sentences',
      sentences,
      len(sentences) > 0 and all(sentences),
      'at least one non-empty sentence',
  )
  _check(
      'beam_size',
      beam_size,
      isinstance(beam_size, int) and beam_size >= 1,
      'a positive int (1: greedy)',
  )
  _check(
      'max_len',
      max_len,
      isinstance(max_len, int) and max_len >= 0,
      'a positive int, or 0 for config.dataset.max_target_len',
  )
  max_len = max_len or int(config.dataset.max_target_len)
  inputs = encode_sentences(vocab, sentences, int(config.dataset.max_source_len))
  fn = decoding.decoder(
      model,
      max_len=max_len,
      beam_size=None if beam_size == 1 else beam_size,
      alpha=alpha,
      eos_id=vocab.eos_id,
  )
  ids = jax.device_get(jax.jit(fn)(variables, inputs))
  return [vocab.decode(row) for row in ids]


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top

  flags.DEFINE_string('workdir', None, 'A training workdir (or an export_params directory).')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_string('prompt', None, 'LM workdirs: the text to continue.')
  flags.DEFINE_integer('length', 200, 'LM workdirs: bytes to generate.')
  flags.DEFINE_float('temperature', 1.0, 'LM workdirs: 0 = greedy.')
  flags.DEFINE_integer('top_k', 0, 'LM workdirs: sample among the k most likely (0: all).')
  flags.DEFINE_integer('seed', 0, 'LM workdirs: sampling seed.')
  flags.DEFINE_multi_string(
      'sentence',
      [],
      'Translation workdirs: a sentence to translate ' '(repeat the flag for several).',
  )
  flags.DEFINE_integer('beam_size', 4, 'Translation workdirs: beam size (1: greedy).')
  flags.DEFINE_float('alpha', 0.6, 'Translation workdirs: length penalty.')
  flags.DEFINE_integer('max_len', 0, 'Translation workdirs: most target tokens (0: config).')
  flags.mark_flag_as_required('workdir')
  return flags.FLAGS


def run(flag_values) -> list[str]:
  """What the command line prints, one string per sample/translation."""
  from contextpool_jax.training import load  # pylint: disable=g-import-not-at-top

  model, variables, config = load(flag_values.workdir, flag_values.step)
  task = config.get('task', 'lm')
  if task == 'lm':
    if flag_values.sentence:
      raise ValueError(
          f'--sentence is for translation workdirs; {flag_values.workdir} is a '
          'language model (config.task=lm): use --prompt.'
      )
    if flag_values.prompt is None:
      raise ValueError(
          f'--prompt is required for a language model workdir ' f'({flag_values.workdir}).'
      )
    text = sample_text(
        model,
        variables,
        config,
        flag_values.prompt,
        length=flag_values.length,
        temperature=flag_values.temperature,
        top_k=flag_values.top_k,
        seed=flag_values.seed,
    )
    return [flag_values.prompt + text]
  if task == 'translation':
    if not flag_values.sentence:
      raise ValueError(
          f'--sentence is required for a translation workdir '
          f'({flag_values.workdir}); repeat it for several sentences.'
      )
    vocab = load_vocab(flag_values.workdir, config)
    return translate(
        model,
        variables,
        config,
        vocab,
        flag_values.sentence,
        beam_size=flag_values.beam_size,
        alpha=flag_values.alpha,
        max_len=flag_values.max_len,
    )
  raise ValueError(
      f'{flag_values.workdir} has config.task={task!r}; sampling supports '
      "'lm' (text) and 'translation' workdirs."
  )


def main(argv):
  from absl import app, flags, logging  # pylint: disable=g-import-not-at-top

  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.ERROR)  # orbax's read-only notices
  from contextpool_jax.training.load import WorkdirError  # pylint: disable=g-import-not-at-top

  try:
    outputs = run(flags.FLAGS)
  except (WorkdirError, FileNotFoundError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  for text in outputs:
    print(text)


if __name__ == '__main__':
  from absl import app as _app  # pylint: disable=g-import-not-at-top

  _define_flags()
  _app.run(main)
