r"""Measured ablation of ContextPool's open choices on the offline default LM.

Trains ``configs/default.py`` (a 2-layer character LM on the Python standard
library's sources) once per variant, side by side in one process, and reports
validation bits per character. This is how the defaults of A1 (``size_norm``)
and A3 (``residual``) were chosen; see docs/context_pool.md, "Choices the paper
leaves open".

  python -m benchmarks.ablation_default --workdir /tmp/ablation [--steps 500] [--seeds 0,1]

Writes ``<workdir>/ablation.md`` and ``ablation.csv``.
"""

from __future__ import annotations

import csv
import pathlib
import sys

from absl import app
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string('workdir', '/tmp/contextpool_ablation', 'Output directory.')
_STEPS = flags.DEFINE_integer('steps', 500, 'Training steps per run.')
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds (one run per seed and variant).')
_VARIANTS = flags.DEFINE_list(
    'variants',
    [
        'baseline',
        'softmax',
        'sigmoid',
        'softmax_residual',
        'sigmoid_residual',
        'softmax_attention_input',
        'sigmoid_attention_input',
        'sigmoid_residual_attention_input',
    ],
    'Variants to run.',
)

# variant: (ContextPool overrides or None for no ContextPool, model overrides).
# Every field studied is set explicitly, so results do not depend on defaults.
_OUTPUT = dict(context_pool_position='output')
VARIANTS = {
    'baseline': (None, {}),
    'softmax': (dict(size_norm='softmax', residual=False), _OUTPUT),
    'sigmoid': (dict(size_norm='sigmoid', residual=False), _OUTPUT),
    'softmax_residual': (dict(size_norm='softmax', residual=True), _OUTPUT),
    'sigmoid_residual': (dict(size_norm='sigmoid', residual=True), _OUTPUT),
    'softmax_attention_input': (
        dict(size_norm='softmax', residual=False),
        dict(context_pool_position='attention_input'),
    ),
    'sigmoid_attention_input': (
        dict(size_norm='sigmoid', residual=False),
        dict(context_pool_position='attention_input'),
    ),
    'sigmoid_residual_attention_input': (
        dict(size_norm='sigmoid', residual=True),
        dict(context_pool_position='attention_input'),
    ),
}


def make_config(variant: str, seed: int, steps: int):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
  from configs import default  # pylint: disable=g-import-not-at-top

  pool, model = VARIANTS[variant]
  c = default.get_config('baseline' if pool is None else '')
  if pool is not None:
    c.model.context_pool.update(pool)
  with c.unlocked():
    c.model.update(model)
  c.seed = seed
  c.num_train_steps = steps
  c.eval_every_steps = steps
  c.checkpoint_every_steps = steps
  c.progress_bar = False
  return c


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top

  out = pathlib.Path(_WORKDIR.value)
  out.mkdir(parents=True, exist_ok=True)
  rows = []
  for seed in map(int, _SEEDS.value):
    for variant in _VARIANTS.value:
      config = make_config(variant, seed, _STEPS.value)
      result = trainer.train_and_evaluate(config, str(out / f'{variant}_seed{seed}'))
      ev = result['eval_validation']
      train_loss = result['train_history'][-1]['loss']
      rows.append(
          dict(
              variant=variant,
              seed=seed,
              val_bpc=ev['bpc'],
              val_accuracy=ev['accuracy'],
              train_loss=train_loss,
          )
      )
      print(f'{variant:18s} seed {seed}: validation BPC {ev["bpc"]:.4f}', flush=True)
  with open(out / 'ablation.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  lines = ['| variant | seeds | validation BPC (mean) | per seed |', '| --- | --- | --- | --- |']
  for variant in _VARIANTS.value:
    vals = [r['val_bpc'] for r in rows if r['variant'] == variant]
    lines.append(
        f'| {variant} | {len(vals)} | {sum(vals) / len(vals):.4f} | '
        + ', '.join(f'{x:.4f}' for x in vals)
        + ' |'
    )
  table = '\n'.join(lines)
  (out / 'ablation.md').write_text(table + '\n')
  print(table)


if __name__ == '__main__':
  app.run(main)
