"""What several test files share: tiny configs and ``train.py`` flags, the stored old workdir, a
translation workdir, run locks, a tiny benchmark workload. A test file imports these from here, never from
another test file (each file of ``tests/<room>/`` stands alone)."""

import json
import pathlib
import shutil
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import default as default_config
from conftest import REPO

# ----------------------------------------------------------------------------
# Tiny training runs.
# ----------------------------------------------------------------------------


def tiny_config(corpus, data_dir, **overrides):
  """configs/default.py shrunk to a 4-step run of a one-layer LM on ``corpus/*.txt`` (the small
  offline LM config)."""
  c = default_config.get_config()
  c.num_train_steps = 4
  c.batch_size = 4
  c.log_every_steps = 2
  c.eval_every_steps = 4
  c.checkpoint_every_steps = 2
  c.progress_bar = False
  c.async_checkpointing = False
  c.model.update(num_layers=1, emb_dim=32, mlp_dim=64, num_heads=2, dropout_rate=0.1)
  c.optimizer.update(schedule='warmup_constant', warmup_steps=2, learning_rate=1e-3)
  c.dataset.update(
      files=(str(corpus / '*.txt'),),
      data_dir=str(data_dir),
      max_bytes=0,
      seq_len=32,
      eval_context=32,
      eval_step=16,
      eval_batch_size=4,
      eval_max_bytes=2048,
  )
  c.update_from_flattened_dict(overrides)
  return c


def tiny_run_config(corpus, tmp_path, steps, **overrides):
  """:func:`tiny_config` for ``steps`` steps, checkpoints every 2, no evaluation."""
  return tiny_config(
      corpus,
      tmp_path / 'data',
      num_train_steps=steps,
      log_every_steps=2,
      checkpoint_every_steps=2,
      eval_every_steps=100,
      **overrides,
  )


def flags(corpus, data_dir, workdir, steps=8, **overrides):
  """``train.py`` flags: configs/default.py shrunk, everything on inside the run."""
  config = {
      'num_train_steps': steps,
      'batch_size': 8,
      'log_every_steps': 2,
      'eval_every_steps': 4,
      'checkpoint_every_steps': 4,
      'progress_bar': False,
      'model.num_layers': 1,
      'model.emb_dim': 32,
      'model.mlp_dim': 64,
      'model.num_heads': 2,
      # A schedule that does not depend on num_train_steps, so a run stopped at
      # step 4 and resumed to 8 follows the uninterrupted run's rates.
      'optimizer.schedule': 'warmup_constant',
      'optimizer.warmup_steps': 2,
      'dataset.files': f"('{corpus}/*.txt',)",
      'dataset.data_dir': str(data_dir),
      'dataset.max_bytes': 0,
      'dataset.seq_len': 32,
      'dataset.eval_context': 32,
      'dataset.eval_step': 16,
      'dataset.eval_batch_size': 4,
      'dataset.eval_max_bytes': 4096,
      **overrides,
  }
  return ['--config', str(REPO / 'configs/default.py'), '--workdir', str(workdir)] + [
      f'--config.{k}={v}' for k, v in config.items()
  ]


def metrics(workdir):
  """{split: [record, ...]} from metrics.jsonl (written by process 0 only)."""
  out = {}
  for line in (pathlib.Path(workdir) / 'metrics.jsonl').read_text().splitlines():
    record = json.loads(line)
    out.setdefault(record.pop('split'), []).append(record)
  return out


def committed_steps(workdir):
  """The steps of the workdir's committed checkpoints, in order."""
  path = pathlib.Path(workdir) / 'checkpoints'
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit()) if path.exists() else []


# Appended to the training commands of the pages' blocks marked `shrink` ({tmp}: the test's
# directory): tests/repo/test_readme.py.
TINY_TRAIN = {
    'batch_size': 4,
    'log_every_steps': 1,
    'eval_every_steps': 2,
    'checkpoint_every_steps': 2,
    'progress_bar': False,
    'model.num_layers': 1,
    'model.emb_dim': 32,
    'model.mlp_dim': 64,
    'model.num_heads': 2,
    'dataset.data_dir': '{tmp}/tfds',
    'dataset.max_bytes': 65536,
    'dataset.seq_len': 32,
    'dataset.eval_context': 32,
    'dataset.eval_step': 16,
    'dataset.eval_batch_size': 4,
    'dataset.eval_max_bytes': 1024,
}

# ----------------------------------------------------------------------------
# Stored and made workdirs.
# ----------------------------------------------------------------------------

# A 2-step run of the tiny LM config written by version 0.1.0 (tests/runs/test_workdirs.py).
OLD = pathlib.Path(__file__).parent / 'fixtures' / 'workdir_0_1_0'
# The corpus the fixture was trained on (its config.json names /tmp/fx/corpus/*.txt).
CORPUS_TEXT = 'the quick brown fox jumps over the lazy dog. ' * 200


def old_workdir_copy(tmp_path: pathlib.Path) -> pathlib.Path:
  """A copy of the fixture in ``tmp_path / 'run'`` with its corpus beside it: the
  machine-specific paths of its ``config.json`` are the only fields that change."""
  workdir = tmp_path / 'run'
  shutil.copytree(OLD, workdir)
  corpus = tmp_path / 'corpus'
  corpus.mkdir()
  (corpus / 'a.txt').write_text(CORPUS_TEXT)
  saved = json.loads((workdir / 'config.json').read_text())
  saved['dataset'].update(files=[str(corpus / '*.txt')], data_dir=str(tmp_path / 'data'))
  (workdir / 'config.json').write_text(json.dumps(saved))
  return workdir


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """An export of the 0.1.0 fixture's step 2 (the workdir is only read)."""
  from contextpool_jax.runs.export import export_params  # pylint: disable=g-import-not-at-top

  return export_params(OLD, tmp_path_factory.mktemp('export') / 'out')


EN = 'the a house cat dog is small big green red sees runs and old new'.split()
DE = 'das ein haus katze hund ist klein gross gruen rot sieht laeuft und alt neu'.split()


@pytest.fixture(scope='module')
def translation_workdir(tmp_path_factory):
  """A translation workdir as the trainer lays it out: config.json, the SentencePiece model
  and a checkpoint of an (untrained) tiny Transformer."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  from contextpool_jax.data import translation_input as ti  # pylint: disable=g-import-not-at-top
  from contextpool_jax.runs import config_fields  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp('translation')
  config = ml_collections.ConfigDict(
      dict(
          task='translation',
          dtype='float32',
          remat=False,
          model=dict(
              name='cp_transformer_tiny',
              vocab_size=48,
              num_layers=1,
              emb_dim=32,
              mlp_dim=64,
              num_heads=2,
          ),
          dataset=dict(
              name='wmt14_translate/de-en',
              source_lang='en',
              target_lang='de',
              vocab_size=48,
              vocab_type='unigram',
              vocab_path='',
              max_source_len=16,
              max_target_len=12,
          ),
      )
  )
  (root / 'config.json').write_text(config.to_json_best_effort(indent=2))
  rng = np.random.default_rng(0)
  sentences = [' '.join(rng.choice(w, 6)) for _ in range(200) for w in (EN, DE)]
  (root / ti.vocab_filename(ti.resolve_spec(config))).write_bytes(
      ti.train_sentencepiece(sentences, vocab_size=48)
  )
  model = config_fields.build_model(config)
  ids = jnp.ones((1, 8), jnp.int32)
  params = model.init(jax.random.key(0), ids, ids)['params']
  state = dict(
      step=jnp.int32(1), params=params, opt_state={}, model_state={}, bad_step=jnp.int32(-1)
  )
  with ocp.CheckpointManager(root / 'checkpoints') as mgr:
    mgr.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    mgr.wait_until_finished()
  return root


# ----------------------------------------------------------------------------
# A tiny benchmark workload.
# ----------------------------------------------------------------------------


class Mlp(nn.Module):
  width: int = 16

  @nn.compact
  def __call__(self, x, train=False):
    h = nn.relu(nn.Dense(self.width)(x))
    h = nn.Dropout(0.1)(h, deterministic=not train)
    return nn.Dense(3)(h)


def mlp_workload(width: int):
  """A two-layer MLP classifying a batch of 4 random 8-vectors: the harness's smallest step
  (a ``benchmarks.harness.Workload``)."""
  import optax  # pylint: disable=g-import-not-at-top

  from benchmarks import harness  # pylint: disable=g-import-not-at-top
  from contextpool_jax.training import objectives  # pylint: disable=g-import-not-at-top

  def make_batch(key):  # 'image' is what a classification objective feeds the model
    return {'image': jax.random.normal(key, (4, 8)), 'label': jnp.arange(4) % 3}

  return harness.Workload(
      Mlp(width),
      objectives.Classification(num_classes=3),
      make_batch,
      (optax.adam(1e-3), optax.constant_schedule(1e-3)),
  )


# ----------------------------------------------------------------------------
# Run locks (training/runlock.py).
# ----------------------------------------------------------------------------


def lock_info(**overrides):
  """A lock file's content as a run on this machine writes it."""
  from contextpool_jax.training import runlock  # pylint: disable=g-import-not-at-top

  return {
      'run_id': 'a' * 32,
      **runlock._this_process(),  # pylint: disable=protected-access
      'started': '2026-11-26 12:00:00 UTC',
      'processes': 1,
      'heartbeat': time.time(),
      **overrides,
  }


# Python source that readies a process for a full disk (run on its main thread: signal handlers
# are set there): a write past the file-size limit fails with EFBIG instead of SIGXFSZ killing the
# process, and the process writes no bytecode. CPython's ``.pyc`` writer ignores a short write,
# so a module first imported under a limit above 0 would leave its ``.pyc`` cut at the limit in
# the shared environment, and every later process importing it fails with ``EOFError: marshal
# data too short`` (seen in CI, where bytecode is written on first import: an export under a
# 20 kB limit cut anyio's, and the notebook test's export failed minutes later).
FULL_DISK_SETUP = (
    'import signal, sys\n'
    'sys.dont_write_bytecode = True\n'
    'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
)


def cap_file_size(limit: int) -> str:
  """Python source that makes the running process see a full disk from here on: no file of it may
  grow past ``limit`` bytes (``RLIMIT_FSIZE``, after :data:`FULL_DISK_SETUP`)."""
  return (
      FULL_DISK_SETUP
      + 'import resource\n'
      + f'resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))\n'
  )


@pytest.fixture
def sleeper():
  """A live process on this machine (the holder of a live lock)."""
  proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
  yield proc
  proc.kill()
  proc.wait()


def make_text_files(root, sizes, seed=0):
  """Random printable text files of ``sizes`` bytes under ``root/dir0``, ``root/dir1``."""
  rng = np.random.default_rng(seed)
  paths = []
  for i, size in enumerate(sizes):
    path = root / f'dir{i % 2}' / f'f{i}.txt'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(rng.integers(32, 127, size, np.uint8).tobytes())
    paths.append(path)
  return paths


def load_config(name, arg=''):
  """The config ``train.py`` starts from for ``--config=configs/<name>.py[:arg]`` (loaded by
  the command line's loader, completed: every model field present)."""
  from contextpool_jax.training import command_line  # pylint: disable=g-import-not-at-top

  return command_line.load_config_file(
      str(REPO / 'configs' / f'{name}.py') + (f':{arg}' if arg else '')
  )
