"""A run's workdir and an export: the names of their files and folders.

A training workdir (written by the trainer) holds :data:`CONFIG_FILE`
(:func:`~contextpool_jax.runs.workdirs.write_config`), :data:`CHECKPOINTS_DIR` ``/<step>/`` and
:data:`METRICS_FILE`; an export (:func:`~contextpool_jax.runs.export.export_params`) holds
:data:`CONFIG_FILE`, :data:`SAFETENSORS_FILE`, :data:`EXPORT_FILE` and :data:`CARD_FILE`.
"""

from __future__ import annotations

import pathlib
from typing import Union

PathLike = Union[str, pathlib.Path]

CONFIG_FILE = 'config.json'
CHECKPOINTS_DIR = 'checkpoints'
METRICS_FILE = 'metrics.jsonl'
EXPORT_FILE = 'variables.msgpack'
SAFETENSORS_FILE = 'model.safetensors'
CARD_FILE = 'README.md'
# The files of an export: what load_from_hub downloads.
EXPORT_FILES = (CONFIG_FILE, SAFETENSORS_FILE, EXPORT_FILE, CARD_FILE)
# The weights files, in the order load reads them (the first present).
WEIGHTS_FILES = (SAFETENSORS_FILE, EXPORT_FILE)
HUB_PREFIX = 'hf://'
STATE_ITEM = 'state'
# What load restores from a checkpoint's 'state' item (TrainState fields).
RESTORED_FIELDS = ('params', 'model_state')
