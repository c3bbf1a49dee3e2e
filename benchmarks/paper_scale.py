r"""Every paper config at the paper's shapes, compiled for TPU: ``python -m benchmarks.paper_scale``.

For each row of :data:`ROWS` (a config of the papers and its baseline), with the
compile command's code (``contextpool_jax.training.aot``, libtpu, no TPU needed):

* **the smallest v5e slice that fits the config's batch**: the train step compiled
  for 1, 4, 8, 16, ... chips (the batch split over them) until the TPU compiler
  accepts it;
* **one chip at the largest batch that fits**: the batch halved from the config's
  until it compiles for one v5e chip.

Each compiled step's per-chip peak memory, GFLOPs and step-time floor
(``aot.StepCost``) go to ``<out>/paper_scale.csv`` as they finish (a rerun skips
what is there) and ``<out>/paper_scale.md`` is written from it. A slow job: a large
config takes minutes per compile on a CPU.
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
  """A config of the papers (``--config`` and ``--config.<key>`` overrides), the paper's
  figures to show beside it."""

  name: str
  config: str
  overrides: tuple[tuple[str, object], ...] = ()
  paper: str = ''


LM = (('model.attention_implementation', 'pallas_tpu'),)
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
FIELDS = (
    'row',
    'search',
    'topology',
    'batch',
    'fits',
    'peak_gib',
    'arguments_gib',
    'temporaries_gib',
    'gflops',
    'bound_ms',
    'compile_s',
    'load_average',
    'others_cpu',
    'message',
)


def _config(row: Row, batch: int):
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  config = command_line.load_config_file(row.config)
  with config.unlocked():
    for key, value in row.overrides:
      node = config
      *parents, leaf = key.split('.')
      for parent in parents:
        node = node[parent]
      node[leaf] = value
    config.batch_size = batch
  return config


def measure(row: Row, chips: int, batch: int) -> dict:
  """The train step of ``row`` at ``batch`` on ``chips`` v5e chips: one CSV row."""
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  topology = aot.parse_topology(f'v5e-{chips}')
  out = dict(row=row.name, topology=topology.name, batch=batch)
  started = time.time()
  # The compile time is a by-product: recorded with the load it ran under (quiet.py).
  with quiet.watch() as load:
    try:
      (cost,) = aot.compile_config(_config(row, batch), topology, ('train',))
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


def run(out: pathlib.Path, rows=ROWS) -> None:
  csv_path = out / 'paper_scale.csv'
  for row in rows:
    config_batch = int(_config_batch(row))
    done = {
        (r['search'], r['topology'], int(r['batch']))
        for r in _done(csv_path)
        if r['row'] == row.name
    }
    # The smallest slice at the config's batch.
    for chips in SLICES:
      if config_batch % chips:
        continue
      key = ('slice', f'v5e:{_shape(chips)}', config_batch)
      record = None
      if key not in done:
        record = measure(row, chips, config_batch) | {'search': 'slice'}
        _append(csv_path, record)
      fits = record['fits'] if record else _fits(csv_path, row.name, 'slice', key[1], config_batch)
      if int(fits):
        break
    # One chip at the largest batch that fits (the slice search's first try, when it fit).
    if int(_fits(csv_path, row.name, 'slice', 'v5e:1x1', config_batch)):
      continue
    batch = config_batch // 2  # the slice search tried one chip at the config's batch first
    while batch >= 1:
      key = ('one chip', 'v5e:1x1', batch)
      record = None
      if key not in done:
        record = measure(row, 1, batch) | {'search': 'one chip'}
        _append(csv_path, record)
      fits = record['fits'] if record else _fits(csv_path, row.name, 'one chip', 'v5e:1x1', batch)
      if int(fits):
        break
      batch //= 2
  report(out)


def _config_batch(row: Row) -> int:
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  return command_line.load_config_file(row.config).batch_size


def _shape(chips: int) -> str:
  from contextpool_jax.training import aot  # pylint: disable=g-import-not-at-top

  return 'x'.join(map(str, aot.slice_shape(chips, 2)))


def _fits(path, row, search, topology, batch) -> str:
  for r in _done(path):
    if (r['row'], r['search'], r['topology'], int(r['batch'])) == (row, search, topology, batch):
      return r['fits']
  return '0'


def report(out: pathlib.Path) -> str:
  """``paper_scale.md`` from the CSV: per row, the smallest fitting slice and one chip."""
  records = _done(out / 'paper_scale.csv')
  lines = [
      "# The papers' configs compiled for TPU v5e",
      '',
      "`python -m benchmarks.paper_scale` (libtpu, no TPU): each config's train step compiled"
      ' with `contextpool_jax.training.aot` (what `contextpool-compile` prints), per chip.'
      " **Slice**: the smallest v5e slice that accepts the config's global batch (tried 1, 4,"
      " 8, 16, ... chips); **one chip**: the largest batch (halving from the config's) that"
      " one v5e chip accepts (the slice row when one chip fits the config's batch). Bound: max(FLOPs / 197 TFLOP/s, bytes / 819 GB/s), a floor.",
      '',
      "| config | search | topology | global batch | fits | peak per chip (GiB) | GFLOPs per chip | bound (ms) | compile (s) | load average, others' CPU |",
      '| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- |',
  ]
  for r in records:
    lines.append(
        f'| {r["row"]} | {r["search"]} | {r["topology"]} | {r["batch"]} |'
        f' {"yes" if r["fits"] == "1" else "no"} | {r["peak_gib"] or "-"} | {r["gflops"] or "-"}'
        f' | {r["bound_ms"] or "-"} | {r["compile_s"]} | {r.get("load_average") or "-"},'
        f' {r.get("others_cpu") or "-"} |'
    )
  lines += [
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

  aot.libtpu_as_compiler()
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  rows = [r for r in ROWS if not FLAGS.rows or any(s in r.name for s in FLAGS.rows)]
  run(out, rows)
  print(report(out))


def define_flags() -> None:
  flags.DEFINE_string('out', str(ROOT / 'benchmarks' / 'results'), 'Output directory.')
  flags.DEFINE_list('rows', [], 'Only the rows whose name contains one of these.')


if __name__ == '__main__':
  if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
  define_flags()
  app.run(main)
