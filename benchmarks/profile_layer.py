r"""Profiles one layer's forward and backward pass at given shapes: a trace and XLA's numbers.

  python -m benchmarks.profile_layer --layer=context_pool --batch=8 --length=1024 --features=512
  python -m benchmarks.profile_layer --layer=lambda_layer --size=56 --features=64 \
      --kwargs="{'position': 'conv', 'scope_size': 23}"

``--layer`` is one of :data:`LAYERS` (the four mechanisms of this package):
``context_pool`` and ``area_attention`` take ``[batch, length, features]``,
``lambda_layer`` and ``augmented_conv`` take ``[batch, size, size, features]``.
``--kwargs`` sets the module's fields (a Python dict literal; the defaults
below fill in the rest). The program jits the gradient of ``sum(y ** 2)`` with
respect to the parameters and the input (forward + backward; BatchNorm in
training mode), compiles it, runs it once (warm-up), then runs ``--steps``
more inside a ``jax.profiler`` trace (each a ``StepTraceAnnotation`` named
after the layer), waiting for each before the next. It prints the parameter
count, the compiled program's ``cost_analysis()`` (FLOPs, bytes accessed) and
``memory_analysis()`` (temp, arguments, outputs, generated code), the median
step time, and where the trace is: ``<out>/plugins/profile/<time>/`` with
``<host>.xplane.pb`` (TensorBoard's Profile tab / XProf:
``tensorboard --logdir <out>``) and ``perfetto_trace.json.gz``
(https://ui.perfetto.dev). docs/training.md#profiling says what to look at.
"""

from __future__ import annotations

import ast
import pathlib
import statistics
import tempfile
import time
from typing import Any, Callable

from absl import app
from absl import flags
from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp

from contextpool_jax import layers
from contextpool_jax.models.common import count_params

# name -> (the module from its fields, the input's layout: 'sequence' or 'image').
LAYERS: dict[str, tuple[Callable[..., nn.Module], str]] = {
    'context_pool': (lambda f, **kw: layers.ContextPool(**kw), 'sequence'),
    'area_attention': (
        lambda f, **kw: layers.AreaAttention(**{'num_heads': 4, 'max_area_width': 3, **kw}),
        'sequence',
    ),
    'lambda_layer': (lambda f, **kw: layers.LambdaLayer(**kw), 'image'),
    'augmented_conv': (
        lambda f, **kw: layers.AugmentedConv2D(
            **{'features': f, 'num_heads': 4, 'key_ratio': 0.25, 'value_ratio': 0.25, **kw}
        ),
        'image',
    ),
}


def _define_flags() -> None:
  """The command line's flags, defined only when run as a program."""
  flags.DEFINE_enum('layer', 'context_pool', list(LAYERS), 'The layer to profile.')
  flags.DEFINE_integer('batch', 2, 'Batch size.', lower_bound=1)
  flags.DEFINE_integer('length', 512, 'Sequence length (context_pool, area_attention).')
  flags.DEFINE_integer('size', 32, 'Image height = width (lambda_layer, augmented_conv).')
  flags.DEFINE_integer('features', 64, 'Feature (channel) dimension of the input.')
  flags.DEFINE_string('kwargs', '{}', "The module's fields: a Python dict literal.")
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Input and compute dtype.')
  flags.DEFINE_integer('steps', 5, 'Traced steps (after one warm-up step).', lower_bound=1)
  flags.DEFINE_string(
      'out', None, 'Trace directory (default: a new directory under the system temp dir).'
  )


def input_shape(layer: str, batch: int, length: int, size: int, features: int) -> tuple:
  layout = LAYERS[layer][1]
  return (batch, length, features) if layout == 'sequence' else (batch, size, size, features)


def make_step(module: nn.Module, layer: str) -> Callable:
  """``(variables, x) -> (loss, (grad params, grad x))``: forward and backward."""

  def apply(variables, x):
    params, state = variables['params'], {k: v for k, v in variables.items() if k != 'params'}

    def loss(params, x):
      kwargs = {'train': True} if layer == 'lambda_layer' else {}
      y = module.apply({'params': params, **state}, x, mutable=list(state) or False, **kwargs)
      y = y[0] if state else y
      return jnp.sum(jnp.square(y.astype(jnp.float32)))

    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)

  return apply


def profile(
    layer: str,
    shape: tuple,
    *,
    kwargs: dict[str, Any] | None = None,
    dtype: Any = jnp.float32,
    steps: int = 5,
    out: str | pathlib.Path,
) -> dict[str, Any]:
  """Compiles, warms up and traces ``steps`` forward+backward steps of ``layer``."""
  kwargs = dict(kwargs or {})
  if dtype != jnp.float32:
    kwargs.setdefault('dtype', dtype)
  module = LAYERS[layer][0](shape[-1], **kwargs)
  x = jax.random.normal(jax.random.key(1), shape, dtype)
  variables = jax.jit(module.init)(jax.random.key(0), x)
  compiled = jax.jit(make_step(module, layer)).lower(variables, x).compile()
  jax.block_until_ready(compiled(variables, x))  # warm-up
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  times = []
  jax.profiler.start_trace(str(out), create_perfetto_trace=True)
  try:
    for i in range(steps):
      tick = time.perf_counter()
      with jax.profiler.StepTraceAnnotation(layer, step_num=i):
        jax.block_until_ready(compiled(variables, x))
      times.append(time.perf_counter() - tick)
  finally:
    jax.profiler.stop_trace()
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  mem = compiled.memory_analysis()
  memory = {
      k: getattr(mem, f'{k}_size_in_bytes', None)
      for k in ('temp', 'argument', 'output', 'alias', 'generated_code')
  }
  return {
      'layer': layer,
      'shape': tuple(shape),
      'params': count_params(variables['params']),
      'flops': float((cost or {}).get('flops', float('nan'))),
      'bytes_accessed': float((cost or {}).get('bytes accessed', float('nan'))),
      'memory': memory,
      'median_seconds': statistics.median(times),
      'trace_files': sorted(str(p) for p in out.glob('plugins/profile/*/*') if p.is_file()),
  }


def report(r: dict[str, Any]) -> str:
  mib = lambda b: 'n/a' if b is None else f'{b / 2**20:.2f} MiB'
  lines = [
      f'{r["layer"]}: forward + backward on input {r["shape"]}, backend {jax.default_backend()}',
      f'  parameters       {r["params"]:,}',
      f'  FLOPs            {r["flops"]:,.0f} (cost_analysis)',
      f'  bytes accessed   {mib(r["bytes_accessed"])} (cost_analysis)',
      '  memory_analysis  '
      + ', '.join(f'{k} {mib(v)}' for k, v in r['memory'].items() if k != 'alias'),
      f'  step time        {r["median_seconds"] * 1e3:.2f} ms (median of the traced steps)',
      '  trace            ' + ('\n                   '.join(r['trace_files']) or '(none)'),
  ]
  return '\n'.join(lines)


def main(argv):
  del argv
  f = flags.FLAGS
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # the profiler's INFO lines about its files
  kwargs = ast.literal_eval(f.kwargs)
  if not isinstance(kwargs, dict):
    raise app.UsageError(f'--kwargs={f.kwargs!r} is not a dict literal.')
  shape = input_shape(f.layer, f.batch, f.length, f.size, f.features)
  out = f.out or tempfile.mkdtemp(prefix=f'profile_{f.layer}_')
  result = profile(f.layer, shape, kwargs=kwargs, dtype=jnp.dtype(f.dtype), steps=f.steps, out=out)
  print(report(result))
  print(
      f'View: tensorboard --logdir {out} (Profile tab; pip install xprof), or open the '
      'perfetto_trace.json.gz at https://ui.perfetto.dev'
  )


if __name__ == '__main__':
  _define_flags()
  app.run(main)
