r"""What a character LM does along training: pool sizes, per-position loss, gradients.

Issue 27 asks why ContextPool, ahead early, ends behind the baseline after
4,000 steps. :func:`diagnose` reads a workdir whose checkpoints were kept
along training (``config.keep_checkpoint_period``; the LM study keeps them
for its long runs of seed 0, ``benchmarks/lm_study.py``) and measures, at
every kept step:

* **pool sizes** per ContextPool layer (the sown ``pool_size`` s in [0, 1]
  and ``pool_sigma`` in tokens), on the validation windows: the share of
  tokens with s > 0.5 (where the sigmoid's gradient towards narrowing is
  damped) and the median sigma, per position bucket;
* **the pooled features' norm** ``|CP(LN x)| / |LN x|`` per bucket (with
  ``context_pool_position='attention_input'``: what the attention reads
  against what it would read without ContextPool; ``'mlp_input'``: the same
  for the feed-forward; ``'output'``: not measured);
* **validation BPC per position bucket** (:func:`buckets`: 0-63, 64-127,
  128-255 of a 256-byte window; the study's validation scores the second
  half of each window, its first window excepted) over the non-overlapping full windows of the validation split;
* **the gradient norm** of the training loss on fixed training windows, in
  total and per module (embedder, ``layer_i/context_pool``,
  ``layer_i/self_attention``, ``layer_i/mlp``, norms).
* **copying** (:func:`copying_bpc`): BPC on windows made of a random
  printable sequence and its repeat (``copying_bpc``), and of the first half
  of a validation window and its repeat (``copying_text_bpc``). The first copy cannot be predicted
  (log2 95 = 6.57 bits per byte at best); the second can only by copying
  from n/2 bytes back, the job of induction heads (a previous-token head in
  one layer, a head in the next that attends to the byte after the earlier
  occurrence of the current one).
* **attention patterns** (:func:`attention_scores`, Olsson et al., 2022) per
  layer and head on the repeated random windows: the previous-token score
  (the mean weight of position t on t - 1) and the induction score (the mean
  weight of t, in the second copy, on the byte after the earlier occurrence
  of its own byte, t - n/2 + 1): whether the heads that copy have formed.

The trainer's own gradient norm along training (``metrics.jsonl``, the mean
over each log interval) is added to the result. :func:`report` turns the
diagnostics of several runs into markdown tables.
"""

from __future__ import annotations

import functools
import json
import math
import pathlib
from typing import Any, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.data import lm_input
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.models import transformer
from contextpool_jax.training import objectives
from contextpool_jax.runs.workdirs import checkpoint_steps, load, read_config

WIDE = 0.5  # s above this counts as a wide pool
GRAD_WINDOWS = 64  # fixed training windows of the gradient norm
GRAD_SEED = 27
COPY_WINDOWS = 32  # repeated random windows of the copying score
COPY_SEED = 28
COPYING = ('copying_bpc', 'copying_text_bpc')  # the two copying scores: random bytes; text
BATCH = 16


def buckets(n: int) -> tuple[tuple[int, int], ...]:
  """Position ranges ``[lo, hi)`` of an n-byte window: its first and second
  quarter and its second half (0-63, 64-127, 128-255 at n = 256; the second
  half is what the study's validation scores)."""
  return ((0, n // 4), (n // 4, n // 2), (n // 2, n))


def bucket_name(lo: int, hi: int) -> str:
  return f'{lo}-{hi - 1}'


def window_of(by_bucket: dict[str, float]) -> int:
  """The window length n of ``{bucket name: value}`` (its last bucket ends at n - 1)."""
  return max(int(name.split('-')[1]) for name in by_bucket) + 1


def _windows(
    split: lm_input.text_builders.ByteSplit, starts: np.ndarray, length: int
) -> np.ndarray:
  """``int32 [len(starts), length + 1]``: the bytes from each start."""
  return np.stack([split.read(int(s), int(s) + length + 1) for s in starts]).astype(np.int32)


def validation_windows(config, max_bytes: int) -> np.ndarray:
  """The non-overlapping full windows ``[w, seq_len + 1]`` of the first
  ``max_bytes`` of the validation split (the study's ``eval_max_bytes``; 0: all of it)."""
  split = lm_input.load_split(lm_input.resolve_spec(config), 'validation')
  n = config.dataset.seq_len
  usable = lm_input.evaluated_bytes(len(split), max_bytes)
  return _windows(split, np.arange(0, usable - n - 1 + 1, n), n)


def training_windows(config) -> np.ndarray:
  """:data:`GRAD_WINDOWS` training windows at seeded offsets (the same for every run)."""
  split = lm_input.load_split(lm_input.resolve_spec(config), 'train')
  n = config.dataset.seq_len
  rng = np.random.default_rng(GRAD_SEED)
  return _windows(split, np.sort(rng.integers(0, len(split) - n - 1, GRAD_WINDOWS)), n)


# The LayerNorm whose output ContextPool pools, per ``context_pool_position``
# (``TransformerLayer``); 'output' pools the residual stream, not a norm.
POOLED_NORM = {'attention_input': 'self_attention_norm', 'mlp_input': 'mlp_norm', 'output': None}


def _is_probed(module, method_name: str) -> bool:
  """Captured outputs: each ContextPool and the norms whose output it may pool."""
  return method_name == '__call__' and (
      isinstance(module, ContextPool) or module.name in POOLED_NORM.values()
  )


def _forward(model, variables, tokens):
  """Per-position NLL ``[b, n]`` (nats) and the captured/sown intermediates, flat."""
  logits, inter = model.apply(
      variables,
      tokens[:, :-1],
      mutable=['intermediates'],
      capture_intermediates=_is_probed,
  )
  nll = objectives.cross_entropy(logits, tokens[:, 1:])
  flat = flax.traverse_util.flatten_dict(inter['intermediates'], sep='/')
  return nll, {k: v[0] for k, v in flat.items()}


def _layer_stats(
    flat: dict[str, np.ndarray], n: int, pooled_norm: Optional[str]
) -> dict[str, dict[str, Any]]:
  """Per ContextPool layer: s, sigma and, when ContextPool pools the norm
  named ``pooled_norm``, the norm ratio, per bucket (numpy in)."""
  out = {}
  for key in sorted(k for k in flat if k.endswith('/pool_sigma')):
    layer = key[: -len('/pool_sigma')]  # .../layer_i/context_pool
    s, sigma = flat[f'{layer}/pool_size'], flat[key]
    pooled = flat.get(f'{layer}/__call__')
    plain = flat.get(f'{layer.rsplit("/", 1)[0]}/{pooled_norm}/__call__') if pooled_norm else None
    ratio = None
    if pooled is not None and plain is not None and pooled.shape == plain.shape:
      ratio = np.linalg.norm(pooled, axis=-1) / np.maximum(np.linalg.norm(plain, axis=-1), 1e-9)
    stats = {}
    named = [(bucket_name(lo, hi), lo, hi) for lo, hi in buckets(n)]
    for name, lo, hi in named + [('all', 0, n)]:
      b = {
          'share_s_above_half': float(np.mean(s[:, lo:hi] > WIDE)),
          'median_s': float(np.median(s[:, lo:hi])),
          'median_sigma': float(np.median(sigma[:, lo:hi])),
          'p90_sigma': float(np.quantile(sigma[:, lo:hi], 0.9)),
      }
      if ratio is not None:
        b['norm_ratio'] = float(np.mean(ratio[:, lo:hi]))
      stats[name] = b
    out[layer.removeprefix('decoder/')] = stats
  return out


def _group(path: tuple[str, ...]) -> str:
  """``layer_0/context_pool`` for ``('decoder', 'layer_0', 'context_pool', ...)``."""
  parts = [p for p in path if p != 'decoder']
  return '/'.join(parts[:2]) if parts[0].startswith('layer_') else parts[0]


def gradient_norms(model, variables, tokens: np.ndarray) -> dict[str, float]:
  """The norm of the mean training loss's gradient on ``tokens``, total and per module group."""

  def loss(params):
    logits = model.apply({**variables, 'params': params}, tokens[:, :-1])
    return jnp.mean(objectives.cross_entropy(logits, tokens[:, 1:]))

  grads = jax.jit(jax.grad(loss))(variables['params'])
  squares: dict[str, float] = {}
  for path, g in flax.traverse_util.flatten_dict(grads).items():
    squares[_group(path)] = squares.get(_group(path), 0.0) + float(
        np.sum(np.square(g, dtype=np.float64))
    )
  norms = {k: math.sqrt(v) for k, v in sorted(squares.items())}
  norms['total'] = math.sqrt(sum(squares.values()))
  return norms


def copying_windows(n: int, count: int = COPY_WINDOWS, seed: int = COPY_SEED) -> np.ndarray:
  """:func:`repeated_windows` of ``count`` random printable sequences (nothing
  in the first copy can be predicted)."""
  return repeated_windows(np.random.default_rng(seed).integers(32, 127, (count, n // 2)), n)


def repeated_windows(windows: np.ndarray, n: int) -> np.ndarray:
  """``[count, n + 1]`` int32: the first ``n // 2`` bytes of each window, the same
  again, and their first byte (the last target)."""
  half = windows[:, : n // 2]
  return np.concatenate([half, half, half[:, :1]], axis=1).astype(np.int32)


def copying_bpc(model, variables, tokens: np.ndarray) -> dict[str, float]:
  """BPC on :func:`repeated_windows`: ``first_copy`` (targets 1 .. n/2 - 1) and
  ``second_copy`` (targets n/2 + 1 .. n, each the byte n/2 positions back; the
  target n/2 follows a byte not seen before and is in neither)."""
  n = tokens.shape[1] - 1
  nll = jax.jit(lambda v, t: objectives.cross_entropy(model.apply(v, t[:, :-1]), t[:, 1:]))
  bits = np.asarray(nll(variables, tokens), np.float64) / math.log(2.0)
  return {  # bits[:, t] scores target t + 1
      'first_copy': float(bits[:, : n // 2 - 1].mean()),
      'second_copy': float(bits[:, n // 2 :].mean()),
  }


def _is_attention_projection(module, method_name: str) -> bool:
  """Captured outputs: the self-attentions' query and key projections."""
  return (
      method_name == '__call__'
      and module.name in ('query', 'key')
      and getattr(module.parent, 'name', None) == 'self_attention'
  )


def _projection(model, calls: tuple[jax.Array, ...]) -> np.ndarray:
  """One projection ``[batch, n, heads, head_dim]`` from its captured calls:
  one, or a :class:`~transformer.HeadMix`'s pooled and plain calls (combined
  as the attention combines them)."""
  if len(calls) == 1:
    return np.asarray(calls[0], np.float64)
  mix = transformer.HeadMix(*calls, heads=model.context_pool_heads)
  return np.asarray(transformer._project(lambda a: a, mix), np.float64)  # pylint: disable=protected-access


def attention_weights(model, variables, tokens: np.ndarray) -> dict[str, np.ndarray]:
  """``{'layer_i': [batch, heads, n, n]}``: each causal self-attention's
  ``softmax(q k^T / sqrt(head_dim))`` on ``tokens[:, :-1]``, from its captured
  query and key projections."""
  capture = functools.partial(
      model.apply, mutable=['intermediates'], capture_intermediates=_is_attention_projection
  )
  _, inter = jax.jit(capture)(variables, tokens[:, :-1])
  flat = flax.traverse_util.flatten_dict(inter['intermediates'], sep='/')
  weights = {}
  for key in sorted(k for k in flat if k.endswith('/self_attention/query/__call__')):
    prefix = key[: -len('query/__call__')]
    q, k = (_projection(model, flat[f'{prefix}{p}/__call__']) for p in ('query', 'key'))
    logits = np.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(q.shape[-1])
    n = q.shape[1]
    logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    weights[_group(tuple(prefix.split('/')[:-2]))] = w / w.sum(-1, keepdims=True)
  return weights


def head_scores(weights: np.ndarray) -> dict[str, list[float]]:
  """Per head of ``weights [batch, heads, n, n]`` on repeated windows (input
  t >= n/2 repeats t - n/2): ``previous_token``, the mean weight of t on t - 1
  (t >= 1); ``induction``, the mean weight of t on t - n/2 + 1, the byte that
  followed the earlier occurrence of its own byte (t >= n/2)."""
  n = weights.shape[-1]
  t = np.arange(1, n)
  previous = weights[:, :, t, t - 1].mean(axis=(0, 2))
  t = np.arange(n // 2, n)
  induction = weights[:, :, t, t - n // 2 + 1].mean(axis=(0, 2))
  return {'previous_token': previous.tolist(), 'induction': induction.tolist()}


def attention_scores(model, variables, tokens: np.ndarray) -> dict[str, dict[str, list[float]]]:
  """:func:`head_scores` of every self-attention on repeated windows
  (:func:`copying_windows`): ``{'layer_i': {score: [per head]}}``."""
  return {layer: head_scores(w) for layer, w in attention_weights(model, variables, tokens).items()}


def diagnose_step(model, variables, valid: np.ndarray, train: np.ndarray) -> dict[str, Any]:
  """The diagnostics of one set of variables (module docstring)."""
  n = valid.shape[1] - 1
  forward = jax.jit(lambda v, t: _forward(model, v, t))
  nll_sum, batches = np.zeros(n), []
  for i in range(0, len(valid), BATCH):
    nll, flat = forward(variables, valid[i : i + BATCH])
    nll_sum += np.asarray(nll, np.float64).sum(0)
    batches.append({k: np.asarray(v, np.float32) for k, v in flat.items()})
  bpc = nll_sum / len(valid) / math.log(2.0)
  merged = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  copies = copying_windows(n)
  return {
      'val_bpc_by_bucket': {bucket_name(lo, hi): float(bpc[lo:hi].mean()) for lo, hi in buckets(n)},
      'val_bpc_all_positions': float(bpc.mean()),
      'layers': _layer_stats(merged, n, POOLED_NORM[model.config.context_pool_position]),
      'grad_norm': gradient_norms(model, variables, train),
      'copying_bpc': copying_bpc(model, variables, copies),
      'copying_text_bpc': copying_bpc(model, variables, repeated_windows(valid[:COPY_WINDOWS], n)),
      'attention': attention_scores(model, variables, copies),
  }


def diagnose(workdir: pathlib.Path, max_bytes: int) -> dict[str, Any]:
  """Diagnostics of every kept checkpoint of ``workdir`` (and the trainer's
  gradient norm along training), ``{'steps': {step: ...}, 'train_grad_norm':
  [(step, norm)]}``."""
  config = read_config(workdir)
  valid, train = validation_windows(config, max_bytes), training_windows(config)
  steps = {}
  for step in checkpoint_steps(workdir):
    model, variables, _ = load(workdir, step)
    steps[step] = diagnose_step(model, variables, valid, train)
  lines = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines() if l]
  grad = {
      l['step']: l['grad_norm'] for l in lines if l.get('split') == 'train' and 'grad_norm' in l
  }
  return {
      'validation_windows': int(len(valid)),
      'steps': steps,
      'train_grad_norm': sorted(grad.items()),
  }


# ----------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------


def _row(cells: Sequence[Any]) -> str:
  return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
  return [_row(header), _row(['---'] * len(header)), *(_row(r) for r in rows), '']


def report(diagnostics: dict[str, dict[str, Any]]) -> str:
  """Markdown tables of ``{run key: diagnose(...)}``: per-position validation
  BPC, pool sizes and norm ratios per layer, gradient norms, along training."""
  first = next(iter(diagnostics.values()))
  n = window_of(next(iter(first['steps'].values()))['val_bpc_by_bucket'])
  lines = [f'## Per-position validation BPC (non-overlapping {n}-byte windows)', '']
  names = [bucket_name(lo, hi) for lo, hi in buckets(n)]
  rows = []
  for key, d in diagnostics.items():
    for step, s in sorted(d['steps'].items(), key=lambda kv: int(kv[0])):
      by = s['val_bpc_by_bucket']
      rows.append([key, step, *(f'{by[b]:.3f}' if b in by else '-' for b in names)])
  lines += _table(['run', 'step', *names], rows)

  lines += ['## Pool sizes and pooled-feature norm per layer', '']
  lines += [
      f'share s > {WIDE}: tokens whose normalised size s exceeds {WIDE} (sigmoid:'
      ' gradient towards narrowing damped); sigma in tokens; norm ratio: mean'
      ' |CP(LN x)| / |LN x|.',
      '',
  ]
  rows = []
  for key, d in diagnostics.items():
    for step, s in sorted(d['steps'].items(), key=lambda kv: int(kv[0])):
      for layer, st in s['layers'].items():
        cells = [key, step, layer, f'{st["all"]["share_s_above_half"]:.2f}']
        for b in names:
          cells.append(f'{st[b]["median_sigma"]:.2f}' if b in st else '-')
        cells += [
            f'{st[b]["norm_ratio"]:.2f}' if 'norm_ratio' in st.get(b, {}) else '-'
            for b in (names[0], names[-1])
        ]
        rows.append(cells)
  lines += _table(
      [
          'run',
          'step',
          'layer',
          'share s > 0.5',
          *(f'median sigma {b}' for b in names),
          f'norm ratio {names[0]}',
          f'norm ratio {names[-1]}',
      ],
      rows,
  )

  lines += ['## Gradient norm of the training loss (64 fixed training windows)', '']
  rows = []
  for key, d in diagnostics.items():
    for step, s in sorted(d['steps'].items(), key=lambda kv: int(kv[0])):
      g = s['grad_norm']
      cp = math.sqrt(sum(v**2 for k, v in g.items() if k.endswith('/context_pool')))
      att = math.sqrt(sum(v**2 for k, v in g.items() if k.endswith('/self_attention')))
      emb = g.get('embedder', 0.0)  # the tied input/output embedding
      rows.append([key, step, f'{g["total"]:.3f}', f'{emb:.3f}', f'{att:.3f}', f'{cp:.3f}'])
  lines += _table(['run', 'step', 'total', 'embedding', 'self-attention', 'ContextPool'], rows)
  return '\n'.join(lines + _copying_table(diagnostics) + _attention_table(diagnostics, n))


def _copying_table(diagnostics: dict[str, dict[str, Any]]) -> list[str]:
  """The copying score of the runs that have it (diagnosed after it was added)."""
  cell = lambda s, k, copy: f'{s[k][copy]:.3f}' if k in s else '-'
  rows = [
      [key, step, *(cell(s, k, c) for k in COPYING for c in ('first_copy', 'second_copy'))]
      for key, d in diagnostics.items()
      for step, s in sorted(d['steps'].items(), key=lambda kv: int(kv[0]))
      if any(k in s for k in COPYING)
  ]
  if not rows:
    return []
  head = ['## Copying: BPC on a sequence and its repeat (random bytes; validation text)', '']
  columns = ['random, first copy', 'random, second copy', 'text, first copy', 'text, second copy']
  return head + _table(['run', 'step', *columns], rows)


def _attention_table(diagnostics: dict[str, dict[str, Any]], n: int) -> list[str]:
  """Per layer, the best head's previous-token and induction scores of the runs
  that have them (diagnosed after :func:`attention_scores` was added), and what
  uniform causal attention over ``n`` bytes scores."""
  rows = []
  for key, d in diagnostics.items():
    for step, s in sorted(d['steps'].items(), key=lambda kv: int(kv[0])):
      for layer, scores in s.get('attention', {}).items():
        best = {name: max(range(len(v)), key=v.__getitem__) for name, v in scores.items()}
        rows.append(
            [key, step, layer]
            + [
                f'{scores[k][best[k]]:.3f} (head {best[k]})'
                for k in ('previous_token', 'induction')
            ]
        )
  if not rows:
    return []
  uniform = head_scores(np.tril(np.ones((1, 1, n, n))) / np.arange(1, n + 1)[:, None])
  head = [
      '## Attention patterns on repeated random bytes (best head per layer)',
      '',
      'previous-token: mean weight of position t on t - 1; induction: mean weight of t'
      ' (second copy) on the byte after the earlier occurrence of its byte. Uniform'
      f' causal attention over {n} bytes scores {uniform["previous_token"][0]:.3f}'
      f' and {uniform["induction"][0]:.3f}.',
      '',
  ]
  return head + _table(['run', 'step', 'layer', 'previous-token', 'induction'], rows)
