"""Greedy decoding time with and without the key/value cache (issue 14).

For each decoder (the tiny 2-layer Transformer of the area attention paper's
sizes: baseline, ContextPool after every layer, area attention in the first
two layers) and each ``max_len``: the wall time of one jitted
``greedy_decode`` of ``batch`` sources (length ``source_len``, the last third
padding) to exactly ``max_len`` tokens (``eos_id=-1``: no early stop), with
``cache=True`` (incremental decoding) and ``cache=False`` (the reference: the
prefix re-run), both in segments from ``decoding.MIN_SEGMENT`` (the cached path
reads the cache's leading slice of the segment's width). The two are timed side by
side in one process, interleaved, ``repeats`` times after a warm-up call;
the table has the medians, their ratio and the cached time relative to the
same decoder's cached time at the previous length. Compilation is excluded.
The uncached path is skipped above ``--uncached_max`` (it grows cubically).

Targets (issue 14): at 256 tokens cached >= 10x faster than uncached; cached
1024 tokens at most ~5x the time of 256.

Usage: python -m benchmarks.decoding_speed [--lengths 64,256,1024] [--repeats 5]
       [--uncached_max 256] [--out benchmarks/results/decoding_speed_cpu.md]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp

from contextpool_jax.models import transformer as T
from contextpool_jax.inference import decoding

DECODERS = {
    'baseline': dict(),
    'cp': dict(context_pool={}),
    'area': dict(attention='area'),
}


def _decoder(name: str, vocab: int):
  return T.Transformer(
      vocab_size=vocab, dropout_rate=0.0, **T.NMT_PRESETS['tiny'], **DECODERS[name]
  )


def _timed(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def measure(name, max_len, *, batch, source_len, vocab, repeats, uncached):
  """``{'cached_ms', 'uncached_ms'}`` medians (uncached None when skipped)."""
  model = _decoder(name, vocab)
  src = jax.random.randint(jax.random.key(0), (batch, source_len), 2, vocab)
  src = src.at[:, source_len - source_len // 3 :].set(0)
  params = jax.jit(model.init)(jax.random.key(1), src, jnp.ones((batch, 4), jnp.int32))
  run = lambda cache: jax.jit(
      functools.partial(decoding.greedy_decode, model, max_len=max_len, eos_id=-1, cache=cache)
  )
  fns = {'cached': run(True)}
  if uncached:
    fns['uncached'] = run(False)
  for fn in fns.values():  # compile + warm up
    _timed(fn, params, src)
  times = {k: [] for k in fns}
  for _ in range(repeats):  # interleaved
    for k, fn in fns.items():
      times[k].append(_timed(fn, params, src))
  med = {f'{k}_ms': 1e3 * statistics.median(v) for k, v in times.items()}
  med.setdefault('uncached_ms', None)
  return med


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--lengths', default='64,256,1024')
  p.add_argument('--decoders', default=','.join(DECODERS))
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--source_len', type=int, default=32)
  p.add_argument('--vocab', type=int, default=1000)
  p.add_argument('--repeats', type=int, default=5)
  p.add_argument('--uncached_max', type=int, default=256)
  p.add_argument('--out', default=None)
  args = p.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(',')]
  lines = [
      f'Greedy decoding, tiny Transformer (2 layers, 128 hidden), batch {args.batch}, '
      f'source length {args.source_len}, {jax.default_backend()}, medians of '
      f'{args.repeats} interleaved runs (`python -m benchmarks.decoding_speed`).',
      '',
      '| decoder | max_len | cached ms | uncached ms | uncached / cached | cached / previous length |',
      '|---|---|---|---|---|---|',
  ]
  for name in args.decoders.split(','):
    previous = None
    for max_len in lengths:
      r = measure(
          name,
          max_len,
          batch=args.batch,
          source_len=args.source_len,
          vocab=args.vocab,
          repeats=args.repeats,
          uncached=max_len <= args.uncached_max,
      )
      c, u = r['cached_ms'], r['uncached_ms']
      speedup = '-' if u is None else f'{u / c:.1f}x'
      growth = '-' if previous is None else f'{c / previous:.2f}x'
      unc = '-' if u is None else f'{u:.1f}'
      lines.append(f'| {name} | {max_len} | {c:.1f} | {unc} | {speedup} | {growth} |')
      print(lines[-1], flush=True)
      previous = c
  text = '\n'.join(lines) + '\n'
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text)


if __name__ == '__main__':
  main()
