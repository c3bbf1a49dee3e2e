"""``contextpool-compile`` (``contextpool_jax/commands/compile.py``) as users run it. What it
compiles and reports is ``training/aot.py``'s (``tests/training/test_aot.py``)."""

import pathlib
import subprocess
import sys

from configs import default as default_config


def test_without_libtpu_the_command_says_so_in_one_line():
  # The config by its path: CI's oldest stack installs the package as `pip install .` does, and
  # the checkout's contextpool_jax (first on the path here) has no `configs` subpackage.
  config = pathlib.Path(default_config.__file__).resolve()
  code = (
      'import importlib.util, sys\n'
      'find = importlib.util.find_spec\n'
      "importlib.util.find_spec = lambda n, *a: None if n == 'libtpu' else find(n, *a)\n"
      'from contextpool_jax.commands import compile as compile_command\n'
      f"sys.argv = ['contextpool-compile', '--config', {str(config)!r}, '--topology', 'v5e:2x2']\n"
      'compile_command.command()\n'
  )
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
      "error: compiling for a TPU needs libtpu: pip install 'contextpool-jax[tpu]'"
      ' (jax[tpu]; it runs on any machine, no TPU needed).'
  ]
