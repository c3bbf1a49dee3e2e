"""Loading a trained workdir back (load, export_params), sampling from it, and the command lines
that do (contextpool-sample, contextpool-viz). (Translating: tests/inference/test_translation.py.)
"""

import json
import pathlib
import subprocess
import sys
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from contextpool_jax.runs import config_fields
from contextpool_jax.commands import sample
from contextpool_jax.inference import sampling
from contextpool_jax.tools import viz
from contextpool_jax.base.errors import ArgumentError
from contextpool_jax.training import trainer
from contextpool_jax.runs.export import export_params
from contextpool_jax.runs.workdirs import WorkdirError, load
from helpers import tiny_config  # the small offline LM config

pytestmark = pytest.mark.slow  # trains a model for its workdir, runs the command lines

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A CP-LM trained for 4 steps (checkpoints at steps 2 and 4)."""
  root = tmp_path_factory.mktemp('lm')
  corpus = root / 'corpus'
  corpus.mkdir()
  for i, path in enumerate(sorted((REPO / 'contextpool_jax').rglob('*.py'))[:12]):
    (corpus / f'{i:02d}.txt').write_bytes(path.read_bytes())
  config = tiny_config(corpus, root / 'data')
  trainer.train_and_evaluate(config, str(root / 'run'))
  return root / 'run'


def _saved_params(workdir, step):
  """The params the trainer saved at ``step``, restored in full (no load involved)."""
  with ocp.CheckpointManager(pathlib.Path(workdir) / 'checkpoints') as mgr:
    restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return jax.tree.map(np.asarray, restored['state']['params'])


TOKENS = jnp.asarray(np.frombuffer(b'def load(workdir, step=None):\n  ', np.uint8)[None], jnp.int32)


def test_load_restores_the_saved_params_and_gives_their_logits(workdir):
  model, variables, config = load(workdir)
  assert config.model.name == 'cp_transformer_lm' and config.dataset.seq_len == 32
  saved = _saved_params(workdir, 4)
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, variables['params']), saved)
  assert set(variables) == {'params'}  # the LM has no other model state
  reference = config_fields.build_model(config).apply({'params': saved}, TOKENS)
  chex.assert_trees_all_close(model.apply(variables, TOKENS), reference, atol=0, rtol=0)
  # An earlier step is another set of parameters.
  _, earlier, _ = load(workdir, step=2)
  chex.assert_trees_all_equal(
      jax.tree.map(np.asarray, earlier['params']), _saved_params(workdir, 2)
  )
  assert not np.array_equal(
      earlier['params']['embedder']['embedding']['embedding'],
      variables['params']['embedder']['embedding']['embedding'],
  )


def test_export_params_loads_back(workdir, tmp_path):
  out = export_params(workdir, tmp_path / 'export')
  assert sorted(p.name for p in out.iterdir()) == [
      'README.md',
      'config.json',
      'model.safetensors',
      'variables.msgpack',
  ]
  model, variables, config = load(out)
  _, original, _ = load(workdir)
  chex.assert_trees_all_equal(variables, original)
  assert config.to_dict() == load(workdir)[2].to_dict()
  chex.assert_trees_all_close(model.apply(variables, TOKENS), model.apply(original, TOKENS))
  with pytest.raises(WorkdirError, match='params-only export'):
    load(out, step=2)
  with pytest.raises(FileExistsError, match='model.safetensors exists'):
    export_params(workdir, out)


def test_a_missing_or_wrong_workdir_is_one_clear_error(workdir, tmp_path):
  missing = tmp_path / 'missing'
  with pytest.raises(
      WorkdirError,
      match=rf'{missing} is not a training workdir: no config.json ' r'\(it does not exist\)',
  ):
    load(missing)
  stray = tmp_path / 'stray'
  stray.mkdir()
  (stray / 'notes.txt').write_text('x')
  with pytest.raises(WorkdirError, match=r'no config.json \(it holds: notes.txt\)'):
    load(stray)
  (stray / 'config.json').write_text(json.dumps(json.loads((workdir / 'config.json').read_text())))
  with pytest.raises(
      WorkdirError, match=r'has no checkpoints/ directory \(it holds: ' r'config.json, notes.txt\)'
  ):
    load(stray)
  with pytest.raises(
      WorkdirError, match=r'step=3 is not a checkpoint of .*; its steps are \[2, 4\]'
  ):
    load(workdir, step=3)
  assert issubclass(WorkdirError, FileNotFoundError)


def test_the_command_line_names_the_flag_a_language_model_workdir_needs(workdir):
  flags = types.SimpleNamespace(workdir=str(workdir), step=None, prompt=None, sentence=[])
  with pytest.raises(ArgumentError, match='--prompt is required for a language model workdir'):
    sample.run(flags)
  flags.prompt, flags.sentence = 'def ', ['a sentence']
  with pytest.raises(ArgumentError, match='--sentence is for translation workdirs'):
    sample.run(flags)


def _run(module, *args):
  return subprocess.run(
      [sys.executable, '-m', module, *args], capture_output=True, text=True, timeout=300, cwd=REPO
  )


def test_sample_command_line(workdir, tmp_path):
  out = _run(
      'contextpool_jax.commands.sample',
      '--workdir',
      str(workdir),
      '--prompt',
      'def ',
      '--length',
      '30',
      '--temperature',
      '0',
  )
  assert out.returncode == 0, out.stderr[-2000:]
  model, variables, config = load(workdir)
  expected = 'def ' + sampling.sample_text(
      model, variables, config, 'def ', length=30, temperature=0
  )
  assert out.stdout == expected + '\n'
  bad = _run(
      'contextpool_jax.commands.sample', '--workdir', str(tmp_path / 'nowhere'), '--prompt', 'x'
  )
  assert bad.returncode == 1
  assert f'error: {tmp_path / "nowhere"} is not a training workdir' in bad.stderr


def test_viz_command_line_writes_the_figures(workdir, tmp_path):
  out = _run(
      'contextpool_jax.commands.viz',
      '--workdir',
      str(workdir),
      '--text',
      'def f(x):\n  return x',
      '--out',
      str(tmp_path / 'figs'),
  )
  assert out.returncode == 0, out.stderr[-2000:]
  names = ['pool_text_0.png', 'gaussian_supports_0.png', 'sigma_distribution.png']
  assert out.stdout.split() == [str(tmp_path / 'figs' / n) for n in names]
  for name in names:
    assert (tmp_path / 'figs' / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_workdir_figures_show_the_models_pools(workdir):
  model, variables, _ = load(workdir)
  text = 'class A:\n  pass'
  figures = viz.workdir_figures(str(workdir), text, centres=[4, 10])
  labels, pools = viz.lm_pools(model, variables, text)
  (pool,) = pools.values()
  image = figures['pool_text_0'].axes[1].images[0].get_array()
  chex.assert_trees_all_close(
      np.asarray(image, np.float64).reshape(-1)[: len(labels)],
      np.asarray(pool['pool_sigma'][0], np.float64),
  )
