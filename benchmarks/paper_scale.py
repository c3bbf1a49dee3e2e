r"""Every paper config at the paper's shapes, compiled for TPU and for NVIDIA GPUs:
``python -m benchmarks.paper_scale [--platform=gpu]``.

For each row of :data:`ROWS` (a config of the papers and its baseline), with the
compile command's code (``contextpool_jax.training.aot``: libtpu or the CUDA plugin,
no TPU or GPU needed):

* TPU (``--platform=tpu``, ``<out>/paper_scale.csv``): **the smallest v5e slice that
  fits the config's batch**, the train step compiled for 1, 4, 8, 16, ... chips (the
  batch split over them) until the TPU compiler accepts it; and **one chip at the
  largest batch that fits**, the batch halved from the config's until it compiles for
  one v5e chip.
* GPU (``--platform=gpu``, ``<out>/paper_scale_gpu.csv``): **one H100** and **eight
  H100** (one host), each at the largest batch, halving from the config's, whose step
  fits the memory JAX allocates (``aot.GPU_MEMORY_FRACTION``).

Each compiled step's per-device peak memory, GFLOPs and step-time floor
(``aot.StepCost``) go to the CSV as they finish (a rerun skips what is there) and
``<out>/paper_scale.md`` is written from both CSVs. A slow job: a large config takes
minutes per compile on a CPU.
"""

from __future__ import annotations

import csv
import dataclasses
import pathlib
import sys
import time
from absl import app
from absl import flags

from benchmarks import quiet

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Row:
  """A config of the papers (``--config`` and ``--config.<key>`` overrides), the step
  measured (its batch: the config's ``batch_size``, or ``dataset.eval_batch_size`` for
  the evaluation step) and the paper's figures to show beside it."""

  name: str
  config: str
  overrides: tuple[tuple[str, object], ...] = ()
  paper: str = ''
  step: str = 'train'  # or 'eval'

  @property
  def batch_key(self) -> str:
    return 'batch_size' if self.step == 'train' else 'dataset.eval_batch_size'


# The LM rows' attention on TPU: the Pallas kernel (the 32k evaluation needs it). On GPUs
# every row runs XLA's attention (the config's default, chosen by JAX on this CPU machine):
# the compile command traces no cuDNN attention (docs/compile.md, GPUs).
LM = (('model.attention_implementation', 'pallas_tpu'),)
# ContextPool's LM evaluation (Sec. 4.1): 32,768 bytes of context, scored 512 at a time.
EVAL_32K = LM + (('dataset.eval_context', 32768), ('dataset.eval_step', 512))
# What the papers report beside each config (../shared/papers: the ContextPool paper's
# Tables 1, 2, 5, S1, S2; the area attention paper's Sec. 4.1; the lambda slides' tables).
# Their figures are per GPU or per machine, for training or inference, as stated; "not
# reported" where our texts of the papers give no hardware, memory or speed.
CP_T1 = 'ContextPool Table 1, one V100'
ROWS = (
    Row(
        'CP-Transformer(12), enwik8/text8, 2,048 bytes',
        'enwik8:stage1',
        LM,
        'no hardware, memory or speed reported; 39M parameters (Table 5)',
    ),
    Row(
        'Transformer(12), enwik8/text8, 2,048 bytes',
        'enwik8:stage1,baseline',
        LM,
        'the T12 baseline (Al-Rfou et al.): not reported in the ContextPool paper',
    ),
    Row(
        'CP-Transformer(12), enwik8/text8, 32k-byte evaluation',
        'enwik8:stage1',
        EVAL_32K,
        'the evaluation of Sec. 4.1 (32k bytes of context, step 512); no hardware reported',
        step='eval',
    ),
    Row(
        'Transformer(12), enwik8/text8, 32k-byte evaluation',
        'enwik8:stage1,baseline',
        EVAL_32K,
        'not reported',
        step='eval',
    ),
    Row(
        'CP-Transformer-Base, WMT14 en-de',
        'wmt14:en-de,base,cp',
        paper=f'17.6 GB, 1.12 steps/s ({CP_T1})',
    ),
    Row(
        'Area Transformer-Base, WMT14 en-de',
        'wmt14:en-de,base,area',
        paper='0.5 s/step, basic form (0.8 s with Eq. 9), ~32k tokens a step on 8 P100 (area'
        ' attention paper, Sec. 4.1.1)',
    ),
    Row(
        'Transformer-Base, WMT14 en-de',
        'wmt14:en-de,base,standard',
        paper=f'17.2 GB, 1.20 steps/s ({CP_T1}); 0.4 s/step on 8 P100 (area attention paper)',
    ),
    Row('CP-Transformer-Big, WMT14 en-de', 'wmt14:en-de,big,cp', paper='not reported'),
    Row(
        'Transformer-Big, WMT14 en-de',
        'wmt14:en-de,big,standard',
        paper='0.5 s/step, ~16k tokens a step on 8 P100 ("due to the memory constraint"; area'
        ' attention paper)',
    ),
    Row(
        'CP-ViT-B/16, ImageNet',
        'imagenet_vit:cp_vit_b16',
        paper='56.7 GFLOPs an image, 84.1 images/s (ContextPool Table 2, one V100)',
    ),
    Row(
        'ViT-B/16, ImageNet',
        'imagenet_vit:vit_b16',
        paper='55.4 GFLOPs an image, 85.9 images/s (ContextPool Table 2, one V100)',
    ),
    Row(
        'CP-ResNet-50, ImageNet',
        'imagenet_resnet:cp_resnet50',
        paper='26.8M parameters (ContextPool Table S2); no hardware or speed reported',
    ),
    Row(
        'ResNet-50, ImageNet',
        'imagenet_resnet:resnet50',
        paper='26.6M (ContextPool Table S2); 7,240 ex/s (lambda paper, hardware not in our text)',
    ),
    Row(
        'LambdaResNet-50, ImageNet',
        'imagenet_resnet:lambda_resnet50',
        paper='15.0M, 1,160 ex/s; its lambda layers 1.9 GB (lambda paper; hardware not in our'
        ' text)',
    ),
    Row('AA-ResNet-50, ImageNet', 'imagenet_resnet:aa_resnet50', paper='not reported'),
    Row(
        'CP-ResNet-44, CIFAR-10',
        'cifar10_resnet:cp_resnet44',
        paper='0.68M parameters (ContextPool Table S1); no hardware or speed reported',
    ),
    Row('ResNet-44, CIFAR-10', 'cifar10_resnet:resnet44', paper='not reported'),
)
SLICES = (1, 4, 8, 16, 32, 64, 128, 256)  # v5e chips
CSV = {'tpu': 'paper_scale.csv', 'gpu': 'paper_scale_gpu.csv'}  # by --platform
FIELDS = (
    'row',
    'search',
    'topology',
    'batch',
    'fits',
    'peak_gib',
    'compiler_peak_gib',
    'arguments_gib',
    'temporaries_gib',
    'gflops',
    'bound_ms',
    'compile_s',
    'load_average',
    'others_cpu',
    'message',
)


def _config(row: Row, batch: int, gpu: bool = False):
  """``row``'s config at ``batch``; for a GPU without the TPU kernel (:data:`LM`)."""
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  config = command_line.load_config_file(row.config)
  overrides = {k: v for k, v in row.overrides if not (gpu and v == 'pallas_tpu')}
  with config.unlocked():
    config.update_from_flattened_dict(overrides | {row.batch_key: batch})
  return config


def measure(row: Row, topology_name: str, batch: int) -> dict:
  """The step of ``row`` (``row.step``) at ``batch`` on ``topology_name``
  (``aot.parse_topology``'s names): one CSV row."""
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  topology = aot.parse_topology(topology_name)
  out = dict(row=row.name, topology=topology.name, batch=batch)
  started = time.time()
  # The compile time is a by-product: recorded with the load it ran under (quiet.py).
  with quiet.watch() as load:
    try:
      config = _config(row, batch, gpu=topology.chip.gpu is not None)
      (cost,) = aot.compile_config(config, topology, (row.step,))
    except aot.DoesNotFit as e:
      cost, message = None, str(e)[:300]
  fields = load().fields()
  out |= dict(
      compile_s=f'{time.time() - started:.0f}',
      load_average=fields['load_average'],
      others_cpu=fields['others_cpu'],
  )
  if cost is None:
    return out | dict(fits=0, message=message)
  gib = 2**30
  return out | dict(
      fits=1,
      peak_gib=f'{cost.peak_bytes / gib:.2f}',
      compiler_peak_gib=f'{cost.compiler_peak / gib:.2f}' if cost.compiler_peak else '',
      arguments_gib=f'{cost.arguments / gib:.2f}',
      temporaries_gib=f'{cost.temporaries / gib:.2f}',
      gflops=f'{cost.flops / 1e9:.0f}',
      bound_ms=f'{1e3 * cost.bound_seconds(topology.chip):.1f}',
  )


def _done(path: pathlib.Path) -> list[dict]:
  if not path.exists():
    return []
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _append(path: pathlib.Path, record: dict) -> None:
  new = not path.exists()
  with open(path, 'a', newline='') as f:
    writer = csv.DictWriter(f, FIELDS)
    if new:
      writer.writeheader()
    writer.writerow({k: record.get(k, '') for k in FIELDS})
  print(record, flush=True)


def _search(path: pathlib.Path, row: Row, search: str, tries: list[tuple[str, int]]) -> bool:
  """Measures ``row`` at each ``(topology name, batch)`` of ``tries`` in turn (a try in
  ``path`` already is read, not compiled again) until one fits; whether one did."""
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  done = {
      (r['search'], r['topology'], int(r['batch'])): r['fits']
      for r in _done(path)
      if r['row'] == row.name
  }
  for name, batch in tries:
    key = (search, aot.parse_topology(name).name, batch)
    if key not in done:
      record = measure(row, name, batch) | {'search': search}
      _append(path, record)
      done[key] = record['fits']
    if int(done[key]):
      return True
  return False


def _halving(batch: int, smallest: int) -> list[int]:
  """``batch``, ``batch // 2``, ... down to ``smallest``."""
  out = []
  while batch >= smallest:
    out.append(batch)
    batch //= 2
  return out


def run(out: pathlib.Path, rows=ROWS) -> None:
  """The TPU table's searches for ``rows``, into ``<out>/paper_scale.csv``."""
  csv_path = out / CSV['tpu']
  for row in rows:
    batch = int(_config_batch(row))
    # The smallest slice at the config's batch.
    slices = [(f'v5e-{chips}', batch) for chips in SLICES if batch % chips == 0]
    _search(csv_path, row, 'slice', slices)
    # One chip at the largest batch that fits (the slice search's first try, when it fit).
    if not int(_fits(csv_path, row.name, 'slice', 'v5e:1x1', batch)):
      _search(csv_path, row, 'one chip', [('v5e-1', b) for b in _halving(batch // 2, 1)])
  report(out)


GPU_SEARCHES = (('one H100', 'h100:1', 1), ('eight H100', 'h100:8', 8))


def run_gpus(out: pathlib.Path, rows=ROWS) -> None:
  """The GPU table's searches for ``rows``, into ``<out>/paper_scale_gpu.csv``."""
  csv_path = out / CSV['gpu']
  for row in rows:
    batch = int(_config_batch(row))
    for search, name, gpus in GPU_SEARCHES:
      _search(csv_path, row, search, [(name, b) for b in _halving(batch, gpus) if b % gpus == 0])
  report(out)


def _config_batch(row: Row) -> int:
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  config = command_line.load_config_file(row.config)
  return config.batch_size if row.step == 'train' else config.dataset.eval_batch_size


def _fits(path, row, search, topology, batch) -> str:
  for r in _done(path):
    if (r['row'], r['search'], r['topology'], int(r['batch'])) == (row, search, topology, batch):
      return r['fits']
  return '0'


def _table(records: list[dict], unit: str) -> list[str]:
  lines = [
      f'| config | search | topology | global batch | fits | peak per {unit} (GiB) |'
      f" compiler's peak (GiB) | GFLOPs per {unit} | bound (ms) | compile (s) | load average,"
      " others' CPU |",
      '| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |',
  ]
  for r in records:
    lines.append(
        f'| {r["row"]} | {r["search"]} | {r["topology"]} | {r["batch"]} |'
        f' {"yes" if r["fits"] == "1" else "no"} | {r["peak_gib"] or "-"} |'
        f' {r.get("compiler_peak_gib") or "-"} | {r["gflops"] or "-"}'
        f' | {r["bound_ms"] or "-"} | {r["compile_s"]} | {r.get("load_average") or "-"},'
        f' {r.get("others_cpu") or "-"} |'
    )
  return lines


def report(out: pathlib.Path) -> str:
  """``paper_scale.md`` from the two CSVs: per row, the TPU and the GPU searches."""
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  h100 = aot.CHIPS['h100']
  lines = [
      "# The papers' configs compiled for TPU v5e and NVIDIA H100",
      '',
      '`python -m benchmarks.paper_scale [--platform=gpu]` (libtpu or the CUDA plugin; no TPU or'
      " GPU): each config's train step (the evaluation step for the 32k-byte rows; their"
      ' batch is the evaluation batch) compiled with `contextpool_jax.training.aot` (what'
      ' `contextpool-compile` prints), per chip or GPU. Two measures of memory'
      ' ([Compiling](../../docs/compile.md#what-it-prints)): the peak, arguments +'
      " temporaries + outputs - donated, and the compiler's own peak ('-': compiled before"
      ' the command read it). On TPU the compiler decides what fits.',
      '',
      '## TPU v5e',
      '',
      "**Slice**: the smallest v5e slice that accepts the config's global batch (tried 1, 4,"
      " 8, 16, ... chips); **one chip**: the largest batch (halving from the config's) that"
      " one v5e chip accepts (the slice row when one chip fits the config's batch). Bound:"
      ' max(FLOPs / 197 TFLOP/s, bytes / 819 GB/s), a floor.',
      '',
      *_table(_done(out / CSV['tpu']), 'chip'),
      '',
      '## NVIDIA H100 (80 GB, SXM)',
      '',
      "**One H100**, **eight H100** (one host): the largest batch, halving from the config's,"
      f' whose step (by both measures) fits the {aot.GPU_MEMORY_FRACTION:.0%} of the GPU that'
      f' JAX allocates by default ({h100.usable_bytes / 2**30:.0f} GiB; XLA_PYTHON_CLIENT_MEM_FRACTION). XLA'
      " attention (the command compiles no cuDNN attention). XLA's GPU compiler counts no FLOPs: they"
      ' are the step lowered for one CPU device, split over the GPUs. Bound: FLOPs /'
      f' {h100.peak_flops / 1e12:g} TFLOP/s (bf16 dense), a floor.',
      '',
      *_table(_done(out / CSV['gpu']), 'GPU'),
      '',
      "What the papers report beside each config (their hardware's figures, as stated):",
      '',
      '| config | the paper |',
      '| --- | --- |',
  ]
  lines += [f'| {row.name} | {row.paper} |' for row in ROWS]
  text = '\n'.join(lines) + '\n'
  (out / 'paper_scale.md').write_text(text)
  return text


FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  aot.compile_only()
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  rows = [r for r in ROWS if not FLAGS.rows or any(s in r.name for s in FLAGS.rows)]
  (run_gpus if FLAGS.platform == 'gpu' else run)(out, rows)
  print(report(out))


def define_flags() -> None:
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Output directory.')
  flags.DEFINE_list('rows', [], 'Only the rows whose name contains one of these.')
  flags.DEFINE_enum('platform', 'tpu', sorted(CSV), 'TPU v5e slices, or one and eight H100.')


if __name__ == '__main__':
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  define_flags()
  app.run(main)
