"""A params-only export of a workdir's checkpoint: :func:`export_params` (what it holds:
:mod:`contextpool_jax.runs.layout`; :func:`contextpool_jax.runs.workdirs.load` reads it back)."""

from __future__ import annotations

import pathlib
from typing import Optional

from flax import serialization
import jax
import numpy as np

from contextpool_jax.io import storage
from contextpool_jax.runs import model_card as card_lib
from contextpool_jax.runs import workdirs
from contextpool_jax.runs.layout import CARD_FILE, EXPORT_FILE, PathLike, SAFETENSORS_FILE, WEIGHTS_FILES


def export_params(
    workdir: PathLike, out_dir: PathLike, step: Optional[int] = None, *, msgpack: bool = True
) -> pathlib.Path:
  """Writes a params-only export of checkpoint ``step`` (None: latest) to ``out_dir``.

  ``out_dir`` gets ``config.json`` (a copy), ``model.safetensors`` (the variables dict:
  params and model state, no optimizer state; keys are the nested paths joined with ``/``,
  ``params/decoder/layer_0/...``), ``variables.msgpack`` (the same dict,
  ``flax.serialization`` msgpack, as 0.1.0 wrote and reads; ``msgpack=False``: not
  written) and ``README.md``, a model card (:func:`~contextpool_jax.runs.model_card.model_card`: the model, the config's
  key fields, data and split, the workdir's latest evaluation metrics up to ``step``, how
  to load it). ``load(out_dir)`` reads it back. The directory can be uploaded as a
  Hugging Face Hub model repo as it is. Returns ``out_dir``.

  Each file is written whole (a temporary file renamed), the weights last: an export that
  cannot be written (a full disk) leaves no file ``load`` would read as an export.

  Raises:
    WorkdirError: as :func:`~contextpool_jax.runs.workdirs.load`.
    FileExistsError: ``out_dir`` already holds an export.
    WriteError: a file of the export cannot be written; names it and the cause.
  """
  source = pathlib.Path(workdir)
  config = workdirs.read_config(source)  # checks the workdir first
  variables, exported_step = workdirs.load_variables(source, step)
  out = pathlib.Path(out_dir)
  for name in WEIGHTS_FILES:
    if (out / name).exists():
      raise FileExistsError(f'{out / name} exists; choose another out_dir.')
  state = jax.tree.map(np.asarray, variables)
  tensors = workdirs.safetensors_numpy().save(
      workdirs.flatten_variables(state), metadata={'format': 'flax'}
  )
  card = card_lib.model_card(
      config, state, exported_step, card_lib.latest_eval(source, exported_step), source=source.name
  )
  with storage.writing(out):
    out.mkdir(parents=True, exist_ok=True)
  workdirs.write_config(out, config)
  storage.write_atomic(out / CARD_FILE, card)
  storage.write_atomic(out / SAFETENSORS_FILE, tensors)
  if msgpack:
    try:
      storage.write_atomic(out / EXPORT_FILE, serialization.msgpack_serialize(state))
    except BaseException:
      (out / SAFETENSORS_FILE).unlink()  # no half export: load would read it
      raise
  return out
