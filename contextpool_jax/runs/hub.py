"""Exports on the Hugging Face Hub: the local copy of an export in a model repo
(``pip install 'contextpool-jax[hub]'``; :func:`contextpool_jax.runs.workdirs.load` reads
``hf://user/repo`` through it)."""

from __future__ import annotations

import pathlib
from typing import Optional

from contextpool_jax.runs.layout import EXPORT_FILES, PathLike


def _huggingface_hub():
  try:
    import huggingface_hub  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ImportError(
        'loading from the Hugging Face Hub needs huggingface_hub, not installed here: '
        f"pip install 'contextpool-jax[hub]' ({e})."
    ) from e
  return huggingface_hub


def hub_snapshot(
    repo_id: str,
    revision: Optional[str] = None,
    *,
    cache_dir: Optional[PathLike] = None,
    local_files_only: bool = False,
) -> pathlib.Path:
  """The local directory of an export in Hugging Face Hub model repo ``repo_id``
  (``'user/repo'``) at ``revision`` (a branch, tag or commit; None: the default branch):
  ``huggingface_hub.snapshot_download`` of the export's files only (``EXPORT_FILES``)
  into the Hub cache (``cache_dir``; None: ``$HF_HUB_CACHE``, by default
  ``~/.cache/huggingface/hub``). ``local_files_only=True`` (or ``HF_HUB_OFFLINE=1``)
  reads the cache without the network.

  Raises:
    ImportError: huggingface_hub is not installed (``pip install 'contextpool-jax[hub]'``).
  """
  hub = _huggingface_hub()
  path = hub.snapshot_download(
      repo_id,
      revision=revision,
      cache_dir=None if cache_dir is None else str(cache_dir),
      local_files_only=local_files_only,
      allow_patterns=list(EXPORT_FILES),
      library_name='contextpool-jax',
  )
  return pathlib.Path(path)
