"""Faults a long run meets: kill -9, SIGTERM, damaged checkpoints, a changed config.

Nothing may be lost or silently restarted: after any of them, running the same
command again ends with exactly the parameters of an uninterrupted run, or
stops with one clear message.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import jax
import numpy as np
import pytest

from configs import default as default_config
from contextpool_jax.runs import layout, workdirs
from contextpool_jax.training import checkpoints, trainer
from contextpool_jax.runs.workdirs import load_variables
from conftest import REPO
from helpers import committed_steps, flags, metrics, tiny_run_config

pytestmark = pytest.mark.slow  # training processes killed and resumed

# Runs train.py with a fault injected: SIGKILL of the whole process at the
# n-th call of a function (argv[1] = 'module:function', argv[2] = n; after the
# call returns), then train.py's own flags.
_KILL_DRIVER = r"""
import os, runpy, signal, sys, importlib
target, n = sys.argv[1], int(sys.argv[2])
module_name, attr = target.split(':')
owner_name, _, function = attr.rpartition('.')
module = importlib.import_module(module_name)
owner = getattr(module, owner_name) if owner_name else module
original = getattr(owner, function)
calls = [0]
def wrapped(*args, **kwargs):
  out = original(*args, **kwargs)
  calls[0] += 1
  if calls[0] == n:
    os.kill(os.getpid(), signal.SIGKILL)
  return out
setattr(owner, function, wrapped)
sys.argv = [sys.argv[0]] + sys.argv[3:]
runpy.run_path({train!r}, run_name='__main__')
"""


def _env():
  return dict(os.environ, JAX_PLATFORMS='cpu')


def _train(args, *, kill_at=None, check=True):
  if kill_at is None:
    cmd = [sys.executable, str(REPO / 'train.py'), *args]
  else:
    driver = _KILL_DRIVER.format(train=str(REPO / 'train.py'))
    cmd = [sys.executable, '-c', driver, kill_at[0], str(kill_at[1]), *args]
  out = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=900)
  if check:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return out


def _final(workdir):
  variables, step = load_variables(workdir)
  return step, jax.tree.map(np.asarray, variables['params'])


def _assert_same_final(a, b):
  step_a, params_a = _final(a)
  step_b, params_b = _final(b)
  assert step_a == step_b
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  assert metrics(a)['eval_validation'][-1] == metrics(b)['eval_validation'][-1]


@pytest.fixture(scope='module')
def reference(corpus, tmp_path_factory):
  """An uninterrupted 8-step run (checkpoints at 2, 4, 6, 8; evaluation at 4 and 8)."""
  root = tmp_path_factory.mktemp('reference')
  args = lambda workdir: flags(corpus, root / 'data', workdir, checkpoint_every_steps=2)
  _train(args(root / 'uninterrupted'))
  return args, root / 'uninterrupted'


# One run killed three times, then run to its end: (what is killed, the function whose
# n-th call, counted from the start of the killed run, ends with SIGKILL). After the
# first kill every rerun resumes from the step-2 checkpoint; none gets to commit step 4.
KILLS = [
    # while the step-4 checkpoint is being written asynchronously: right after
    # CheckpointManager.save returned for the second time (steps 2 and 4)
    ('during_async_checkpoint_write', ('orbax.checkpoint:CheckpointManager.save', 2)),
    # between checkpoints: after the first training batch of the resumed run (step 3)
    # is put on the devices
    ('mid_training', ('contextpool_jax.training.sharding:put_batch', 1)),
    # during the first evaluation (its first batch is on the devices), at step 4,
    # before checkpoint 4 (the first call makes the training sums)
    ('during_evaluation', ('contextpool_jax.training.steps:zero_sums', 2)),
]


def test_kill_9_then_rerun_equals_an_uninterrupted_run(reference, tmp_path):
  """Each kill leaves the step-2 checkpoint as the last committed one (a cut
  asynchronous write leaves at most its temporary directory, which the rerun
  ignores), each rerun resumes there, and the last one ends with the uninterrupted
  run's parameters and evaluation. One run for the three kill points: each rerun
  is the next kill's run, so every kill is checked by the resume after it."""
  args, uninterrupted = reference
  workdir = tmp_path / 'run'
  for i, (point, kill_at) in enumerate(KILLS):
    killed = _train(args(workdir), kill_at=kill_at, check=False)
    assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-2000:])
    assert committed_steps(workdir) == [2], point
    if i > 0:  # a rerun of a killed run
      assert f'Resumed from {workdir / "checkpoints"} at step 2.' in killed.stdout, point
  resumed = _train(args(workdir))
  assert f'Resumed from {workdir / "checkpoints"} at step 2.' in resumed.stdout
  _assert_same_final(workdir, uninterrupted)


def test_sigterm_saves_the_current_step_and_the_rerun_resumes_there(reference, tmp_path):
  args, uninterrupted = reference
  workdir = tmp_path / 'run'
  # Checkpoints every 2 steps would hide the preemption save: every 100 here.
  proc_args = args(workdir) + [
      '--config.checkpoint_every_steps=100',
      '--config.num_train_steps=400',
  ]
  proc = subprocess.Popen(
      [sys.executable, str(REPO / 'train.py'), *proc_args],
      env=_env(),
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  log = workdir / 'metrics.jsonl'
  deadline = time.time() + 600
  while not (log.exists() and '"train"' in log.read_text()) and time.time() < deadline:
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 143, out[-2000:] + err[-3000:]
  assert 'Traceback' not in err
  saved = committed_steps(workdir)
  assert len(saved) == 1 and 2 <= saved[0] < 400
  assert f'saved a checkpoint at step {saved[0]}' in out
  # The rerun (back to the 8-step schedule, the reference's) resumes exactly there.
  if saved[0] <= 8:
    resumed = _train(args(workdir))
    assert f'at step {saved[0]}.' in resumed.stdout
    _assert_same_final(workdir, uninterrupted)
  else:  # a slow start overshot step 8: resume to a later step instead
    resumed = _train(proc_args[:-1] + [f'--config.num_train_steps={saved[0] + 2}'])
    assert f'at step {saved[0]}.' in resumed.stdout
    assert committed_steps(workdir)[-1] == saved[0] + 2


def test_sigterm_on_two_processes_saves_one_common_step(corpus, tmp_path):
  workdir = tmp_path / 'run'
  args = flags(
      corpus,
      tmp_path / 'data',
      workdir,
      steps=400,
      log_every_steps=2,
      checkpoint_every_steps=1000,
      eval_every_steps=1000,
  )
  proc = subprocess.Popen(
      [
          sys.executable,
          '-m',
          'contextpool_jax.commands.launch',
          '--num_processes=2',
          '--devices_per_process=2',
          '--',
          *args,
      ],
      env=_env(),
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
  )
  log = workdir / 'metrics.jsonl'
  deadline = time.time() + 600
  while not (log.exists() and '"train"' in log.read_text()) and time.time() < deadline:
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)  # the launcher forwards it to both processes
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 143, out[-4000:]
  saved = committed_steps(workdir)
  assert len(saved) == 1
  lines = [l for l in out.splitlines() if 'saved a checkpoint at step' in l]
  assert len(lines) == 2 and all(f'at step {saved[0]} ' in l for l in lines), lines


# ----------------------------------------------------------------------------
# Damaged checkpoints and a changed config (in process: fast).
# ----------------------------------------------------------------------------


def _largest_array_file(step_dir):
  files = [p for p in step_dir.rglob('*') if p.is_file() and p.parent.name == 'd']
  return max(files, key=lambda p: p.stat().st_size)


DAMAGE = {
    'array_file_missing': lambda step_dir: _largest_array_file(step_dir).unlink(),
    'array_file_truncated': lambda step_dir: _largest_array_file(step_dir).write_bytes(
        _largest_array_file(step_dir).read_bytes()[:100]
    ),
    'metadata_truncated': lambda step_dir: (step_dir / 'state' / '_METADATA').write_text(
        (step_dir / 'state' / '_METADATA').read_text()[:50]
    ),
    'data_iterator_state_missing': lambda step_dir: next(
        (step_dir / 'data').glob('process_*.json')
    ).unlink(),
}


@pytest.fixture(scope='module')
def uninterrupted_six(corpus, tmp_path_factory):
  root = tmp_path_factory.mktemp('six')
  trainer.train_and_evaluate(tiny_run_config(corpus, root, 6), str(root / 'run'))
  return root / 'run'


@pytest.mark.parametrize('damage', sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    corpus, tmp_path, uninterrupted_six, damage
):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 4), str(workdir))
  DAMAGE[damage](workdir / 'checkpoints' / '4')
  with pytest.warns(
      UserWarning,
      match=r'(?s)Resuming from checkpoint step 2 in .*'
      r'step 4 \(moved to .*damaged_checkpoints/4-',
  ):
    result = trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 6), str(workdir))
  assert result['step'] == 6
  assert [p.name.split('-')[0] for p in (workdir / 'damaged_checkpoints').iterdir()] == ['4']
  step, params = _final(workdir)
  step_ref, params_ref = _final(uninterrupted_six)
  assert step == step_ref == 6
  jax.tree.map(np.testing.assert_array_equal, params, params_ref)


def test_no_readable_checkpoint_stops_with_one_message_not_a_restart(corpus, tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 4, keep_checkpoints=2), str(workdir))
  for step in (2, 4):
    DAMAGE['array_file_missing'](workdir / 'checkpoints' / str(step))
  with pytest.raises(
      checkpoints.CheckpointError,
      match=r'(?s)No checkpoint in .*checkpoints ' r'could be read.*step 4.*step 2',
  ):
    trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 6), str(workdir))
  assert not (workdir / 'checkpoints' / '6').exists()  # nothing trained from step 0


def test_resuming_with_a_different_model_names_what_differs(corpus, tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 2), str(workdir))
  saved = (workdir / 'config.json').read_text()
  changed = tiny_run_config(corpus, tmp_path, 4, **{'model.num_layers': 2, 'model.emb_dim': 48})
  with pytest.raises(
      checkpoints.CheckpointError,
      match=r'(?s)different configuration.*'
      r'model\.emb_dim: saved 32, now 48.*model\.num_layers: saved 1, now 2',
  ):
    trainer.train_and_evaluate(changed, str(workdir))
  assert (workdir / 'config.json').read_text() == saved  # nothing written or restored
  # Fields that do not change the saved state may change (here the step count).
  assert trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 4), str(workdir))['step'] == 4


def _torn_reads(write, path, rewrites=300):
  """How many of a reader's parses of ``path`` fail while ``write`` rewrites it
  ``rewrites`` times (what another process's resume check sees)."""
  write()
  done, torn, reads = threading.Event(), [0], [0]

  def reader():
    while not done.is_set():
      try:
        json.loads(path.read_text())
      except (json.JSONDecodeError, FileNotFoundError):
        torn[0] += 1
      reads[0] += 1

  thread = threading.Thread(target=reader)
  thread.start()
  for _ in range(rewrites):
    write()
  done.set()
  thread.join()
  assert reads[0] > 0
  return torn[0]


def test_the_saved_config_is_never_seen_half_written(tmp_path):
  # On a resume, process 0 rewrites config.json while the other processes read
  # it in check_resume_config. Under load, a 2-process resume failed that way:
  # process 1 left before the first barrier (as a torn read makes it do), and
  # process 0, still waiting there, failed the shutdown barrier.
  config = default_config.get_config()
  path = tmp_path / layout.CONFIG_FILE
  assert _torn_reads(lambda: workdirs.write_config(tmp_path, config), path) == 0
  assert json.loads(path.read_text()) == json.loads(config.to_json_best_effort())
  assert [p.name for p in tmp_path.iterdir()] == [layout.CONFIG_FILE]  # no temporaries left
  # The probe can fail: a plain rewrite (truncate, then write) is seen torn.
  naive = lambda: path.write_text(config.to_json_best_effort(indent=2))
  assert _torn_reads(naive, path) > 0
