"""The settings both entry points share (the function's arguments, the module's
fields): :class:`AreaSettings`."""

from __future__ import annotations

from typing import Any, NamedTuple

from contextpool_jax.layers.area_attention.areas import AreaLayout
from contextpool_jax.layers.area_attention.areas import area_layout


class AreaSettings(NamedTuple):
  """What areas exist and how they are attended (checked by
  :func:`~.validate.check_config`).

  Attributes:
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of the memory grid (stored row-major).
    key_mode: one of ``KEY_MODES`` (:mod:`.keys`).
    value_mode: ``'sum'``, ``'mean'`` or ``'max'``.
    causal: also mask items ``j > i`` (raster order in 2D, top-left aligned).
    dropout_rate: dropout on the attention probabilities.
    std_epsilon: variance floor inside the area std.
  """

  max_area_width: Any
  max_area_height: Any
  memory_height: Any
  key_mode: Any
  value_mode: Any
  causal: Any
  dropout_rate: Any
  std_epsilon: Any

  def layout(self, kv_len: int) -> AreaLayout:
    """The areas of a memory of ``kv_len`` items (:func:`area_layout`)."""
    return area_layout(
        kv_len,
        max_area_width=self.max_area_width,
        max_area_height=self.max_area_height,
        memory_height=self.memory_height,
    )
