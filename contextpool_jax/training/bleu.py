"""BLEU on detokenised text with sacreBLEU, and a decode-then-score helper for eval batches.

:func:`corpus_bleu` is sacreBLEU's corpus BLEU (one reference per segment) with
its default ``13a`` tokenisation (the WMT ``mteval-v13a`` tokeniser), default
``exp`` smoothing, case-sensitive, on detokenised text: the hypotheses are
SentencePiece-decoded strings and the references the raw target sentences.
This is the signature-reproducible number (``nrefs:1|case:mixed|eff:no|
tok:13a|smooth:exp``); it is *not* the tokenised, compound-split BLEU
(``multi-bleu.perl`` after Moses tokenisation) that Vaswani et al. (2017) and
Li et al. (2019) report for WMT14 EN-DE, which is usually higher (Post, 2018,
"A Call for Clarity in Reporting BLEU Scores"), so do not compare the two directly.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Optional, Sequence

import jax
import numpy as np
import sacrebleu
from jax.sharding import NamedSharding

from contextpool_jax.training import decoding, sharding


def corpus_bleu(
    hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str = '13a'
) -> float:
  """Corpus BLEU in [0, 100] of ``hypotheses`` against one reference each."""
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} references.')
  return float(sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize).score)


class ScoredTranslations(dict):
  """The metrics dict ``{'bleu': float}`` (so a trainer can ``metrics.update`` it), plus
  attributes ``bleu``, ``hypotheses`` and ``references`` (lists of str in split
  order, i.e. by example index when the batches carry ``'index'``)."""

  def __init__(self, bleu: float, hypotheses: list[str], references: list[str]):
    super().__init__(bleu=float(bleu))
    self.bleu = float(bleu)
    self.hypotheses = hypotheses
    self.references = references


def make_decode_fn(
    model,
    *,
    max_len: int,
    beam_size: Optional[int] = 4,
    alpha: float = 0.6,
    eos_id: int = 1,
    min_segment: Optional[int] = decoding.MIN_SEGMENT,
) -> Callable[[Any, Any], jax.Array]:
  """A jitted ``(params, inputs) -> ids [b, max_len]``: beam search, or greedy if
  ``beam_size`` is None (:func:`decoding.decoder`)."""
  return jax.jit(
      decoding.decoder(
          model,
          max_len=max_len,
          beam_size=beam_size,
          alpha=alpha,
          eos_id=eos_id,
          min_segment=min_segment,
      )
  )


def decode_and_score(
    model,
    params,
    batches: Iterable[dict[str, Any]],
    vocab,
    *,
    max_len: Optional[int] = None,
    beam_size: Optional[int] = 4,
    alpha: float = 0.6,
    eos_id: int = 1,
    min_segment: Optional[int] = decoding.MIN_SEGMENT,
    references: Optional[Sequence[str]] = None,
    decode_fn: Optional[Callable[[Any, Any], Any]] = None,
    max_batches: Optional[int] = None,
    tokenize: str = '13a',
    data_sharding: Optional[NamedSharding] = None,
) -> ScoredTranslations:
  """Decodes every eval batch, detokenises and scores with :func:`corpus_bleu`.

  Args:
    model, params: the Transformer (or any model, see ``decoding``) and the
      variables for ``model.apply`` (``{'params': ...}``); a bare parameter tree
      (no top-level ``'params'`` key) is wrapped as ``{'params': tree}``.
    batches: eval batches with ``'inputs'``; ``'mask'`` (bool, False = padding
      example) and ``'index'`` (position in the split, -1 = padding) are used
      when present, e.g. :class:`~contextpool_jax.data.translation_input.EvalBatches`.
    vocab: has ``decode(ids) -> str`` (cuts at EOS, drops padding).
    max_len: decoded length; default the batch's ``targets`` width.
    beam_size: beam width, or None for greedy decoding. ``alpha``: length penalty.
    references: reference strings indexed by ``'index'`` (or in order when the
      batches carry no index); default ``batches.references`` if it exists,
      else the detokenised ``'targets'`` (only approximates the raw text).
    decode_fn: ``(params, inputs) -> ids`` to use instead of the built-in jitted
      search (``inputs`` is a global array sharded by ``data_sharding``).
    max_batches: score only the first ``max_batches`` batches (None or 0 = all;
      must be the same on every process).

  Decoding is data parallel over ``data_sharding`` (default: every device of
  every process, split along the batch axis, as the trainer's evaluation
  steps): each process passes its own rows, padded here to a multiple of its
  local device count, and the decoded ids, indices and masks are read back
  with :func:`sharding.fetch`, so every process scores the whole set. In a
  multi-process run every process must call this with the same number of
  batches.
  """
  if not (isinstance(params, dict) and 'params' in params):
    params = {'params': params}
  if data_sharding is None:
    data_sharding = sharding.batch_sharding(sharding.make_mesh())
  local_devices = len(data_sharding.mesh.local_devices)
  if max_batches:
    batches_iter = itertools.islice(batches, int(max_batches))
  else:
    batches_iter = iter(batches)
  keep_targets = references is None and not hasattr(batches, 'references')
  fns: dict[int, Callable] = {}
  ids_all, index_all, mask_all, target_text = [], [], [], []
  count = 0
  for batch in batches_iter:
    inputs = np.asarray(batch['inputs'])
    n = inputs.shape[0]
    host = {
        'inputs': inputs,
        'mask': np.asarray(batch.get('mask', np.ones(n, bool)), bool),
        'index': np.asarray(batch.get('index', np.arange(count, count + n)), np.int32),
    }
    if keep_targets:
      host['targets'] = np.asarray(batch['targets'])
    count += n
    host, _ = sharding.pad_rows(host, local_devices)  # padded rows: mask False
    length = max_len or int(np.asarray(batch['targets']).shape[1])
    fn = decode_fn
    if fn is None:
      if length not in fns:
        fns[length] = make_decode_fn(
            model,
            max_len=length,
            beam_size=beam_size,
            alpha=alpha,
            eos_id=eos_id,
            min_segment=min_segment,
        )
      fn = fns[length]
    device_batch = sharding.put_batch(host, data_sharding)
    out = sharding.fetch(dict(device_batch, ids=fn(params, device_batch['inputs'])))
    ids_all.append(out['ids'])
    index_all.append(out['index'])
    mask_all.append(out['mask'])
    if keep_targets:
      target_text.append(out['targets'])
  if not ids_all:
    return ScoredTranslations(0.0, [], [])
  width = max(a.shape[1] for a in ids_all)
  ids = np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in ids_all])
  index, mask = np.concatenate(index_all), np.concatenate(mask_all)
  keep = mask & (index >= 0)
  order = np.argsort(index[keep], kind='stable')
  hypotheses = [vocab.decode(row) for row in ids[keep][order]]
  if references is None and hasattr(batches, 'references'):
    references = batches.references
  if references is not None:
    refs = [references[int(i)] for i in index[keep][order]]
  else:
    twidth = max(a.shape[1] for a in target_text)
    targets = np.concatenate([np.pad(a, ((0, 0), (0, twidth - a.shape[1]))) for a in target_text])
    refs = [vocab.decode(row) for row in targets[keep][order]]
  return ScoredTranslations(corpus_bleu(hypotheses, refs, tokenize=tokenize), hypotheses, refs)
