"""Corpus BLEU (contextpool_jax.training.bleu): equal to sacrebleu's and to the definition's, on a
pair worked by hand. (BLEU of decoded evaluation batches: tests/data/test_translation_input.py.)"""

import math
from collections import Counter

import numpy as np
import pytest
import sacrebleu

from contextpool_jax.training import bleu


def _independent_bleu(hyps, refs):
  """Corpus BLEU from its definition (Papineni et al.) for whitespace-tokenised text."""
  match, total = np.zeros(4), np.zeros(4)
  c = r = 0
  for h, ref in zip(hyps, refs):
    h, ref = h.split(), ref.split()
    c, r = c + len(h), r + len(ref)
    for n in range(1, 5):
      hn = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
      rn = Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
      match[n - 1] += sum(min(k, rn[g]) for g, k in hn.items())
      total[n - 1] += max(len(h) - n + 1, 0)
  bp = 1.0 if c > r else math.exp(1 - r / c)
  return 100 * bp * math.exp(np.mean(np.log(match / total)))


def test_corpus_bleu_matches_sacrebleu_and_the_definition():
  refs = ['the quick brown fox jumped over the lazy dog', 'a cat sat on the mat today']
  assert bleu.corpus_bleu(refs, refs) == pytest.approx(100.0)
  hyps = ['the quick brown fox jumps over the dog', 'a cat sat on a mat today']
  got = bleu.corpus_bleu(hyps, refs)
  assert got == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
  assert got == pytest.approx(_independent_bleu(hyps, refs))
  # One pair worked by hand: p1..p4 = 7/8, 4/7, 2/6, 1/5; BP = exp(1 - 9/8).
  one = 100 * math.exp(1 - 9 / 8) * (7 / 8 * 4 / 7 * 2 / 6 * 1 / 5) ** 0.25
  assert bleu.corpus_bleu(hyps[:1], refs[:1]) == pytest.approx(one)
  assert one == pytest.approx(37.71, abs=0.01)
  with pytest.raises(ValueError, match='references'):
    bleu.corpus_bleu(hyps, refs[:1])
