"""``contextpool-compile`` (``contextpool_jax/commands/compile.py``) as users run it. What it
compiles and reports is ``training/aot.py``'s (``tests/training/test_aot.py``)."""

import pathlib
import subprocess
import sys

import pytest

from configs import default as default_config


@pytest.mark.parametrize(
    'topology,module,line',
    [
        (
            'v5e:2x2',
            'libtpu',
            "error: compiling for a TPU needs libtpu: pip install 'contextpool-jax[tpu]'"
            ' (jax[tpu]; it runs on any machine, no TPU needed).',
        ),
        (
            'h100:8',
            'jax_plugins.xla_cuda',
            "error: compiling for an NVIDIA GPU needs JAX's CUDA plugin: pip install"
            " 'contextpool-jax[gpu-compile]' (jax[cuda12-local]; it runs on any machine, no GPU"
            ' or CUDA needed).',
        ),
    ],
)
def test_without_the_compiler_the_command_says_so_in_one_line(topology, module, line):
  # The config by its path: CI's oldest stack installs the package as `pip install .` does, and
  # the checkout's contextpool_jax (first on the path here) has no `configs` subpackage.
  config = pathlib.Path(default_config.__file__).resolve()
  code = (
      'import importlib.util, sys\n'
      'find = importlib.util.find_spec\n'
      f'importlib.util.find_spec = lambda n, *a: None if n.startswith({module!r}) else find(n, *a)\n'
      'from contextpool_jax.commands import compile as compile_command\n'
      f"sys.argv = ['contextpool-compile', '--config', {str(config)!r}, '--topology', {topology!r}]\n"
      'compile_command.command()\n'
  )
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [line]
