r"""Against the implementations users would otherwise use: ``python -m benchmarks.peers``.

Regenerates issue 16's comparison table in one run, side by side:

* basic 1D area attention (batch 4, 8 heads, n 256, depth 64, max width 5):
  tensor2tensor's own ``tensor2tensor/layers/area_attention.py``
  (``dot_product_area_attention``, key mode 'mean', value mode 'sum') in
  TensorFlow with XLA (``tf.function(jit_compile=True)``) and in graph mode
  (``tf.function``), against ours (:func:`dot_product_area_attention`); each
  also relative to plain softmax attention in the same framework.
* the global and the conv (r = 23) LambdaLayer at 56x56x64, batch 2: timm's
  ``timm.layers.LambdaLayer`` (PyTorch) against ours, BatchNorm in training
  mode, gradients of ``sum(y ** 2)`` with respect to all parameters.

Peers never enter this repository or its requirements: they are installed on
demand into separate virtualenvs under ``--peer_env`` (default
``~/.cache/contextpool_peers``; ``tf/`` and ``torch/``, see :data:`PEER_ENVS`),
and tensor2tensor's file is imported from the installed release at run time
(its path is printed). tensor2tensor 1.15.7 needs ``tensorflow.contrib`` or,
in TF2, tensorflow-addons, which needs Keras 2's ``keras.src.engine``:
TensorFlow 2.15 is the newest release whose own Keras still has it, hence the
pins. Each peer runs in its own subprocess of its env (this file, run as a
script with ``--worker``: standard library imports only at the top), kept
alive for the whole table and driven one step at a time over stdin/stdout
(JSON lines), so its steps interleave with ours, which run in this process:
every repeat times one step of each candidate in turn.

Reported per candidate: median forward+backward time (BatchNorm in training
mode), median forward-only time as at inference (BatchNorm on its running
averages: timm's layer in ``eval()`` mode under ``torch.inference_mode``,
ours with ``train=False``; area attention has no mode; the peers' without a
tape or gradients), ours relative to the fastest peer of the row (forward and
f+b), and memory. Memory is
not measured alike on both sides, and the table says which: peers, the peak
RSS growth of their process over the run (``ru_maxrss`` minus the RSS before
the first step); ours, XLA's planned ``memory_analysis().temp_size_in_bytes``
of the compiled forward+backward. ContextPool's step-time overhead (the
issue's last row) has no peer: ``python -m benchmarks --tables=contextpool_nmt``.

Usage:
  python -m benchmarks.peers [--repeats 5] [--rows area,lambda_global,lambda_conv]
      [--peer_env DIR] [--no_install] [--out benchmarks/results/peers_cpu.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

# Requirements of each peer env: (installed with dependencies, installed with
# --no-deps). tensor2tensor's declared dependencies (gym, mesh-tensorflow,
# tensorflow-probability==0.7.0, ...) conflict with any TF2 that runs on
# Python 3.11; area_attention.py needs only TF, tf-slim, addons and probability.
# timm goes in without torchvision: PyPI's torchvision wheels are CUDA builds
# whose compiled ops cannot load next to the CPU torch (_import_timm_lambda_layer).
PEER_ENVS = {
    'tf': (
        (
            'tensorflow-cpu==2.15.1',
            'tensorflow-addons==0.23.0',
            'tensorflow-probability==0.23.0',
            'tf-slim==1.1.0',
        ),
        ('tensor2tensor==1.15.7',),
    ),
    'torch': (('torch==2.13.0', 'pyyaml', 'huggingface_hub', 'safetensors'), ('timm==1.0.31',)),
}
# The interpreter a peer env is made with, where ours may be too new for it (TensorFlow 2.15
# has wheels up to Python 3.11); None: the one running this file.
PEER_PYTHONS = {'tf': 'python3.11', 'torch': None}
AREA = dict(batch=4, heads=8, length=256, depth=64, width=5)
LAMBDA = dict(batch=2, size=56, channels=64, heads=4, key_depth=16, scope=23)
ROWS = ('area', 'lambda_global', 'lambda_conv')


# ----------------------------------------------------------------------------
# Peer environments.


def ensure_env(root: pathlib.Path, name: str, install: bool, log: Callable[[str], None]) -> str:
  """The python of peer env ``name`` under ``root``, created/installed if needed."""
  env = root / name
  python = env / 'bin' / 'python'
  stamp = env / 'peers-requirements.json'
  wanted = json.dumps(PEER_ENVS[name])
  if python.exists() and stamp.exists() and stamp.read_text() == wanted:
    return str(python)
  if not install:
    raise RuntimeError(
        f'peer env {env} is missing or out of date; run without --no_install to create it'
    )
  log(f'Installing the {name!r} peer env into {env} (once) ...')
  with_deps, no_deps = PEER_ENVS[name]
  if not python.exists():
    maker = PEER_PYTHONS[name] or sys.executable
    if shutil.which(maker) is None:
      raise RuntimeError(f'the {name!r} peer env needs {maker} (on PATH), which is not here')
    subprocess.run([maker, '-m', 'venv', str(env)], check=True)
  pip = [str(python), '-m', 'pip', 'install', '--quiet']
  subprocess.run(pip + list(with_deps), check=True)
  if no_deps:
    subprocess.run(pip + ['--no-deps'] + list(no_deps), check=True)
  stamp.write_text(wanted)
  return str(python)


# ----------------------------------------------------------------------------
# Worker side (runs in a peer env: TensorFlow or PyTorch, no JAX, no repo).


def _rss_bytes() -> int:
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _tf_area(spec: dict[str, Any]) -> tuple[dict, Callable, Callable]:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import importlib
  import importlib.metadata

  import numpy as np
  import tensorflow as tf

  info = {'tensorflow': tf.__version__}
  if spec['impl'] == 't2t':
    t2t = importlib.import_module('tensor2tensor.layers.area_attention')
    info['tensor2tensor'] = importlib.metadata.version('tensor2tensor')
    info['file'] = t2t.__file__

    def attend(q, k, v):
      return t2t.dot_product_area_attention(
          q,
          k,
          v,
          None,
          max_area_width=spec['width'],
          area_key_mode='mean',
          area_value_mode='sum',
          training=False,
      )

  else:  # softmax(q k^T) v, q pre-scaled

    def attend(q, k, v):
      return tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True)), v)

  jit = spec['mode'] == 'xla'

  @tf.function(jit_compile=jit)
  def forward(q, k, v):
    return attend(q, k, v)

  @tf.function(jit_compile=jit)
  def forward_backward(q, k, v):
    with tf.GradientTape() as tape:
      tape.watch([q, k, v])
      out = attend(q, k, v)
      loss = tf.reduce_sum(out * out)
    return tape.gradient(loss, [q, k, v])

  rng = np.random.default_rng(0)
  shape = (spec['batch'], spec['heads'], spec['length'], spec['depth'])
  q, k, v = (tf.constant(rng.normal(size=shape).astype(np.float32)) for _ in range(3))
  q = q * spec['depth'] ** -0.5
  sync = lambda outs: [o.numpy() for o in tf.nest.flatten(outs)]
  return info, lambda: sync(forward_backward(q, k, v)), lambda: sync(forward(q, k, v))


def _import_timm_lambda_layer() -> tuple[Any, str]:
  """timm's ``LambdaLayer`` class and how it was imported.

  ``import timm`` needs torchvision (its data and norm-layer modules import it
  at import time); when that fails, ``timm/layers/lambda_layer.py`` of the
  installed release is imported by file path with ``timm`` and ``timm.layers``
  registered as bare packages (their ``__init__`` files are not run), which
  is all the lambda layer and its helpers (grid, helpers, weight_init) need.
  """
  import importlib
  import importlib.util
  import types

  try:
    from timm.layers import LambdaLayer  # pylint: disable=g-import-not-at-top

    return LambdaLayer, 'import timm.layers'
  except (ImportError, RuntimeError) as e:
    reason = f'{type(e).__name__}: {e}'
  for name in [n for n in sys.modules if n == 'timm' or n.startswith('timm.')]:
    del sys.modules[name]
  root = pathlib.Path(importlib.util.find_spec('timm').origin).parent
  for name, path in (('timm', root), ('timm.layers', root / 'layers')):
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    sys.modules[name] = package
  module = importlib.import_module('timm.layers.lambda_layer')
  return module.LambdaLayer, f'by file path {module.__file__} (import timm: {reason})'


def _timm_lambda(spec: dict[str, Any]) -> tuple[dict, Callable, Callable]:
  import importlib.metadata

  import torch

  TimmLambda, how = _import_timm_lambda_layer()
  info = {'torch': torch.__version__, 'timm': importlib.metadata.version('timm'), 'loaded': how}
  info['threads'] = torch.get_num_threads()
  size, channels = spec['size'], spec['channels']
  layer = TimmLambda(
      channels,
      channels,
      feat_size=(size, size) if spec['position'] == 'global' else None,
      num_heads=spec['heads'],
      dim_head=spec['key_depth'],
      r=None if spec['position'] == 'global' else spec['scope'],
  ).train()
  torch.manual_seed(0)
  x = torch.randn(spec['batch'], channels, size, size)

  def forward_backward():
    layer.train()
    for p in layer.parameters():
      p.grad = None
    (layer(x) ** 2).sum().backward()

  def forward():  # inference: BatchNorm on its running averages, no autograd
    layer.eval()
    with torch.inference_mode():
      layer(x)

  return info, forward_backward, forward


WORKERS = {'tf_area': _tf_area, 'timm_lambda': _timm_lambda}


def worker_main(spec: dict[str, Any]) -> None:
  """Protocol: one JSON line ``{"ready": info}``, then per stdin line
  ``fb`` / ``f`` one timed step -> ``{"ms": t}``; ``mem`` -> peak RSS growth;
  ``quit``. Errors -> ``{"error": text}`` and exit."""
  out = sys.stdout
  try:
    info, forward_backward, forward = WORKERS[spec['kind']](spec)
    base = _rss_bytes()
    forward_backward()  # warm-up (tf.function tracing, XLA compilation)
    forward()
  except Exception as e:  # pylint: disable=broad-except
    import traceback

    out.write(json.dumps({'error': f'{type(e).__name__}: {e}', 'trace': traceback.format_exc()}))
    out.write('\n')
    out.flush()
    return
  out.write(json.dumps({'ready': info}) + '\n')
  out.flush()
  steps = {'fb': forward_backward, 'f': forward}
  for line in sys.stdin:
    cmd = line.strip()
    if cmd in steps:
      start = time.perf_counter()
      steps[cmd]()
      reply = {'ms': 1e3 * (time.perf_counter() - start)}
    elif cmd == 'mem':
      peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
      reply = {'peak_growth_bytes': peak - base}
    else:
      break
    out.write(json.dumps(reply) + '\n')
    out.flush()


# ----------------------------------------------------------------------------
# Parent side.


class PeerProcess:
  """A live worker in a peer env; ``step('fb' | 'f')`` returns milliseconds."""

  def __init__(self, python: str, spec: dict[str, Any]):
    self._log = tempfile.TemporaryFile(mode='w+')
    self._proc = subprocess.Popen(
        [python, str(pathlib.Path(__file__).resolve()), '--worker', json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=self._log,
        text=True,
    )
    self.info = self._read()
    if 'error' in self.info:
      self.close()
      raise RuntimeError(self.info['error'] + '\n' + self.info.get('trace', ''))
    self.info = self.info['ready']

  def _read(self) -> dict[str, Any]:
    line = self._proc.stdout.readline()
    if not line:
      self._log.seek(0)
      raise RuntimeError('peer worker died:\n' + self._log.read()[-3000:])
    return json.loads(line)

  def _ask(self, cmd: str) -> dict[str, Any]:
    self._proc.stdin.write(cmd + '\n')
    self._proc.stdin.flush()
    return self._read()

  def step(self, cmd: str) -> float:
    return self._ask(cmd)['ms']

  def peak_growth_bytes(self) -> float:
    return self._ask('mem')['peak_growth_bytes']

  def close(self) -> None:
    if self._proc.poll() is None:
      try:
        self._proc.stdin.write('quit\n')
        self._proc.stdin.close()
      except OSError:
        pass
      self._proc.wait(timeout=60)
    self._log.close()


@dataclasses.dataclass
class Candidate:
  """One implementation of a row: ``step(cmd)`` -> ms; ``memory()`` -> (bytes, measure)."""

  name: str
  framework: str
  step: Callable[[str], float]
  memory: Callable[[], tuple[float, str]]
  info: dict[str, Any]
  close: Callable[[], None] = lambda: None
  times: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {'fb': [], 'f': []})


def _peer(name: str, framework: str, python: str, spec: dict[str, Any]) -> Candidate:
  """A peer worker; one that fails to start is kept as a row saying what failed."""
  try:
    proc = PeerProcess(python, spec)
  except RuntimeError as e:
    error = str(e).strip().splitlines()
    return Candidate(
        name + ' -- FAILED: ' + error[0],
        framework,
        lambda cmd: float('nan'),
        lambda: (float('nan'), ''),
        {'error': error[-1] if error else ''},
    )
  return Candidate(
      name,
      framework,
      proc.step,
      lambda: (proc.peak_growth_bytes(), 'peak RSS growth'),
      proc.info,
      proc.close,
  )


def _ours(
    name: str,
    forward_backward: Callable,
    forward: Callable,
    args: tuple,
    forward_args: tuple | None = None,
) -> Candidate:
  """Compiles both steps (and warms them up); memory = the compiled f+b's temp bytes.

  ``forward_args`` (default ``args``): the forward's arguments when they differ
  (the lambda layer's inference forward takes its BatchNorm statistics too).
  """
  import jax

  from benchmarks import harness

  inputs = {'fb': args, 'f': args if forward_args is None else forward_args}
  compiled = {
      'fb': jax.jit(forward_backward).lower(*inputs['fb']).compile(),
      'f': jax.jit(forward).lower(*inputs['f']).compile(),
  }
  for cmd, c in compiled.items():
    jax.block_until_ready(c(*inputs[cmd]))

  def step(cmd):
    start = time.perf_counter()
    jax.block_until_ready(compiled[cmd](*inputs[cmd]))
    return 1e3 * (time.perf_counter() - start)

  temp = harness.compiled_cost(compiled['fb'])['temp_bytes']
  info = {'jax': jax.__version__, 'backend': jax.default_backend()}
  return Candidate(name, 'JAX', step, lambda: (temp, 'XLA temp (planned)'), info)


def _grad_sum_squares(fn: Callable, argnums) -> Callable:
  import jax
  import jax.numpy as jnp

  return jax.grad(lambda *a: jnp.sum(jnp.square(fn(*a))), argnums=argnums)


def area_candidates(pythons: dict[str, str]) -> list[Candidate]:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from contextpool_jax.layers.area_attention import dot_product_area_attention

  c = AREA
  rng = np.random.default_rng(0)
  shape = (c['batch'], c['length'], c['heads'], c['depth'])  # ours: [batch, n, heads, depth]
  q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(3))
  q = q * c['depth'] ** -0.5

  def area(q, k, v):
    return dot_product_area_attention(q, k, v, max_area_width=c['width'], scale=1.0)

  def standard(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, scale=1.0)

  out = []
  for impl, mode, name in [
      ('t2t', 'xla', 'tensor2tensor area_attention.py, TF + XLA'),
      ('standard', 'xla', 'standard attention, TF + XLA'),
      ('t2t', 'graph', 'tensor2tensor area_attention.py, TF graph mode'),
      ('standard', 'graph', 'standard attention, TF graph mode'),
  ]:
    spec = dict(kind='tf_area', impl=impl, mode=mode, **c)
    out.append(_peer(name, 'TF', pythons['tf'], spec))
  grads = (0, 1, 2)
  args = (q, k, v)
  out.append(_ours('ours: dot_product_area_attention', _grad_sum_squares(area, grads), area, args))
  out.append(
      _ours(
          'standard attention, JAX (jax.nn.dot_product_attention)',
          _grad_sum_squares(standard, grads),
          standard,
          args,
      )
  )
  return out


def lambda_candidates(pythons: dict[str, str], position: str, batch: int) -> list[Candidate]:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from contextpool_jax.layers.lambda_layer import LambdaLayer

  c = {**LAMBDA, 'batch': batch}
  spec = dict(kind='timm_lambda', position=position, **c)
  label = 'global' if position == 'global' else f'conv (r = {c["scope"]})'
  out = [_peer(f'timm LambdaLayer {label}', 'PyTorch', pythons['torch'], spec)]
  x = jnp.asarray(
      np.random.default_rng(0).normal(size=(c['batch'], c['size'], c['size'], c['channels'])),
      jnp.float32,
  )
  # 'auto' (the default) and the algorithm it replaced as the default: for 'conv', 'banded'
  # ('auto' takes 'fft' at r = 23 on 56x56); for 'global', 'correlation' ('auto': 'rows').
  algorithms = ('auto', 'banded' if position == 'conv' else 'correlation')
  for algorithm in algorithms:
    module = LambdaLayer(
        key_depth=c['key_depth'],
        heads=c['heads'],
        position=position,
        scope_size=c['scope'],
        position_algorithm=algorithm,
    )
    variables = module.init(jax.random.key(0), x)
    state = {'batch_stats': variables['batch_stats']}

    def train_forward(params, x, module=module, state=state):
      y, _ = module.apply({'params': params, **state}, x, train=True, mutable=['batch_stats'])
      return y

    def forward(variables, x, module=module):  # inference: BatchNorm's running averages
      return module.apply(variables, x, train=False)

    name = f"ours: LambdaLayer {label}, position_algorithm='{algorithm}'"
    args = (variables['params'], x)
    fb = _grad_sum_squares(train_forward, 0)
    out.append(_ours(name, fb, forward, args, forward_args=(variables, x)))
  return out


def run_row(candidates: list[Candidate], repeats: int, log: Callable[[str], None]) -> None:
  """Interleaved timing: each repeat runs one step of every candidate in turn."""
  for cmd in ('fb', 'f'):
    for r in range(repeats):
      for cand in candidates:
        cand.times[cmd].append(cand.step(cmd))
      log(
          f'  {cmd} repeat {r + 1}/{repeats}: '
          + ', '.join(
              f'{cand.name.split(",")[0]} {cand.times[cmd][-1]:.0f} ms' for cand in candidates
          )
      )


def _median(xs: list[float]) -> float:
  return statistics.median(xs) if xs else float('nan')


def _is_peer(rec: dict[str, Any]) -> bool:
  """A peer's implementation of the row's mechanism (not a baseline, not failed)."""
  return (
      rec['framework'] != 'JAX'
      and not rec['name'].startswith('standard')
      and not math.isnan(rec['f_ms'])
  )


def row_records(row: str, candidates: list[Candidate]) -> list[dict[str, Any]]:
  """Medians, memory, ours relative to the row's fastest peer (forward and f+b),
  and (area) the ratio to the same framework's standard attention."""
  records = []
  for cand in candidates:
    memory, measure = cand.memory()
    records.append(
        dict(
            row=row,
            name=cand.name,
            framework=cand.framework,
            fb_ms=_median(cand.times['fb']),
            f_ms=_median(cand.times['f']),
            fb_all=[round(t, 1) for t in cand.times['fb']],
            f_all=[round(t, 1) for t in cand.times['f']],
            memory_mib=memory / 2**20,
            memory_measure=measure,
            info=cand.info,
        )
    )
  if row == 'area':
    for rec in records:
      mode = 'graph mode' if 'graph' in rec['name'] else 'XLA'
      base = [
          b
          for b in records
          if b['framework'] == rec['framework']
          and b['name'].startswith('standard')
          and (rec['framework'] == 'JAX' or mode in b['name'])
      ]
      if base and not rec['name'].startswith('standard'):
        rec['ratio'] = rec['fb_ms'] / base[0]['fb_ms']
  peer = [r for r in records if _is_peer(r)]
  for rec in records:
    if peer and rec['framework'] == 'JAX' and not rec['name'].startswith('standard'):
      rec['f_vs_peer'] = rec['f_ms'] / min(r['f_ms'] for r in peer)
      rec['fb_vs_peer'] = rec['fb_ms'] / min(r['fb_ms'] for r in peer)
  return records


def _load(record: dict[str, Any]) -> str:
  """The row's load: the load average and others' CPU while it was timed, and
  'loaded' where the quiet-machine rule (benchmarks/quiet.py) would have refused it."""
  if 'load_average' not in record:
    return 'not recorded'
  loaded = ' (loaded)' if record['measured_under_load'] else ''
  return f'{record["load_average"]}, {record["others_cpu"]:.0%}{loaded}'


def markdown(records: list[dict[str, Any]], repeats: int, note: str = '') -> str:
  lines = [
      f'Forward+backward and forward, median of {repeats} interleaved steps per candidate '
      '(each repeat runs one step of every candidate of its row in turn); float32, CPU. '
      'f+b: BatchNorm in training mode; forward: as at inference (BatchNorm on its running '
      "averages, no gradients). '/ peer': ours over the fastest peer implementation of the "
      "row (the faster of tensor2tensor's two modes), below 1 = ours faster.",
  ]
  if note:
    lines.append(note)
  lines += [
      '',
      '| row | implementation | f+b (ms) | forward (ms) | forward / peer | f+b / peer | '
      'memory (MiB) | memory measure | f+b / standard attention (same framework) | '
      "load average, others' CPU |",
      '|---|---|---:|---:|---:|---:|---:|---|---:|---|',
  ]
  times = lambda r, key: f'{r[key]:.2f}x' if key in r else ''
  for r in records:
    lines.append(
        f'| {r["row"]} | {r["name"]} | {r["fb_ms"]:.0f} | {r["f_ms"]:.0f} | '
        f'{times(r, "f_vs_peer")} | {times(r, "fb_vs_peer")} | '
        f'{r["memory_mib"]:.0f} | {r["memory_measure"]} | {times(r, "ratio")} | '
        f'{_load(r)} |'
    )
  lines += ['', 'Versions and files:', '']
  seen = set()
  for r in records:
    key = json.dumps(r['info'], sort_keys=True)
    if key not in seen:
      seen.add(key)
      lines.append(f'- {r["framework"]}: ' + ', '.join(f'{k} {v}' for k, v in r['info'].items()))
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--worker', help=argparse.SUPPRESS)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--rows', default=','.join(ROWS), help=f'comma-separated subset of {ROWS}')
  parser.add_argument(
      '--peer_env', default=str(pathlib.Path.home() / '.cache' / 'contextpool_peers')
  )
  parser.add_argument('--no_install', action='store_true', help='fail instead of installing')
  parser.add_argument('--out', default=None, help='also write the markdown here')
  parser.add_argument('--note', default='', help='a line printed under the header')
  parser.add_argument(
      '--batches', default=str(LAMBDA['batch']), help='the lambda rows at each of these batches'
  )
  parser.add_argument(
      '--allow_load',
      action='store_true',
      help='keep a row timed while other processes used the machine (marked in the table)',
  )
  args = parser.parse_args(argv)
  if args.worker:
    worker_main(json.loads(args.worker))
    return
  rows = [r for r in args.rows.split(',') if r]
  bad = [r for r in rows if r not in ROWS]
  if bad:
    raise ValueError(f'--rows={args.rows!r}: unknown {bad}; allowed: {ROWS}')
  log = lambda s: print(s, file=sys.stderr, flush=True)
  root = pathlib.Path(args.peer_env).expanduser()
  needed = {'tf'} if 'area' in rows else set()
  needed |= {'torch'} if any(r.startswith('lambda') for r in rows) else set()
  pythons = {name: ensure_env(root, name, not args.no_install, log) for name in sorted(needed)}
  from benchmarks import quiet  # pylint: disable=g-import-not-at-top  # not in the workers

  batches = [int(b) for b in args.batches.split(',') if b]
  jobs = [('area', lambda: area_candidates(pythons))] if 'area' in rows else []
  for position in ('global', 'conv'):
    if f'lambda_{position}' in rows:
      for b in batches:
        make = lambda position=position, b=b: lambda_candidates(pythons, position, b)
        jobs.append((f'lambda_{position}, batch {b}', make))
  records = []
  for row, make in jobs:
    log(f'{row}: starting peers and compiling ...')
    candidates = make()
    try:
      with quiet.watch() as load:
        run_row(candidates, args.repeats, log)
      quiet.check(load(), f'the {row} row', args.allow_load)
      log(f'{row}: {load().describe()}')
      for rec in row_records(row, candidates):
        records.append({**rec, **load().fields()})
    finally:
      for cand in candidates:
        cand.close()
  text = markdown(records, args.repeats, args.note)
  print(text)
  if args.out:
    pathlib.Path(args.out).write_text(text)


if __name__ == '__main__':
  main()
