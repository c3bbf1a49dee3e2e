r"""ContextPool against its baselines on the character LM: a resumable study.

Trains the character-LM family of ``configs/default.py`` on this machine's CPU,
one run per (corpus, arm, depth, steps, seed), and reports what held and what
did not (issue 17; README "Results").

  python -m benchmarks.lm_study --study_dir ~/lm_study                  # run (resumable)
  python -m benchmarks.lm_study --study_dir ~/lm_study --groups costs   # GFLOPs and paired step time
  python -m benchmarks.lm_study --study_dir ~/lm_study --report benchmarks/results

**Resumable.** Each run trains in its own subprocess in ``<study_dir>/runs/<key>``
and, when it finishes, writes ``<study_dir>/results/<key>.json`` (final
validation and test BPC, learning curves, wall time); a rerun skips every key
with a result and resumes an interrupted run from its last checkpoint (the
trainer's own resume, every ``eval_every`` steps). Stop the study at any time
(Ctrl-C, SIGTERM: the running trainer saves its step) and start it again.

**Several processes.** Start the same command twice (e.g. one per core, each
``nice``): a process claims each run before training it (:func:`claim`), so the
two never train the same run and share the list. On this 2-core machine two
processes together ran 4.5 steps/s against 3.5 for one alone (depth 2): the
trainer's input pipeline, evaluation and checkpoints then overlap the other's
steps.

**Paired by seed.** Every arm of a comparison runs with the same seeds; a seed
fixes the data order and the initialisation of every parameter whose path and
shape the arms share (flax folds the module path into the key), so differences
are paired per seed.

**Groups** (``--groups``; each a list of runs, duplicates run once):

* ``depth``: ``baseline`` vs ``cp`` at every ``--depths`` on every corpus;
* ``ablation``: at ``--ablation_depth`` on ``--ablation_corpus``, area (basic)
  and local attention (a window a quarter of the context: ``ARMS['local']``),
  ContextPool's ablation rows (Tables 1 and 3: uniform and non-local weights;
  no locality, fixed window, random sparse; MLP and self-attention mappings)
  and the defaults the README's decisions chose (A1 ``size_norm``, A3
  ``residual``, ``context_pool_position``) against their alternatives;
* ``long``: ``baseline`` vs ``cp`` and ``cp_residual`` (:data:`LONG_ARMS`) at
  ``--ablation_depth`` trained ``--long_steps``, so "faster early" and "better
  at the end" can be told apart;
* ``images``: ResNet vs CP-ResNet (``configs/digits_resnet.py``, depths
  ``--image_depths``) on the one real image dataset that is offline,
  scikit-learn's 8x8 digits; reported as classification error (%);
* ``tuning``: peak rate x warm-up (:data:`benchmarks.lm_comparisons.TUNING_LRS`,
  ``grid_warmups`` by arm and context) of the baseline and both ContextPool readings at every
  context compared (256, 1,024 and 2,048 bytes), and of the baseline with rotary
  positions (``baseline_rotary``) at 1,024 and 2,048, seed 0 (issue 68); a best setting
  at the grid's edge is extended past it
  (:func:`benchmarks.lm_comparisons.tuning_extension`), the study planning again as
  results land;
* ``context``: at 1,024 and 2,048 bytes, each arm of the tuning at its tuned setting,
  3 seeds, and at 2,048 the baseline at depth 4
  (:func:`benchmarks.lm_comparisons.context_study`); a context's runs appear once its
  baseline's tuning grid is done;
* ``costs``: per (arm, depth, context) compiled GFLOPs of the trainer's step and its
  step time paired with the baseline's at the same depth and context
  (``benchmarks.harness``; run it on a quiet machine), for the runs of the
  groups listed with it, or of every group when it is listed alone.

**Corpora** (both offline on a fresh machine): ``code``, ``configs/default.py``'s
corpus (the pinned snapshot of CPython 3.11.7's standard-library sources, the same
bytes on every Python); ``text``, English prose: the Python Language Reference and
library topics that the *running* CPython ships as ``pydoc_data/topics.py`` (the text
``help('topics')`` shows; ~0.46 MB; PSF licence; not pinned, so it differs between
Python versions), written out as a plain text file by :func:`write_text_corpus`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from absl import app
from absl import flags

from benchmarks.lm_runs import CostKey, Run, paired, parse_key

ROOT = pathlib.Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------
# What is compared.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arm:
  """One model variant: ``family`` groups arms in plots; ``context_pool`` None =
  the LM without ContextPool, else overrides of the default config's
  ContextPool fields; ``model`` overrides other model fields."""

  family: str
  context_pool: Optional[dict[str, Any]] = None
  model: dict[str, Any] = dataclasses.field(default_factory=dict)


# What every ContextPool arm's attention reads unless the arm says otherwise: the
# paper's reading (queries, keys and values pooled, before every attention), as the
# study was measured, whatever configs/default.py chooses.
CONTEXT_POOL_PLACEMENT = dict(context_pool_position='attention_input', context_pool_reads='qkv')
ARMS = {
    'baseline': Arm('transformer'),
    'cp': Arm('contextpool', {}),
    # Other adaptive-context baselines: the area attention paper's basic form
    # at the model's default area sizes; local attention over the previous 64
    # bytes, a quarter of the study's context (the LM's default window, 256,
    # would read all of a 256-byte context: the baseline again, which
    # make_config refuses).
    'area': Arm('area', model=dict(attention='area')),
    'local': Arm('local', model=dict(attention='local', local_window=64)),
    # Table 1: pooling weights; Table 3: locality and mapping.
    'cp_uniform': Arm('contextpool', dict(weights='uniform')),
    'cp_nonlocal': Arm('contextpool', dict(weights='nonlocal')),
    'cp_no_locality': Arm('contextpool', dict(locality='none')),
    'cp_fixed_window': Arm('contextpool', dict(locality='fixed_window')),
    'cp_random_sparse': Arm('contextpool', dict(locality='random_sparse')),
    'cp_mlp': Arm('contextpool', dict(mapping='mlp')),
    'cp_attention': Arm('contextpool', dict(mapping='attention')),
    # The README decisions' alternatives (A1, A3, position).
    'cp_softmax_size': Arm('contextpool', dict(size_norm='softmax')),
    'cp_residual': Arm('contextpool', dict(residual=True)),
    'cp_at_output': Arm('contextpool', {}, dict(context_pool_position='output')),
}
# Issue 27: arms against the late deficit of the default ContextPool, each a
# field (README "Decisions"), screened on the long setup. SEQ_LEN stands for
# the study's --size_seq_len, BELOW_TOP for the layer below the run's top one.
SEQ_LEN = 'seq_len'
BELOW_TOP = 'below_top'
LATE_ARMS = {
    # Where and what the attention reads pooled (model fields).
    'cp_after_attention': Arm('contextpool', {}, dict(context_pool_first_layer=1)),
    'cp_kv': Arm('contextpool', {}, dict(context_pool_reads='kv')),
    'cp_q': Arm('contextpool', {}, dict(context_pool_reads='q')),
    'cp_half_heads': Arm('contextpool', {}, dict(context_pool_heads=2)),  # of the 4 heads
    'cp_one_head': Arm('contextpool', {}, dict(context_pool_heads=1)),
    # Pooled features in every layer but the top one, whose attention reads
    # exact bytes (the diagnostics: pooled queries in the top layer leave no
    # induction head).
    'cp_below_top': Arm('contextpool', {}, dict(context_pool_last_layer=BELOW_TOP)),
    # Every attention exact; the feed-forward reads the pooled features (the
    # diagnostics: the early lead is a local n-gram feature, the late cost that
    # the queries carry it).
    'cp_mlp_input': Arm('contextpool', {}, dict(context_pool_position='mlp_input')),
    # How the pooled features replace the input, and the sizes (layer fields).
    'cp_gate': Arm('contextpool', dict(gate=True)),
    'cp_narrow': Arm('contextpool', dict(size_bias_init=-3.2)),  # s ~ 0.04: sigma ~ 1 at r n = 25.6
    'cp_ratio_small': Arm('contextpool', dict(ratio=0.025)),
    'cp_static_n': Arm('contextpool', dict(sigma_length=SEQ_LEN)),
    # A combination of the two arms that screened best, on different axes (which
    # heads read pooled features; how the pooled features replace the input).
    'cp_half_heads_gate': Arm('contextpool', dict(gate=True), dict(context_pool_heads=2)),
    # The gate closed at the start (the baseline at step 0), opened as training finds
    # it useful: does the early shortcut of a pooled path cost the late loss?
    'cp_gate_closed': Arm('contextpool', dict(gate=True, gate_init=0.0)),
    # The paper's LM placement (Sec. 3): the residual stream pooled after every block
    # but the last, so the output head reads exact features.
    'cp_output_below_top': Arm(
        'contextpool', {}, dict(context_pool_position='output', context_pool_last_layer=BELOW_TOP)
    ),
    # Issue 72: pooled keys and values on each of ContextPool's two implementations, whatever
    # the context ('auto' picks blockwise above 1,024 positions): benchmarks/cp_step_cost.py.
    'cp_kv_dense': Arm('contextpool', dict(implementation='dense'), dict(context_pool_reads='kv')),
    'cp_kv_blockwise': Arm(
        'contextpool', dict(implementation='blockwise'), dict(context_pool_reads='kv')
    ),
    # Issue 68: the baseline with rotary positions (RoPE), what current LMs use and a
    # locality prior of its own, so that a ContextPool gain is not only the locality
    # that sinusoidal positions lack.
    'baseline_rotary': Arm('rotary', model=dict(positions='rotary')),
}
ARMS.update(LATE_ARMS)
ABLATION_ARMS = tuple(a for a in ARMS if a not in ('baseline', 'cp') and a not in LATE_ARMS)
# The long group. Trained 4x longer, the default ContextPool ends behind the
# baseline, and its training loss trails too: it optimises more slowly. With
# A3's residual, attention reads x + pool(x), keeping each byte's own features.
# That made it the candidate fix, so it is trained long too (it did not help:
# README "Results").
LONG_ARMS = ('baseline', 'cp', 'cp_residual')
# The long runs of these seeds keep a checkpoint every DIAGNOSTIC_PERIOD steps
# for benchmarks/lm_diagnostics.py (pool sizes, per-position loss, gradients).
DIAGNOSED_SEEDS = (0,)
DIAGNOSTIC_PERIOD = 500
CORPORA = ('code', 'text')  # the LM corpora
IMAGES = 'digits'  # the image data of the images group (configs/digits_resnet.py)
GROUPS = (
    'depth',
    'ablation',
    'long',
    'images',
    'costs',
    'sweep',
    'comparisons',
    'tuning',
    'context',
)
# What each corpus reports (lower is better): bits per character, or the
# classification error in percent.
METRICS = {'code': 'bpc', 'text': 'bpc', IMAGES: 'error'}


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The study's model and schedule sizes (flags ``--size_<field>``). Half the
  default LM's width (256 -> 128) so that the whole study (87 runs at 3 seeds)
  fits in hours on a 2-core CPU; the schedule and data are the default's."""

  emb_dim: int = 128
  mlp_dim: int = 512
  num_heads: int = 4
  seq_len: int = 256
  batch_size: int = 16
  steps: int = 1000
  long_steps: int = 4000
  eval_every: int = 200
  eval_max_bytes: int = 0  # the whole validation split (test: once, at the end)
  diagnose: int = 1  # 1: the long LM runs of DIAGNOSED_SEEDS record diagnostics; 0: none
  max_bytes: int = 4 * 2**20
  image_steps: int = 2000  # configs/digits_resnet.py's schedule


def plan(
    groups: Sequence[str],
    *,
    corpora: Sequence[str],
    depths: Sequence[int],
    seeds: Sequence[int],
    sizes: Sizes,
    ablation_corpus: str,
    ablation_depth: int,
    ablation_arms: Sequence[str] = ABLATION_ARMS,
    long_arms: Sequence[str] = LONG_ARMS,
    image_depths: Sequence[int] = (20,),
    best_arm: str = 'cp_kv',
    results: Mapping[str, Mapping[str, Any]] = MappingProxyType({}),
) -> list[Run]:
  """The training runs of ``groups``, in the order they run (seed-major, so a
  stopped study has complete comparisons for its first seeds), without duplicates.
  ``sweep``, ``comparisons``, ``tuning`` and ``context`` are
  :mod:`benchmarks.lm_comparisons`'s runs (their own seeds and sizes; ``best_arm``
  joins the default ContextPool in the longer-context and fewer-layers comparisons
  and is the prose arm; ``context`` reads the tuned settings from ``results``, the
  study's results by key, and has runs only once a context's baseline is tuned).
  ``tuning`` and ``context`` go context-major (:func:`lm_comparisons.by_context`): a
  context's comparison (its tuned arms' seeds), then its grids, before the next context's."""
  runs: list[Run] = []
  for seed in seeds:
    if 'depth' in groups:
      runs += [
          Run(c, a, d, sizes.steps, seed)
          for c in corpora
          for d in depths
          for a in ('baseline', 'cp')
      ]
    if 'ablation' in groups:
      runs += [
          Run(ablation_corpus, a, ablation_depth, sizes.steps, seed)
          for a in ('baseline', 'cp', *ablation_arms)
      ]
    if 'long' in groups:
      runs += [Run(ablation_corpus, a, ablation_depth, sizes.long_steps, seed) for a in long_arms]
    if 'images' in groups:
      runs += [
          Run(IMAGES, a, d, sizes.image_steps, seed)
          for d in image_depths
          for a in ('baseline', 'cp')
      ]
  if {'sweep', 'comparisons', 'tuning', 'context'} & set(groups):
    from benchmarks import lm_comparisons  # pylint: disable=g-import-not-at-top

    tuning = lm_comparisons.tuning_runs(results) if 'tuning' in groups else []
    context = []
    if 'context' in groups:
      context = [r for c in lm_comparisons.context_study(results) for r in c.runs()]
    runs += lm_comparisons.by_context(tuning, context)  # context-major: 1,024 bytes first

    if 'sweep' in groups:
      runs += lm_comparisons.sweep_runs()
    if 'comparisons' in groups:
      runs += [r for c in lm_comparisons.study(best_arm) for r in c.runs()]
  return list(dict.fromkeys(runs))


# ----------------------------------------------------------------------------
# Corpora and configs.
# ----------------------------------------------------------------------------


def write_text_corpus(directory: pathlib.Path) -> pathlib.Path:
  """CPython's ``pydoc_data.topics`` (the Language Reference and library topics
  as plain English text, in topic order) written to ``directory``; returns the
  file. Rewritten only when its content would change."""
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top

  text = '\n\n'.join(topics.topics[k].strip('\n') for k in sorted(topics.topics)) + '\n'
  path = directory / 'python_reference_topics.txt'
  if not path.exists() or path.read_text(encoding='utf-8') != text:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix('.tmp')
    tmp.write_text(text, encoding='utf-8')
    os.replace(tmp, path)
  return path


def _image_config(run: Run, sizes: Sizes, study_dir: pathlib.Path):
  """``configs/digits_resnet.py``: ResNet-<depth>, with ContextPool for arm ``cp``."""
  from configs import digits_resnet  # pylint: disable=g-import-not-at-top

  if run.arm not in ('baseline', 'cp'):
    raise ValueError(f'{run.key}: the images group has arms baseline and cp, not {run.arm!r}.')
  c = digits_resnet.get_config(f'{"cp_" if run.arm == "cp" else ""}resnet{run.depth}')
  c.num_train_steps = run.steps
  c.eval_every_steps = c.checkpoint_every_steps = max(run.steps // 10, 1)  # 10-point curves
  c.log_every_steps = c.eval_every_steps
  c.dataset.data_dir = str(study_dir / 'tfds')
  return c


def make_config(run: Run, sizes: Sizes, study_dir: pathlib.Path):
  """``configs/default.py`` (``configs/digits_resnet.py`` for the images) with
  the run's arm, depth, seed, corpus and sizes."""
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  from configs import default  # pylint: disable=g-import-not-at-top

  if run.corpus == IMAGES:
    c = _image_config(run, sizes, study_dir)
    c.seed = run.seed
    c.keep_checkpoints = 1
    c.progress_bar = False
    c.log_pool_sizes = False
    return c

  arm = ARMS[run.arm]
  c = default.get_config('baseline' if arm.context_pool is None else '')
  resolved = lambda fields: {
      k: {SEQ_LEN: run.seq_len or sizes.seq_len, BELOW_TOP: run.depth - 2}.get(v, v)
      if isinstance(v, str)
      else v
      for k, v in fields.items()
  }
  with c.unlocked():
    if arm.context_pool is not None:
      c.model.context_pool.update(resolved(arm.context_pool))
    c.model.update(
        dict(
            num_layers=run.depth,
            emb_dim=sizes.emb_dim,
            mlp_dim=sizes.mlp_dim,
            num_heads=sizes.num_heads,
        )
        | (CONTEXT_POOL_PLACEMENT if arm.context_pool is not None else {})
        | resolved(arm.model)
    )
    c.seed = run.seed
    seq_len = run.seq_len or sizes.seq_len
    c.batch_size = sizes.batch_size * sizes.seq_len // seq_len  # the same bytes per step
    c.num_train_steps = run.steps
    if run.lr is not None:
      c.optimizer.learning_rate = run.lr
    if run.dropout is not None:
      c.model.dropout_rate = run.dropout
    if run.warmup is not None:
      c.optimizer.warmup_steps = run.warmup
    c.eval_every_steps = sizes.eval_every
    c.checkpoint_every_steps = sizes.eval_every
    c.log_every_steps = sizes.eval_every
    c.keep_checkpoints = 1
    c.eval_splits = ('validation',)  # test: scored once, at the end (train_one)
    c.progress_bar = False
    c.log_pool_sizes = False
    c.dataset.seq_len = seq_len
    from contextpool_jax.models import transformer  # pylint: disable=g-import-not-at-top

    window = c.model.get('local_window', transformer.TransformerLM.local_window)
    if c.model.get('attention') == 'local' and window >= seq_len:
      raise ValueError(
          f'arm {run.arm!r}: model.local_window={window} >= seq_len='
          f'{seq_len} reads the whole context, so the arm is the baseline again;'
          ' expected a window below seq_len'
      )
    c.dataset.eval_context = seq_len
    c.dataset.eval_step = seq_len // 2
    c.dataset.eval_max_bytes = sizes.eval_max_bytes
    c.dataset.max_bytes = sizes.max_bytes
    # Prepared corpora are shared by every run of the study.
    c.dataset.data_dir = str(study_dir / 'tfds')
    if run.corpus == 'text':
      c.dataset.files = (str(write_text_corpus(study_dir / 'corpora')),)
  return c


# ----------------------------------------------------------------------------
# Running.
# ----------------------------------------------------------------------------


def _read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _curve(lines: Iterable[dict[str, Any]], split: str, field: str) -> list[tuple[int, float]]:
  """``[(step, value)]`` of one split, the last entry per step (a resumed run
  may repeat a step)."""
  by_step = {l['step']: l[field] for l in lines if l['split'] == split and field in l}
  return sorted(by_step.items())


def _last_record(lines: Sequence[dict[str, Any]], split: str, step: int) -> dict[str, Any]:
  """The metrics of ``split`` the run logged at its last ``step`` (from its
  metrics.jsonl: a run resumed at its end logs nothing in this process)."""
  at_end = [l for l in lines if l['split'] == split and l['step'] == step]
  if not at_end:
    raise ValueError(f'metrics.jsonl has no {split!r} record at the last step {step}')
  return {k: v for k, v in at_end[-1].items() if k not in ('step', 'split')}


def result_path(study_dir: pathlib.Path, run: Run) -> pathlib.Path:
  return study_dir / 'results' / f'{run.key}.json'


def _claim_path(study_dir: pathlib.Path, run: Run) -> pathlib.Path:
  return study_dir / 'runs' / f'{run.key}.claim'


def _alive_study_process(pid: int) -> bool:
  """Whether ``pid`` is a running ``benchmarks.lm_study`` process (a claim by
  any other, or by a process gone since, e.g. before a restart, is stale)."""
  try:
    cmdline = pathlib.Path(f'/proc/{pid}/cmdline').read_bytes()
  except OSError:
    return False
  return b'lm_study' in cmdline


def claim(study_dir: pathlib.Path, run: Run) -> bool:
  """Takes ``run`` for this process, so that several study processes started
  on the same ``study_dir`` (one per core is faster than one alone: module
  docstring) never train the same run: False if a live study process holds it.
  The claim is ``<study_dir>/runs/<key>.claim`` holding the holder's pid; a
  stale one is taken over; :func:`release` removes it."""
  path = _claim_path(study_dir, run)
  path.parent.mkdir(parents=True, exist_ok=True)
  me = str(os.getpid())
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
  except FileExistsError:
    try:
      holder = int(path.read_text() or 0)
    except (OSError, ValueError):
      holder = 0
    if holder and holder != os.getpid() and _alive_study_process(holder):
      return False
    tmp = path.with_name(f'{path.name}.{me}')
    tmp.write_text(me)
    os.replace(tmp, path)  # take the stale claim over
    return path.read_text() == me  # another taker may have replaced it meanwhile
  with os.fdopen(fd, 'w') as f:
    f.write(me)
  return True


def release(study_dir: pathlib.Path, run: Run) -> None:
  _claim_path(study_dir, run).unlink(missing_ok=True)


def diagnosed(run: Run, sizes: Sizes) -> bool:
  """Whether ``run`` keeps checkpoints along training for
  :mod:`benchmarks.lm_diagnostics`: the long LM runs of :data:`DIAGNOSED_SEEDS`."""
  return (
      bool(sizes.diagnose)
      and run.corpus in CORPORA
      and run.steps == sizes.long_steps
      and run.seed in DIAGNOSED_SEEDS
  )


def diagnostics_path(study_dir: pathlib.Path, run: Run) -> pathlib.Path:
  return study_dir / 'diagnostics' / f'{run.key}.json'


def _write_json(path: pathlib.Path, value: Any) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix('.tmp')
  tmp.write_text(json.dumps(value, indent=1))
  os.replace(tmp, path)


def train_one(run: Run, sizes: Sizes, study_dir: pathlib.Path) -> dict[str, Any]:
  """Trains (or resumes) ``run`` in this process and records its result and,
  for a :func:`diagnosed` run, its diagnostics. A run that has a result is
  trained again only for its diagnostics: the recorded result is kept, and the
  diagnostics hold both validation BPCs (the retrained run should repeat it)."""
  import shutil  # pylint: disable=g-import-not-at-top

  from benchmarks import lm_diagnostics  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import trainer  # pylint: disable=g-import-not-at-top

  workdir = study_dir / 'runs' / run.key
  t0 = time.time()
  config = make_config(run, sizes, study_dir)
  if diagnosed(run, sizes):
    config.keep_checkpoint_period = DIAGNOSTIC_PERIOD
  out = trainer.train_and_evaluate(config, str(workdir))
  if out.get('preempted'):
    raise SystemExit(143)
  metric = METRICS[run.corpus]
  recorded = result_path(study_dir, run)
  if diagnosed(run, sizes):
    d = lm_diagnostics.diagnose(workdir, sizes.eval_max_bytes)
    d['key'] = run.key
    if 'eval_validation' in out:  # trained now, not resumed at its last (kept) step
      d['val_bpc_this_training'] = out['eval_validation'][metric]
    if recorded.exists():
      d['val_bpc_recorded'] = json.loads(recorded.read_text())[f'val_{metric}']
    _write_json(diagnostics_path(study_dir, run), d)
  if recorded.exists():  # trained again (or resumed at its end) for its diagnostics only
    return json.loads(recorded.read_text())
  lines = _read_jsonl(workdir / 'metrics.jsonl')
  out.setdefault('eval_validation', _last_record(lines, 'eval_validation', run.steps))
  if run.corpus == IMAGES:  # error in percent from top-1 accuracy
    lines = [dict(l, error=100 * (1 - l['top1'])) if 'top1' in l else l for l in lines]
    for split in ('validation', 'test'):
      out[f'eval_{split}']['error'] = 100 * (1 - out[f'eval_{split}']['top1'])
  else:  # the LM's test split, scored once from the last checkpoint
    from benchmarks import eval_spread  # pylint: disable=g-import-not-at-top

    out['eval_test'] = eval_spread.split_metrics(str(workdir), 'test')
  rates = [v for _, v in _curve(lines, 'train', 'steps_per_sec')]
  result = dict(
      dataclasses.asdict(run),
      key=run.key,
      family='resnet' if run.corpus == IMAGES else ARMS[run.arm].family,
      metric=metric,
      train_loss=_last_record(lines, 'train', run.steps)['loss'],
      val_loss=out['eval_validation']['loss'],
      test_loss=out['eval_test']['loss'],
      val_curve=_curve(lines, 'eval_validation', metric),
      test_curve=_curve(lines, 'eval_test', metric),
      train_curve=_curve(lines, 'train', 'loss'),
      steps_per_sec_median=statistics.median(rates) if rates else None,
      # The load beside the step rate (1, 5 and 15 minutes) as training ended: the rate is
      # this run's and whatever else shared the cores.
      load_average_at_end=list(os.getloadavg()),
      wall_s_last_session=time.time() - t0,
      sizes=dataclasses.asdict(sizes),
      **{f'{split}_{metric}': out[f'eval_{name}'][metric] for split, name in _SPLITS},
  )
  _write_json(recorded, result)
  if not diagnosed(run, sizes):  # a diagnosed run keeps its checkpoints for later probes
    shutil.rmtree(workdir / 'checkpoints', ignore_errors=True)  # only needed to resume
  return result


_SPLITS = (('val', 'validation'), ('test', 'test'))


def check_sizes(study_dir: pathlib.Path, sizes: Sizes) -> None:
  """Records the sizes of a new study; refuses to add runs of other sizes to it."""
  path = study_dir / 'sizes.json'
  if path.exists():
    recorded = json.loads(path.read_text())
    diff = {k: (v, getattr(sizes, k)) for k, v in recorded.items() if getattr(sizes, k) != v}
    if diff:
      raise app.UsageError(
          f'{study_dir} holds a study with other sizes ((recorded, given): {diff}); pass the '
          'recorded --size_* flags or use another --study_dir.'
      )
  else:
    study_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(sizes), indent=1))


def done(study_dir: pathlib.Path, run: Run, sizes: Sizes, diagnose_existing: bool) -> bool:
  """``run`` has a result and, if ``diagnose_existing`` and it is
  :func:`diagnosed`, its diagnostics."""
  if not result_path(study_dir, run).exists():
    return False
  return (
      not (diagnose_existing and diagnosed(run, sizes)) or diagnostics_path(study_dir, run).exists()
  )


def run_as_planned(
    planned: Callable[[], list[Run]], sizes: Sizes, study_dir: pathlib.Path, **kwargs
) -> list[Run]:
  """:func:`run_all` of ``planned()``, one run at a time, planned again after each run
  (some runs follow from results: a tuning grid's extensions come right after their
  arm's grid, the tuned comparisons after their arms are settled) until none is left to
  train; returns the last plan."""
  runs = planned()
  while run_all(runs, sizes, study_dir, stop_after=1, **kwargs):
    runs = planned()
  return runs


def run_all(
    runs: Sequence[Run],
    sizes: Sizes,
    study_dir: pathlib.Path,
    *,
    in_process: bool = False,
    diagnose_existing: bool = False,
    stop_after: Optional[int] = None,
    log=print,
) -> list[Run]:
  """Trains every run that is not :func:`done` (each in a subprocess unless
  ``in_process``), in order, stopping after ``stop_after`` runs if given; returns the
  runs trained now."""
  trained = []
  for i, run in enumerate(runs):
    if done(study_dir, run, sizes, diagnose_existing):
      continue
    if not claim(study_dir, run):
      log(f'[{i + 1}/{len(runs)}] {run.key}: another study process is training it; next')
      continue
    try:
      if done(study_dir, run, sizes, diagnose_existing):  # finished while we were claiming it
        continue
      log(f'[{i + 1}/{len(runs)}] {run.key}')
      if in_process:
        train_one(run, sizes, study_dir)
      else:
        cmd = [sys.executable, '-m', 'benchmarks.lm_study', f'--study_dir={study_dir}']
        cmd += [f'--train_one={run.key}'] + _size_flags(sizes)
        proc = subprocess.run(cmd, cwd=ROOT, check=False)
        if proc.returncode:
          raise SystemExit(f'{run.key} exited with {proc.returncode}; rerun to resume.')
      trained.append(run)
    finally:
      release(study_dir, run)
    if len(trained) == stop_after:
      break
  return trained


# ----------------------------------------------------------------------------
# Costs: the trainer's step, compiled and paired with the baseline's.
# ----------------------------------------------------------------------------


def _cost_file(key: CostKey) -> str:
  arm, depth, seq_len = key
  return f'{arm}-L{depth}' + (f'-ctx{seq_len}' if seq_len else '') + '.json'


def cost_pairs(runs: Sequence[Run]) -> list[CostKey]:
  """The cost keys of the LM ``runs`` without dropout, each with its baseline's (same
  depth and context)."""
  runs = [r for r in runs if r.corpus in CORPORA]
  keys = {r.cost_key for r in runs} | {
      dataclasses.replace(r, arm='baseline').cost_key for r in runs
  }
  keys.discard(None)  # runs with dropout (Run.cost_key)
  return sorted(keys, key=lambda k: (k[2] or 0, k[1], list(ARMS).index(k[0])))


def measure_costs(
    keys: Sequence[CostKey],
    sizes: Sizes,
    study_dir: pathlib.Path,
    log=print,
    allow_load: bool = False,
) -> None:
  """``<study_dir>/costs/<arm>-L<depth>[-ctx<seq_len>].json``: params, GFLOPs and
  temp memory of the trainer's step at the study's sizes (the run's context and
  batch), and its step time paired with the baseline's at the same depth and
  context (``step_ratio``), with the load it ran under (``benchmarks/quiet.py``: a
  loaded machine is refused unless ``allow_load``). Skips recorded ones."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import optim, spec, tasks  # pylint: disable=g-import-not-at-top

  def workload(arm: str, depth: int, seq_len: Optional[int]) -> harness.Workload:
    config = make_config(Run('code', arm, depth, sizes.steps, 0, seq_len=seq_len), sizes, study_dir)
    n = config.dataset.seq_len

    def make_batch(key):
      tokens = jax.random.randint(key, (config.batch_size, n + 1), 0, 256, jnp.int32)
      return {'tokens': tokens, 'weights': jnp.ones((config.batch_size, n), jnp.float32)}

    specs = spec.read(config, process_count=1, device_count=1)
    return harness.Workload(
        module=specs.model,
        objective=tasks.make_objective(specs.task, specs.data, specs.model),
        make_batch=make_batch,
        optimizer=optim.make_optimizer(specs.optimizer, specs.run.num_train_steps),
    )

  out = study_dir / 'costs'
  out.mkdir(parents=True, exist_ok=True)
  for depth, seq_len in sorted({(d, n) for _, d, n in keys}, key=lambda g: (g[1] or 0, g[0])):
    todo = [a for a, d, n in keys if (d, n) == (depth, seq_len)]
    todo = [a for a in todo if not (out / _cost_file((a, depth, seq_len))).exists()]
    if not todo:
      continue
    base_row, base = harness.measure_row(
        'baseline',
        lambda: workload('baseline', depth, seq_len),
        repeats=20,
        allow_load=allow_load,
        log=log,
    )
    for arm in todo:
      if arm == 'baseline':
        row = dict(base_row, step_ratio=1.0)
      else:
        row = harness.measure(
            arm,
            lambda arm=arm: workload(arm, depth, seq_len),
            repeats=20,
            baseline=base,
            allow_load=allow_load,
            log=log,
        )
      row.update(arm=arm, depth=depth, seq_len=seq_len, family=ARMS[arm].family)
      (out / _cost_file((arm, depth, seq_len))).write_text(json.dumps(row, indent=1))
    base.close()


# ----------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------


def load_results(study_dir: pathlib.Path) -> list[dict[str, Any]]:
  return [json.loads(p.read_text()) for p in sorted((study_dir / 'results').glob('*.json'))]


def load_costs(study_dir: pathlib.Path) -> dict[CostKey, dict[str, Any]]:
  rows = [json.loads(p.read_text()) for p in sorted((study_dir / 'costs').glob('*.json'))]
  return {(r['arm'], r['depth'], r.get('seq_len')): r for r in rows}


def _mean_std(values: Sequence[float]) -> str:
  if not values:
    return '-'
  if len(values) == 1:
    return f'{values[0]:.3f}'
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


def _diff_cell(p: Optional[dict[str, Any]]) -> str:
  if p is None:
    return '-'
  verdict = 'yes' if p['significant'] else 'no'
  per_seed = ', '.join(f'{x:+.3f}' for x in p['diffs'])
  return f'{p["mean"]:+.3f} ± {p["half"]:.3f} ({per_seed}) | {verdict}'


def _run(result: dict[str, Any]) -> Run:
  """The :class:`Run` a result records."""
  fields = ('corpus', 'arm', 'depth', 'steps', 'seed')
  overrides = ('lr', 'seq_len', 'dropout', 'warmup')
  return Run(*(result[f] for f in fields), *(result.get(f) for f in overrides))


def _options(result: dict[str, Any]) -> str:
  """The settings a run overrides, as its key shows them ('' = the study's own)."""
  return _run(result).options


def _shown(options: str) -> str:
  return options[1:] or '-'  # '-lr0.004-drop0' -> 'lr0.004-drop0'


def _groups(results: Sequence[dict[str, Any]]) -> list[tuple[int, int, str]]:
  """The ``(steps, depth, options)`` groups: runs compared with each other."""
  return sorted({(r['steps'], r['depth'], _options(r)) for r in results})


def _by_seed(results, **match) -> dict[int, dict[str, Any]]:
  """``{seed: result}`` of the results whose fields (``options``: see
  :func:`_options`) equal ``match``; two of one seed raise (a mixed group)."""
  found: dict[int, dict[str, Any]] = {}
  for r in results:
    if all((_options(r) if k == 'options' else r[k]) == v for k, v in match.items()):
      if r['seed'] in found:
        raise ValueError(
            f'{found[r["seed"]]["key"]} and {r["key"]} both match {match}: a report group'
            ' must tell apart every setting its runs differ in'
        )
      found[r['seed']] = r
  return found


def _fewer_layers_table(
    rs: Sequence[dict[str, Any]], costs: dict[CostKey, dict[str, Any]], val: str
) -> list[str]:
  """The paper's "fewer layers" claim: each arm at depth d against the
  baseline at every deeper depth trained as long, paired by seed."""
  from benchmarks import harness  # pylint: disable=g-import-not-at-top

  rows = []
  for steps, depth, options, arm in sorted(
      {(r['steps'], r['depth'], _options(r), r['arm']) for r in rs}
  ):
    if arm == 'baseline':
      continue
    group = dict(steps=steps, options=options)
    mine_results = _by_seed(rs, arm=arm, depth=depth, **group)
    mine = {s: r[val] for s, r in mine_results.items()}
    run = _run(next(iter(mine_results.values())))
    for deeper in sorted(
        {d for n, d, o in _groups(rs) if (n, o) == (steps, options) and d > depth}
    ):
      base = _by_seed(rs, arm='baseline', depth=deeper, **group)
      diff = paired(mine, {s: r[val] for s, r in base.items()})
      if diff:
        gflops = [
            harness.gflops_cell(costs.get(r.cost_key, {}))
            for r in (run, dataclasses.replace(run, arm='baseline', depth=deeper))
        ]
        rows.append(
            f'| {steps} | {_shown(options)} | {arm} | {depth} | {deeper} | {_diff_cell(diff)} | '
            f'{gflops[0]} vs {gflops[1]} |'
        )
  if not rows:
    return []
  return [
      '',
      '### Fewer layers: an arm against the baseline with more layers, trained as long',
      '',
      '| steps | options | arm | depth | baseline depth | arm − deeper baseline (val, 95% CI,'
      ' per seed) | beyond seed noise | GFLOPs/step (arm vs baseline) |',
      '| --- | --- | --- | --- | --- | --- | --- | --- |',
  ] + rows


def _curve_at(result: dict[str, Any], field: str, step: int) -> Optional[float]:
  """``field``'s value at ``step`` (a ``[(step, value)]`` curve), None if not recorded."""
  return dict((s, v) for s, v in result.get(field, [])).get(step)


def _paired_at(mine, base, field: str, step: int, unit: float) -> Optional[dict[str, Any]]:
  """:func:`paired` of two ``{seed: result}`` at one step of a curve, in ``unit``."""

  def at(runs):
    values = {s: _curve_at(r, field, step) for s, r in runs.items()}
    return {s: v / unit for s, v in values.items() if v is not None}

  return paired(at(mine), at(base))


def _paired_best(mine, base) -> Optional[dict[str, Any]]:
  """:func:`paired` of two ``{seed: result}``'s lowest validation value along
  training (a corpus small enough to overfit has it before the end)."""

  def best(runs):
    return {s: min(v for _, v in r['val_curve']) for s, r in runs.items() if r.get('val_curve')}

  return paired(best(mine), best(base))


def _early_and_final_table(
    rs: Sequence[dict[str, Any]], longer: Sequence[tuple[int, int, str]], early: int
) -> list[str]:
  """The longer runs' arms against the baseline, paired by seed: validation
  BPC at step ``early`` (the shorter runs' length), at the end and at its
  lowest along training, and the training loss (BPC) at the end. Does an arm
  that ends ahead keep its early lead, and is a late gap in optimisation or in
  generalisation?"""
  rows = []
  for steps, depth, options in longer:
    group = dict(steps=steps, depth=depth, options=options)
    base = _by_seed(rs, arm='baseline', **group)
    for arm in (a for a in ARMS if a != 'baseline'):
      mine = _by_seed(rs, arm=arm, **group)
      diffs = [
          _paired_at(mine, base, 'val_curve', early, 1.0),
          _paired_at(mine, base, 'val_curve', steps, 1.0),
          _paired_best(mine, base),
          _paired_at(mine, base, 'train_curve', steps, math.log(2)),
      ]
      if diffs[1]:
        cells = ' | '.join(_diff_cell(d) if d else '- | -' for d in diffs)
        rows.append(f'| {steps} | {depth} | {_shown(options)} | {arm} | {cells} |')
  if not rows:
    return []
  return [
      '',
      '### Early lead and end, paired by seed (BPC, arm − baseline, 95% CI, per seed)',
      '',
      f'| steps | depth | options | arm | validation at step {early} | beyond seed noise |'
      ' validation at the end | beyond seed noise | lowest validation along training |'
      ' beyond seed noise | training loss at the end | beyond seed noise |',
      '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ] + rows


def _curve_tables(
    rs: Sequence[dict[str, Any]],
    groups: Sequence[tuple[int, int, str]],
    field: str,
    scale: float = 1.0,
) -> list[str]:
  """One markdown table per ``(steps, depth, options)`` group: ``field`` (a
  ``[(step, value)]`` curve) times ``scale``, mean over seeds, per arm (with the
  seeds it averages: arms part-way through their seeds average different ones),
  at ten or so steps (always the last)."""
  lines = []
  for steps, depth, options in groups:
    curves, seeds = {}, {}
    for arm in ARMS:
      mine = _by_seed(rs, arm=arm, steps=steps, depth=depth, options=options)
      mine = {seed: r for seed, r in mine.items() if r.get(field)}  # the seeds it averages
      by_step: dict[int, list[float]] = {}
      for r in mine.values():
        for step, v in r[field]:
          by_step.setdefault(step, []).append(v * scale)
      if by_step:
        curves[arm] = {s: statistics.mean(v) for s, v in by_step.items()}
        seeds[arm] = ', '.join(str(s) for s in sorted(mine))
    if not curves:
      continue
    all_steps = sorted({s for c in curves.values() for s in c})
    shown = all_steps if len(all_steps) <= 10 else all_steps[:: math.ceil(len(all_steps) / 10)]
    if all_steps[-1] not in shown:
      shown.append(all_steps[-1])
    lines += [
        f'{steps} steps, depth {depth}' + f', {_shown(options)}' * bool(options) + ':',
        '',
        '| arm | seeds | ' + ' | '.join(str(s) for s in shown) + ' |',
        '| --- | --- |' + ' --- |' * len(shown),
    ]
    for arm, c in curves.items():
      values = ' | '.join(f'{c[s]:.3f}' if s in c else '-' for s in shown)
      lines.append(f'| {arm} | {seeds[arm]} | {values} |')
    lines.append('')
  return lines


def corpus_report(
    results: Sequence[dict[str, Any]], costs: dict[CostKey, dict[str, Any]], corpus: str
) -> str:
  """The markdown tables of one corpus."""
  from benchmarks import harness  # pylint: disable=g-import-not-at-top

  rs = [r for r in results if r['corpus'] == corpus]
  metric = METRICS[corpus]
  name = {'bpc': 'BPC', 'error': 'error %'}[metric]
  val, test = f'val_{metric}', f'test_{metric}'
  lines = [f'## Corpus `{corpus}`', '']
  groups = _groups(rs)
  lines += [
      f'| steps | depth | options | arm | seeds | val {name} | test {name} | arm − baseline'
      ' (val, 95% CI, per seed) | beyond seed noise | GFLOPs/step | step time vs baseline |',
      '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ]
  for steps, depth, options in groups:
    group = dict(steps=steps, depth=depth, options=options)
    arms = [a for a in ARMS if _by_seed(rs, arm=a, **group)]
    base = _by_seed(rs, arm='baseline', **group)
    for arm in arms:
      mine = _by_seed(rs, arm=arm, **group)
      diff = (
          None
          if arm == 'baseline'
          else paired({s: r[val] for s, r in mine.items()}, {s: r[val] for s, r in base.items()})
      )
      cost = costs.get(_run(next(iter(mine.values()))).cost_key, {})
      gflops = harness.gflops_cell(cost)
      ratio = f'{cost["step_ratio"]:.3f}x' if cost.get('step_ratio') else '-'
      ratio += ' (under load)' * bool(cost.get('measured_under_load'))
      lines.append(
          f'| {steps} | {depth} | {_shown(options)} | {arm} | {len(mine)} | '
          f'{_mean_std([r[val] for r in mine.values()])} | '
          f'{_mean_std([r[test] for r in mine.values()])} | '
          f'{_diff_cell(diff) if diff else "- | -"} | {gflops} | {ratio} |'
      )
  if any(costs.get(_run(r).cost_key, {}).get('measured_under_load') for r in rs):
    lines += [
        '',
        '`(under load)`: step time measured while other jobs shared the cores (recorded as'
        ' `measured_under_load` in its costs file); its GFLOPs are exact, its step time is not.',
    ]
  if any(costs.get(_run(r).cost_key, {}).get('gflops_lower_bound') for r in rs):
    lines += [
        '',
        "`>=`: the step has a loop (area attention's query blocks) whose body XLA's"
        ' `cost_analysis()` counts once, so its GFLOPs are a lower bound.',
    ]
  lines += _fewer_layers_table(rs, costs, val)
  longer = [g for g in groups if g[0] > groups[0][0]] if metric == 'bpc' and groups else []
  lines += _early_and_final_table(rs, longer, early=groups[0][0]) if longer else []
  lines += ['', f'### Learning curves (validation {name}, mean over seeds)', '']
  lines += _curve_tables(rs, groups, 'val_curve')
  if longer:
    # Is a late reversal overfitting (train still better) or slower
    # optimisation (train worse too)? The training loss tells them apart.
    lines += [
        '### Training loss along the longer runs (BPC: the mean over the training steps'
        ' since the previous evaluation, mean over seeds)',
        '',
    ]
    lines += _curve_tables(rs, longer, 'train_curve', scale=1 / math.log(2))
  return '\n'.join(lines)


RUN_FIELDS = (
    'key',
    'corpus',
    'arm',
    'family',
    'depth',
    'steps',
    'seed',
    'metric',
    'val_bpc',
    'test_bpc',
    'val_error',
    'test_error',
    'val_loss',
    'test_loss',
    'train_loss',
    'steps_per_sec_median',
    'load_average_at_end',
)


def write_report(
    study_dir: pathlib.Path, out_dir: pathlib.Path, best_arm: str = 'cp_kv'
) -> list[pathlib.Path]:
  """``lm_study_<corpus>.md``, ``lm_study_runs.csv`` and ``lm_study_cost.png``
  (BPC vs step time and vs GFLOPs per family over depths, where runs at the
  study's own settings have costs) in ``out_dir``."""
  results, costs = load_results(study_dir), load_costs(study_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  path = out_dir / 'lm_study_runs.csv'
  with open(path, 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=RUN_FIELDS, extrasaction='ignore')
    w.writeheader()
    w.writerows(sorted(results, key=lambda r: r['key']))
  written.append(path)
  for corpus in sorted({r['corpus'] for r in results}):
    path = out_dir / f'lm_study_{corpus}.md'
    path.write_text(corpus_report(results, costs, corpus) + '\n')
    written.append(path)
  steps, points = _cost_points(results, costs)
  if points:  # the depth study's runs (the comparisons' tables show their costs)
    written.append(_plot(points, steps, out_dir / 'lm_study_cost.png'))
  written += _long_report(study_dir, results, out_dir)
  if any(r.get('lr') is not None for r in results):
    from benchmarks import lm_comparisons  # pylint: disable=g-import-not-at-top

    path = out_dir / 'lm_study_comparisons.md'
    path.write_text(lm_comparisons.report(results, best_arm, costs) + '\n')
    written.append(path)
    drawn = lm_comparisons.figure(results, out_dir / 'lm_study_comparisons.png', best_arm)
    written += [drawn] if drawn else []  # None: no comparison has a result yet
  return written


def load_diagnostics(study_dir: pathlib.Path) -> dict[str, dict[str, Any]]:
  """``{run key: diagnostics}``, in :data:`ARMS` order (baseline first)."""
  found = {p.stem: json.loads(p.read_text()) for p in (study_dir / 'diagnostics').glob('*.json')}
  return dict(sorted(found.items(), key=lambda kv: (list(ARMS).index(parse_key(kv[0]).arm), kv[0])))


def _long_report(study_dir, results, out_dir: pathlib.Path) -> list[pathlib.Path]:
  """The long runs' figures (learning curves, per-position losses) and the
  diagnostics' tables, when there are long runs / diagnostics."""
  from benchmarks import lm_diagnostics, lm_study_figures  # pylint: disable=g-import-not-at-top

  written = []
  lm = [r for r in results if r['corpus'] in CORPORA and not _options(r)]
  long_steps = max((r['steps'] for r in lm), default=0)
  if any(r['steps'] < long_steps for r in lm):  # a longer group exists
    written.append(
        lm_study_figures.long_curves(lm, long_steps, list(ARMS), out_dir / 'lm_study_long.png')
    )
  diagnostics = load_diagnostics(study_dir)
  if diagnostics:
    path = out_dir / 'lm_study_diagnostics.md'
    path.write_text(lm_diagnostics.report(diagnostics) + '\n')
    written.append(path)
    by_corpus: dict[str, dict[str, Any]] = {}
    for key, d in diagnostics.items():
      by_corpus.setdefault(parse_key(key).corpus, {})[key] = d
    written.append(lm_study_figures.position_losses(by_corpus, out_dir / 'lm_study_positions.png'))
  return written


def _cost_points(results, costs) -> tuple[int, dict[tuple[str, str], list[tuple]]]:
  """``(steps, {(corpus, family arm): [(step_ms, gflops, mean val BPC, std, depth)]})``
  over depths, for the LM runs at the study's own settings (no options) and their
  shortest ``steps``."""
  results = [r for r in results if r['corpus'] in CORPORA and not _options(r)]
  steps = min((r['steps'] for r in results), default=0)
  points = {}
  for corpus in sorted({r['corpus'] for r in results}):
    for family_arm in ('baseline', 'cp'):
      pts = []
      for depth in sorted({r['depth'] for r in results if r['arm'] == family_arm}):
        mine = [
            r
            for r in results
            if (r['corpus'], r['arm'], r['depth'], r['steps']) == (corpus, family_arm, depth, steps)
        ]
        cost = costs.get(_run(mine[0]).cost_key, {}) if mine else {}
        vals = [r['val_bpc'] for r in mine]
        if vals and cost.get('step_ms') and not cost.get('gflops_lower_bound'):
          err = statistics.stdev(vals) if len(vals) > 1 else 0.0
          pts.append((cost['step_ms'], cost['gflops'], statistics.mean(vals), err, depth))
      if pts:
        points[corpus, family_arm] = pts
  return steps, points


def _plot(points, steps: int, path: pathlib.Path) -> pathlib.Path:
  """BPC against step time and against GFLOPs (:func:`_cost_points`), a row per corpus."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  corpora = sorted({c for c, _ in points})
  fig, axes = plt.subplots(len(corpora), 2, figsize=(10, 4 * len(corpora)), squeeze=False)
  for (corpus, family_arm), pts in points.items():
    row = axes[corpora.index(corpus)]
    for ax, xi, label in ((row[0], 0, 'step time (ms, CPU)'), (row[1], 1, 'GFLOPs per step')):
      ax.errorbar(
          [p[xi] for p in pts],
          [p[2] for p in pts],
          yerr=[p[3] for p in pts],
          marker='o',
          capsize=3,
          label=ARMS[family_arm].family,
      )
      for p in pts:
        ax.annotate(f'L={p[4]}', (p[xi], p[2]), textcoords='offset points', xytext=(4, 4))
      ax.set_xlabel(label)
      ax.set_ylabel(f'validation BPC ({corpus}, {steps} steps)')
      ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# ----------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------

_STUDY_DIR = flags.DEFINE_string('study_dir', None, 'Where runs, results and costs are kept.')
_GROUPS = flags.DEFINE_list('groups', ['depth', 'ablation', 'long', 'images'], f'Any of {GROUPS}.')
_CORPORA = flags.DEFINE_list('corpora', list(CORPORA), 'Corpora of the depth group.')
_DEPTHS = flags.DEFINE_list('depths', ['1', '2', '4'], 'Depths of the depth group.')
_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of every group.')
_ABL_CORPUS = flags.DEFINE_enum('ablation_corpus', 'code', CORPORA, 'Corpus of ablation/long.')
_ABL_DEPTH = flags.DEFINE_integer('ablation_depth', 2, 'Depth of the ablation and long groups.')
_IMAGE_DEPTHS = flags.DEFINE_list('image_depths', ['20'], 'ResNet depths of the images group.')
_REPORT = flags.DEFINE_string('report', None, 'Write the report to this directory and stop.')
_TRAIN_ONE = flags.DEFINE_string('train_one', None, 'Internal: train one run key.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'List the runs and whether each is done.')
_ALLOW_LOAD = flags.DEFINE_bool(
    'allow_load', False, 'costs: time while other processes load the machine (rows marked).'
)
_LONG_ARMS = flags.DEFINE_list('long_arms', list(LONG_ARMS), 'Arms of the long group.')
_BEST_ARM = flags.DEFINE_string(
    'best_arm',
    'cp_kv',
    'The arm the later comparisons add to the default ContextPool (prose: the only arm).',
)
_DIAGNOSE_EXISTING = flags.DEFINE_bool(
    'diagnose_existing',
    False,
    'Train again the diagnosed runs (long, seed 0) that have a result but no diagnostics.',
)
_SIZE_FLAGS = {
    f.name: flags.DEFINE_integer(f'size_{f.name}', f.default, f'Sizes.{f.name}')
    for f in dataclasses.fields(Sizes)
}


def _size_flags(sizes: Sizes) -> list[str]:
  return [f'--size_{k}={v}' for k, v in dataclasses.asdict(sizes).items()]


def _check_choices(name: str, values: Sequence[str], allowed: Sequence[str]) -> None:
  bad = [v for v in values if v not in allowed]
  if bad:
    raise app.UsageError(f'--{name}: {bad} not in {list(allowed)}.')


def main(argv):
  del argv
  if not _STUDY_DIR.value:
    raise app.UsageError('--study_dir is required.')
  study_dir = pathlib.Path(_STUDY_DIR.value).expanduser().resolve()
  sizes = Sizes(**{k: f.value for k, f in _SIZE_FLAGS.items()})
  if _TRAIN_ONE.value:
    train_one(parse_key(_TRAIN_ONE.value), sizes, study_dir)
    return
  if _REPORT.value:
    for path in write_report(study_dir, pathlib.Path(_REPORT.value), _BEST_ARM.value):
      print(f'wrote {path}')
    return
  _check_choices('groups', _GROUPS.value, GROUPS)
  _check_choices('corpora', _CORPORA.value, CORPORA)
  _check_choices('long_arms', _LONG_ARMS.value, list(ARMS))
  depths, seeds = [int(d) for d in _DEPTHS.value], [int(s) for s in _SEEDS.value]
  planned = lambda: plan(
      _GROUPS.value,
      corpora=_CORPORA.value,
      depths=depths,
      seeds=seeds,
      sizes=sizes,
      ablation_corpus=_ABL_CORPUS.value,
      ablation_depth=_ABL_DEPTH.value,
      long_arms=_LONG_ARMS.value,
      image_depths=[int(d) for d in _IMAGE_DEPTHS.value],
      best_arm=_BEST_ARM.value,
      results={r['key']: r for r in load_results(study_dir)},
  )
  if _DRY_RUN.value:
    for run in planned():
      finished = done(study_dir, run, sizes, _DIAGNOSE_EXISTING.value)
      print(('done ' if finished else 'todo ') + run.key)
    return
  check_sizes(study_dir, sizes)
  runs = run_as_planned(planned, sizes, study_dir, diagnose_existing=_DIAGNOSE_EXISTING.value)
  if 'costs' in _GROUPS.value:
    # The costs of the listed groups' runs; of every group's when `costs` is alone.
    measured = runs
    if set(_GROUPS.value) == {'costs'}:
      measured = plan(
          GROUPS,
          corpora=_CORPORA.value,
          depths=depths,
          seeds=seeds[:1],
          sizes=sizes,
          ablation_corpus=_ABL_CORPUS.value,
          ablation_depth=_ABL_DEPTH.value,
          best_arm=_BEST_ARM.value,
      )
    measure_costs(cost_pairs(measured), sizes, study_dir, allow_load=_ALLOW_LOAD.value)


if __name__ == '__main__':
  app.run(main)
