r"""How far the numbers move between the tested stacks (docs/install.md, "The tested stacks").

Two measurements, each run once on every stack (a virtualenv per stack) and then compared:

* **The layers.** Each layer at its default fields (:data:`CASES`), initialised from key 0 and
  applied to a fixed input, in float32; ``--save`` writes every output and the flattened
  parameters to an ``.npz``, ``--compare`` prints, per array, the largest absolute difference
  between two such files against the largest magnitude:

    .venv311/bin/python -m benchmarks.stacks --save /tmp/layers311.npz
    .venv312/bin/python -m benchmarks.stacks --save /tmp/layers312.npz
    python -m benchmarks.stacks --compare /tmp/layers311.npz,/tmp/layers312.npz

* **The default run on one corpus.** The default corpus is a pinned snapshot, the same bytes
  on every Python (docs/data.md), so ``train.py`` runs compare across stacks as they are. The
  runs in the results file predate the snapshot, when the default was the running Python's
  standard library: ``--stdlib`` trains with ``train.py``'s flags (after ``--``) on the given
  standard library's sources, to compare the stacks on those bytes:

    .venv312/bin/python -m benchmarks.stacks \
        --stdlib /root/.pyenv/versions/3.11.7/lib/python3.11 -- \
        --config configs/default.py --workdir /tmp/cp312_s1 --config.seed=1

Results: benchmarks/results/stacks.md.
"""

from __future__ import annotations

import sys
from typing import Mapping

import numpy as np

# name -> (layer constructor arguments, input shape); the layers' own defaults otherwise.
CASES = {
    'ContextPool': (('ContextPool', {}), (2, 64, 32)),
    'ContextPool, causal': (('ContextPool', {'causal': True}), (2, 64, 32)),
    'AreaAttention': (('AreaAttention', {'num_heads': 4, 'max_area_width': 3}), (2, 64, 32)),
    'LambdaLayer, global': (('LambdaLayer', {'out_features': 32}), (2, 12, 12, 32)),
    'LambdaLayer, conv': (
        ('LambdaLayer', {'out_features': 32, 'position': 'conv', 'scope_size': 5}),
        (2, 12, 12, 32),
    ),
    'AugmentedConv2D': (('AugmentedConv2D', {'features': 40, 'num_heads': 4}), (2, 12, 12, 32)),
}


def layer_outputs() -> dict[str, np.ndarray]:
  """``{case: output, case + ' params': every parameter, flattened}`` (float64 copies)."""
  import jax  # pylint: disable=g-import-not-at-top

  import contextpool_jax  # pylint: disable=g-import-not-at-top

  out = {}
  for i, (name, ((cls, fields), shape)) in enumerate(CASES.items()):
    layer = getattr(contextpool_jax, cls)(**fields)
    x = jax.random.normal(jax.random.key(i + 1), shape)
    variables = layer.init(jax.random.key(0), x)
    y, _ = layer.apply(variables, x, mutable=['batch_stats'])
    out[name] = np.asarray(y, np.float64)
    leaves = jax.tree.leaves(variables)
    out[name + ' params'] = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in leaves])
  return out


def compare(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> str:
  """A Markdown table: per array of both, the largest |a - b|, the largest |a|, their ratio."""
  if set(a) != set(b):
    raise ValueError(f'the two files hold different arrays: {sorted(set(a) ^ set(b))}')
  rows = ['| array | max abs difference | max abs value | ratio |', '| --- | ---: | ---: | ---: |']
  for name in a:
    if a[name].shape != b[name].shape:
      raise ValueError(f'{name}: shapes {a[name].shape} and {b[name].shape} differ')
    diff, scale = float(np.abs(a[name] - b[name]).max()), float(np.abs(a[name]).max())
    ratio = diff / scale if scale else 0.0
    rows.append(f'| {name} | {diff:.2e} | {scale:.2e} | {ratio:.1e} |')
  return '\n'.join(rows)


def train_on_stdlib(stdlib: str, argv: list[str]) -> None:
  """``train.py``'s command with ``argv``, its default corpus read from ``stdlib``."""
  from contextpool_jax.data import text_builders  # pylint: disable=g-import-not-at-top
  from contextpool_jax.commands import train  # pylint: disable=g-import-not-at-top

  text_builders.stdlib_source_dir = lambda: stdlib
  sys.argv = ['train.py', *argv]
  train.command()


def main(argv: list[str]) -> None:
  usage = 'usage: --save OUT.npz | --compare A.npz,B.npz | --stdlib DIR -- <train.py flags>'
  if len(argv) == 2 and argv[0] == '--save':
    np.savez(argv[1], **layer_outputs())
  elif len(argv) == 2 and argv[0] == '--compare':
    first, second = argv[1].split(',')
    print(compare(dict(np.load(first)), dict(np.load(second))))
  elif len(argv) >= 3 and argv[0] == '--stdlib' and argv[2] == '--':
    train_on_stdlib(argv[1], argv[3:])
  else:
    raise SystemExit(usage)


if __name__ == '__main__':
  main(sys.argv[1:])
