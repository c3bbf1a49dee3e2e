"""Input pipelines: TFDS (read through ``tfds.data_source`` + grain, no TensorFlow).

Contract with the trainer (``contextpool_jax/training``): each data module reads
and checks ``config.dataset`` (and ``config.seed``, ``config.batch_size``) once,
``resolve_spec(config) -> spec`` (``training.spec.read`` calls it, through the task
kind: ``TaskKind.read_data``); its pipeline functions receive that spec, never the config.

* ``make_train_dataset(spec, *, process_index, process_count) -> grain.IterDataset``
  yields *per-process* batches (``config.batch_size // process_count`` examples)
  as dicts of numpy arrays, forever (repeated), deterministically from
  ``config.seed``. Its iterator's state (``get_state``/``set_state``) is saved in
  every checkpoint, so a resumed run continues at the exact data position.
* ``make_eval_batches(spec, split, *, process_index, process_count)`` returns a
  finite, deterministic iterable of per-process batches, padded to a fixed batch
  size with a per-example ``'mask'``/``'weights'`` so every batch has one shape.

Batch formats:

* language modelling: ``{'tokens': int32 [b, seq_len + 1], 'weights': float32 [b, seq_len]}``
  (the model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``; ``weights``
  marks the positions that count, e.g. only the last ``step`` of a BPC window);
* translation: ``{'inputs': int32 [b, source_len], 'targets': int32 [b, target_len]}``
  (0 = padding; the loss weights are ``targets != 0``);
* classification: ``{'image': float32 [b, h, w, 3], 'label': int32 [b]}`` (eval
  batches add ``'mask'`` for padded examples).
* A missing dataset raises :class:`DatasetNotFoundError` with one message saying
  how to prepare it; so do local_text patterns that name no file.
* Unusable data (binary or too little text, a split that is not prepared or
  selects no example, splits too short for the windows) raises ``ValueError``
  naming the setting, its value and what is expected. An evaluation split
  smaller than one batch is not an error: padding rows have zero weight.
"""

import inspect

from etils import epath

from contextpool_jax.base.errors import DatasetNotFoundError  # pylint: disable=unused-import


def builder_code_path(cls):
  """``code_path`` of a TFDS builder defined inside this package: the file that
  defines it (TFDS's own probes ``importlib_resources``, a backport installed
  only on Python < 3.9). TFDS reads it to look up the (absent) checksums. Use as
  ``code_path = tfds.core.utils.classproperty(classmethod(builder_code_path))``."""
  try:
    return epath.Path(inspect.getfile(cls))
  except (TypeError, OSError):
    return None
