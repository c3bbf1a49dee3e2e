r"""The sampling command line's entry point and flags, and the old home of sampling and
translation (kept as an alias: the code is in :mod:`contextpool_jax.inference`,
``sampling``, ``translation`` and ``cli``).

  python -m contextpool_jax.sample --workdir /tmp/cp --prompt "def " --length 200 \
      --temperature 0.8 --top_k 40 --seed 0
  python -m contextpool_jax.sample --workdir /tmp/wmt --sentence "A small house." --beam_size 4

The names below keep working (``from contextpool_jax import sample``;
``sample.sample_text`` ...).
"""

# pylint: disable=unused-import
from contextpool_jax.byte_text import decode_bytes, encode_bytes
from contextpool_jax.inference import decoding
from contextpool_jax.inference.cli import main, run
from contextpool_jax.inference.sampling import (
    cached_next_token_logits,
    choose_tokens,
    next_token_logits,
    sample_text,
    sample_tokens,
)
from contextpool_jax.inference.translation import encode_sentences, load_vocab, translate


def define_flags():
  """Defines the command line's flags (absl) and returns ``flags.FLAGS``."""
  from absl import flags  # pylint: disable=g-import-not-at-top  # train extra

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
  flags.DEFINE_integer(
      'beam_size', decoding.BEAM_SIZE, 'Translation workdirs: beam size (1: greedy).'
  )
  flags.DEFINE_float('alpha', decoding.BEAM_ALPHA, 'Translation workdirs: length penalty.')
  flags.DEFINE_integer('max_len', 0, 'Translation workdirs: most target tokens (0: config).')
  flags.mark_flag_as_required('workdir')
  return flags.FLAGS


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top  # train extra

  define_flags()
  app.run(main)
