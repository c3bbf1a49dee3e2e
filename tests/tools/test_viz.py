"""contextpool_jax.tools.viz: the plotted data is the data given, and the maths matches the layer."""

import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contextpool_jax import ContextPool
from contextpool_jax.tools import viz
from contextpool_jax.layers.area_attention import area_layout
from contextpool_jax.models import create


def _pool(x, **fields):
  """A ContextPool's output and its sown weights and sigma (one example)."""
  layer = ContextPool(**fields)
  variables = layer.init(jax.random.key(1), x)
  y, state = layer.apply(variables, x, mutable=['intermediates'])
  pools = viz.pool_intermediates(state, spatial_ndim=x.ndim - 2)
  ((name, pool),) = pools.items()
  assert name == ''  # the layer itself is the root module
  return y, pool['pool_weights'], pool['pool_sigma']


def _image_data(ax):
  return np.asarray(ax.images[0].get_array(), np.float64)


@pytest.mark.parametrize('causal', [True, False])
def test_pooling_distribution_reproduces_the_layer_on_a_sequence(causal):
  x = jax.random.normal(jax.random.key(0), (1, 20, 6))
  y, w, sigma = _pool(x, causal=causal)
  p = viz.pooling_distribution(w[0], sigma[0], range(20), causal=causal)
  chex.assert_trees_all_close(
      p @ np.asarray(x[0], np.float64), np.asarray(y[0]), atol=1e-5, rtol=1e-5
  )
  if causal:
    assert np.all(np.triu(p, 1) == 0)


def test_pooling_distribution_reproduces_the_layer_on_a_grid():
  x = jax.random.normal(jax.random.key(0), (1, 6, 5, 4))
  y, w, sigma = _pool(x)
  cells = [(r, c) for r in range(6) for c in range(5)]
  p = viz.pooling_distribution(w[0], sigma[0], cells)
  chex.assert_trees_all_close(
      p @ np.asarray(x[0], np.float64).reshape(30, 4),
      np.asarray(y[0]).reshape(30, 4),
      atol=1e-5,
      rtol=1e-5,
  )


def test_gaussian_support_is_the_formula():
  sigma = np.array([0.5, 1.0, 2.0, 3.0, 0.7])
  g = viz.gaussian_support(sigma, [3], causal=True)
  j = np.arange(5)
  expected = np.where(j <= 3, np.exp(-((3 - j) ** 2) / (2 * 3.0**2)), 0.0)
  chex.assert_trees_all_close(g[0], expected)


def test_text_figure_holds_the_sown_weights_and_sigma():
  x = jax.random.normal(jax.random.key(2), (1, 11, 6))
  _, w, sigma = _pool(x, causal=True)
  labels = viz.byte_labels('déf f(x):\n')  # 'é' is two bytes: 11 labels
  assert len(labels) == 11 and labels[2] == '' and labels[-1] == '↵'
  fig = viz.plot_pool_text(labels, w[0], sigma[0], line_width=4)
  weights_img, sigma_img = _image_data(fig.axes[0]), _image_data(fig.axes[1])
  assert weights_img.shape == (3, 4)  # 11 tokens in lines of 4
  chex.assert_trees_all_close(weights_img.reshape(-1)[:11], np.asarray(w[0], np.float64))
  chex.assert_trees_all_close(sigma_img.reshape(-1)[:11], np.asarray(sigma[0], np.float64))
  assert np.isnan(sigma_img.reshape(-1)[11:]).all()
  assert [t.get_text() for t in fig.axes[0].texts] == labels


def test_gaussian_supports_figure_lines_are_the_supports_and_distributions():
  x = jax.random.normal(jax.random.key(3), (1, 16, 6))
  _, w, sigma = _pool(x, causal=True)
  centres = [3, 9, 15]
  fig = viz.plot_gaussian_supports(w[0], sigma[0], centres, tokens=list('abcdefghijklmnop'))
  top, bottom = fig.axes[:2]
  g = viz.gaussian_support(sigma[0], centres, causal=True)
  p = viz.pooling_distribution(w[0], sigma[0], centres, causal=True)
  chex.assert_trees_all_close(
      np.stack([l.get_ydata() for l in top.lines if len(l.get_ydata()) == 16]), g
  )
  chex.assert_trees_all_close(np.stack([l.get_ydata() for l in bottom.lines]), p)
  chex.assert_trees_all_close(p.sum(-1), np.ones(3))


def test_sigma_distribution_bars_are_the_histograms_per_layer():
  rng = np.random.default_rng(0)
  sigmas = {'layer_0': rng.gamma(2.0, 1.0, (2, 50)), 'layer_1': rng.gamma(5.0, 1.0, (2, 50))}
  fig = viz.plot_sigma_distribution(sigmas, bins=10)
  assert len(fig.axes) == 2
  lo = min(v.min() for v in sigmas.values())
  hi = max(v.max() for v in sigmas.values())
  for ax, values in zip(fig.axes, sigmas.values()):
    counts, _ = np.histogram(values, bins=np.linspace(lo, hi, 11))
    chex.assert_trees_all_equal(
        np.array([p.get_height() for p in ax.patches]), counts.astype(np.float64)
    )


@pytest.mark.slow
def test_model_pools_splits_scanned_layers_and_matches_unscanned():
  tokens = jnp.arange(12, dtype=jnp.int32)[None] % 7
  kw = dict(num_layers=2, emb_dim=16, mlp_dim=32, num_heads=2, dropout_rate=0.0)
  scanned = create('cp_transformer_lm', scan_layers=True, **kw)
  pools = viz.model_pools(scanned, scanned.init(jax.random.key(0), tokens), tokens)
  assert sorted(pools) == [
      'decoder/scanned_layers/layer/context_pool[0]',
      'decoder/scanned_layers/layer/context_pool[1]',
  ]
  for pool in pools.values():
    assert pool['pool_weights'].shape == pool['pool_sigma'].shape == (1, 12)
  plain = create('cp_transformer_lm', **kw)
  pools = viz.model_pools(plain, plain.init(jax.random.key(0), tokens), tokens)
  assert sorted(pools) == [f'decoder/layer_{i}/context_pool' for i in range(2)]


def test_grid_figure_holds_weights_sigma_and_the_gaussian_mask():
  x = jax.random.normal(jax.random.key(4), (1, 6, 5, 4))
  _, w, sigma = _pool(x)
  image = np.random.default_rng(0).uniform(size=(24, 20, 3))
  fig = viz.plot_pool_grid(w[0], sigma[0], image=image, centres=[(1, 1), (4, 3)])
  panels = [ax for ax in fig.axes if ax.images and ax.get_label() != '<colorbar>']
  assert len(panels) == 4  # image, weights, sigma, masks
  chex.assert_trees_all_close(_image_data(panels[1]), np.asarray(w[0], np.float64))
  chex.assert_trees_all_close(_image_data(panels[2]), np.asarray(sigma[0], np.float64))
  mask = viz.gaussian_support(sigma[0], [(1, 1), (4, 3)]).max(0).reshape(6, 5)
  chex.assert_trees_all_close(np.asarray(panels[3].images[1].get_array()), mask)
  assert mask[1, 1] == mask[4, 3] == 1.0


def test_area_attention_figure_places_each_area_weight():
  layout = area_layout(6, max_area_width=3)
  probs = np.random.default_rng(0).dirichlet(np.ones(layout.num_areas))
  fig = viz.plot_area_attention(probs, layout.col, layout.width, tokens=list('abcdef'), query=5)
  grid = _image_data(fig.axes[0])
  assert grid.shape == (3, 6) and np.isnan(grid).sum() == 3 * 6 - layout.num_areas
  for p, s, w in zip(probs, layout.col, layout.width):
    assert grid[w - 1, s] == p
  per_item = [
      sum(p for p, s, w in zip(probs, layout.col, layout.width) if s <= j < s + w) for j in range(6)
  ]
  bars = [p.get_height() for p in fig.axes[1].patches]
  chex.assert_trees_all_close(np.array(bars), np.array(per_item))


def test_costs_figure_bars():
  costs = {'a': {'flops': 2e9, 'temp_bytes': 3 * 2**20}, 'b': {'flops': 5e8, 'temp_bytes': 0}}
  fig = viz.plot_costs(costs)
  chex.assert_trees_all_close(
      np.array([p.get_width() for p in fig.axes[0].patches]), np.array([2.0, 0.5])
  )
  chex.assert_trees_all_close(
      np.array([p.get_width() for p in fig.axes[1].patches]), np.array([3.0, 0.0])
  )


def test_bad_inputs_name_the_argument():
  with pytest.raises(ValueError, match=r'sigma.shape=\(3,\) is not allowed; expected 4 values'):
    viz.plot_pool_text(list('abcd'), np.ones(4), np.ones(3))
  with pytest.raises(ValueError, match='centre=9 is not allowed'):
    viz.gaussian_support(np.ones(5), [9])
  with pytest.raises(ValueError, match='spatial_ndim=3'):
    viz.pool_intermediates({}, spatial_ndim=3)


def test_missing_matplotlib_is_one_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'matplotlib.figure', None)
  with pytest.raises(ImportError, match=r'pip install matplotlib'):
    viz.plot_costs({'a': {'flops': 1.0, 'temp_bytes': 1.0}})
