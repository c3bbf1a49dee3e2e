"""Storage (contextpool_jax.io.storage): metrics.jsonl cut back to a resumed step, a torn last
line dropped; the TensorBoard event file raises a failed write where tensorboardX's writer loses it
and blocks."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from helpers import cap_file_size
from contextpool_jax.io import storage


@pytest.mark.slow  # in the tier of the full-disk tests (tests/training/test_cluster_faults.py)
def test_metrics_are_cut_back_to_the_resumed_step_and_a_torn_line_dropped(tmp_path):
  path = tmp_path / 'metrics.jsonl'
  lines = [json.dumps({'step': s, 'split': 'train', 'loss': 1.0 / s}) for s in range(1, 7)]
  path.write_text('\n'.join(lines) + '\n' + '{"step": 7, "spl')  # torn by a full disk
  assert storage.resume_metrics(path, 4) == 3
  assert path.read_text() == '\n'.join(lines[:4]) + '\n'
  assert storage.resume_metrics(path, 4) == 0
  assert storage.resume_metrics(tmp_path / 'absent.jsonl', 4) == 0


# tensorboardX's public writer, SummaryWriter, cannot take storage.EventFile's place: it writes
# from a thread, and a write that fails there (a full disk) kills that thread with a traceback
# on stderr and is never raised to the caller; once its queue holds max_queue events, the
# caller's next add_* blocks forever (the training loop would hang, its error unsaid).
# EventFile writes on the caller's thread and raises WriteError at once. Both under a file-size
# limit of 0 (every write that grows a file fails with EFBIG, as on a full disk).
_FULL_DISK = r"""
import os, sys, threading, time
import tensorboardX
from tensorboardX import summary
from contextpool_jax.io import storage
from contextpool_jax.base.errors import WriteError

ours = storage.EventFile(sys.argv[1] + '/ours')
theirs = tensorboardX.SummaryWriter(sys.argv[1] + '/theirs', max_queue=10)
theirs.flush()
"""
_FULL_DISK += cap_file_size(0)
_FULL_DISK += r"""
text = 'x' * 100_000  # an event larger than the file's buffer: written at once
try:
  ours.add(1, summary.text('config', text))
  ours.flush()
except WriteError as e:
  print(f'ours: {e}', flush=True)
returned = []

def log():
  for step in range(1, 40):
    theirs.add_text('config', text, step)
    try:
      theirs.flush()  # does not wait for the thread; it may raise a later error, or not
    except OSError:
      pass
    returned.append(step)

thread = threading.Thread(target=log, daemon=True)
thread.start()
count, since = -1, time.time()
while thread.is_alive() and time.time() - since < 3:  # until no call returns for 3 s
  if len(returned) != count:
    count, since = len(returned), time.time()
  time.sleep(0.05)
print(f'theirs: {len(returned)} calls returned, blocked: {thread.is_alive()}', flush=True)
os._exit(0)
"""


def test_a_process_with_a_full_disk_leaves_no_truncated_bytecode(tmp_path):
  # A module larger than the cap, first imported by a process under it, bytecode writing on (as
  # in CI): a later process must still import it (a .pyc cut at the cap would fail it with
  # "marshal data too short").
  (tmp_path / 'big.py').write_text(
      '\n'.join(f'def f{i}(x):\n  return x + {i} * "abc{i}"' for i in range(3000))
  )
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONDONTWRITEBYTECODE'}
  for script in (cap_file_size(20000) + 'import big\n', 'import big\n'):
    out = subprocess.run(
        [sys.executable, '-c', script], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
  assert (tmp_path / 'big.py').stat().st_size > 100_000


@pytest.mark.slow
def test_tensorboardx_summary_writer_loses_a_failed_write_and_blocks_where_ours_raises(tmp_path):
  out = subprocess.run(
      [sys.executable, '-c', _FULL_DISK, str(tmp_path)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  ours, theirs = out.stdout.splitlines()
  assert re.fullmatch(
      rf'ours: cannot write {re.escape(str(tmp_path))}/ours/events\.out\.tfevents\.\S+: '
      r'\[Errno 27\] File too large',
      ours,
  ), ours
  # The writer thread died on the first event; the queue took 10 more; the 12th call blocks.
  assert theirs == 'theirs: 11 calls returned, blocked: True', theirs
  assert 'Exception in thread' in out.stderr and 'File too large' in out.stderr, out.stderr
