"""Checkpoints (contextpool_jax.training.checkpoints) a run resumes from: a damaged latest one is
moved aside and the run resumes from the one before, ending as an uninterrupted run; none
readable stops with one message, never a restart; a changed model is named before anything is
restored. (Kills and SIGTERM around checkpoints: tests/training/test_faults.py.)"""

import shutil

import jax
import numpy as np
import pytest

from contextpool_jax.runs.workdirs import load_variables
from contextpool_jax.training import checkpoints, trainer
from helpers import tiny_run_config

pytestmark = pytest.mark.slow  # tiny training runs, resumed


def _final(workdir):
  variables, step = load_variables(workdir)
  return step, jax.tree.map(np.asarray, variables['params'])


def _largest_array_file(step_dir):
  files = [p for p in step_dir.rglob('*') if p.is_file() and p.parent.name == 'd']
  return max(files, key=lambda p: p.stat().st_size)


DAMAGE = {
    'array_file_missing': lambda step_dir: _largest_array_file(step_dir).unlink(),
    'array_file_truncated': lambda step_dir: _largest_array_file(step_dir).write_bytes(
        _largest_array_file(step_dir).read_bytes()[:100]
    ),
    'metadata_truncated': lambda step_dir: (step_dir / 'state' / '_METADATA').write_text(
        (step_dir / 'state' / '_METADATA').read_text()[:50]
    ),
    'data_iterator_state_missing': lambda step_dir: next(
        (step_dir / 'data').glob('process_*.json')
    ).unlink(),
}


@pytest.fixture(scope='module')
def uninterrupted_six(corpus, tmp_path_factory):
  root = tmp_path_factory.mktemp('six')
  trainer.train_and_evaluate(tiny_run_config(corpus, root, 6), str(root / 'run'))
  return root / 'run'


@pytest.mark.parametrize('damage', sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(
    corpus, tmp_path, uninterrupted_six, damage
):
  workdir = tmp_path / 'run'
  # A run stopped after its step-4 checkpoint: the uninterrupted run's workdir without step 6.
  shutil.copytree(uninterrupted_six, workdir)
  shutil.rmtree(workdir / 'checkpoints' / '6')
  DAMAGE[damage](workdir / 'checkpoints' / '4')
  with pytest.warns(
      UserWarning,
      match=r'(?s)Resuming from checkpoint step 2 in .*'
      r'step 4 \(moved to .*damaged_checkpoints/4-',
  ):
    result = trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 6), str(workdir))
  assert result['step'] == 6
  assert [p.name.split('-')[0] for p in (workdir / 'damaged_checkpoints').iterdir()] == ['4']
  step, params = _final(workdir)
  step_ref, params_ref = _final(uninterrupted_six)
  assert step == step_ref == 6
  jax.tree.map(np.testing.assert_array_equal, params, params_ref)


def test_no_readable_checkpoint_stops_with_one_message_not_a_restart(corpus, tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 4, keep_checkpoints=2), str(workdir))
  for step in (2, 4):
    DAMAGE['array_file_missing'](workdir / 'checkpoints' / str(step))
  with pytest.raises(
      checkpoints.CheckpointError,
      match=r'(?s)No checkpoint in .*checkpoints ' r'could be read.*step 4.*step 2',
  ):
    trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 6), str(workdir))
  assert not (workdir / 'checkpoints' / '6').exists()  # nothing trained from step 0


def test_resuming_with_a_different_model_names_what_differs(corpus, tmp_path):
  workdir = tmp_path / 'run'
  trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 2), str(workdir))
  saved = (workdir / 'config.json').read_text()
  changed = tiny_run_config(corpus, tmp_path, 4, **{'model.num_layers': 2, 'model.emb_dim': 48})
  with pytest.raises(
      checkpoints.CheckpointError,
      match=r'(?s)different configuration.*'
      r'model\.emb_dim: saved 32, now 48.*model\.num_layers: saved 1, now 2',
  ):
    trainer.train_and_evaluate(changed, str(workdir))
  assert (workdir / 'config.json').read_text() == saved  # nothing written or restored
  # Fields that do not change the saved state may change (here the step count).
  assert trainer.train_and_evaluate(tiny_run_config(corpus, tmp_path, 4), str(workdir))['step'] == 4
