r"""Pictures of what ContextPool learned (and of area attention and layer costs).

Every ``plot_*`` function takes numpy-like arrays and returns a
``matplotlib.figure.Figure`` (made without pyplot, so nothing is shown or kept
globally; in a notebook the returned figure displays itself, elsewhere call
``fig.savefig(path)``). matplotlib is an optional dependency
(``pip install 'contextpool-jax[notebook]'``), imported on first use.

* :func:`plot_pool_text`: the learned pooling weights w and sizes sigma per
  character over a passage, the text analogue of the paper's Fig. 3.
* :func:`plot_gaussian_supports`: the Gaussian support ``g^i_j`` and the
  resulting pooling distribution ``p^i_j = w_j g^i_j / sum_j' w_j' g^i_j'`` of a
  few chosen tokens i (Eq. 4).
* :func:`plot_sigma_distribution`: the distribution of pooling sizes per layer
  (Fig. 4).
* :func:`plot_pool_grid`: weights, sizes and the Gaussian masks of chosen cells
  over an image (Fig. 3, Eq. 6).
* :func:`plot_area_attention`: one query's attention weights over areas.
* :func:`plot_costs`: compiled FLOPs and memory per layer.

The numbers come from the ``'intermediates'`` a model sows
(``apply(..., mutable=['intermediates'])``): :func:`pool_intermediates` turns
that collection into ``{layer: {'pool_weights', 'pool_sigma'}}``.

Command line (language-model workdirs; installed, also ``contextpool-viz``)::

  python -m contextpool_jax.commands.viz --workdir /tmp/cp --text "def main():" --out /tmp/figs
"""

from __future__ import annotations

import math
import pathlib
import sys
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from contextpool_jax.base.byte_text import encode_bytes
from contextpool_jax.base.checks import check_argument
from contextpool_jax.base.errors import ContextPoolJaxError
from contextpool_jax.base.numerics import MIN_TWO_VARIANCE

WEIGHTS = 'pool_weights'
SIGMA = 'pool_sigma'


def _figure(**kwargs):
  """A new ``matplotlib.figure.Figure`` (no pyplot); a clear error without matplotlib."""
  try:
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        'contextpool_jax.tools.viz needs matplotlib: pip install matplotlib '
        "(or pip install 'contextpool-jax[notebook]')."
    ) from e
  return Figure(layout='constrained', **kwargs)


# ----------------------------------------------------------------------------
# Data: intermediates, Gaussian supports, pooling distributions (numpy, pure).
# ----------------------------------------------------------------------------


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    path = f'{prefix}/{key}' if prefix else str(key)
    if isinstance(value, Mapping):
      out.update(_flatten(value, path))
    else:
      out[path] = value
  return out


def pool_intermediates(
    intermediates: Mapping[str, Any], spatial_ndim: int = 1
) -> dict[str, dict[str, np.ndarray]]:
  """``{layer: {'pool_weights': [batch, *spatial], 'pool_sigma': [batch, *spatial]}}``.

  ``intermediates``: a model's ``'intermediates'`` collection (the second output of
  ``model.apply(..., mutable=['intermediates'])``, with or without the outer
  ``'intermediates'`` key). ``layer`` is the ContextPool module's path, e.g.
  ``'decoder/layer_0/context_pool'``. Layers under ``nn.scan`` (sown arrays with a
  leading layer axis) are split into ``'<path>[k]'``. ``spatial_ndim``: 1 for
  sequences, 2 for grids. Non-local pairwise weights are left out (not ``[batch,
  *spatial]``); a layer without a learned size has no ``'pool_sigma'``.
  """
  check_argument('spatial_ndim', spatial_ndim, spatial_ndim in (1, 2), '1 (sequences) or 2 (grids)')
  tree = intermediates.get('intermediates', intermediates)
  layers: dict[str, dict[str, np.ndarray]] = {}
  for path, value in sorted(_flatten(tree).items()):
    layer, _, name = path.rpartition('/')
    if name not in (WEIGHTS, SIGMA):
      continue
    array = np.asarray(value[0] if isinstance(value, (tuple, list)) else value)
    if array.ndim == 2 + spatial_ndim:  # stacked by nn.scan: [layers, batch, *spatial]
      for k in range(array.shape[0]):
        layers.setdefault(f'{layer}[{k}]', {})[name] = array[k]
    elif array.ndim == 1 + spatial_ndim:
      layers.setdefault(layer, {})[name] = array
  return layers


def model_pools(
    model,
    variables: Mapping[str, Any],
    *args: Any,
    spatial_ndim: int = 1,
    method: Any = None,
    **kwargs: Any,
) -> dict[str, dict[str, np.ndarray]]:
  """Runs ``model.apply(variables, *args, **kwargs)`` collecting the intermediates:
  :func:`pool_intermediates` of one forward pass (``train=False`` unless given)."""
  kwargs.setdefault('train', False)
  if method is not None:
    kwargs['method'] = method
  _, state = model.apply(variables, *args, mutable=['intermediates'], **kwargs)
  return pool_intermediates(state, spatial_ndim)


def _coordinates(spatial: Sequence[int]) -> np.ndarray:
  """``[n, ndim]`` row-major grid coordinates."""
  grids = np.meshgrid(*[np.arange(s) for s in spatial], indexing='ij')
  return np.stack([g.reshape(-1) for g in grids], -1).astype(np.float64)


def _flat_centres(centres: Sequence[Any], spatial: Sequence[int]) -> np.ndarray:
  """Centres (flat indices, or ``(row, col)`` pairs on a grid) as flat indices ``[k]``."""
  n = math.prod(spatial)
  flat = []
  for c in centres:
    index = (
        int(np.ravel_multi_index(tuple(int(x) for x in c), tuple(spatial)))
        if (len(spatial) > 1 and isinstance(c, (tuple, list, np.ndarray)))
        else int(c)
    )
    check_argument(
        'centre', c, 0 <= index < n, f'a position inside the input of shape {tuple(spatial)}'
    )
    flat.append(index)
  return np.asarray(flat, np.int64)


def gaussian_support(
    sigma: np.ndarray, centres: Sequence[Any], *, causal: bool = False
) -> np.ndarray:
  """``g^i_j = exp(-d(i, j)^2 / (2 sigma_i^2))`` for each centre i: ``[k, n]``.

  ``sigma``: ``[*spatial]`` (one example; token or grid-cell units, as sown);
  ``centres``: k flat indices, or ``(row, col)`` pairs on a grid. ``causal``:
  zero for ``j > i`` (a causal LM's support).
  """
  sigma = np.asarray(sigma, np.float64)
  spatial = sigma.shape
  idx = _flat_centres(centres, spatial)
  coords = _coordinates(spatial)
  d2 = np.sum(np.square(coords[idx][:, None] - coords[None]), -1)  # [k, n]
  two_var = 2.0 * np.square(sigma.reshape(-1)[idx])[:, None] + MIN_TWO_VARIANCE
  g = np.exp(-d2 / two_var)
  if causal:
    g = np.where(np.arange(coords.shape[0])[None] <= idx[:, None], g, 0.0)
  return g


def pooling_distribution(
    weights: np.ndarray, sigma: np.ndarray, centres: Sequence[Any], *, causal: bool = False
) -> np.ndarray:
  """``p^i_j = w_j g^i_j / sum_j' w_j' g^i_j'`` (Eq. 4/6) for each centre i: ``[k, n]``.

  ``weights``, ``sigma``: ``[*spatial]`` of one example (the sown ``pool_weights``
  and ``pool_sigma``). ``y_i = sum_j p^i_j x_j`` is the layer's output at i (for
  learned weights, Gaussian locality, ``residual=False``).
  """
  weights = np.asarray(weights, np.float64)
  check_argument(
      'weights.shape',
      weights.shape,
      weights.shape == np.shape(sigma),
      f'the shape of sigma {np.shape(sigma)}',
  )
  unnorm = weights.reshape(1, -1) * gaussian_support(sigma, centres, causal=causal)
  return unnorm / np.maximum(unnorm.sum(-1, keepdims=True), 1e-300)


def byte_labels(text: str) -> list[str]:
  """One label per UTF-8 byte of ``text`` (byte-level LMs see bytes): the character at
  its first byte, ``''`` at continuation bytes; newline ``'↵'``, tab ``'→'``."""
  labels = []
  for ch in text:
    shown = {'\n': '↵', '\t': '→', '\r': '↵'}.get(ch, ch)
    labels += [shown] + [''] * (len(ch.encode('utf-8')) - 1)
  return labels


# ----------------------------------------------------------------------------
# Plots.
# ----------------------------------------------------------------------------


def _grid(values: np.ndarray, line_width: int) -> np.ndarray:
  """``[n]`` -> ``[rows, line_width]`` row-major, NaN after the end."""
  rows = -(-values.size // line_width)
  out = np.full(rows * line_width, np.nan)
  out[: values.size] = values
  return out.reshape(rows, line_width)


def plot_pool_text(
    tokens: Sequence[str],
    weights: np.ndarray,
    sigma: np.ndarray,
    *,
    line_width: int = 64,
    title: Optional[str] = None,
):
  """Pooling weights and sizes per token over a passage (Fig. 3 for text).

  Two panels, each the passage laid out in lines of ``line_width`` tokens with
  every cell coloured by its value: top ``weights`` (the normalised w_j), bottom
  ``sigma`` (the Gaussian std in tokens). ``tokens``: n labels (characters; see
  :func:`byte_labels`); ``weights``, ``sigma``: ``[n]``. The images hold the values
  row-major (``fig.axes[0].images[0].get_array()``, NaN-padded).
  """
  weights = np.asarray(weights, np.float64).reshape(-1)
  sigma = np.asarray(sigma, np.float64).reshape(-1)
  n = len(tokens)
  check_argument('weights.shape', weights.shape, weights.size == n, f'{n} values, one per token')
  check_argument('sigma.shape', sigma.shape, sigma.size == n, f'{n} values, one per token')
  check_argument('line_width', line_width, line_width > 0, 'a positive int')
  width = min(line_width, max(n, 1))
  rows = -(-n // width)
  fig = _figure(figsize=(max(4.0, 0.17 * width + 1.5), 2 * (0.32 * rows + 0.6)))
  axes = fig.subplots(2, 1)
  panels = (
      (axes[0], weights, 'Blues', 'pooling weight $w_j$'),
      (axes[1], sigma, 'Oranges', r'pooling size $\sigma_j$ (tokens)'),
  )
  for ax, values, cmap, label in panels:
    image = ax.imshow(_grid(values, width), cmap=cmap, aspect='auto', interpolation='nearest')
    for i, token in enumerate(tokens):
      ax.text(
          i % width, i // width, token, ha='center', va='center', fontsize=7, family='monospace'
      )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(label, loc='left', fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
  if title:
    fig.suptitle(title)
  return fig


def plot_gaussian_supports(
    weights: np.ndarray,
    sigma: np.ndarray,
    centres: Sequence[int],
    *,
    tokens: Optional[Sequence[str]] = None,
    causal: bool = True,
    title: Optional[str] = None,
):
  """The Gaussian supports ``g^i_j`` (top) and pooling distributions ``p^i_j``
  (bottom) of the tokens ``centres`` over a sequence, one line per centre.

  ``weights``, ``sigma``: ``[n]`` of one example; ``tokens``: optional n labels
  shown on the x axis (if n <= 96). Line k of each panel holds row k of
  :func:`gaussian_support` / :func:`pooling_distribution`.
  """
  weights = np.asarray(weights, np.float64).reshape(-1)
  sigma = np.asarray(sigma, np.float64).reshape(-1)
  check_argument('centres', centres, len(centres) > 0, 'at least one token position')
  g = gaussian_support(sigma, centres, causal=causal)
  p = pooling_distribution(weights, sigma, centres, causal=causal)
  fig = _figure(figsize=(10, 5))
  top, bottom = fig.subplots(2, 1, sharex=True)
  positions = np.arange(sigma.size)
  for k, c in enumerate(centres):
    label = f'i={int(c)}, $\\sigma_i$={sigma[int(c)]:.2f}'
    if tokens is not None:
      label += f' ({tokens[int(c)]!r})'
    (line,) = top.plot(positions, g[k], marker='.', ms=3, label=label)
    bottom.plot(positions, p[k], marker='.', ms=3, color=line.get_color())
    top.axvline(int(c), color=line.get_color(), lw=0.6, ls=':')
  top.set_ylabel('$g^i_j$ (Gaussian support)')
  bottom.set_ylabel('$p^i_j$ (pooling distribution)')
  bottom.set_xlabel('position j')
  top.legend(fontsize=8, loc='upper left')
  if tokens is not None and len(tokens) <= 96:
    bottom.set_xticks(positions, list(tokens), fontsize=6, family='monospace')
  if title:
    fig.suptitle(title)
  return fig


def plot_sigma_distribution(
    sigmas: Mapping[str, np.ndarray], *, bins: int = 40, title: Optional[str] = None
):
  """Histograms of the pooling sizes of each layer (Fig. 4), one row per layer.

  ``sigmas``: ``{layer name: any-shape array of sigma values}``, in display order.
  Row k's bars are ``np.histogram(sigmas[k], bins)`` over a shared range.
  """
  check_argument('sigmas', list(sigmas), len(sigmas) > 0, 'at least one layer')
  values = {k: np.asarray(v, np.float64).reshape(-1) for k, v in sigmas.items()}
  lo = min(v.min() for v in values.values())
  hi = max(v.max() for v in values.values())
  edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
  fig = _figure(figsize=(7, 1.3 * len(values) + 0.8))
  axes = np.atleast_1d(fig.subplots(len(values), 1, sharex=True, squeeze=False)[:, 0])
  for ax, (name, v) in zip(axes, values.items()):
    ax.hist(v, bins=edges, color='tab:orange')
    ax.set_ylabel('count')
    ax.set_title(f'{name}: mean {v.mean():.2f}, median {np.median(v):.2f}', fontsize=9)
  axes[-1].set_xlabel(r'pooling size $\sigma$')
  if title:
    fig.suptitle(title)
  return fig


def plot_pool_grid(
    weights: np.ndarray,
    sigma: np.ndarray,
    *,
    image: Optional[np.ndarray] = None,
    centres: Sequence[tuple[int, int]] = (),
    title: Optional[str] = None,
):
  """Weights and sizes over a grid (Fig. 3), plus the Gaussian masks of ``centres``.

  ``weights``, ``sigma``: ``[h, w]`` of one example (the grid ContextPool pooled,
  e.g. ViT patches or a ResNet feature map); ``image``: optional ``[H, W, 3]`` (or
  ``[H, W]``) shown first and under the masks; ``centres``: ``(row, col)`` grid
  cells whose soft Gaussian mask ``g`` is drawn (their maximum), each marked.
  Axes: ``[image,] weights, sigma[, masks]``; the weights and sigma axes' images
  hold the arrays as given.
  """
  weights = np.asarray(weights, np.float64)
  sigma = np.asarray(sigma, np.float64)
  check_argument('weights.shape', weights.shape, weights.ndim == 2, '[height, width]')
  check_argument(
      'sigma.shape',
      sigma.shape,
      sigma.shape == weights.shape,
      f'the shape of weights {weights.shape}',
  )
  h, w = weights.shape
  panels = int(image is not None) + 2 + int(bool(centres))
  fig = _figure(figsize=(3.2 * panels, 3.2))
  axes = list(np.atleast_1d(fig.subplots(1, panels)))
  extent = (-0.5, w - 0.5, h - 0.5, -0.5)  # images drawn over the grid's cells
  if image is not None:
    ax = axes.pop(0)
    ax.imshow(np.asarray(image), extent=extent)
    ax.set_title('input')
  for ax, values, cmap, label in (
      (axes[0], weights, 'viridis', 'weights $w$'),
      (axes[1], sigma, 'magma', r'size $\sigma$ (cells)'),
  ):
    im = ax.imshow(values, cmap=cmap, interpolation='nearest')
    ax.set_title(label)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
  if centres:
    ax = axes[2]
    mask = gaussian_support(sigma, centres).max(0).reshape(h, w)
    if image is not None:
      ax.imshow(np.asarray(image), extent=extent)
    ax.imshow(
        mask,
        cmap='gray',
        alpha=0.65 if image is not None else 1.0,
        extent=extent,
        vmin=0.0,
        vmax=1.0,
    )
    for r, c in centres:
      ax.plot([c], [r], marker='x', color='tab:red')
    ax.set_title('Gaussian masks $g$')
  for ax in fig.axes:
    if ax.get_label() != '<colorbar>':
      ax.set_xticks([])
      ax.set_yticks([])
  if title:
    fig.suptitle(title)
  return fig


def area_grid(probs: np.ndarray, starts: np.ndarray, widths: np.ndarray, length: int) -> np.ndarray:
  """1D areas' values as ``[max_width, length]``: entry ``(w - 1, s)`` is the area of
  width w starting at item s, NaN where there is none. ``probs``, ``starts``,
  ``widths``: ``[num_areas]`` (e.g. ``area_layout(...).col`` and ``.width``)."""
  probs = np.asarray(probs, np.float64).reshape(-1)
  starts, widths = np.asarray(starts), np.asarray(widths)
  check_argument(
      'probs.shape',
      probs.shape,
      probs.size == starts.size == widths.size,
      f'one value per area ({starts.size})',
  )
  grid = np.full((int(widths.max()), length), np.nan)
  grid[widths - 1, starts] = probs
  return grid


def plot_area_attention(
    probs: np.ndarray,
    starts: np.ndarray,
    widths: np.ndarray,
    *,
    tokens: Sequence[str],
    query: Optional[int] = None,
    title: Optional[str] = None,
):
  """One query's attention weights over the areas of a 1D memory.

  Top: :func:`area_grid` (row = area width, column = first item). Bottom: the
  weight each item receives, the sum over the areas that contain it (an area's
  weight counted once per item). ``tokens``: the memory's n item labels;
  ``query``: the query position, marked if given.
  """
  n = len(tokens)
  grid = area_grid(probs, starts, widths, n)
  per_item = np.zeros(n)
  for p, s, w in zip(np.asarray(probs).reshape(-1), starts, widths):
    per_item[s : s + w] += p
  fig = _figure(figsize=(max(6.0, 0.25 * n + 2), 4.5))
  top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(grid.shape[0], 2))
  im = top.imshow(
      grid,
      cmap='Purples',
      aspect='auto',
      interpolation='nearest',
      extent=(-0.5, n - 0.5, grid.shape[0] + 0.5, 0.5),
  )
  top.set_ylabel('area width')
  top.set_yticks(np.arange(1, grid.shape[0] + 1))
  fig.colorbar(im, ax=top, label='weight of the area starting here', fraction=0.03)
  bottom.bar(np.arange(n), per_item, color='tab:purple')
  bottom.set_ylabel('per item')
  bottom.set_xticks(np.arange(n), list(tokens), fontsize=7, family='monospace')
  if query is not None:
    for ax in (top, bottom):
      ax.axvline(query, color='tab:red', lw=0.8, ls='--')
  if title:
    fig.suptitle(title)
  return fig


def plot_costs(costs: Mapping[str, Mapping[str, float]], *, title: Optional[str] = None):
  """Bar charts of compiled cost per layer: ``costs = {layer: {'flops': ...,
  'temp_bytes': ...}}`` (e.g. ``benchmarks.harness.compiled_cost`` or
  ``compiled.cost_analysis()`` / ``memory_analysis()``). Left: GFLOPs, right:
  temporary memory in MiB; bars in the given order."""
  check_argument('costs', list(costs), len(costs) > 0, 'at least one layer')
  names = list(costs)
  fig = _figure(figsize=(9, 0.45 * len(names) + 1.5))
  left, right = fig.subplots(1, 2, sharey=True)
  left.barh(names, [costs[k]['flops'] / 1e9 for k in names], color='tab:blue')
  left.set_xlabel('GFLOPs')
  left.invert_yaxis()
  right.barh(names, [costs[k]['temp_bytes'] / 2**20 for k in names], color='tab:green')
  right.set_xlabel('temporary memory (MiB)')
  if title:
    fig.suptitle(title)
  return fig


# ----------------------------------------------------------------------------
# From a trained workdir.
# ----------------------------------------------------------------------------


def lm_pools(
    model, variables: Mapping[str, Any], text: str, *, context: Optional[int] = None
) -> tuple[list[str], dict[str, dict[str, np.ndarray]]]:
  """``(labels, pools)`` of a byte-level LM over ``text``: its first ``context`` bytes
  (labels from :func:`byte_labels`) and the :func:`model_pools` of one pass
  (arrays ``[1, n]``)."""
  check_argument('text', text, bool(text), 'a non-empty string')
  ids = encode_bytes(text, model.vocab_size)[:context]
  labels = byte_labels(text)[: len(ids)]
  return labels, model_pools(model, variables, np.asarray([ids], np.int32))


def workdir_figures(
    workdir: str, text: str, *, step: Optional[int] = None, centres: Sequence[int] = ()
) -> dict[str, Any]:
  """``{name: Figure}`` for a language-model workdir over ``text``: per ContextPool
  layer ``pool_text_<k>`` (weights and sizes per character) and
  ``gaussian_supports_<k>`` (of ``centres``, default three spread over the text),
  and ``sigma_distribution`` (all layers)."""
  # Loading a workdir needs flax and ml_collections; this module imports without them.
  # pylint: disable=g-import-not-at-top
  from contextpool_jax.inference import sampling
  from contextpool_jax.runs.workdirs import load

  model, variables, config = load(workdir, step)
  if not sampling.is_language_model(model):
    raise ValueError(
        f'{workdir} holds a {type(model).__name__} (config.model.name='
        f'{config.model.name!r}); the command line draws language-model workdirs. '
        'For images use plot_pool_grid.'
    )
  labels, pools = lm_pools(model, variables, text, context=sampling.trained_context(config) or None)
  pools = {k: v for k, v in pools.items() if WEIGHTS in v and SIGMA in v}
  if not pools:
    raise ValueError(
        f'{workdir}: model {config.model.name!r} has no ContextPool layer with '
        'learned weights and sizes to draw.'
    )
  n = len(labels)
  centres = list(centres) or sorted({n // 4, n // 2, n - 1})
  figures = {}
  for k, (name, pool) in enumerate(pools.items()):
    w, s = pool[WEIGHTS][0], pool[SIGMA][0]
    figures[f'pool_text_{k}'] = plot_pool_text(labels, w, s, title=name)
    figures[f'gaussian_supports_{k}'] = plot_gaussian_supports(
        w, s, centres, tokens=labels, causal=True, title=name
    )
  figures['sigma_distribution'] = plot_sigma_distribution(
      {name: pool[SIGMA] for name, pool in pools.items()}
  )
  return figures


def write_figures(figures: Mapping[str, Any], out_dir: str, *, dpi: int = 100) -> list[str]:
  """Saves each figure as ``<out_dir>/<name>.png``; returns the paths."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = []
  for name, fig in figures.items():
    path = out / f'{name}.png'
    fig.savefig(path, dpi=dpi)
    paths.append(str(path))
  return paths
