"""Gaussian block skipping in ContextPool's blockwise path: time, memory, blocks skipped.

Pools ``[1, n, 256]`` float32 tokens causally (the default LM's width) with the
learned pooling sizes and weights of a trained default LM, with today's
blockwise pooling (``gaussian_skip_nats=None``: every key block on or below the
diagonal) and with Gaussian block skipping (the default margin, 18 nats), and
writes a markdown table: forward + backward time of each (the gradient with
respect to sigma, the log weights a_j and the features), timed side by side in
one process (interleaved, median of the repeats, and the median of the paired
ratios), XLA's compiled temp memory of the forward + backward, and the share of
the (query block, key block) pairs the skipping leaves out of the forward pass.

Pooling sizes: the trained model's sown ``pool_sigma`` and ``pool_weights`` of
each ContextPool layer on ``windows`` windows of 256 bytes of text (CPython's
``inspect.py``, as the offline corpus: stdlib sources). Sigma is ``r n_i s_i``
(causal: ``n_i = i + 1``), so the normalised sizes ``s_i = sigma_i / (r (i +
1))`` are what the model learned; at length n they are the windows' ``s`` and
``a`` laid end to end (cycled), and ``sigma_i = r (i + 1) s_i`` -- sigma scales
with n as ``r n s`` says.

  python train.py --config configs/default.py --workdir /tmp/cp     # or an existing workdir
  python -m benchmarks.gaussian_skip --workdir /tmp/cp [--lengths 2048,8192,32768]
      [--repeats 5] [--block_size 512] [--out benchmarks/results/gaussian_skip_cpu.md]

Lengths of ``--forward_only_from`` (32768) and more are timed forward only and
with one repeat (a CPU backward at that length takes minutes).
"""

from __future__ import annotations

import inspect as _inspect_module
import pathlib
import statistics
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from contextpool_jax.tools import viz
from contextpool_jax.inference import sampling
from contextpool_jax.layers import context_pool as cp
from contextpool_jax.runs.workdirs import load as load_workdir

_WORKDIR = flags.DEFINE_string(
    'workdir', None, 'A trained default LM (train.py --config configs/default.py).'
)
_LENGTHS = flags.DEFINE_list('lengths', ['2048', '8192', '32768'], 'Sequence lengths n.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed repeats per length (after one warm-up).')
_BLOCK = flags.DEFINE_integer('block_size', 512, "ContextPool.block_size of today's blockwise.")
_SKIP_BLOCK = flags.DEFINE_integer(
    'skip_block_size', None, 'ContextPool.block_size with skipping (None: --block_size).'
)
_FEATURES = flags.DEFINE_integer('features', 256, 'Token width (the default LM: 256).')
_WINDOWS = flags.DEFINE_integer('windows', 16, 'Text windows of 256 bytes the sizes come from.')
_FORWARD_ONLY = flags.DEFINE_integer(
    'forward_only_from', 32768, 'From this length on: forward only, one repeat.'
)
_NEEDED = flags.DEFINE_bool(
    'needed', False, 'Print the least work of exact skipping (needed_share) and stop.'
)
_OUT = flags.DEFINE_string(
    'out',
    str(pathlib.Path(__file__).resolve().parent / 'results' / 'gaussian_skip_cpu.md'),
    'Markdown output.',
)


def learned_sizes(workdir: str, windows: int) -> tuple[dict[str, dict[str, np.ndarray]], float]:
  """``({layer: {'s': [windows * 256], 'a': [windows * 256]}}, r)``: the normalised
  sizes ``s_i = sigma_i / (r (i + 1))`` and log weights ``a_j = log w_j`` (up to a
  per-window constant, which cancels in Eq. 4) of each ContextPool layer."""
  model, variables, config = load_workdir(workdir)
  context = config.dataset.seq_len
  pool = dict(config.model.context_pool or {})
  ratio = pool.get('ratio') or cp.DEFAULT_RATIO[1]
  if not sampling.is_language_model(model):
    raise ValueError('benchmarks.gaussian_skip needs a causal LM workdir (configs/default.py).')
  text = _inspect_module.getsource(_inspect_module)
  out: dict[str, dict[str, list[np.ndarray]]] = {}
  for w in range(windows):
    _, pools = viz.lm_pools(model, variables, text[w * context :], context=context)
    for layer, arrays in pools.items():
      sigma = np.asarray(arrays['pool_sigma'][0], np.float64)
      s = sigma / (ratio * np.arange(1, sigma.size + 1))
      a = np.log(np.maximum(np.asarray(arrays['pool_weights'][0], np.float64), 1e-30))
      out.setdefault(layer, {'s': [], 'a': []})
      out[layer]['s'].append(s)
      out[layer]['a'].append(a)
  return {k: {n: np.concatenate(v) for n, v in d.items()} for k, d in out.items()}, ratio


def pool_inputs(sizes: dict[str, np.ndarray], ratio: float, n: int, features: int) -> cp.PoolInputs:
  """Causal pooling inputs of length n, batch 1: the learned s and a cycled to n."""
  s = np.resize(sizes['s'], n)
  a = np.resize(sizes['a'], n)
  sigma = ratio * np.arange(1, n + 1) * s
  valid = jnp.ones((1, n), bool)
  x = jax.random.normal(jax.random.key(0), (1, n, features), jnp.float32)
  centres = cp.Centres(index=np.arange(n), valid=valid, sigma=jnp.asarray(sigma[None], jnp.float32))
  context = cp.Context(
      index=jnp.arange(n), valid=valid, x=x, log_w=jnp.asarray(a[None], jnp.float32)
  )
  return cp.PoolInputs(centres, context)


def programs(rule, block_size, inputs, skip_nats, backward: bool):
  """The compiled forward (+ backward) of one pooling and its arguments."""
  probe = jax.random.normal(jax.random.key(1), inputs.context.x.shape, jnp.float32)

  def forward(sigma, log_w, x):
    c = inputs.centres._replace(sigma=sigma)
    k = inputs.context._replace(log_w=log_w, x=x)
    return cp.pool_blockwise(rule, block_size, cp.PoolInputs(c, k), skip_nats)

  def loss(sigma, log_w, x):
    return jnp.sum(forward(sigma, log_w, x) * probe)

  fn = jax.grad(loss, (0, 1, 2)) if backward else forward
  args = (inputs.centres.sigma, inputs.context.log_w, inputs.context.x)
  compiled = jax.jit(fn).lower(*args).compile()
  return compiled, args


def _time(compiled, args) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return time.perf_counter() - t0


def measure(
    rule, block_size, skip_block_size, inputs, backward: bool, repeats: int
) -> dict[str, float]:
  """Today's blockwise vs skipping, interleaved (alternating which goes first)."""
  base, args = programs(rule, block_size, inputs, None, backward)
  skip, _ = programs(rule, skip_block_size, inputs, cp.GAUSSIAN_SKIP_NATS, backward)
  _time(base, args), _time(skip, args)  # warm-up
  tb, ts = [], []
  for r in range(repeats):
    if r % 2:
      ts.append(_time(skip, args))
      tb.append(_time(base, args))
    else:
      tb.append(_time(base, args))
      ts.append(_time(skip, args))
  visited, planned = cp.blockwise_visits(rule, skip_block_size, inputs, cp.GAUSSIAN_SKIP_NATS)
  return dict(
      base_ms=1e3 * statistics.median(tb),
      skip_ms=1e3 * statistics.median(ts),
      speedup=statistics.median(b / s for b, s in zip(tb, ts)),
      base_mib=harness.compiled_cost(base)['temp_bytes'] / 2**20,
      skip_mib=harness.compiled_cost(skip)['temp_bytes'] / 2**20,
      skipped=1.0 - int(visited) / planned,
      planned=planned,
  )


def needed_share(
    sizes: dict[str, np.ndarray],
    ratio: float,
    n: int,
    nats: float,
    blocks: tuple[int, ...],
    sort_block: int = 512,
) -> dict[Any, float]:
  """The least work any exact skipping at ``nats`` must do, from the learned sizes
  at length n: ``{granularity: share}`` of the causal pairs (i, j <= i) lying in a
  (row block of ``g`` centres, key block of ``g`` inputs) tile holding at least
  one pair whose logit ``a_j - (i - j)^2 / (2 sigma_i^2)`` is within ``nats`` of
  its row's maximum (granularity 1: the pairs themselves). A tile with no such
  pair is what :func:`_skip_block`'s bound could at best leave out; one with
  one must be computed. ``('sorted', g)``: the same with each block of
  ``sort_block`` centres sorted by sigma before it is cut into row groups of
  g (narrow centres together), whole g x g tiles counted. Exact (float64
  numpy, row by row)."""
  s = np.resize(sizes['s'], n)
  a = np.resize(sizes['a'], n)
  sigma = ratio * np.arange(1, n + 1) * s
  need = np.zeros((n, n), bool)
  for i in range(n):
    j = np.arange(i + 1)
    logits = a[: i + 1] - np.square(i - j) / (2.0 * np.square(max(sigma[i], 1e-6)))
    need[i, : i + 1] = logits >= logits.max() - nats
  causal = n * (n + 1) / 2
  out = {1: float(need.sum()) / causal}
  for g in blocks:
    tiles = need.reshape(n // g, g, n // g, g).any(axis=(1, 3))
    rows, cols = np.indices(tiles.shape)
    # Pairs each needed tile holds on or below the diagonal.
    per_tile = np.where(rows > cols, g * g, np.where(rows == cols, g * (g + 1) / 2, 0))
    out[g] = float((tiles * per_tile).sum()) / causal
    # Row groups: each block of ``sort_block`` centres sorted by sigma, then g
    # sorted centres x g inputs per tile (whole tiles counted).
    work = 0
    for b0 in range(0, n, sort_block):
      order = b0 + np.argsort(sigma[b0 : b0 + sort_block], kind='stable')
      for g0 in range(0, len(order), g):
        rows_g = order[g0 : g0 + g]
        work += need[rows_g].reshape(len(rows_g), n // g, g).any(axis=(0, 2)).sum() * g * g
    out[('sorted', g)] = work / causal
  return out


def main(argv):
  del argv
  if not _WORKDIR.value:
    raise app.UsageError(
        '--workdir: a trained default LM (python train.py --config configs/default.py).'
    )
  layers, ratio = learned_sizes(_WORKDIR.value, _WINDOWS.value)
  if _NEEDED.value:
    blocks = (64, 128, 256, 512)
    lines = [
        f'# Least work of exact Gaussian skipping at {cp.GAUSSIAN_SKIP_NATS:g} nats '
        f'(`python -m benchmarks.gaussian_skip --workdir <default LM> --needed`)',
        '',
        'Share of the causal pairs in tiles (g centres x g inputs) holding a pair within '
        f'{cp.GAUSSIAN_SKIP_NATS:g} nats of its row maximum (pairs: g = 1; sorted rows: each '
        '512-centre block sorted by sigma first); 1 / share bounds the speed-up of any exact '
        'skipping at that granularity over the causal blockwise pass.',
        '',
        '| layer | n | pairs | '
        + ' | '.join(f'g = {g}' for g in blocks)
        + ' | '
        + ' | '.join(f'sorted rows, g = {g}' for g in blocks)
        + ' |',
        '|---|---:|---:|' + '---:|' * (2 * len(blocks)),
    ]
    for layer, sizes in layers.items():
      for n in map(int, _LENGTHS.value):
        if n > 8192:
          continue  # an n x n bool matrix
        share = needed_share(sizes, ratio, n, cp.GAUSSIAN_SKIP_NATS, blocks)
        keys = (1,) + blocks + tuple(('sorted', g) for g in blocks)
        cells = ' | '.join(f'{100 * share[k]:.1f}%' for k in keys)
        lines.append(f'| {layer} | {n} | {cells} |')
        print(lines[-1], flush=True)
    print('\n'.join(lines))
    return
  skip_block = _SKIP_BLOCK.value or _BLOCK.value
  rule = cp.ContextPool(causal=True).pool_rule((0,), dropout=False)
  lines = [
      '# Gaussian block skipping: ContextPool blockwise, causal, batch 1, '
      f'{_FEATURES.value} features, block {_BLOCK.value} (skip: {skip_block}), CPU',
      '',
      f'`python -m benchmarks.gaussian_skip --workdir <default LM> --lengths {",".join(_LENGTHS.value)} '
      f'--repeats {_REPEATS.value} --block_size {_BLOCK.value} --skip_block_size {skip_block}`; sizes from `{_WORKDIR.value}` '
      f'({_WINDOWS.value} windows of 256 bytes of inspect.py). Today: `gaussian_skip_nats=None`; '
      f'skip: the default {cp.GAUSSIAN_SKIP_NATS:g} nats. Times: medians of interleaved repeats; '
      'speed-up: median of the paired ratios; memory: compiled temp.',
      '',
      '| layer | s mean / median / max | n | pass | repeats | today (ms) | skip (ms) | speed-up | '
      'today temp (MiB) | skip temp (MiB) | key blocks skipped (forward) |',
      '|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for layer, sizes in layers.items():
    s = sizes['s']
    stats = f'{s.mean():.3f} / {np.median(s):.3f} / {s.max():.3f}'
    for n in map(int, _LENGTHS.value):
      backward = n < _FORWARD_ONLY.value
      repeats = _REPEATS.value if backward else 1
      r = measure(
          rule._replace(spatial=(n,)),
          _BLOCK.value,
          skip_block,
          pool_inputs(sizes, ratio, n, _FEATURES.value),
          backward,
          repeats,
      )
      line = (
          f'| {layer} | {stats} | {n} | {"fwd+bwd" if backward else "fwd"} | {repeats} | '
          f'{r["base_ms"]:.0f} | {r["skip_ms"]:.0f} | {r["speedup"]:.2f}x | {r["base_mib"]:.1f} | '
          f'{r["skip_mib"]:.1f} | {100 * r["skipped"]:.1f}% of {r["planned"]} |'
      )
      print(line, flush=True)
      lines.append(line)
  pathlib.Path(_OUT.value).write_text('\n'.join(lines) + '\n')
  print('wrote', _OUT.value)


if __name__ == '__main__':
  app.run(main)
