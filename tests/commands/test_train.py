"""``train.py`` (``contextpool_jax/commands/train.py``) as users run it: a config error is one
line, a bug in a module is a traceback, an unknown key names itself."""

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_command_line_rejects_unknown_keys(tmp_path):
  out = subprocess.run(
      [
          sys.executable,
          str(REPO / 'train.py'),
          '--config',
          str(REPO / 'configs/default.py'),
          '--workdir',
          str(tmp_path),
          '--config.num_train_stepz=3',
      ],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=REPO,
  )
  assert out.returncode != 0
  assert 'num_train_stepz' in out.stderr


# train.py with the model's forward pass replaced by one that has a shape bug.
_BROKEN_MODEL_DRIVER = r"""
import runpy, sys
import flax.linen as nn
from contextpool_jax.runs import config_fields

class Broken(nn.Module):
  @nn.compact
  def __call__(self, tokens, train=False):
    raise ValueError('shape bug in a module the researcher edited')

config_fields.build_model = lambda config: Broken()
script = sys.argv.pop(1)
runpy.run_path(script, run_name='__main__')
"""


def _cli(args, driver=None):
  script = [str(REPO / 'train.py')] if driver is None else ['-c', driver, str(REPO / 'train.py')]
  return subprocess.run(
      [sys.executable, *script, '--config', str(REPO / 'configs/default.py'), *args],
      capture_output=True,
      text=True,
      timeout=300,
      cwd=REPO,
  )


@pytest.mark.slow
def test_command_line_errors_config_one_line_other_errors_traceback(corpus, tmp_path):
  data = [
      '--config.dataset.data_dir=' + str(tmp_path / 'data'),
      f"--config.dataset.files=('{corpus}/*.txt',)",
      '--config.dataset.max_bytes=0',
  ]
  config_error = _cli(['--workdir', str(tmp_path / 'a'), '--config.optimizer.name=adamx'])
  assert config_error.returncode == 1
  assert (
      config_error.stderr.strip()
      .splitlines()[-1]
      .startswith("error: config.optimizer.name='adamx' is not supported")
  )
  assert 'Traceback' not in config_error.stderr
  bug = _cli(['--workdir', str(tmp_path / 'b'), *data], driver=_BROKEN_MODEL_DRIVER)
  assert bug.returncode == 1
  assert 'Traceback' in bug.stderr and 'shape bug in a module' in bug.stderr
