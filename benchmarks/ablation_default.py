r"""Measured ablation of ContextPool's open choices on the offline default LM.

Trains ``configs/default.py`` (a 2-layer character LM on the Python standard
library's sources) once per variant, seed and learning rate, and reports
validation bits per character with each variant's difference to the baseline
and to the default, paired by seed. This is how the defaults of A1
(``size_norm``), A3 (``residual``), ``context_pool_position`` and the default
config's learning rates are chosen (docs/context_pool.md, "Choices the paper
leaves open").

  python -m benchmarks.ablation_default --workdir /tmp/ablation --seeds 0,1,2
  python -m benchmarks.ablation_default --workdir /tmp/ablation --seeds 0 \
      --variants baseline,sigmoid_attention_input --learning_rates 2e-3,4e-3,8e-3

Without ``--learning_rates`` each variant trains at its peak rate
(:func:`config_lr`: the baseline and the default at ``configs/default.py``'s
own tuned rates, the other variants at the rate they were screened at).
Resumable: each run keeps
``<workdir>/<run>/result.json`` and is skipped when it has one; each result is
kept in ``--data`` (``benchmarks/ablation_default_data/``, committed). Writes
``<out>/ablation_default.md`` from every run kept there: each variant at
its own rate, paired by seed with the baseline at its own, then one table per
learning rate.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
from typing import Optional

from absl import app
from absl import flags
from absl import logging

from benchmarks import lm_runs

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT = 'sigmoid_attention_input_kv'  # the configs/default.py model
# The peak rate the other ContextPool variants train at: the one tuned for pooled
# queries, keys and values ('sigmoid_attention_input', the config's model before
# pooled keys and values replaced it), at which the open choices were screened.
SCREEN_LR = 4e-3

# variant: (ContextPool overrides or None for no ContextPool, model overrides).
# Every field studied is set explicitly, so results do not depend on defaults.
_OUTPUT = dict(context_pool_position='output', context_pool_reads='qkv')
_INPUT = dict(context_pool_position='attention_input', context_pool_reads='qkv')
_INPUT_KV = dict(context_pool_position='attention_input', context_pool_reads='kv')
VARIANTS = {
    'baseline': (None, {}),
    'softmax': (dict(size_norm='softmax', residual=False), _OUTPUT),
    'sigmoid': (dict(size_norm='sigmoid', residual=False), _OUTPUT),
    'softmax_residual': (dict(size_norm='softmax', residual=True), _OUTPUT),
    'sigmoid_residual': (dict(size_norm='sigmoid', residual=True), _OUTPUT),
    'softmax_attention_input': (dict(size_norm='softmax', residual=False), _INPUT),
    'sigmoid_attention_input': (dict(size_norm='sigmoid', residual=False), _INPUT),
    'sigmoid_residual_attention_input': (dict(size_norm='sigmoid', residual=True), _INPUT),
    # Only keys and values read the pooled features (queries read LN x).
    'sigmoid_attention_input_kv': (dict(size_norm='sigmoid', residual=False), _INPUT_KV),
}


def make_config(variant: str, seed: int, steps: Optional[int], lr: Optional[float]):
  """``configs/default.py`` with the variant's fields, one evaluation at the end."""
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  from configs import default  # pylint: disable=g-import-not-at-top

  pool, model = VARIANTS[variant]
  c = default.get_config('baseline' if pool is None else '')
  if pool is not None:
    c.model.context_pool.update(pool)
  with c.unlocked():
    c.model.update(model)
  c.seed = seed
  if steps:
    c.num_train_steps = steps
  if lr is not None:
    c.optimizer.learning_rate = lr
  c.eval_every_steps = c.checkpoint_every_steps = c.num_train_steps
  c.progress_bar = False
  return c


def config_lr(variant: str) -> float:
  """The variant's peak learning rate: ``configs/default.py``'s for the baseline and
  the default (each arm's tuned rate), :data:`SCREEN_LR` for the other variants."""
  if variant in ('baseline', DEFAULT):
    return make_config(variant, 0, None, None).optimizer.learning_rate
  return SCREEN_LR


def run_name(variant: str, seed: int, lr: float) -> str:
  return f'{variant}_seed{seed}_lr{lr:g}'


def train(workdir: pathlib.Path, variant: str, seed: int, steps, lr) -> dict:
  """The run's result, trained now unless ``<run>/result.json`` holds it."""
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top

  run_dir = workdir / run_name(variant, seed, lr)
  done = run_dir / 'result.json'
  if done.exists():
    result = json.loads(done.read_text())
  else:
    config = make_config(variant, seed, steps, lr)
    out = trainer.train_and_evaluate(config, str(run_dir))
    result = dict(
        variant=variant,
        seed=seed,
        learning_rate=config.optimizer.learning_rate,
        steps=config.num_train_steps,
        val_bpc_trainer=out['eval_validation']['bpc'],  # the config's evaluation
        train_loss=out['train_history'][-1]['loss'],
    )
  return _scored(run_dir, result)


def _scored(run_dir: pathlib.Path, result: dict) -> dict:
  """``result`` with its BPC on the whole validation split (whatever the config's
  ``eval_max_bytes``), scored from the run's checkpoint once and recorded."""
  if 'val_bpc_whole' not in result:
    from benchmarks import eval_spread  # pylint: disable=g-import-not-at-top

    result['val_bpc_whole'] = eval_spread.split_metrics(str(run_dir), 'validation')['bpc']
    (run_dir / 'result.json').write_text(json.dumps(result, indent=1))
  return result


def recorded(workdir: pathlib.Path, steps: int) -> list[dict]:
  """Every run of ``steps`` steps recorded in ``workdir`` (this and earlier invocations)."""
  paths = sorted(workdir.glob('*/result.json'))
  results = [(p.parent, json.loads(p.read_text())) for p in paths]
  return [_scored(d, r) for d, r in results if r['steps'] == steps]


def _key(result: dict) -> str:
  return run_name(result['variant'], result['seed'], result['learning_rate'])


def archive(results: list[dict], data: pathlib.Path, steps: int) -> list[dict]:
  """Copies ``results`` into ``data`` (one ``<run>.json`` each, a recorded run kept as
  it is) and returns every run of ``steps`` steps ``data`` holds: the repository keeps
  the results (``benchmarks/ablation_default_data/``), workdirs come and go."""
  data.mkdir(parents=True, exist_ok=True)
  for r in results:
    path = data / f'{_key(r)}.json'
    if not path.exists():
      path.write_text(json.dumps(r, indent=1) + '\n')
  kept = [json.loads(p.read_text()) for p in sorted(data.glob('*.json'))]
  return [r for r in kept if r['steps'] == steps]


def _paired(mine: dict[int, float], other: dict[int, float]) -> str:
  p = lm_runs.paired(mine, other)
  if p is None:
    seeds = sorted(set(mine) & set(other))
    return ', '.join(f'{mine[s] - other[s]:+.3f}' for s in seeds) or '-'
  return f'{p["mean"]:+.3f} ± {p["half"]:.3f} ({", ".join(f"{d:+.3f}" for d in p["diffs"])})'


def _table(results: list[dict], variants: list[str], rate: dict[str, float]) -> list[str]:
  """Each variant at ``rate[variant]``: BPC per seed, mean, and the paired differences."""
  by = {
      v: {
          r['seed']: r['val_bpc_whole']
          for r in results
          if (r['variant'], r['learning_rate']) == (v, rate[v])
      }
      for v in variants
  }
  lines = [
      '| variant | peak learning rate | seeds | validation BPC (mean) | per seed | − baseline |'
      f' − {DEFAULT} |',
      '| --- | ---: | ---: | ---: | --- | --- | --- |',
  ]
  for v in (v for v in variants if by[v]):
    seeds = sorted(by[v])
    lines.append(
        f'| {v} | {rate[v]:g} | {len(seeds)} | {statistics.mean(by[v].values()):.3f} |'
        f' {", ".join(f"{by[v][s]:.3f}" for s in seeds)} |'
        f' {_paired(by[v], by.get("baseline", {})) if v != "baseline" else ""} |'
        f' {_paired(by[v], by.get(DEFAULT, {})) if v != DEFAULT else ""} |'
    )
  return lines


def report(results: list[dict], variants: list[str], tuned: dict[str, float]) -> str:
  """The variants at their ``tuned`` rates (the config's), then one table per learning rate."""
  lines = [
      '# Ablation of the open choices on the offline default (`configs/default.py`)',
      '',
      '`python -m benchmarks.ablation_default`: validation BPC (lower is better) on the whole'
      " validation split of each variant after the config's schedule; differences are paired by"
      ' seed (mean ± 95% t-interval, then per seed).',
      '',
      '## Each variant at its own learning rate',
      '',
      *_table(results, variants, tuned),
  ]
  for lr in sorted({r['learning_rate'] for r in results}):
    lines += [
        '',
        f'## Peak learning rate {lr:g}',
        '',
        *_table(results, variants, dict.fromkeys(variants, lr)),
    ]
  return '\n'.join(lines) + '\n'


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = pathlib.Path(FLAGS.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  tuned = {v: config_lr(v) for v in VARIANTS}
  lrs = [float(x) for x in FLAGS.learning_rates] or [None]
  steps = FLAGS.steps or make_config(DEFAULT, 0, None, None).num_train_steps
  for seed in map(int, FLAGS.seeds):
    for lr in lrs:
      for variant in FLAGS.variants:
        rate = tuned[variant] if lr is None else lr
        bpc = train(workdir, variant, seed, FLAGS.steps, rate)['val_bpc_whole']
        print(f'{run_name(variant, seed, rate)}: validation BPC {bpc:.4f}')
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  # The report shows every run recorded in the workdir or kept in --data, not only this
  # invocation's.
  kept = archive(recorded(workdir, steps), pathlib.Path(FLAGS.data), steps)
  text = report(kept, list(VARIANTS), tuned)
  (out / 'ablation_default.md').write_text(text)
  print(text)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined only when run as a script, so that tests can
  import this module beside others that define the same names)."""
  flags.DEFINE_string('workdir', '/tmp/contextpool_ablation', 'Runs directory.')
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Report directory.')
  flags.DEFINE_string(
      'data', str(ROOT / 'benchmarks' / 'ablation_default_data'), 'Where the results are kept.'
  )
  flags.DEFINE_integer('steps', None, "Training steps per run (None: the config's).")
  flags.DEFINE_list('seeds', ['0'], 'Seeds (one run per seed and variant).')
  flags.DEFINE_list('learning_rates', [], "Peak learning rates (none: the config's).")
  flags.DEFINE_list('variants', list(VARIANTS), 'Variants to run.')


if __name__ == '__main__':
  define_flags()
  app.run(main)
