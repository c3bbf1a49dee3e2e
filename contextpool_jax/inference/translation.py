"""Translating sentences with a trained encoder-decoder workdir.

:func:`translate` encodes the sentences with the workdir's SentencePiece model
(:func:`load_vocab`) and decodes with :mod:`contextpool_jax.inference.decoding`
(beam search, or greedy for ``beam_size=1``). The command line is
:mod:`contextpool_jax.commands.sample` (``python -m contextpool_jax.commands.sample
--sentence ...``).
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp

from contextpool_jax.base.checks import check_argument
from contextpool_jax.inference import decoding

Array = jax.Array


def load_vocab(workdir, config):
  """The SentencePiece model a translation workdir trained with (never trains one).

  ``config.dataset.vocab_path`` if set, else ``<workdir>/<vocab_filename(spec)>``.
  For an export (``export_params``) pass ``vocab_path`` in the config or copy the
  ``.model`` file next to it.
  """
  # The data modules (sentencepiece) come with the [train] extra; this module imports without it.
  from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

  spec = translation_input.resolve_spec(config)
  path = (
      pathlib.Path(spec.vocab_path)
      if spec.vocab_path
      else pathlib.Path(workdir) / translation_input.vocab_filename(spec)
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
    beam_size: int = decoding.BEAM_SIZE,
    alpha: float = decoding.BEAM_ALPHA,
    max_len: int = 0,
) -> list[str]:
  """Translations of ``sentences`` (detokenised strings, in order).

  Beam search with the GNMT length penalty ``alpha`` (``beam_size=1``: greedy),
  at most ``max_len`` target tokens (0: ``config.dataset.max_target_len``).
  """
  # The data modules (sentencepiece) come with the [train] extra; this module imports without it.
  from contextpool_jax.data import translation_input  # pylint: disable=g-import-not-at-top

  check_argument(
      'sentences',
      sentences,
      len(sentences) > 0 and all(sentences),
      'at least one non-empty sentence',
  )
  check_argument(
      'beam_size',
      beam_size,
      isinstance(beam_size, int) and beam_size >= 1,
      'a positive int (1: greedy)',
  )
  check_argument(
      'max_len',
      max_len,
      isinstance(max_len, int) and max_len >= 0,
      'a positive int, or 0 for config.dataset.max_target_len',
  )
  data = translation_input.resolve_spec(config)
  max_len = max_len or data.max_target_len
  inputs = encode_sentences(vocab, sentences, data.max_source_len)
  fn = decoding.decoder(
      model,
      max_len=max_len,
      beam_size=None if beam_size == 1 else beam_size,
      alpha=alpha,
      eos_id=vocab.eos_id,
  )
  ids = jax.device_get(jax.jit(fn)(variables, inputs))
  return [vocab.decode(row) for row in ids]
