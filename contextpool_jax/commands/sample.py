r"""The sampling command line: text from a language-model workdir, translations from a
translation workdir (``contextpool-sample``, or ``python -m contextpool_jax.commands.sample``): its flags
and what it does with them.

  python -m contextpool_jax.commands.sample --workdir /tmp/cp --prompt "def " --length 200 \
      --temperature 0.8 --top_k 40 --seed 0
  python -m contextpool_jax.commands.sample --workdir /tmp/wmt --sentence "A small house." --beam_size 4

Other flags: ``--step N`` (a checkpoint; default the latest); translation: ``--sentence`` once
per sentence, ``--alpha 0.6`` (length penalty), ``--max_len 0`` (0: the config's).

What a workdir gets is decided by the model it holds (:func:`runner`), not by its
config: a language model gets :func:`~contextpool_jax.inference.sampling.sample_text`,
an encoder-decoder :func:`~contextpool_jax.inference.translation.translate`.
"""

from __future__ import annotations

import sys

from contextpool_jax.base.errors import ArgumentError, ContextPoolJaxError
from contextpool_jax.inference import decoding
from contextpool_jax.inference.sampling import is_language_model, sample_text
from contextpool_jax.inference.translation import load_vocab, translate

# absl (flags, app; with ml_collections) and the workdir loader are imported where they
# are used, so that the library functions import with jax alone.


def _sample_lm(flag_values, model, variables, config) -> list[str]:
  if flag_values.sentence:
    raise ArgumentError(
        f'--sentence is for translation workdirs; {flag_values.workdir} is a '
        'language model: use --prompt.'
    )
  if flag_values.prompt is None:
    raise ArgumentError(
        f'--prompt is required for a language model workdir ({flag_values.workdir}).'
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


def _translate(flag_values, model, variables, config) -> list[str]:
  if not flag_values.sentence:
    raise ArgumentError(
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


def runner(model):
  """What the command line does with a workdir's model: translate with an
  encoder-decoder, sample text from a language model; None for any other model."""
  if decoding.is_encoder_decoder(model):
    return _translate
  if is_language_model(model):
    return _sample_lm
  return None


def run(flag_values) -> list[str]:
  """What the command line prints, one string per sample/translation."""
  from contextpool_jax.runs.workdirs import load  # pylint: disable=g-import-not-at-top  # with ml_collections

  model, variables, config = load(flag_values.workdir, flag_values.step)
  run_model = runner(model)
  if run_model is None:
    raise ArgumentError(
        f'{flag_values.workdir} holds a {type(model).__name__} (config.model.name='
        f'{config.model.name!r}); sampling supports language models (text) and '
        'encoder-decoder translation models.'
    )
  return run_model(flag_values, model, variables, config)


def main(argv):
  from absl import app, flags, logging  # pylint: disable=g-import-not-at-top  # with ml_collections

  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.set_verbosity(logging.ERROR)  # orbax's read-only notices
  try:
    outputs = run(flags.FLAGS)
  except (ContextPoolJaxError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  for text in outputs:
    print(text)


def define_flags():
  """Defines the command line's flags (absl) and returns ``flags.FLAGS``."""
  from absl import flags  # pylint: disable=g-import-not-at-top  # with ml_collections

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


def command() -> None:
  """The console script ``contextpool-sample`` (and ``python -m contextpool_jax.commands.sample``)."""
  from absl import app  # pylint: disable=g-import-not-at-top  # with ml_collections

  define_flags()
  app.run(main)


if __name__ == '__main__':
  command()
