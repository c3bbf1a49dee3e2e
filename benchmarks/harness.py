"""Side-by-side cost measurement of training steps: params, FLOPs, memory, time.

A :class:`Workload` says how to train one model on random inputs of a fixed
shape: the model, its objective (:mod:`contextpool_jax.training.objectives`),
the batch and the optimizer. :func:`measure` builds *the trainer's own train
step* for it (:func:`contextpool_jax.training.steps.make_train_step`: forward,
backward, gradient norm, the non-finite guard and the optax update) and
returns a row dict:

* ``params``: parameter count, from ``jax.eval_shape`` of ``module.init``
  (nothing is allocated).
* ``gflops``: ``cost_analysis()['flops']`` of the compiled step / 1e9. XLA
  counts the body of a ``while`` loop (``lax.map``, ``lax.scan``) once, not
  once per trip, so for a step with a loop (e.g. area attention's query
  blocks) it is a lower bound: ``gflops_lower_bound`` is then True and tables
  print it as ``>=``.
* ``temp_mib``: ``memory_analysis().temp_size_in_bytes`` of the compiled
  step (activations kept for the backward pass, gradients, workspace);
  ``total_mib`` adds the arguments and outputs not aliased to them (params,
  optimizer state, batch), i.e. the step's peak device memory as XLA plans it.
* ``step_ms``: median wall time of ``repeats`` steps after ``warmup`` steps,
  each ended by ``jax.block_until_ready``; the state is donated and threaded
  through the steps as in training. Skipped (None) with ``timing=False`` or
  when ``total_mib`` exceeds ``max_run_bytes`` (only compiled then, never run).
  Given the baseline's :class:`Runner`, each timed step alternates with a
  baseline step and the relative step time is the median per-pair ratio.

Compilation never executes anything, so params, FLOPs and memory can be
measured at any shape on any machine. :func:`add_relative` adds ``*_rel``
columns (each row / the baseline row); :func:`markdown` and :func:`write_csv`
format a table.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks import quiet
import numpy as np
import optax

from contextpool_jax.models.common import count_params
from contextpool_jax.training import objectives, steps
from contextpool_jax.training.steps import TrainState

Array = jax.Array
Batch = dict[str, Array]


@dataclasses.dataclass(frozen=True)
class Workload:
  """How to train ``module`` for one step on random data.

  Attributes:
    module: the Flax module; called as ``module(*objective.model_args(batch),
      train=...)``, like every model of the registry.
    objective: its loss and metrics (the tasks' convention: a loss sum and the
      batch's total weight).
    make_batch: ``key -> batch`` (a dict of arrays, the step's input).
    optimizer: ``(optax transformation, learning-rate schedule)``, e.g. from
      ``contextpool_jax.training.optim.make_optimizer``.
  """

  module: nn.Module
  objective: objectives.Objective
  make_batch: Callable[[Array], Batch]
  optimizer: tuple[optax.GradientTransformation, Callable[[Any], Any]]


def init_shapes(w: Workload, batch: Batch) -> tuple[Any, dict[str, Any]]:
  """``(params, model_state)`` as ``ShapeDtypeStruct`` trees (nothing allocated)."""

  def init(key, batch):
    return w.module.init(
        {'params': key, 'dropout': key}, *w.objective.model_args(batch), train=False
    )

  variables = dict(jax.eval_shape(init, jax.random.key(0), batch))
  variables.pop('intermediates', None)
  params = variables.pop('params')
  return params, variables


def make_train_step(w: Workload) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """The trainer's step for ``w``: ``(state, batch) -> (state, metric sums)``."""
  tx, schedule = w.optimizer
  return steps.make_train_step(w.module, w.objective, tx, schedule, jax.random.key(1))


def synthetic_state(
    w: Workload, params_shape: Any, model_state_shape: Any, seed: int = 0
) -> TrainState:
  """A state with the right shapes, every float in [-0.02, 0.02] (params and
  model state), the optimizer state from ``optimizer.init``.

  Costs do not depend on parameter values (no data-dependent control flow),
  so the models' own initialisers -- one more compilation per row -- are not
  run, and the values are a cheap deterministic pattern (``0.02 sin(...)``):
  drawing tens of millions of random normals costs more than the step on a
  CPU. The step's loss is still checked to be finite.
  """

  def fill(shapes, offset):
    leaves, treedef = jax.tree_util.tree_flatten(shapes)
    out = []
    for i, s in enumerate(leaves):
      if jnp.issubdtype(s.dtype, jnp.floating):
        phase = np.arange(math.prod(s.shape), dtype=np.float32) * np.float32(0.7548776662)
        value = np.float32(0.02) * np.sin(phase + np.float32((offset + i) * 0.5698402910))
        out.append(jnp.asarray(value.reshape(s.shape), s.dtype))
      else:
        out.append(jnp.zeros(s.shape, s.dtype))
    return jax.tree_util.tree_unflatten(treedef, out)

  params = fill(params_shape, seed)
  opt_state = jax.jit(w.optimizer[0].init)(params)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=opt_state,
      model_state=fill(model_state_shape, seed + 10_000),
      bad_step=jnp.full((), -1, jnp.int32),
  )


def compiled_cost(compiled) -> dict[str, float]:
  """XLA's numbers for a compiled program: ``flops`` (``cost_analysis()``),
  ``temp_bytes`` and ``total_bytes`` = temp + arguments + outputs - aliased
  (donated) buffers, i.e. its peak device memory as planned (NaN if unknown)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0] if cost else {}
  mem = compiled.memory_analysis()
  if mem is None:
    temp = total = math.nan
  else:
    temp = float(mem.temp_size_in_bytes)
    total = (
        float(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes)
        + temp
    )
  return {
      'flops': float((cost or {}).get('flops', math.nan)),
      'temp_bytes': temp,
      'total_bytes': total,
  }


def writes_a_loop(lowered) -> bool:
  """Whether the program as JAX lowered it has a ``while`` loop (``lax.scan``,
  ``lax.map``, ``fori_loop``), whose body XLA's ``cost_analysis()`` counts once,
  so that its ``flops`` is then a lower bound. Read before XLA's passes: loops
  the compiler makes itself (scatters expanded into loops by XLA's classic
  emitters, which the tests select) compute a few additions, not the model's
  FLOPs, and loops of one trip it removes still mean a program that loops."""
  return 'stablehlo.while' in lowered.as_text()


class Runner:
  """A compiled step with its live state and batch: ``step()`` runs and times one."""

  def __init__(self, compiled, state: TrainState, batch: Batch):
    self._compiled, self._state, self._batch = compiled, state, batch
    self.loss = math.nan

  def step(self) -> float:
    """Runs one step (state donated and replaced); returns its wall time in seconds."""
    t0 = time.perf_counter()
    self._state, metrics = self._compiled(self._state, self._batch)
    jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - t0
    self.loss = metrics['loss'] / jnp.maximum(metrics['weight'], 1e-9)
    return elapsed

  def close(self) -> None:
    """Frees the state and batch."""
    self._state = self._batch = self._compiled = None


def _time_steps(runner, baseline, times, ratios, repeats, min_repeats, time_budget_s) -> None:
  """The timed steps of :func:`measure_row` (appended to ``times``, and with a
  ``baseline`` the per-pair ratios to ``ratios``)."""
  spent = 0.0
  while len(times) < repeats:
    if baseline is None:
      times.append(runner.step())
      spent += times[-1]
    else:
      if len(times) % 2:
        base_t = baseline.step()
        times.append(runner.step())
      else:
        times.append(runner.step())
        base_t = baseline.step()
      ratios.append(times[-1] / base_t)
      spent += times[-1] + base_t
    if time_budget_s is not None and len(times) >= min_repeats and spent >= time_budget_s:
      break


def measure_row(
    name: str,
    build_fn: Callable[[], Workload],
    *,
    timing: bool = True,
    warmup: int = 2,
    repeats: int = 5,
    min_repeats: Optional[int] = None,
    time_budget_s: Optional[float] = None,
    max_run_bytes: Optional[float] = None,
    baseline: Optional[Runner] = None,
    allow_load: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[dict[str, Any], Optional[Runner]]:
  """Compiles (and, with ``timing``, runs) one training step.

  Timing: ``warmup`` untimed steps, then ``repeats`` timed steps -- or fewer,
  but at least ``min_repeats``, once the timed steps (and the baseline's) have
  taken ``time_budget_s`` (slow rows get fewer samples, fast rows more). With
  a ``baseline`` runner, every timed step is paired with a baseline step (in
  alternating order) and ``step_ratio`` is the median of the per-pair ratios:
  a slowdown of the machine during the row hits both steps of a pair, so the
  ratio stays fair on a busy machine, where absolute times do not.

  The quiet-machine rule (:mod:`benchmarks.quiet`): the timed steps record the load
  average and the other processes' share of the cores (``load_average``,
  ``others_cpu``, ``measured_under_load``); a loaded timing raises
  :class:`~benchmarks.quiet.LoadedMachine` unless ``allow_load``.

  Returns ``(row, runner)``: row keys ``variant, params, gflops, temp_mib,
  total_mib, step_ms, step_ms_min, step_ms_max, step_ratio, repeats,
  compile_s, loss, note`` (see the module docstring), and the load's with a timing;
  the runner (None if not run) keeps the state alive for later pairing -- ``close()``
  it when done.
  """
  w = build_fn()
  batch_shape = jax.eval_shape(w.make_batch, jax.random.key(0))
  params_shape, model_state_shape = init_shapes(w, batch_shape)
  state_shape = jax.eval_shape(
      lambda p, m: TrainState(
          step=jnp.zeros((), jnp.int32),
          params=p,
          opt_state=w.optimizer[0].init(p),
          model_state=m,
          bad_step=jnp.zeros((), jnp.int32),
      ),
      params_shape,
      model_state_shape,
  )
  step = jax.jit(make_train_step(w), donate_argnums=0)
  t0 = time.perf_counter()
  lowered = step.lower(state_shape, batch_shape)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  cost = compiled_cost(compiled)
  total = cost['total_bytes']
  row: dict[str, Any] = dict(
      variant=name,
      params=count_params(params_shape),
      gflops=cost['flops'] / 1e9,
      gflops_lower_bound=writes_a_loop(lowered),
      temp_mib=cost['temp_bytes'] / 2**20,
      total_mib=total / 2**20,
      step_ms=None,
      step_ms_min=None,
      step_ms_max=None,
      step_ratio=None,
      repeats=0,
      compile_s=compile_s,
      loss=None,
      note='',
  )
  log(
      f'  {name}: {row["params"]:,} params, {gflops_cell(row)} GFLOPs, temp '
      f'{row["temp_mib"]:.1f} MiB, total {row["total_mib"]:.1f} MiB, compiled in '
      f'{compile_s:.1f} s'
  )
  if not timing:
    return row, None
  if max_run_bytes is not None and total > max_run_bytes:
    row['note'] = f'not run: needs {total / 2**30:.1f} GiB > --max_run_gb'
    log(f'  {name}: {row["note"]}')
    return row, None
  runner = Runner(
      compiled, synthetic_state(w, params_shape, model_state_shape), w.make_batch(jax.random.key(3))
  )
  for _ in range(warmup):
    runner.step()
  min_repeats = repeats if min_repeats is None else max(1, min(min_repeats, repeats))
  times: list[float] = []
  ratios: list[float] = []
  with quiet.watch() as load:
    _time_steps(runner, baseline, times, ratios, repeats, min_repeats, time_budget_s)
  row.update(load().fields())
  quiet.check(load(), f'the step of {name!r}', allow_load)
  loss = float(runner.loss)
  row.update(
      step_ms=1e3 * statistics.median(times),
      step_ms_min=1e3 * min(times),
      step_ms_max=1e3 * max(times),
      repeats=len(times),
      loss=loss,
      step_ratio=statistics.median(ratios) if ratios else None,
  )
  if not math.isfinite(loss):
    row['note'] = 'non-finite loss'
  paired = f', {row["step_ratio"]:.3f}x its paired baseline steps' if ratios else ''
  log(
      f'  {name}: {row["step_ms"]:.1f} ms/step (median of {len(times)}, min '
      f'{row["step_ms_min"]:.1f}, max {row["step_ms_max"]:.1f}){paired}'
  )
  return row, runner


def measure(name: str, build_fn: Callable[[], Workload], **kwargs) -> dict[str, Any]:
  """:func:`measure_row` without keeping the state: returns the row."""
  row, runner = measure_row(name, build_fn, **kwargs)
  if runner is not None:
    runner.close()
  return row


# ----------------------------------------------------------------------------
# Tables.
# ----------------------------------------------------------------------------

MEASURED = ('params', 'gflops', 'temp_mib', 'total_mib', 'step_ms')


@dataclasses.dataclass(frozen=True)
class PaperColumn:
  """A number a paper reports for each row, and how it compares to the baseline.

  ``relative``: None (no ratio column), ``'ratio'`` (row / baseline, like our
  measured columns) or ``'inverse'`` (baseline / row: turns a speed such as
  steps/s or images/s into a relative step time, comparable to ``step_ms_rel``).
  """

  key: str
  header: str
  fmt: str = '{:.2f}'
  relative: Optional[str] = 'ratio'
  rel_header: str = 'rel'


def _ratio(a: Any, b: Any) -> Optional[float]:
  if a is None or b is None:
    return None
  a, b = float(a), float(b)
  if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
    return None
  return a / b


def add_relative(
    rows: Sequence[dict[str, Any]], baseline: str, paper_columns: Sequence[PaperColumn] = ()
) -> list[dict[str, Any]]:
  """Adds ``<column>_rel`` = row / baseline row for every measured column and
  ``paper_<key>_rel`` for the paper columns (see :class:`PaperColumn`).

  ``step_ms_rel`` is the row's ``step_ratio`` where it has one (timed in pairs
  with the baseline's steps), else the ratio of the medians.
  """
  base = next(r for r in rows if r['variant'] == baseline)
  out = []
  for r in rows:
    r = dict(r)
    for c in MEASURED:
      r[f'{c}_rel'] = _ratio(r.get(c), base.get(c))
    if r is not base and r.get('step_ratio') is not None:
      r['step_ms_rel'] = r['step_ratio']  # paired with baseline steps (measure_row)
    for p in paper_columns:
      if p.relative == 'ratio':
        r[f'{p.key}_rel'] = _ratio(r.get(p.key), base.get(p.key))
      elif p.relative == 'inverse':
        r[f'{p.key}_rel'] = _ratio(base.get(p.key), r.get(p.key))
    out.append(r)
  return out


def _fmt(value: Any, fmt: str) -> str:
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return '-'
  return fmt.format(value)


_MEASURED_HEADERS = (
    ('params', 'params', '{:,}'),
    ('gflops', 'GFLOPs', '{:.2f}'),
    ('temp_mib', 'temp memory (MiB)', '{:.1f}'),
    ('total_mib', 'total memory (MiB)', '{:.1f}'),
    ('step_ms', 'step time (ms)', '{:.1f}'),
)


def gflops_cell(row: Mapping[str, Any], key: str = 'gflops', fmt: str = '{:.2f}') -> str:
  """``row[key]`` formatted, ``>=`` first when the step has a loop whose body
  XLA counted once (``gflops_lower_bound``; module docstring), ``-`` if unknown."""
  cell = _fmt(row.get(key), fmt)
  return '>=' + cell if row.get('gflops_lower_bound') and cell != '-' else cell


def markdown(rows: Sequence[dict[str, Any]], paper_columns: Sequence[PaperColumn] = ()) -> str:
  """A markdown table: each measured column and its ratio, then the paper's."""
  headers = ['variant']
  align = ['---']
  for _, h, _ in _MEASURED_HEADERS:
    headers += [h, 'rel']
    align += ['---:', '---:']
  for p in paper_columns:
    headers.append(p.header)
    align.append('---:')
    if p.relative:
      headers.append(p.rel_header)
      align.append('---:')
  lines = ['| ' + ' | '.join(headers) + ' |', '|' + '|'.join(align) + '|']
  for r in rows:
    cells = [r['variant'] + (f' ({r["note"]})' if r.get('note') else '')]
    for key, _, fmt in _MEASURED_HEADERS:
      if key == 'gflops':
        cells += [gflops_cell(r), gflops_cell(r, 'gflops_rel', '{:.3f}')]
      else:
        cells += [_fmt(r.get(key), fmt), _fmt(r.get(f'{key}_rel'), '{:.3f}')]
    for p in paper_columns:
      cells.append(_fmt(r.get(p.key), p.fmt))
      if p.relative:
        cells.append(_fmt(r.get(f'{p.key}_rel'), '{:.3f}'))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def csv_fields(paper_columns: Sequence[PaperColumn] = ()) -> list[str]:
  fields = ['table', 'variant']
  for c in MEASURED:
    fields += [c, f'{c}_rel']
  fields += [
      'gflops_lower_bound',
      'step_ms_min',
      'step_ms_max',
      'step_ratio',
      'repeats',
      'compile_s',
      'loss',
      'load_average',
      'others_cpu',
      'measured_under_load',
  ]
  for p in paper_columns:
    fields.append(p.key)
    if p.relative:
      fields.append(f'{p.key}_rel')
  return fields + ['shapes', 'note']


def write_csv(path: str, rows: Iterable[Mapping[str, Any]], fields: Sequence[str]) -> None:
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction='ignore')
    writer.writeheader()
    for r in rows:
      writer.writerow({k: ('' if r.get(k) is None else r.get(k)) for k in fields})
