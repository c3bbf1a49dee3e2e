"""Runs tests/training/multi_device/ in a subprocess with 4 fake CPU devices."""

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a subprocess with four fake devices

HERE = pathlib.Path(__file__).resolve().parent


def test_multi_device_suite():
  """Slow: one subprocess with 4 fake CPU devices runs every test of tests/training/multi_device/
  (they must set XLA_FLAGS before JAX starts); one process for all of them, so the start-up
  is paid once."""
  env = dict(os.environ, CONTEXTPOOL_MULTI_DEVICE='1', JAX_PLATFORMS='cpu')
  flags = env.get('XLA_FLAGS', '')
  env['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count=4'.strip()
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'pytest',
          '-q',
          '-p',
          'no:cacheprovider',
          '-p',
          'no:xdist',
          str(HERE / 'multi_device'),
      ],
      cwd=HERE.parents[1],  # the repository's root
      env=env,
      capture_output=True,
      text=True,
      timeout=1800,
  )
  assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
  assert ' passed' in out.stdout and 'skipped' not in out.stdout, out.stdout[-2000:]
