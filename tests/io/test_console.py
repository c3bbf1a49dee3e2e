"""The console of `python train.py`: one line per event and per log step off a terminal, a bar
on one; TFDS's chatter only with --verbosity."""

import io
import re
import subprocess
import sys

import pytest

from conftest import REPO
from contextpool_jax.io import console
from contextpool_jax.data import text_builders as tb
from helpers import TINY_TRAIN

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


@pytest.mark.slow  # runs train.py in a subprocess
def test_the_default_run_into_a_file_prints_one_line_per_event_and_log_step(tmp_path):
  """stdout and stderr not terminals (captured, as in ``> run.log 2>&1``): no progress bar,
  whose redraws would be carriage-return frames, but a line per log step."""
  console = _train(tmp_path)
  assert not [c for c in TFDS_CHATTER if c in console], console
  assert '\r' not in console
  events = [line.strip() for line in console.splitlines() if line.strip()]
  run = tmp_path / 'run'
  expected = [
      rf'Preparing local_text \(once; later runs reuse it\): {tmp_path}/tfds/local_text/\S+',
      rf'What each split holds \({tmp_path}/tfds/local_text/\S+/splits\.json\):',
      *(rf'{split}: [\d,]+ bytes \([\d.]+%\), \d+ pieces of \d+ files .*' for split in tb.SPLITS),
      r'Compiling the train step \(its first call waits for it\)\.',
      r'step 2/4: loss \d+\.\d{4}, \d+\.\d\d steps/s, \d\d:\d\d left',
      r'step 2: validation loss=\S+, accuracy=\S+, bpc=\S+',
      rf'step 2: saving checkpoint {run}/checkpoints/2',
      r'step 4/4: loss \d+\.\d{4}, \d+\.\d\d steps/s, 00:00 left',
      r'step 4: validation loss=\S+, accuracy=\S+, bpc=\S+',
      rf'step 4: saving checkpoint {run}/checkpoints/4',
      r'Finished at step 4: eval_validation: loss=\S+, accuracy=\S+, bpc=\S+',
  ]
  assert len(events) == len(expected), '\n'.join(events)
  for line, pattern in zip(events, expected):
    assert re.fullmatch(pattern, line), (line, pattern)


@pytest.mark.slow  # runs train.py in a subprocess
def test_verbosity_brings_back_what_tfds_prints(tmp_path):
  console = _train(tmp_path, '--verbosity=1')
  assert [c for c in TFDS_CHATTER if c not in console] == [], console


class _Stream(io.StringIO):
  """A console stream that says whether it is a terminal."""

  def __init__(self, terminal: bool):
    super().__init__()
    self.terminal = terminal

  def isatty(self) -> bool:
    return self.terminal


@pytest.mark.parametrize('out_terminal', [True, False])
@pytest.mark.parametrize('err_terminal', [True, False])
def test_progress_is_a_bar_on_a_terminal_and_a_line_per_log_step_in_a_file(
    out_terminal, err_terminal
):
  """The bar (on stderr) only where stderr is a terminal; a line per log step only where
  stdout is not one; events on stdout always."""
  out, err = _Stream(out_terminal), _Stream(err_terminal)
  progress = console.Progress(0, 100, enabled=True, out=out, err=err)
  progress.write('an event')
  for step in range(1, 51):
    progress.update()
    if step % 25 == 0:
      progress.logged(step, loss=2.5 - step / 100, steps_per_sec=12.5)
  progress.close()
  lines = out.getvalue().splitlines()
  if out_terminal:
    assert lines == ['an event']
  else:
    assert lines == [
        'an event',
        'step 25/100: loss 2.2500, 12.50 steps/s, 00:06 left',
        'step 50/100: loss 2.0000, 12.50 steps/s, 00:04 left',
    ]
  if err_terminal:
    assert '\r' in err.getvalue() and '50/100' in err.getvalue() and 'loss=' in err.getvalue()
  else:
    assert err.getvalue() == ''


def test_disabled_progress_prints_only_the_events():
  out, err = _Stream(False), _Stream(True)
  progress = console.Progress(0, 10, enabled=False, out=out, err=err)
  progress.write('an event')
  progress.update()
  progress.logged(1, loss=1.0, steps_per_sec=1.0)
  progress.close()
  assert out.getvalue() == 'an event\n' and err.getvalue() == ''
