"""Compiled memory and FLOPs of lambda layers vs global self-attention.

Compiles (never runs) one forward + backward step -- the gradient of
``sum(y ** 2)`` with respect to all parameters, BatchNorm in training mode --
for each layer on the same ``[batch, size, size, channels]`` tokens and prints
a markdown table of XLA's ``memory_analysis().temp_size_in_bytes`` and
``cost_analysis()['flops']``.

Layers: LambdaLayer with global relative embeddings, lambda convolution
(scope 23), content-only, and ``flax.linen.MultiHeadDotProductAttention`` over
all ``size * size`` tokens (same number of heads, qkv/out features =
channels). Target (issue): global lambda temp memory at least 10x below MHA.

Usage: python -m benchmarks.lambda_memory [--batch 1] [--size 56] [--channels 64]
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks import harness
from contextpool_jax.layers.lambda_layer import LambdaLayer
from contextpool_jax.models.common import count_params


class GlobalMHA(nn.Module):
  """Multi-head self-attention over all grid positions (the baseline).

  ``__call__(x, train=False)``: ``[batch, height, width, channels]`` -> same
  shape; qkv and output features = channels.
  """

  heads: int
  dtype: Any = None

  @nn.compact
  def __call__(self, x, *, train=False):
    del train
    batch, height, width, channels = x.shape
    tokens = x.reshape(batch, height * width, channels)
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.heads, qkv_features=channels, out_features=channels, dtype=self.dtype
    )(tokens)
    return y.reshape(x.shape)


def compile_step(module: nn.Module, x: jax.ShapeDtypeStruct) -> dict[str, float]:
  """Lowers and compiles grad-of-loss for ``module`` on an abstract input."""
  variables = jax.eval_shape(module.init, jax.random.key(0), x)
  params = variables['params']
  state = {k: v for k, v in variables.items() if k != 'params'}

  def step(params, state, x):
    def loss(params):
      y, new_state = module.apply({'params': params, **state}, x, train=True, mutable=list(state))
      return jnp.sum(jnp.square(y.astype(jnp.float32))), new_state

    return jax.value_and_grad(loss, has_aux=True)(params)

  compiled = jax.jit(step).lower(params, state, x).compile()
  return {**harness.compiled_cost(compiled), 'params': float(count_params(params))}


def layers(channels: int, scope: int) -> dict[str, Callable[[], nn.Module]]:
  return {
      'LambdaLayer global': lambda: LambdaLayer(position='global'),
      f'LambdaLayer conv (scope {scope})': lambda: LambdaLayer(position='conv', scope_size=scope),
      'LambdaLayer content-only': lambda: LambdaLayer(position='none'),
      'global MHA (flax)': lambda: GlobalMHA(heads=4),
  }


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--size', type=int, default=56)
  parser.add_argument('--channels', type=int, default=64)
  parser.add_argument('--scope', type=int, default=23)
  args = parser.parse_args(argv)

  x = jax.ShapeDtypeStruct((args.batch, args.size, args.size, args.channels), jnp.float32)
  results = {
      name: compile_step(make(), x) for name, make in layers(args.channels, args.scope).items()
  }
  baseline = results['global MHA (flax)']['temp_bytes']
  print(
      f'Forward+backward, input {x.shape} float32, backend {jax.default_backend()}, '
      'defaults |k|=16 |h|=4 |u|=1\n'
  )
  print('| layer | params | temp memory (MiB) | MHA / layer memory | GFLOPs |')
  print('|---|---:|---:|---:|---:|')
  for name, r in results.items():
    print(
        f'| {name} | {int(r["params"]):,} | {r["temp_bytes"] / 2**20:.2f} | '
        f'{baseline / r["temp_bytes"]:.1f}x | {r["flops"] / 1e9:.2f} |'
    )
  ratio = baseline / results['LambdaLayer global']['temp_bytes']
  verdict = 'holds' if ratio >= 10 else 'does NOT hold'
  print(f'\nTarget (global lambda temp memory >= 10x below global MHA): {verdict} ({ratio:.1f}x).')


if __name__ == '__main__':
  main()
