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
from jax.sharding import Mesh, NamedSharding

from contextpool_jax.inference import decoding
from contextpool_jax.training import sharding


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
    beam_size: Optional[int] = decoding.BEAM_SIZE,
    alpha: float = decoding.BEAM_ALPHA,
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
    beam_size: Optional[int] = decoding.BEAM_SIZE,
    alpha: float = decoding.BEAM_ALPHA,
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
  if decode_fn is None:
    settings = dict(beam_size=beam_size, alpha=alpha, eos_id=eos_id, min_segment=min_segment)
    decode_fns: Callable[[dict[str, Any]], Callable] = _DecodeFns(model, max_len, settings)
  else:
    decode_fns = _fixed(decode_fn)
  keep_targets = references is None and not hasattr(batches, 'references')
  if max_batches:
    batches_iter = itertools.islice(batches, int(max_batches))
  else:
    batches_iter = iter(batches)
  out = _decode_batches(batches_iter, params, decode_fns, data_sharding, keep_targets)
  if out is None:
    return ScoredTranslations(0.0, [], [])
  keep = out['mask'] & (out['index'] >= 0)
  order = np.argsort(out['index'][keep], kind='stable')
  hypotheses = [vocab.decode(row) for row in out['ids'][keep][order]]
  if references is None:
    references = getattr(batches, 'references', None)
  if references is not None:
    refs = [references[int(i)] for i in out['index'][keep][order]]
  else:
    refs = [vocab.decode(row) for row in out['targets'][keep][order]]
  return ScoredTranslations(corpus_bleu(hypotheses, refs, tokenize=tokenize), hypotheses, refs)


class _DecodeFns:
  """``(batch) -> `` the jitted search for the batch's output length (``max_len`` if
  set, else the batch's ``targets`` width), compiled once per length."""

  def __init__(self, model, max_len: Optional[int], settings: dict[str, Any]):
    self.model, self.max_len, self.settings = model, max_len, settings
    self.fns: dict[int, Callable] = {}

  def __call__(self, batch: dict[str, Any]) -> Callable:
    length = self.max_len or int(np.asarray(batch['targets']).shape[1])
    if length not in self.fns:
      self.fns[length] = make_decode_fn(self.model, max_len=length, **self.settings)
    return self.fns[length]


def _fixed(decode_fn: Callable) -> Callable[[dict[str, Any]], Callable]:
  """A user's ``decode_fn`` for every batch."""
  return lambda batch: decode_fn


def _decode_batches(
    batches: Iterable[dict[str, Any]],
    params,
    decode_fns: Callable[[dict[str, Any]], Callable],
    data_sharding: NamedSharding,
    keep_targets: bool,
) -> Optional[dict[str, np.ndarray]]:
  """Decodes every batch data parallel (see :func:`decode_and_score`); the global
  ``'ids'``, ``'index'``, ``'mask'`` (and ``'targets'``) of all batches, ids and
  targets right-padded to one width, or None for no batches."""
  mesh = data_sharding.mesh
  assert isinstance(mesh, Mesh)  # a concrete mesh (an abstract one has no devices)
  local_devices = len(mesh.local_devices)
  parts: dict[str, list[np.ndarray]] = {'ids': [], 'index': [], 'mask': []}
  if keep_targets:
    parts['targets'] = []
  count = 0
  for batch in batches:
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
    fn = decode_fns(batch)
    device_batch = sharding.put_batch(host, data_sharding)
    out = sharding.fetch(dict(device_batch, ids=fn(params, device_batch['inputs'])))
    for key, values in parts.items():
      values.append(out[key])
  if not parts['ids']:
    return None
  return {key: _concatenate_padded(values) for key, values in parts.items()}


def _concatenate_padded(arrays: Sequence[np.ndarray]) -> np.ndarray:
  """Rows of every array, the 2-D ones right-padded with 0 to the widest."""
  if arrays[0].ndim == 1:
    return np.concatenate(arrays)
  width = max(a.shape[1] for a in arrays)
  return np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in arrays])
