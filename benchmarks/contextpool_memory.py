"""Compiled memory and FLOPs of ContextPool: 'dense' vs 'blockwise'.

Compiles (never runs) one forward + backward step -- the gradient of
``sum(y ** 2)`` with respect to the parameters and the input -- of
``ContextPool(causal=True)`` (cnn mapping, learned weights, Gaussian locality)
on ``[batch, n, features]`` float32 tokens, for both implementations, and
prints a markdown table of XLA's ``memory_analysis().temp_size_in_bytes`` and
``cost_analysis()['flops']``. Then compiles (never runs) a full training step
(forward, backward, AdamW update) of the 12-layer ``cp_transformer_lm``
(``remat='full'``, batch 1, n = 8192: enwik8's last stage) and prints its
compiled memory, to show that it fits in 24 GB.

Target (issue): at n = 8192, blockwise temp memory at least 8x below dense.

FLOPs: XLA's cost analysis counts the body of a while loop once, not once per
iteration, so for 'blockwise' its number is far too small; the table therefore
also gives the pooling's own FLOPs counted analytically (see
:func:`pool_flops`).

Usage: python -m benchmarks.contextpool_memory [--lengths 1024,2048,4096,8192]
  [--batch 1] [--features 512] [--block-size 512] [--no-lm] [--lm-length 8192]
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import optax

from benchmarks import harness
from contextpool_jax import models
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.training import objectives

GiB = 2.0**30
MiB = 2.0**20


def compile_pool_step(
    length: int,
    implementation: str,
    *,
    batch: int = 1,
    features: int = 512,
    block_size: int = 512,
    causal: bool = True,
) -> dict[str, float]:
  """Lowers and compiles forward + backward of ContextPool on an abstract input."""
  module = ContextPool(causal=causal, implementation=implementation, block_size=block_size)
  x = jax.ShapeDtypeStruct((batch, length, features), jnp.float32)
  params = jax.eval_shape(module.init, jax.random.key(0), x)['params']

  def step(params, x):
    def loss(params, x):
      y = module.apply({'params': params}, x)
      return jnp.sum(jnp.square(y))

    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)

  return harness.compiled_cost(jax.jit(step).lower(params, x).compile())


def pool_flops(
    length: int, features: int, implementation: str, *, causal: bool = True, block_size: int = 512
) -> float:
  """Multiply-add FLOPs (x2) of the pooling's matrix products, forward + backward.

  Both implementations do three ``[n, n] x [n, d]`` products: ``p @ x``
  forward, ``p^T dy`` and ``dy x^T`` backward (blockwise recomputes the
  logits in the backward pass, elementwise, not a product). Dense does them
  over the full matrix; blockwise only over the visited blocks (causal: the
  blocks on or below the diagonal). Elementwise work is not counted.
  """
  pairs = float(length) ** 2
  if implementation == 'blockwise' and causal:
    blocks = -(-length // min(block_size, length))
    pairs *= (blocks * (blocks + 1) / 2) / blocks**2
  return 3 * 2 * pairs * features


def compile_lm_train_step(
    length: int,
    *,
    batch: int = 1,
    name: str = 'cp_transformer_lm',
    context_pool: Any = None,
    scan_layers: bool = False,
) -> dict[str, Any]:
  """Compiles (never runs) one AdamW train step of the 12-layer LM ``name``
  (remat) with :mod:`benchmarks.harness`; returns its row (``params``,
  ``temp_mib``, ``total_mib`` = planned peak, ``compile_s``, ...).

  ``context_pool``: None keeps the registry's ContextPool fields (``{}``:
  implementation 'auto'), else overrides them.
  """
  overrides = {} if context_pool is None else {'context_pool': context_pool}
  model = models.create(name, remat='full', scan_layers=scan_layers, **overrides)

  def make_batch(key):  # the model reads `length` tokens and predicts the next of each
    return {
        'tokens': jax.random.randint(key, (batch, length + 1), 0, 256),
        'weights': jnp.ones((batch, length), jnp.float32),
    }

  workload = harness.Workload(
      module=model,
      objective=objectives.LanguageModelling(),
      make_batch=make_batch,
      optimizer=(optax.adamw(1e-3, weight_decay=0.01), optax.constant_schedule(1e-3)),
  )
  return harness.measure(name, lambda: workload, timing=False)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--lengths', default='1024,2048,4096,8192')
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--features', type=int, default=512)
  parser.add_argument('--block-size', type=int, default=512)
  parser.add_argument('--lm-length', type=int, default=8192)
  parser.add_argument('--no-lm', action='store_true', help='skip the 12-layer LM steps')
  parser.add_argument(
      '--skip-unrolled', action='store_true', help='only the scan_layers=True LM steps'
  )
  args = parser.parse_args(argv)
  lengths = [int(n) for n in args.lengths.split(',')]

  print(
      f'ContextPool(causal=True) forward+backward (grad of sum(y^2) wrt params and x), '
      f'batch {args.batch}, {args.features} features, float32, block_size '
      f'{args.block_size}, backend {jax.default_backend()}; compiled, never run.\n'
  )
  print(
      '| n | dense temp (MiB) | blockwise temp (MiB) | dense / blockwise | '
      'XLA GFLOPs dense | XLA GFLOPs blockwise* | pooling GFLOPs dense | '
      'pooling GFLOPs blockwise |'
  )
  print('|---:|---:|---:|---:|---:|---:|---:|---:|')
  ratio = {}
  for n in lengths:
    r = {
        impl: compile_pool_step(
            n, impl, batch=args.batch, features=args.features, block_size=args.block_size
        )
        for impl in ('dense', 'blockwise')
    }
    ratio[n] = r['dense']['temp_bytes'] / r['blockwise']['temp_bytes']
    flops = {
        impl: pool_flops(n, args.features, impl, block_size=args.block_size) * args.batch
        for impl in r
    }
    print(
        f'| {n} | {r["dense"]["temp_bytes"] / MiB:.1f} | '
        f'{r["blockwise"]["temp_bytes"] / MiB:.1f} | {ratio[n]:.1f}x | '
        f'{r["dense"]["flops"] / 1e9:.1f} | {r["blockwise"]["flops"] / 1e9:.1f} | '
        f'{flops["dense"] / 1e9:.1f} | {flops["blockwise"] / 1e9:.1f} |',
        flush=True,
    )
  print(
      '\n*XLA counts a while loop body once, so this undercounts blockwise; the '
      "'pooling GFLOPs' columns count the three [n, n] x [n, d] products analytically."
  )
  if 8192 in ratio:
    verdict = 'holds' if ratio[8192] >= 8 else 'does NOT hold'
    print(
        f'\nTarget (n = 8192: blockwise temp memory >= 8x below dense): {verdict} '
        f'({ratio[8192]:.1f}x).'
    )

  if args.no_lm:
    return
  print(
      f'\n12-layer LM AdamW train step (models.create(..., remat="full")), batch '
      f'{args.batch}, n = {args.lm_length}; compiled, never run. Peak = temp + arguments + '
      'outputs - aliased (donated) buffers.\n'
  )
  print(
      '| model | layers | ContextPool | params | temp (GiB) | peak (GiB) | fits 24 GB | '
      'compile (s) |'
  )
  print('|---|---|---|---:|---:|---:|---|---:|')
  rows = [
      ('cp_transformer_lm', True, None, "'auto' (= blockwise)"),
      ('cp_transformer_lm', True, {'implementation': 'dense'}, "'dense'"),
      ('transformer_lm', True, None, 'none (baseline)'),
      ('cp_transformer_lm', False, None, "'auto' (= blockwise)"),
      ('transformer_lm', False, None, 'none (baseline)'),
  ]
  if args.skip_unrolled:
    rows = [r for r in rows if r[1]]
  for name, scan, cp, label in rows:
    s = compile_lm_train_step(
        args.lm_length, batch=args.batch, name=name, context_pool=cp, scan_layers=scan
    )
    peak = s['total_mib'] * MiB
    print(
        f'| {name} | {"nn.scan" if scan else "unrolled"} | {label} | '
        f'{int(s["params"]):,} | {s["temp_mib"] * MiB / GiB:.2f} | {peak / GiB:.2f} | '
        f'{"yes" if peak < 24 * GiB else "NO"} | {s["compile_s"]:.0f} |',
        flush=True,
    )
  print(
      '\nUnrolled layers (scan_layers=False): on the CPU backend XLA does not keep '
      "jax.checkpoint's recomputation next to its use, so every layer's [heads, n, n] "
      'attention lives at once and temp memory grows with depth, with or without '
      'ContextPool (the baseline row). With scan_layers=True the remat layers run one '
      'at a time.'
  )


if __name__ == '__main__':
  main()
