"""The console of `python train.py`: one line per event; TFDS's chatter only with --verbosity."""

import re
import subprocess
import sys

import pytest

from conftest import REPO
from contextpool_jax.data import text_builders as tb
from test_readme import TINY_TRAIN

pytestmark = pytest.mark.slow  # runs train.py in a subprocess

# The shrunk default command (README "Train"), as test_readme shrinks it, with its progress
# bar on and a log line every other step.
SHRINK = {
    **{k: v for k, v in TINY_TRAIN.items() if k not in ('progress_bar', 'dataset.data_dir')},
    'num_train_steps': 4,
    'log_every_steps': 2,
}
TFDS_CHATTER = (
    'Using custom data configuration',
    'has no dataset_info.json',
    'Downloading and preparing dataset',
    'Generating splits',
    'Shuffling',
    'downloaded and prepared to',
)
PROGRESS = re.compile(r'^\s*\d+%\|.*\| \d+/4 \[')


def _train(tmp_path, *extra):
  args = [f'--config.{k}={v}' for k, v in SHRINK.items()]
  args.append(f'--config.dataset.data_dir={tmp_path / "tfds"}')  # prepared by this run
  out = subprocess.run(
      [sys.executable, 'train.py', '--config', 'configs/default.py', '--workdir']
      + [str(tmp_path / 'run'), *args, *extra],
      capture_output=True,
      text=True,
      timeout=900,
      cwd=REPO,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out.stdout + out.stderr


def _lines(console):
  """The console's lines, a progress bar's redraws (carriage returns) each a line."""
  return [l.strip() for l in re.split(r'[\r\n]', console) if l.strip()]


def test_the_default_run_prints_one_line_per_event(tmp_path):
  console = _train(tmp_path)
  assert not [c for c in TFDS_CHATTER if c in console], console
  lines = _lines(console)
  events = [l for l in lines if not PROGRESS.match(l)]
  run = tmp_path / 'run'
  expected = [
      rf'Preparing local_text \(once; later runs reuse it\): {tmp_path}/tfds/local_text/\S+',
      rf'What each split holds \({tmp_path}/tfds/local_text/\S+/splits\.json\):',
      *(rf'{split}: [\d,]+ bytes \([\d.]+%\), \d+ pieces of \d+ files .*' for split in tb.SPLITS),
      r'Compiling the train step \(its first call waits for it\)\.',
      r'step 2: validation loss=\S+, accuracy=\S+, bpc=\S+',
      rf'step 2: saving checkpoint {run}/checkpoints/2',
      r'step 4: validation loss=\S+, accuracy=\S+, bpc=\S+',
      rf'step 4: saving checkpoint {run}/checkpoints/4',
      r'Finished at step 4: eval_validation: loss=\S+, accuracy=\S+, bpc=\S+',
  ]
  assert len(events) == len(expected), '\n'.join(events)
  for line, pattern in zip(events, expected):
    assert re.fullmatch(pattern, line), (line, pattern)
  assert any(PROGRESS.match(l) and '4/4' in l for l in lines), lines  # the progress bar


def test_verbosity_brings_back_what_tfds_prints(tmp_path):
  console = _train(tmp_path, '--verbosity=1')
  assert [c for c in TFDS_CHATTER if c not in console] == [], console
