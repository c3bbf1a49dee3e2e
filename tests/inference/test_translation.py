"""Translating from a workdir (contextpool_jax.inference.translation): its vocabulary, the
sentences encoded, and contextpool-sample's --sentence decoding with it, greedy and beam."""

import types

import numpy as np
import pytest

from contextpool_jax.base.errors import ArgumentError
from contextpool_jax.commands import sample
from contextpool_jax.inference import translation
from contextpool_jax.runs.workdirs import load
from helpers import translation_workdir  # pylint: disable=unused-import  # a fixture

pytestmark = pytest.mark.slow  # runs the sample command line's decoding


def test_translate_decodes_with_the_workdirs_vocab(translation_workdir):
  from contextpool_jax.inference import decoding

  model, variables, config = load(translation_workdir)
  vocab = translation.load_vocab(translation_workdir, config)
  sentences = ['the small cat sees a dog', 'old house']
  flags = types.SimpleNamespace(
      workdir=str(translation_workdir),
      step=None,
      prompt=None,
      sentence=sentences,
      beam_size=1,
      alpha=0.6,
      max_len=8,
  )
  greedy = sample.run(flags)
  inputs = translation.encode_sentences(vocab, sentences, 16)
  assert inputs.shape[0] == 2 and all(int(row[row > 0][-1]) == 1 for row in inputs)  # EOS
  ids = decoding.greedy_decode(model, variables, inputs, max_len=8)
  assert greedy == [vocab.decode(row) for row in np.asarray(ids)]
  flags.beam_size = 3
  beams = sample.run(flags)
  assert len(beams) == 2 and all(isinstance(t, str) for t in beams)
  flags.sentence = []
  with pytest.raises(ArgumentError, match='--sentence is required for a translation workdir'):
    sample.run(flags)
