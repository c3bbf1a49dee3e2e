"""Loading an export from a Hugging Face Hub repo (contextpool_jax.runs.hub), offline, from a local
cache laid out as the Hub's; without huggingface_hub, the error names the extra."""

import hashlib
import os
import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax.runs import hub, workdirs
from contextpool_jax.runs.workdirs import load
from helpers import CORPUS_TEXT, OLD
from helpers import exported  # pylint: disable=unused-import  # a fixture

TOKENS = jnp.asarray(np.frombuffer(CORPUS_TEXT[:16].encode(), np.uint8)[None], jnp.int32)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


COMMIT = 'a' * 40  # a commit hash of the fake repo


def hub_cache(cache: pathlib.Path, repo_id: str, export: pathlib.Path) -> pathlib.Path:
  """Lays ``export``'s files out as ``huggingface_hub`` caches a downloaded repo:
  ``models--<user>--<repo>/blobs/<sha256>``, ``snapshots/<commit>/<file>`` (relative
  symlinks to the blobs) and ``refs/main`` (the commit). Returns the snapshot."""
  root = cache / ('models--' + repo_id.replace('/', '--'))
  snapshot = root / 'snapshots' / COMMIT
  (root / 'blobs').mkdir(parents=True)
  snapshot.mkdir(parents=True)
  (root / 'refs').mkdir()
  (root / 'refs' / 'main').write_text(COMMIT)
  for path in sorted(export.iterdir()):
    blob = root / 'blobs' / hashlib.sha256(path.read_bytes()).hexdigest()
    shutil.copy(path, blob)
    (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
  return snapshot


def test_load_from_hub_offline_from_the_hub_cache(exported, tmp_path, monkeypatch):
  pytest.importorskip('huggingface_hub')
  snapshot = hub_cache(tmp_path / 'hub', 'someone/tiny-cp-lm', exported)
  # The real snapshot_download, never the network: local_files_only, and the Hub's
  # offline switch for load('hf://...') through the default cache.
  model, variables, config = workdirs.load_from_hub(
      'someone/tiny-cp-lm', cache_dir=tmp_path / 'hub', local_files_only=True
  )
  ref_model, checkpoint, _ = load(OLD)
  chex.assert_trees_all_equal(_np(variables), _np(checkpoint))
  chex.assert_trees_all_equal(
      model.apply(variables, TOKENS, train=False),
      ref_model.apply(checkpoint, TOKENS, train=False),
  )
  assert config.model.name == 'cp_transformer_lm'
  assert hub.hub_snapshot(
      'someone/tiny-cp-lm', 'main', cache_dir=tmp_path / 'hub', local_files_only=True
  ) == pathlib.Path(snapshot)

  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
  import huggingface_hub.constants  # pylint: disable=import-outside-toplevel

  # The constants are read at import; set them as the environment would have.
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
  _, by_url, _ = load('hf://someone/tiny-cp-lm')
  chex.assert_trees_all_equal(_np(by_url), _np(checkpoint))
  _, by_rev, _ = load(f'hf://someone/tiny-cp-lm@{COMMIT}')
  chex.assert_trees_all_equal(_np(by_rev), _np(checkpoint))
  with pytest.raises(Exception, match='Cannot find an appropriate cached snapshot'):
    load('hf://someone/not-there')


def test_without_huggingface_hub_the_error_names_the_extra(monkeypatch):
  import builtins  # pylint: disable=import-outside-toplevel

  real_import = builtins.__import__

  def no_hub(name, *args, **kwargs):
    if name == 'huggingface_hub' or name.startswith('huggingface_hub.'):
      raise ModuleNotFoundError(f"No module named '{name}'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, '__import__', no_hub)
  with pytest.raises(ImportError, match=r"pip install 'contextpool-jax\[hub\]'"):
    load('hf://someone/tiny-cp-lm')
  with pytest.raises(ImportError, match=r"pip install 'contextpool-jax\[hub\]'"):
    workdirs.load_from_hub('someone/tiny-cp-lm')
