"""The local multi-process launcher (``commands/launch.py``): one process per rank with its own
fake CPU devices and the coordinator's flags, the others' output prefixed, the first failure
stopping the rest and becoming the exit code. Tiny scripts stand in for training here; the
launcher starting real training runs: tests/training/test_scale.py, test_faults.py."""

import sys
import textwrap
import time

import pytest
from absl import app

from contextpool_jax.commands import launch

# Prints its rank and its device flag; rank 1 exits with 3 when told to, the others then
# wait "in a collective" (sleep) until the launcher stops them.
SCRIPT = textwrap.dedent("""
    import os, sys, time
    rank = int([a for a in sys.argv if a.startswith('--process_id=')][0].split('=')[1])
    flags = os.environ['XLA_FLAGS']
    print(f'rank {rank} of {sys.argv[-2].split("=")[1]}: {flags}', flush=True)
    if '--fail' in sys.argv:
      if rank == 1:
        sys.exit(3)
      time.sleep(60)
    """)


def test_each_process_gets_its_devices_and_the_coordinators_flags():
  env = launch.process_env(4, {'XLA_FLAGS': '--xla_a=1 --xla_force_host_platform_device_count=8'})
  assert env['XLA_FLAGS'] == '--xla_a=1 --xla_force_host_platform_device_count=4'
  assert (env['JAX_PLATFORMS'], env['JAX_CPU_COLLECTIVES_IMPLEMENTATION']) == ('cpu', 'gloo')
  cmds = launch.commands(None, ['--config', 'c.py'], 2, 1234)
  assert cmds == [
      [
          sys.executable,
          '-m',
          'contextpool_jax.commands.train',
          '--config',
          'c.py',
          '--coordinator_address=127.0.0.1:1234',
          '--num_processes=2',
          f'--process_id={i}',
      ]
      for i in range(2)
  ]


def test_the_others_output_is_prefixed_and_all_succeed(tmp_path, capfd):
  script = tmp_path / 'rank.py'
  script.write_text(SCRIPT)
  assert launch.run(str(script), [], num_processes=3, devices_per_process=2) == 0
  lines = sorted(capfd.readouterr().out.splitlines())
  flag = '--xla_force_host_platform_device_count=2'
  assert [line.split(':')[0] for line in lines] == [
      '[1] rank 1 of 3',
      '[2] rank 2 of 3',
      'rank 0 of 3',
  ]
  assert all(line.endswith(flag) for line in lines)


def test_the_first_failure_stops_the_others_and_is_the_exit_code(tmp_path):
  script = tmp_path / 'rank.py'
  script.write_text(SCRIPT)
  start = time.monotonic()
  assert launch.run(str(script), ['--fail'], num_processes=2, devices_per_process=1) == 3
  assert time.monotonic() - start < 30  # rank 0 was stopped, not waited for (60 s)


def test_a_script_that_is_not_a_file_is_a_usage_error(tmp_path):
  with pytest.raises(app.UsageError, match='--script=.* is not a file'):
    launch.run(str(tmp_path / 'nope.py'), [], num_processes=2, devices_per_process=1)
