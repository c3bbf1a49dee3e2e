"""config.profile (a jax.profiler trace of chosen training steps) and benchmarks.profile_layer."""

import gzip
import json
import subprocess
import sys

import pytest

from contextpool_jax.base.errors import ConfigError
from contextpool_jax.training import profiling, trainer
from conftest import REPO
from helpers import tiny_config


def _losses(workdir):
  """Every metrics.jsonl value but the timing, by (step, split)."""
  out = {}
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    record = json.loads(line)
    record.pop('steps_per_sec', None)
    out[(record.pop('step'), record.pop('split'))] = record
  return out


def _traced_steps(trace_dir):
  """The step numbers of the ``train`` step annotations in the Perfetto trace."""
  (trace,) = trace_dir.glob('plugins/profile/*/perfetto_trace.json.gz')
  data = json.loads(gzip.decompress(trace.read_bytes()))
  events = data['traceEvents'] if isinstance(data, dict) else data
  return sorted(int(e['args']['step_num']) for e in events if e.get('name') == 'train')


@pytest.mark.slow
def test_a_profile_of_chosen_steps_is_written_and_changes_no_value(corpus, tmp_path):
  data = tmp_path / 'data'
  kw = dict(num_train_steps=5, eval_every_steps=5, checkpoint_every_steps=5)
  trainer.train_and_evaluate(tiny_config(corpus, data, **kw), str(tmp_path / 'plain'))
  profiled = tiny_config(corpus, data, **kw, **{'profile.start_step': 2, 'profile.num_steps': 2})
  trainer.train_and_evaluate(profiled, str(tmp_path / 'profiled'))
  trace_dir = tmp_path / 'profiled' / 'profile'
  files = {p.name for p in trace_dir.glob('plugins/profile/*/*')}
  assert 'perfetto_trace.json.gz' in files and any(f.endswith('.xplane.pb') for f in files)
  assert _traced_steps(trace_dir) == [2, 3]  # steps 2 and 3, inside the trace
  assert not (tmp_path / 'plain' / 'profile').exists()  # off by default
  assert _losses(tmp_path / 'profiled') == _losses(tmp_path / 'plain')


def test_the_window_skips_the_first_step_of_a_run_and_steps_it_does_not_run(tmp_path):
  spec = lambda start, n: profiling.ProfileSpec(start_step=start, num_steps=n, all_processes=False)
  window = lambda s, start, total: profiling.StepProfiler(s, tmp_path, start, total).window
  assert window(spec(10, 0), 0, 100) is None  # off
  assert window(spec(10, 5), 0, 100) == (10, 14)
  assert window(spec(1, 3), 0, 100) == (2, 3)  # step 1 compiles
  assert window(spec(10, 5), 11, 100) == (13, 14)  # resumed inside it: step 12 compiles
  assert window(spec(10, 5), 20, 100) is None  # resumed after it
  assert window(spec(10, 5), 0, 12) == (10, 12)  # the run ends inside it
  assert profiling.trace_dir(tmp_path, 0, 1) == tmp_path / 'profile'
  assert profiling.trace_dir(tmp_path, 1, 2) == tmp_path / 'profile' / 'process_1'


@pytest.mark.parametrize(
    'field, value, message',
    [
        ('profile.num_steps', -1, 'config.profile.num_steps=-1 is invalid'),
        ('profile.start_step', 0, 'config.profile.start_step=0 is invalid'),
    ],
)
def test_a_bad_profile_field_fails_before_anything_is_built(
    corpus, tmp_path, field, value, message
):
  with pytest.raises(ConfigError, match=message):
    trainer.train_and_evaluate(tiny_config(corpus, tmp_path, **{field: value}), str(tmp_path / 'r'))
  assert not (tmp_path / 'r').exists()


@pytest.mark.slow
def test_profile_layer_traces_each_layer_and_prints_the_compiled_numbers(tmp_path):
  from benchmarks import profile_layer

  for layer in profile_layer.LAYERS:
    shape = profile_layer.input_shape(layer, batch=1, length=8, size=4, features=16)
    r = profile_layer.profile(layer, shape, steps=1, out=tmp_path / layer)
    assert r['params'] > 0 and r['flops'] > 0 and r['memory']['temp'] is not None, r
    assert any(f.endswith('perfetto_trace.json.gz') for f in r['trace_files']), r
    assert any(f.endswith('.xplane.pb') for f in r['trace_files']), r
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'benchmarks.profile_layer',
          '--layer=area_attention',
          '--batch=1',
          '--length=8',
          '--features=16',
          '--steps=1',
          f'--out={tmp_path / "cli"}',
      ],
      capture_output=True,
      text=True,
      timeout=600,
      cwd=REPO,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'area_attention: forward + backward on input (1, 8, 16)' in out.stdout
  for word in ('FLOPs', 'memory_analysis  temp', 'perfetto_trace.json.gz', '.xplane.pb'):
    assert word in out.stdout, out.stdout
  assert out.stderr.strip() == '', out.stderr[-3000:]
