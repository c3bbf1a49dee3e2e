"""Faults a long run meets: kill -9, SIGTERM (damaged checkpoints and a changed config:
tests/training/test_checkpoints.py).

Nothing may be lost or silently restarted: after any of them, running the same
command again ends with exactly the parameters of an uninterrupted run, or
stops with one clear message.
"""

import os
import signal
import subprocess
import sys
import time
import warnings

import jax
import numpy as np
import pytest

from contextpool_jax.runs.workdirs import load_variables
from conftest import REPO
from helpers import committed_steps, flags, metrics

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
