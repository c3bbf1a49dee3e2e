r"""The old home of sampling and translation, kept as an alias: the code is in
:mod:`contextpool_jax.inference` (``sampling``, ``translation``, ``cli``).

  python -m contextpool_jax.sample --workdir /tmp/cp --prompt "def " --length 200 \
      --temperature 0.8 --top_k 40 --seed 0
  python -m contextpool_jax.sample --workdir /tmp/wmt --sentence "A small house." --beam_size 4

keeps working (:func:`contextpool_jax.inference.cli.command_line`), and so do the
names below (``from contextpool_jax import sample``; ``sample.sample_text`` ...).
"""

# pylint: disable=unused-import
from contextpool_jax.byte_text import decode_bytes, encode_bytes
from contextpool_jax.inference.cli import main, run
from contextpool_jax.inference.sampling import (
    cached_next_token_logits,
    choose_tokens,
    next_token_logits,
    sample_text,
    sample_tokens,
)
from contextpool_jax.inference.translation import encode_sentences, load_vocab, translate

if __name__ == '__main__':
  from contextpool_jax.inference import cli  # pylint: disable=g-import-not-at-top

  cli.command_line()
