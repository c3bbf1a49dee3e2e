"""One split of a prepared TFDS dataset (array_record, no TensorFlow), with clear errors.

Shared by the translation and image pipelines (the byte corpora have their own
builders, :mod:`contextpool_jax.data.text_builders`). :func:`open_split` calls
``tfds.data_source(name, split=..., data_dir=..., download=False)`` and turns
its failures into one of two errors:

* :class:`~contextpool_jax.data.DatasetNotFoundError` -- the dataset is not
  prepared in ``data_dir`` (or TFDS does not know it); the message is the
  caller's how-to-prepare text plus TFDS's reason.
* ``ValueError`` naming the setting and its value -- the dataset is prepared
  but the split is not one of its splits, its slice syntax is wrong, or it
  selects no example (for which TFDS/array_record only say "Paths sequence can
  not be of 0 length"); the message lists the prepared splits and their sizes.
  A source with no examples (e.g. from a mock) is the same error.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, cast

from contextpool_jax.data import DatasetNotFoundError
from contextpool_jax.base.errors import ConfigError

_EXPECTED_SPLIT = (
    'expected one of them, or a TFDS slice of one that selects at least one '
    "example (e.g. 'train[:90%]')"
)


def _prepared_splits(name: str, data_dir: Optional[str]) -> str:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    splits = tfds.builder(name, data_dir=data_dir).info.splits
  except (ValueError, FileNotFoundError, tfds.core.DatasetNotFoundError) as e:
    return f'unknown ({type(e).__name__}: {str(e).splitlines()[0][:200]})'
  return ', '.join(f'{s} ({info.num_examples} examples)' for s, info in splits.items())


def require_examples(
    source: Sequence[Any], setting: str, name: str, data_dir: Optional[str] = None
) -> None:
  """Raises ValueError naming ``setting`` if ``source`` has no examples."""
  try:
    empty = len(source) == 0
  except ValueError:  # a reversed slice ('train[5:2]'): TFDS's source has a negative length
    empty = True
  if empty:
    raise ConfigError(
        f"{setting} selects no example of '{name}'. Prepared splits: "
        f'{_prepared_splits(name, data_dir)}; {_EXPECTED_SPLIT}.'
    )


def open_split(
    name: str,
    split: str,
    data_dir: Optional[str],
    *,
    setting: str,
    how_to_prepare: Callable[[], str],
) -> Sequence[Any]:
  """``tfds.data_source`` of one split with the errors of the module docstring.

  Args:
    name: TFDS name (``'cifar10'``, ``'wmt14_translate/de-en'``).
    split: split name or TFDS slice (``'train[:1%]'``).
    data_dir: TFDS data directory (None = TFDS's default).
    setting: how messages name the setting that chose ``split`` and its value,
      e.g. ``"config.dataset.eval_split='valid'"``.
    how_to_prepare: returns the DatasetNotFoundError message.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  try:
    # One split (a string): one data source.
    source = cast(
        Sequence[Any], tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    )
  except (
      NotImplementedError,
      AssertionError,
      FileNotFoundError,
      tfds.core.DatasetNotFoundError,
  ) as e:
    raise DatasetNotFoundError(
        f'{how_to_prepare()} ({type(e).__name__}: {str(e).splitlines()[0][:200]})'
    ) from e
  except ValueError as e:  # The dataset is prepared: the split is wrong.
    raise ConfigError(
        f"{setting} cannot be read from '{name}' ({e}). Prepared splits: "
        f'{_prepared_splits(name, data_dir)}; {_EXPECTED_SPLIT}.'
    ) from e
  require_examples(source, setting, name, data_dir)
  return source
