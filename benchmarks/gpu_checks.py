r"""The checks to run when a session is lent a GPU: ``python -m benchmarks.gpu_checks --out DIR``.

One script, minutes on an H100, that needs only what a GPU image with JAX has (jax, flax,
optax, numpy) plus ``ml_collections`` (the configs): the models are built from the
package's configs (``runs.config_fields.build_model``) and trained by a plain next-byte
step here, not by the trainer (whose input pipeline needs TFDS and grain).

* **cuDNN attention**: the character LM (2 layers, width 256, bfloat16, 1,024 bytes) with
  ``attention_implementation='cudnn'`` against ``'xla'``: logits and gradients, the
  largest difference relative to the largest value.
* **Step time and memory**: the CP-Transformer(12) of ``configs/enwik8.py`` and its
  baseline at 2,048 bytes, with XLA's and with cuDNN's attention: the compiled train
  step's FLOPs (the GPU compiler's own count), its memory (``memory_analysis()``), and
  the median of timed steps, against ``contextpool-compile``'s step-time floor.
* **The compile command's GPU figures against the GPU's**: each step's peak memory
  compiled for the real GPU and for the abstract one ``contextpool-compile --topology
  h100`` builds (``training/aot.py``), in the same process.

Writes ``<out>/gpu_checks.json`` and prints a table. ``--small`` runs every check at toy
sizes (on the CPU too, with XLA's attention only: how ``tests/benchmarks`` runs it).

On a lent GPU (the ``device`` tool; its image has jax, flax and optax but not
ml_collections): download the wheel here into an ignored folder (``pip download --no-deps
--only-binary=:all: -d .whl ml_collections``), carry ``.whl`` and run
``python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export
PYTHONPATH=/tmp/site:. && PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_checks --out $OUT``.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
import sys
import time
from typing import Any

from absl import app
from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The shapes of the checks: the paper's (:data:`FULL`) or toy ones (:data:`SMALL`)."""

  lm_layers: int  # the step-time model's depth (the paper's 12)
  lm_width: int
  lm_heads: int
  seq_len: int  # bytes of context in the step-time check
  batch: int
  attention_len: int  # the cuDNN check's
  timed_steps: int


FULL = Sizes(12, 512, 8, 2048, 8, 1024, 20)
SMALL = Sizes(2, 32, 2, 64, 2, 32, 3)


def lm_config(baseline: bool, sizes: Sizes, attention: str):
  """``configs/enwik8.py``'s model section (stage 1) at ``sizes``, its attention ``attention``."""
  from configs import enwik8  # pylint: disable=g-import-not-at-top

  config = enwik8.get_config('stage1,baseline' if baseline else 'stage1')
  with config.unlocked():
    config.model.update(
        num_layers=sizes.lm_layers,
        emb_dim=sizes.lm_width,
        mlp_dim=4 * sizes.lm_width,
        num_heads=sizes.lm_heads,
        attention_implementation=attention,
        scan_layers=False,
    )
  return config


def train_step(model, tx):
  """A next-byte cross-entropy step with ``tx`` (jit it): ``(params, opt_state, tokens,
  rng) -> (params, opt_state, loss)``."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  def loss_fn(params, tokens, rng):
    logits = model.apply({'params': params}, tokens[:, :-1], train=True, rngs={'dropout': rng})
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  def step(params, opt_state, tokens, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def cudnn_agreement(sizes: Sizes) -> dict[str, Any]:
  """The LM's logits and parameter gradients with cuDNN's attention against XLA's."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from contextpool_jax.runs import config_fields  # pylint: disable=g-import-not-at-top

  small = dataclasses.replace(sizes, lm_layers=2, lm_width=max(sizes.lm_width // 2, 32))
  tokens = jax.random.randint(jax.random.key(0), (2, sizes.attention_len), 0, 256)
  out = {}
  for attention in ('xla', 'cudnn'):
    model = config_fields.build_model(lm_config(False, small, attention))
    params = model.init(jax.random.key(1), tokens)['params']
    logits_fn = lambda p, m=model: m.apply({'params': p}, tokens).astype(jnp.float32)
    loss = lambda p, f=logits_fn: jax.nn.logsumexp(f(p), axis=-1).mean()
    out[attention] = (jax.jit(logits_fn)(params), jax.jit(jax.grad(loss))(params))
  (xla_logits, xla_grads), (cudnn_logits, cudnn_grads) = out['xla'], out['cudnn']
  relative = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(a)), 1e-30))
  grads = jax.tree.leaves(jax.tree.map(relative, xla_grads, cudnn_grads))
  return dict(
      logits_max_relative_difference=relative(xla_logits, cudnn_logits),
      grads_max_relative_difference=max(grads),
      dtype=str(xla_logits.dtype),
  )


def step_cost(baseline: bool, attention: str, sizes: Sizes) -> dict[str, Any]:
  """The train step compiled for this machine's first device: FLOPs, memory, timed steps;
  and (on a GPU) the same step compiled for ``contextpool-compile``'s abstract H100."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from contextpool_jax.runs import config_fields  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  model = config_fields.build_model(lm_config(baseline, sizes, attention))
  tokens = jax.random.randint(jax.random.key(0), (sizes.batch, sizes.seq_len + 1), 0, 256)
  params = jax.jit(model.init)(jax.random.key(1), tokens[:, :-1])['params']
  tx = optax.adamw(1e-4)
  opt_state = tx.init(params)
  step = jax.jit(train_step(model, tx), donate_argnums=(0, 1))
  args = (params, opt_state, tokens, jax.random.key(2))
  lowered = step.lower(*args)
  compiled = lowered.compile()
  cost = aot.step_cost('train step', compiled)
  times = []
  params, opt_state, loss = compiled(*args)
  jax.block_until_ready(loss)
  for i in range(sizes.timed_steps):
    started = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, tokens, jax.random.key(3 + i))
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - started)
  device = jax.devices()[0]
  row = dict(
      model='baseline' if baseline else 'contextpool',
      attention=attention,
      device=device.device_kind,
      gflops=cost.flops / 1e9,
      peak_gib=cost.peak_bytes / 2**30,
      step_ms=1e3 * statistics.median(times),
      loss=float(loss),
  )
  if device.platform == 'gpu':
    # The abstract H100 of `contextpool-compile --topology h100`, the same lowered program.
    abstract = aot.devices(aot.parse_topology('h100'))[0]
    sharding = jax.sharding.SingleDeviceSharding(abstract)
    shaped = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
    row['compile_command_peak_gib'] = (
        aot.step_cost('train step', step.lower(*shaped).compile()).peak_bytes / 2**30
    )
    chip = aot.CHIPS['h100']
    row['bound_ms'] = 1e3 * cost.flops / chip.peak_flops
  return row


def run(sizes: Sizes, attentions: tuple[str, ...]) -> dict[str, Any]:
  import jax  # pylint: disable=g-import-not-at-top

  results: dict[str, Any] = dict(
      devices=[d.device_kind for d in jax.devices()],
      jax=jax.__version__,
      sizes=dataclasses.asdict(sizes),
  )
  if 'cudnn' in attentions:
    results['cudnn_attention'] = cudnn_agreement(sizes)
  results['steps'] = [
      step_cost(baseline, attention, sizes)
      for attention in attentions
      for baseline in (True, False)
  ]
  return results


def table(results: dict[str, Any]) -> str:
  lines = [
      f"{', '.join(results['devices'])}; jax {results['jax']}; {results['sizes']}",
      '',
      '| model | attention | GFLOPs | peak (GiB) | compile command peak (GiB) | step (ms) | bound (ms) |',
      '| --- | --- | ---: | ---: | ---: | ---: | ---: |',
  ]
  for r in results['steps']:
    command = r.get('compile_command_peak_gib')
    bound = r.get('bound_ms')
    lines.append(
        f"| {r['model']} | {r['attention']} | {r['gflops']:,.1f} | {r['peak_gib']:.2f} |"
        f" {'-' if command is None else f'{command:.2f}'} | {r['step_ms']:.2f} |"
        f" {'-' if bound is None else f'{bound:.2f}'} |"
    )
  if 'cudnn_attention' in results:
    lines += ['', f"cuDNN against XLA attention: {results['cudnn_attention']}"]
  return '\n'.join(lines)


FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  import jax  # pylint: disable=g-import-not-at-top

  sizes = SMALL if FLAGS.small else FULL
  gpu = jax.devices()[0].platform == 'gpu'
  results = run(sizes, ('xla', 'cudnn') if gpu else ('xla',))
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'gpu_checks.json').write_text(json.dumps(results, indent=1))
  print(table(results))


def define_flags() -> None:
  flags.DEFINE_string('out', '.', 'Where gpu_checks.json goes.')
  flags.DEFINE_bool('small', False, 'Toy sizes (any device).')


if __name__ == '__main__':
  define_flags()
  app.run(main)
