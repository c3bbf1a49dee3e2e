"""The default config end to end on several devices and several processes.

Every run goes through the command line users run (``train.py``, or the local
multi-process launcher), with logging, ContextPool pool-size logging,
evaluation and checkpoints inside the run; results are read back from
``metrics.jsonl`` and the checkpoints.

* 4 fake devices in one process give the losses and evaluation metrics of 1
  device. The evaluation has more batches (64) than XLA's CPU runtime admits
  computations in flight per device (32): it deadlocked before the loop
  bounded how far the host runs ahead (sharding.InFlight).
* 2 processes x 2 devices over loopback (gloo) give those of 1 process x 4
  devices and write one checkpoint directory, replicated and FSDP; a resumed
  2-process run with FSDP ends with exactly the parameters of an uninterrupted one
  (replicated: tests/training/test_cluster_faults.py kills and resumes two processes).
"""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from contextpool_jax.runs.workdirs import load_variables
from conftest import REPO
from helpers import flags, metrics

pytestmark = pytest.mark.slow  # training on several processes


def _env(devices):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  xla = env.get('XLA_FLAGS', '')
  env['XLA_FLAGS'] = f'{xla} --xla_force_host_platform_device_count={devices}'.strip()
  return env


def run_train(args, devices):
  out = subprocess.run(
      [sys.executable, str(REPO / 'train.py'), *args],
      env=_env(devices),
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


def run_launcher(args, processes, devices):
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'contextpool_jax.commands.launch',
          f'--num_processes={processes}',
          f'--devices_per_process={devices}',
          '--',
          *args,
      ],
      env=dict(os.environ, JAX_PLATFORMS='cpu'),
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=900,
  )
  assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-3000:]
  return out.stdout


def assert_same_run(a, b, rtol=2e-5):
  """Same logged steps, train losses, evaluation metrics and pool sizes."""
  assert set(a) == set(b) >= {'train', 'eval_validation', 'pool_sigma_mean'}
  for split in a:
    assert [r['step'] for r in a[split]] == [r['step'] for r in b[split]], split
    for ra, rb in zip(a[split], b[split]):
      for key in ra:
        if key not in ('step', 'steps_per_sec'):
          np.testing.assert_allclose(ra[key], rb[key], rtol=rtol, err_msg=f'{split} {key}')


def params(workdir):
  """The latest checkpoint's (step, params), restored on this one-device process."""
  variables, step = load_variables(workdir)
  return step, jax.tree.map(np.asarray, variables['params'])


@pytest.fixture(scope='module', params=['replicated', 'fsdp'])
def four_devices(request, corpus, tmp_path_factory):
  """``(param_sharding, data dir, workdir)`` of the run on 4 devices in one process that
  both tests compare with (it prepares the data the other runs read)."""
  root = tmp_path_factory.mktemp(f'four-{request.param}')
  extra = {'param_sharding': request.param}
  run_train(flags(corpus, root / 'data', root / 'four', **extra), devices=4)
  return request.param, root / 'data', root / 'four'


@pytest.fixture(scope='module')
def one_device(corpus, tmp_path_factory):
  """The workdir of the run on 1 device (its own data dir, the default replicated parameters)
  that both shardings' 4-device runs are compared with. On a one-device mesh, replicated and
  FSDP parameters compile the same computation: the two one-device runs were bit-identical
  (metrics less steps_per_sec, final parameters), so one run serves both cases."""
  root = tmp_path_factory.mktemp('one')
  run_train(flags(corpus, root / 'data', root / 'one'), devices=1)
  return root / 'one'


def test_four_devices_equal_one_with_evaluation_logging_and_checkpoints(one_device, four_devices):
  _, _, four_dir = four_devices
  one, four = metrics(one_device), metrics(four_dir)
  assert_same_run(one, four)
  assert [r['step'] for r in four['eval_validation']] == [4, 8]
  assert [r['step'] for r in four['train']] == [2, 4, 6, 8]
  checkpoints = sorted(p.name for p in (four_dir / 'checkpoints').iterdir() if p.name.isdigit())
  assert checkpoints == ['4', '8']
  # The 4-device checkpoint restores on one device (params are not compared:
  # Adam's first steps are ~sign(g), which float rounding flips for g ~ 0).
  step, restored = params(four_dir)
  assert step == 8
  jax.tree.map(
      lambda a, b: np.testing.assert_equal(a.shape, b.shape), restored, params(one_device)[1]
  )


@pytest.fixture(scope='module')
def two_processes(corpus, four_devices, tmp_path_factory):
  """``(param_sharding, data dir, workdir)`` of the same run in two processes x two devices."""
  param_sharding, data, _ = four_devices
  workdir = tmp_path_factory.mktemp(f'two-{param_sharding}') / 'full'
  run_launcher(flags(corpus, data, workdir, param_sharding=param_sharding), processes=2, devices=2)
  return param_sharding, data, workdir


def test_two_processes_equal_one(four_devices, two_processes):
  """Two processes x two devices train as one process x four. Slow: each process
  imports JAX and compiles its steps."""
  _, _, reference = four_devices
  _, _, full = two_processes
  assert_same_run(metrics(reference), metrics(full))
  # One checkpoint directory, shared by both processes.
  assert sorted(p.name for p in (full / 'checkpoints').iterdir() if p.name.isdigit()) == ['4', '8']


# Resuming two processes with replicated parameters is checked by
# tests/training/test_cluster_faults.py, whose two-process runs are killed at random moments
# and resumed to the uninterrupted run's parameters; here, with the parameters sharded.
@pytest.mark.parametrize('four_devices', ['fsdp'], indirect=True)
def test_two_processes_resume_exactly_with_sharded_parameters(corpus, tmp_path, two_processes):
  """A two-process run stopped after its step-4 checkpoint and resumed ends with the
  uninterrupted run's params.

  The stopped run is the uninterrupted run's workdir without its step-8 checkpoint
  (what a run killed between its checkpoints at 4 and 8 leaves: metrics lines past
  step 4, which the resume cuts back)."""
  param_sharding, data, full = two_processes
  resumed = tmp_path / 'resumed'
  shutil.copytree(full, resumed)
  shutil.rmtree(resumed / 'checkpoints' / '8')
  log = run_launcher(flags(corpus, data, resumed, param_sharding=param_sharding), 2, 2)
  assert 'Resumed from' in log and 'at step 4' in log
  step_full, params_full = params(full)
  step_resumed, params_resumed = params(resumed)
  assert step_full == step_resumed == 8
  jax.tree.map(np.testing.assert_array_equal, params_full, params_resumed)
  resumed_evals = metrics(resumed)['eval_validation']
  assert [r['step'] for r in resumed_evals] == [4, 8]
  assert resumed_evals[-1] == metrics(full)['eval_validation'][-1]
