"""Areas of a memory and their features, for area attention (Li et al., ICML 2019).

An area is a contiguous range of 1..``max_area_width`` items of a 1D memory,
or a rectangle of up to ``max_area_height`` x ``max_area_width`` items of a 2D
memory (a grid stored flattened row-major, ``memory_height`` rows of ``length
// memory_height`` items). This file says which areas exist, in which order,
and computes their features without ever gathering an area's items:

* :func:`area_layout` / :func:`num_areas`: the areas (Section 3, Fig. 1-2).
* :func:`area_sums`: the sum of every area from a summed area table (integral
  image, Eq. 10-11, Algorithm 1); also how area attention (:mod:`.masks`) counts the
  masked items of every area.
* :func:`padded_area_sums` (and its transpose, :func:`padded_area_valid`,
  :func:`pad_areas`): weighted sums of every area by direct window sums, in a
  padded layout with one grid-sized block per shape; area attention's basic
  form sums item logits into area logits with it.
* :func:`area_features`: sum (Eq. 4, 11), mean (Eq. 3), standard deviation
  (Eq. 5; pairwise merges of the areas' moments instead of Eq. 12's table of
  squares, which cancels catastrophically in float32) and maximum (sliding
  maxima) of every area (Algorithm 2), in O(n * number of area shapes).

Choices the paper leaves open (each documented where it is made):

* Area order: by shape (height-major, then width), then by top-left corner in
  row-major order; shapes larger than the grid are skipped (no such areas).
  Areas never wrap across rows and never extend past the grid (no padding).
* Standard deviation: ``sqrt(var + std_epsilon)`` so that its gradient is
  finite for constant areas (single items included); ``var`` is the
  population variance of the area's items.
* Numerics: tables and moments are accumulated in (at least) float32,
  whatever the compute dtype. Table differences carry an absolute rounding
  error of about ``float32 eps * |prefix sum|`` (sums and means of an area are
  unaffected in practice). The std never uses the tables: Eq. 12's ``E[x^2] -
  E[x]^2`` would cancel catastrophically for values with an offset; merging
  the areas' moments pairwise (:func:`_area_variances`) keeps it within a few
  float32 epsilons, relatively, against float64 on the same float32 inputs
  (measured, 1D and 2D: docs/area_attention.md, Precision; asserted in
  ``tests/layers/test_area_attention.py``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from contextpool_jax.base import checks
from contextpool_jax.base.errors import ConfigError

Array = jax.Array

FEATURE_NAMES = ('sum', 'mean', 'std', 'max')


# ----------------------------------------------------------------------------
# Area layout (static).
# ----------------------------------------------------------------------------


class AreaLayout(NamedTuple):
  """Static description of every area of a memory, in the order used everywhere.

  Attributes:
    row: ``[num_areas]`` int, grid row of each area's top-left item.
    col: ``[num_areas]`` int, grid column of each area's top-left item.
    height: ``[num_areas]`` int, area height in items (1..max_area_height).
    width: ``[num_areas]`` int, area width in items (1..max_area_width).
    grid_height: rows of the memory grid (``memory_height``).
    grid_width: items per row (``kv_len // memory_height``).
    shapes: the area shapes ``(h, w)`` present, in order.
  """

  row: np.ndarray
  col: np.ndarray
  height: np.ndarray
  width: np.ndarray
  grid_height: int
  grid_width: int
  shapes: tuple[tuple[int, int], ...]

  @property
  def last_index(self) -> np.ndarray:
    """``[num_areas]`` flattened (row-major) index of each area's bottom-right item.

    It is the largest flattened index of any item in the area, which is what
    causal masking compares with the query position.
    """
    return (self.row + self.height - 1) * self.grid_width + self.col + self.width - 1

  @property
  def num_areas(self) -> int:
    return int(self.row.shape[0])

  @property
  def size(self) -> int:
    """Items in the memory (``grid_height * grid_width``)."""
    return self.grid_height * self.grid_width


def check_area_options(
    owner: str, max_area_width: Any, max_area_height: Any, memory_height: Any
) -> None:
  """Raises ConfigError unless the three area options are positive ints."""
  checks.check_positive(owner, 'max_area_width', max_area_width, integer=True)
  checks.check_positive(owner, 'max_area_height', max_area_height, integer=True)
  checks.check_positive(owner, 'memory_height', memory_height, integer=True)


def check_memory_length(owner: str, length: int, memory_height: int, what: str) -> None:
  """Raises ConfigError unless ``memory_height`` divides the memory ``length``
  (``what`` names the memory in the message)."""
  if length % memory_height:
    raise ConfigError(
        f'{owner}.memory_height={memory_height!r} does not divide the {what} '
        f'length {length}; a 2D memory is memory_height rows of '
        f'length // memory_height items, so the length must be a multiple of '
        'memory_height.'
    )


def _area_shapes(
    grid_height: int, grid_width: int, max_area_height: int, max_area_width: int
) -> tuple[tuple[int, int], ...]:
  """Area shapes ``(h, w)`` that fit in the grid, height-major."""
  return tuple(
      (h, w)
      for h in range(1, min(max_area_height, grid_height) + 1)
      for w in range(1, min(max_area_width, grid_width) + 1)
  )


def area_layout(
    length: int, *, max_area_width: int = 1, max_area_height: int = 1, memory_height: int = 1
) -> AreaLayout:
  """Enumerates the areas of a memory of ``length`` items (Section 3, Fig. 1-2).

  The memory is a grid of ``memory_height`` rows of ``length // memory_height``
  items stored row-major (``memory_height=1``: a 1D sequence). The areas are
  every rectangle of ``h x w`` items with ``1 <= h <= max_area_height`` and
  ``1 <= w <= max_area_width`` lying entirely inside the grid; they never wrap
  across rows. Order (the paper leaves it open): by shape, height-major, then by
  top-left corner, row-major -- the order of Algorithm 1's loop over shapes with
  its per-shape results flattened and concatenated.

  The count is ``sum_{a=1..A} (n - a + 1)`` in 1D and
  ``sum_{h, w} (H - h + 1)(W - w + 1)`` in 2D.

  Args:
    length: number of items ``kv_len``.
    max_area_width: largest area width (a larger value than the grid width is
      clipped: such areas do not exist).
    max_area_height: largest area height (clipped to ``memory_height``).
    memory_height: rows of the grid.

  Returns:
    An :class:`AreaLayout` of numpy arrays.

  Raises:
    ValueError: a non-positive option, or ``length`` not a multiple of
      ``memory_height``.
  """
  owner = 'area_layout'
  check_area_options(owner, max_area_width, max_area_height, memory_height)
  check_memory_length(owner, length, memory_height, 'memory')
  grid_h, grid_w = memory_height, length // memory_height
  shapes = _area_shapes(grid_h, grid_w, max_area_height, max_area_width)
  rows, cols, heights, widths = [], [], [], []
  for h, w in shapes:
    r, c = np.meshgrid(np.arange(grid_h - h + 1), np.arange(grid_w - w + 1), indexing='ij')
    rows.append(r.reshape(-1))
    cols.append(c.reshape(-1))
    heights.append(np.full(r.size, h))
    widths.append(np.full(r.size, w))
  cat = lambda xs: np.concatenate(xs).astype(np.int32) if xs else np.zeros((0,), np.int32)
  return AreaLayout(cat(rows), cat(cols), cat(heights), cat(widths), grid_h, grid_w, shapes)


def num_areas(
    length: int, *, max_area_width: int = 1, max_area_height: int = 1, memory_height: int = 1
) -> int:
  """Number of areas of a memory; see :func:`area_layout`."""
  return area_layout(
      length,
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
  ).num_areas


# ----------------------------------------------------------------------------
# Summed area tables and sliding maxima (Eq. 10-12, Algorithms 1-2).
# ----------------------------------------------------------------------------


def _summed_area_table(x: Array, axis: int) -> Array:
  """Integral image over axes ``(axis, axis + 1)``, zero-padded top and left (Eq. 10).

  ``table[..., r, c, ...]`` is the sum of ``x[..., :r, :c, ...]``; the result has
  one more row and column than ``x`` (Algorithm 1, lines 1-3).
  """
  table = jnp.cumsum(jnp.cumsum(x, axis=axis), axis=axis + 1)
  pad = [(0, 0)] * x.ndim
  pad[axis] = pad[axis + 1] = (1, 0)
  return jnp.pad(table, pad)


def _area_sums(table: Array, shapes: Sequence[tuple[int, int]], axis: int) -> list[Array]:
  """Sums of every ``h x w`` window, for each shape, from a summed area table (Eq. 11).

  ``S(r, c) = I(r + h, c + w) - I(r + h, c) - I(r, c + w) + I(r, c)`` for every
  top-left corner ``(r, c)``, evaluated separably as
  ``[I(r + h, c + w) - I(r + h, c)] - [I(r, c + w) - I(r, c)]``: the column
  differences are shared by all shapes of one width. Returns, per shape,
  ``[..., H - h + 1, W - w + 1, ...]``.
  """
  rows, cols = table.shape[axis], table.shape[axis + 1]
  col_diff = {}
  for w in sorted({w for _, w in shapes}):
    col_diff[w] = jax.lax.slice_in_dim(table, w, cols, axis=axis + 1) - jax.lax.slice_in_dim(
        table, 0, cols - w, axis=axis + 1
    )
  return [
      jax.lax.slice_in_dim(col_diff[w], h, rows, axis=axis)
      - jax.lax.slice_in_dim(col_diff[w], 0, rows - h, axis=axis)
      for h, w in shapes
  ]


def _grow_areas(
    leaf: Any,
    shapes: Sequence[tuple[int, int]],
    axis: int,
    merge: Callable[[Any, Any, int, int], Any],
) -> dict:
  """A statistic of every ``h x w`` window, for each shape, built by merging.

  ``leaf`` is a pytree of ``[..., H, W, ...]`` arrays (grid axes ``axis``,
  ``axis + 1``), the statistic of every single item. ``merge(a, b, n_a, n_b)``
  gives the statistic of the union of two disjoint windows from theirs, ``a``
  the left/top one (``n_a``, ``n_b`` items). Windows grow one column at a
  time, ``S_{1,w} = merge(S_{1,w-1}[:, :-1], leaf[:, w-1:])``, then one row at
  a time, ``S_{h,w} = merge(S_{h-1,w}[:-1], S_{1,w}[h-1:])``: one merge per
  shape, O(n * number of shapes), no gathers.

  Returns:
    ``{(h, w): statistic with grid axes [H - h + 1, W - w + 1]}``.
  """
  first = jax.tree.leaves(leaf)[0]
  grid_h, grid_w = first.shape[axis], first.shape[axis + 1]
  max_w = max(w for _, w in shapes)
  max_h = max(h for h, _ in shapes)
  take = lambda tree, ax, start, n: jax.tree.map(
      lambda a: jax.lax.slice_in_dim(a, start, start + n, axis=ax), tree
  )
  strip = {1: leaf}
  for w in range(2, max_w + 1):
    n = grid_w - w + 1
    strip[w] = merge(take(strip[w - 1], axis + 1, 0, n), take(leaf, axis + 1, w - 1, n), w - 1, 1)
  out = {}
  for w in range(1, max_w + 1):
    stat = out[(1, w)] = strip[w]
    for h in range(2, max_h + 1):
      n = grid_h - h + 1
      stat = out[(h, w)] = merge(
          take(stat, axis, 0, n), take(strip[w], axis, h - 1, n), (h - 1) * w, w
      )
  return out


def _area_maxima(x: Array, shapes: Sequence[tuple[int, int]], axis: int) -> dict:
  """Element-wise maximum over every ``h x w`` window, for each shape.

  A summed area table cannot give maxima; :func:`_grow_areas` builds them with
  one element-wise maximum per shape.

  Returns:
    ``{(h, w): [..., H - h + 1, W - w + 1, ...]}``.
  """
  return _grow_areas(x, shapes, axis, lambda a, b, n_a, n_b: jnp.maximum(a, b))


class _Moments(NamedTuple):
  """Shifted moments of a window: ``shift`` = its top-left item, ``mean`` = its
  mean minus ``shift``, ``m2`` = the sum of squared deviations from its mean."""

  shift: Array
  mean: Array
  m2: Array


def _merge_moments(a: _Moments, b: _Moments, n_a: int, n_b: int) -> _Moments:
  """Moments of the union of two disjoint windows (Chan, Golub and LeVeque's
  pairwise update): ``m2 = m2_a + m2_b + delta^2 n_a n_b / (n_a + n_b)`` with
  ``delta = mean_b - mean_a``, computed as ``(shift_b - shift_a) + (mean'_b -
  mean'_a)``: a difference of two inputs plus one of small shifted means, so
  nothing cancels catastrophically, whatever the offset of the values."""
  n = n_a + n_b
  delta = (b.shift - a.shift) + (b.mean - a.mean)
  return _Moments(
      a.shift, a.mean + delta * (n_b / n), a.m2 + b.m2 + jnp.square(delta) * (n_a * n_b / n)
  )


def _area_variances(x: Array, shapes: Sequence[tuple[int, int]], axis: int) -> dict:
  """Population variance ``sum (x - mean)^2 / (h w)`` of every ``h x w`` window.

  Not Eq. 12's ``E[x^2] - E[x]^2`` from a table of squares: in float32 that
  difference cancels catastrophically when the values have an offset (n =
  4096, values 3 + 0.01 N(0, 1), width-5 areas: errors up to 0.07 on stds of
  about 0.007). Instead the windows' moments are merged pairwise by
  :func:`_grow_areas` and :func:`_merge_moments` (O(n * number of shapes),
  like the tables): never negative, exactly 0 for single items, and relative
  errors of a few float32 epsilons times the area size in that example.

  Returns:
    ``{(h, w): [..., H - h + 1, W - w + 1, ...]}``.
  """
  leaf = _Moments(x, jnp.zeros_like(x), jnp.zeros_like(x))
  moments = _grow_areas(leaf, shapes, axis, _merge_moments)
  return {(h, w): moments[(h, w)].m2 / float(h * w) for h, w in shapes}


def _flatten_corners(a: Array, axis: int) -> Array:
  """A per-shape statistic ``[..., H - h + 1, W - w + 1, ...]`` (one entry per
  top-left corner, on axes ``axis``, ``axis + 1``) with its corners on one axis,
  row-major (:func:`area_layout`'s order within a shape)."""
  return a.reshape(a.shape[:axis] + (a.shape[axis] * a.shape[axis + 1],) + a.shape[axis + 2 :])


def _concat_areas(per_shape: Sequence[Array], axis: int) -> Array:
  """Per-shape statistics as one ``[..., num_areas, ...]`` array, in
  :func:`area_layout`'s order."""
  return jnp.concatenate([_flatten_corners(a, axis) for a in per_shape], axis=axis)


def area_sums(x: Array, layout: AreaLayout, axis: int) -> Array:
  """Sum of every area of ``layout`` (Eq. 10-11): ``x`` has the grid on axes
  ``(axis, axis + 1)``; the result replaces them by one ``num_areas`` axis, in
  the layout's order. Sums are accumulated in ``x``'s dtype (exact for ints)."""
  table = _summed_area_table(x, axis)
  return _concat_areas(_area_sums(table, layout.shapes, axis), axis)


def padded_area_sums(
    x: Array, layout: AreaLayout, axis: int, weights: Sequence[float] | None = None
) -> Array:
  """``weight(h, w) * sum`` of every area of ``layout`` in the *padded* area layout.

  The padded layout gives every shape ``(h, w)`` of ``layout.shapes`` a full
  ``grid_height x grid_width`` block, indexed by the area's top-left corner,
  row-major; corners whose area would leave the grid are padding (their
  entries are sums over a zero-padded grid: meaningless, see
  :func:`padded_area_valid`). Blocks follow the shapes' order, so dropping the
  padding gives :func:`area_layout`'s order (:func:`pad_areas` maps between the
  two). Unlike the packed layout, every block is the grid's size: a regular
  ``[num_shapes * grid size]`` axis, cheaper to sum into, reduce over and sum
  back from than a concatenation of ragged blocks.

  ``x`` has the grid on axes ``(axis, axis + 1)``; the result replaces them by
  one axis of ``num_shapes * grid_height * grid_width`` entries. ``weights``:
  one scalar per shape (``None``: all 1), e.g. ``1 / (h w)`` for means (Eq. 3).
  The windows grow by one addition per shape (:func:`_grow_areas`), so an
  area's sum adds its own ``h w`` items only: no prefix-sum rounding (unlike
  :func:`area_sums`' table). Used by area attention to sum item logits into
  area logits; :func:`padded_area_sums_transpose` sums back.
  """
  weights = (1.0,) * len(layout.shapes) if weights is None else tuple(weights)
  max_h = max(h for h, _ in layout.shapes)
  max_w = max(w for _, w in layout.shapes)
  pad = [(0, 0)] * x.ndim
  pad[axis], pad[axis + 1] = (0, max_h - 1), (0, max_w - 1)
  sums = _grow_areas(jnp.pad(x, pad), layout.shapes, axis, lambda a, b, n_a, n_b: a + b)
  blocks = []
  for shape, c in zip(layout.shapes, weights):
    block = jax.lax.slice_in_dim(sums[shape], 0, layout.grid_height, axis=axis)
    block = jax.lax.slice_in_dim(block, 0, layout.grid_width, axis=axis + 1)
    blocks.append(_flatten_corners(block if c == 1.0 else block * c, axis))
  return jnp.concatenate(blocks, axis=axis)


def padded_area_sums_transpose(
    y: Array, layout: AreaLayout, axis: int, weights: Sequence[float] | None = None
) -> Array:
  """The transpose of :func:`padded_area_sums`: areas back to items.

  ``y`` has the padded area axis on ``axis`` (its padding entries must be 0);
  item ``j`` of the result is ``sum over the areas a containing j of
  weight(a) * y[a]``, on grid axes ``(axis, axis + 1)``. Built by
  :func:`jax.vjp` of the (linear) sums, so it is the exact adjoint: shifted additions,
  one per shape, no scatter.
  """
  grid = (layout.grid_height, layout.grid_width)
  shape = y.shape[:axis] + grid + y.shape[axis + 1 :]
  forward = lambda x: padded_area_sums(x, layout, axis, weights)
  # The primal's type carries y's varying manual axes (inside shard_map), so
  # the transpose's cotangent type matches.
  axis_type = getattr(jax.typeof(y), 'manual_axis_type', None)
  vma = tuple(sorted(axis_type.varying)) if axis_type is not None else ()
  primal = jnp.zeros(shape, y.dtype)
  if vma:
    primal = jax.lax.pcast(primal, vma, to='varying')
  _, transpose = jax.vjp(forward, primal)
  (x,) = transpose(y)
  return x


def padded_area_valid(layout: AreaLayout) -> np.ndarray:
  """``[num_shapes * grid size]`` bool: which entries of the padded layout
  (:func:`padded_area_sums`) are areas (True) rather than padding."""
  rows = np.arange(layout.grid_height)[:, None]
  cols = np.arange(layout.grid_width)[None, :]
  return np.concatenate(
      [
          ((rows + h <= layout.grid_height) & (cols + w <= layout.grid_width)).reshape(-1)
          for h, w in layout.shapes
      ]
  )


def pad_areas(a: Array, layout: AreaLayout, axis: int, fill: Any) -> Array:
  """A per-area array in :func:`area_layout`'s order (``num_areas`` on
  ``axis``) in the padded layout of :func:`padded_area_sums`, padding entries
  set to ``fill``."""
  blocks, start = [], 0
  for h, w in layout.shapes:
    rows, cols = layout.grid_height - h + 1, layout.grid_width - w + 1
    block = jax.lax.slice_in_dim(a, start, start + rows * cols, axis=axis)
    block = block.reshape(a.shape[:axis] + (rows, cols) + a.shape[axis + 1 :])
    pad = [(0, 0)] * block.ndim
    pad[axis], pad[axis + 1] = (0, h - 1), (0, w - 1)
    blocks.append(_flatten_corners(jnp.pad(block, pad, constant_values=fill), axis))
    start += rows * cols
  return jnp.concatenate(blocks, axis=axis)


class AreaFeatures(NamedTuple):
  """Per-area features of a memory (Algorithm 2); a pytree.

  Array features have shape ``[batch, num_areas, *feature_dims]`` (e.g.
  ``[batch, num_areas, heads, depth]``) and are ``None`` when not requested.

  Attributes:
    sum: sum of the item vectors in the area (Eq. 4, Eq. 11).
    mean: ``sum / (height * width)`` (Eq. 3).
    std: ``sqrt(var + std_epsilon)``, var the population variance of the
      area's items (Eq. 5; computed by pairwise merges, not Eq. 12's table).
    max: element-wise maximum over the area's items.
    height: ``[num_areas]`` int32 area heights.
    width: ``[num_areas]`` int32 area widths.
  """

  sum: Array | None
  mean: Array | None
  std: Array | None
  max: Array | None
  height: Array
  width: Array


def area_features(
    x: Array,
    *,
    max_area_width: int = 1,
    max_area_height: int = 1,
    memory_height: int = 1,
    features: Sequence[str] = FEATURE_NAMES,
    std_epsilon: float = 1e-6,
) -> AreaFeatures:
  """Computes per-area features in O(n * number of area shapes) (Eq. 10-12, Algorithms 1-2).

  ``x`` is ``[batch, length, *feature_dims]``, the items of a memory of
  ``memory_height`` rows of ``length // memory_height`` items stored row-major.
  Areas are those of :func:`area_layout`, in its order.

  * ``sum`` (Eq. 11): from the integral image of ``x`` (Eq. 10).
  * ``mean`` (Eq. 3): ``sum / (h * w)``.
  * ``std`` (Eq. 5): ``sqrt(var + std_epsilon)``, var = ``sum (x - mean)^2 /
    (h w)``. Not from Eq. 12's table of ``x * x`` (``E[x^2] - E[x]^2`` cancels
    catastrophically in float32 when the values have an offset): the areas'
    moments are merged pairwise, one column then one row at a time
    (:func:`_area_variances`), which is never negative and exactly 0 for
    single items. ``std_epsilon`` keeps the gradient finite at zero variance
    (the paper's Algorithm 2 has none).
  * ``max``: sliding maxima (a summed area table cannot give maxima).

  Tables and moments are accumulated in at least float32 (bfloat16 cumulative
  sums lose everything) and the features are cast back to ``x.dtype``. Only
  the requested features are computed. Precision: a table entry is a prefix
  sum over up to ``length`` items, so an area sum carries an absolute rounding
  error of about ``float32 eps * |prefix sum|`` (the paper's method, not
  exact); the std is relatively accurate to a few float32 epsilons whatever
  the offset of the values. Under ``jax.enable_x64`` float64 inputs are
  accumulated in float64.

  Args:
    x: ``[batch, length, *feature_dims]`` item vectors.
    max_area_width: largest area width.
    max_area_height: largest area height.
    memory_height: rows of the memory grid (1: a 1D sequence).
    features: which of ``'sum', 'mean', 'std', 'max'`` to compute.
    std_epsilon: added to the variance inside the square root.

  Returns:
    An :class:`AreaFeatures`.

  Raises:
    ValueError: bad rank, option, feature name or length.
  """
  owner = 'area_features'
  check_area_options(owner, max_area_width, max_area_height, memory_height)
  checks.check_rank(owner, 'x', x, (3, 4, 5, 6), '[batch, length, *feature_dims]')
  for name in features:
    checks.check_choice(owner, 'features', name, FEATURE_NAMES)
  checks.check_positive(owner, 'std_epsilon', std_epsilon, allow_zero=True)
  check_memory_length(owner, x.shape[1], memory_height, 'memory')
  layout = area_layout(
      x.shape[1],
      max_area_width=max_area_width,
      max_area_height=max_area_height,
      memory_height=memory_height,
  )
  return compute_area_features(x, layout, features=features, std_epsilon=std_epsilon)


def compute_area_features(
    x: Array, layout: AreaLayout, *, features: Sequence[str], std_epsilon: float
) -> AreaFeatures:
  """:func:`area_features` of ``x [batch, length, *feature_dims]`` for a layout
  of its length, without checking the arguments (the callers have)."""
  batch, feat = x.shape[0], x.shape[2:]
  grid = x.reshape((batch, layout.grid_height, layout.grid_width) + feat)
  acc_dtype = jnp.promote_types(x.dtype, jnp.float32)
  want = set(features)
  sums = means = stds = maxes = None
  if want & {'sum', 'mean'}:
    table = _summed_area_table(grid.astype(acc_dtype), axis=1)
    per_shape = [_flatten_corners(a, 1) for a in _area_sums(table, layout.shapes, axis=1)]
    if 'sum' in want:
      sums = jnp.concatenate(per_shape, axis=1).astype(x.dtype)
    if 'mean' in want:
      means = jnp.concatenate(
          [s / float(h * w) for s, (h, w) in zip(per_shape, layout.shapes)], axis=1
      ).astype(x.dtype)
  if 'std' in want:
    variances = _area_variances(grid.astype(acc_dtype), layout.shapes, axis=1)
    stds = _concat_areas(
        [jnp.sqrt(variances[s] + std_epsilon) for s in layout.shapes], axis=1
    ).astype(x.dtype)
  if 'max' in want:
    maxima = _area_maxima(grid, layout.shapes, axis=1)
    maxes = _concat_areas([maxima[s] for s in layout.shapes], axis=1)
  return AreaFeatures(
      sums, means, stds, maxes, jnp.asarray(layout.height), jnp.asarray(layout.width)
  )
