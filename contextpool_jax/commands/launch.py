r"""Starts N local training processes with D CPU devices each: multi-host on one machine.

  python -m contextpool_jax.commands.launch --num_processes 2 --devices_per_process 2 \
      -- --config configs/default.py --workdir /tmp/cp2x2

Everything after ``--`` goes to every process's training command (``train.py``,
``contextpool-train``: ``python -m contextpool_jax.commands.train``). Each process is a
real JAX process (``jax.distributed.initialize`` with a coordinator on
127.0.0.1, gloo CPU collectives, ``--xla_force_host_platform_device_count=D``),
so the run exercises exactly the code paths of a TPU pod or a GPU cluster: one
global mesh over N x D devices, every process reading its own shard of the data,
metrics and checkpoints shared through the workdir. For tests and for trying
multi-host code; on real clusters start ``train.py`` once per host
(docs/distributed.md#multi-host).

Output: process 0's lines as they are, the others' prefixed with ``[i]``.
If a process fails, the others are stopped and the launcher exits with its
code; SIGINT/SIGTERM are forwarded to every process (each saves a checkpoint
on SIGTERM where the trainer supports it).
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from absl import app
from absl import flags

_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 2, 'Processes to start.', lower_bound=1)
_DEVICES = flags.DEFINE_integer('devices_per_process', 1, 'CPU devices per process.', lower_bound=1)
_PORT = flags.DEFINE_integer('port', 0, 'Coordinator port on 127.0.0.1 (0: a free one).')
_SCRIPT = flags.DEFINE_string(
    'script',
    None,
    'A training script (default: python -m contextpool_jax.commands.train, the training '
    'command that train.py and contextpool-train run).',
)
# The module every process runs without --script.
TRAINING_COMMAND = 'contextpool_jax.commands.train'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def process_env(devices: int, base: dict[str, str] | None = None) -> dict[str, str]:
  """The environment of one CPU process with ``devices`` fake devices."""
  env = dict(os.environ if base is None else base)
  xla = ' '.join(
      f
      for f in env.get('XLA_FLAGS', '').split()
      if not f.startswith('--xla_force_host_platform_device_count')
  )
  env['XLA_FLAGS'] = f'{xla} --xla_force_host_platform_device_count={devices}'.strip()
  env['JAX_PLATFORMS'] = 'cpu'
  env['JAX_CPU_COLLECTIVES_IMPLEMENTATION'] = 'gloo'
  return env


def commands(
    script: str | None, args: Sequence[str], num_processes: int, port: int
) -> list[list[str]]:
  """One training command line per process: ``script``, or the training command."""
  program = [script] if script else ['-m', TRAINING_COMMAND]
  return [
      [
          sys.executable,
          *program,
          *args,
          f'--coordinator_address=127.0.0.1:{port}',
          f'--num_processes={num_processes}',
          f'--process_id={i}',
      ]
      for i in range(num_processes)
  ]


def _pump(stream: IO[str], prefix: str, out: IO[str]) -> None:
  for line in iter(stream.readline, ''):
    out.write(prefix + line)
    out.flush()


def run(
    script: str | None,
    args: Sequence[str],
    num_processes: int,
    devices_per_process: int,
    port: int = 0,
) -> int:
  """Starts the processes, waits for all; returns 0 or the first failing exit code."""
  if script and not pathlib.Path(script).is_file():
    raise app.UsageError(f'--script={script!r} is not a file; pass the path of train.py.')
  port = port or free_port()
  env = process_env(devices_per_process)
  procs, pumps = [], []
  for i, cmd in enumerate(commands(script, args, num_processes, port)):
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    pump = threading.Thread(
        target=_pump, args=(proc.stdout, '' if i == 0 else f'[{i}] ', sys.stdout), daemon=True
    )
    pump.start()
    procs.append(proc)
    pumps.append(pump)

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    code = 0
    # Every process polled each round (any() would stop at the first one still running and
    # never see a later one fail while the others wait for it in a collective).
    while None in [p.poll() for p in procs]:
      failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
      if failed and not code:
        code = failed[0]
        for p in procs:  # the others would wait forever in a collective
          if p.poll() is None:
            p.terminate()
      time.sleep(0.2)
    for pump in pumps:
      pump.join(timeout=5)
    return code or next((p.returncode for p in procs if p.returncode), 0)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def main(argv: Sequence[str]) -> None:
  args = list(argv[1:])
  if not args:
    raise app.UsageError(
        'Pass the train.py flags after --, e.g. '
        '-- --config configs/default.py --workdir /tmp/run'
    )
  sys.exit(
      run(
          _SCRIPT.value,
          args,
          _NUM_PROCESSES.value,
          _DEVICES.value,
          _PORT.value,
      )
  )


if __name__ == '__main__':
  app.run(main)
