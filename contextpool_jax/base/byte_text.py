"""Text as the byte-level language models' tokens: UTF-8 bytes, one id each.

Shared by sampling (:mod:`contextpool_jax.inference.sampling`) and the plots
(:mod:`contextpool_jax.tools.viz`); no dependencies.
"""

from __future__ import annotations

from typing import Sequence


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
