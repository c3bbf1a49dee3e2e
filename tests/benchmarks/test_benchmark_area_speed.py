"""Tests for benchmarks/area_speed.py (formatting and candidates; no timing)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import area_speed


def test_candidates_compute_the_same_area_attention_and_markdown_lists_them():
  """The two area candidates agree (small shapes, same width) and the table has a
  row per candidate with the ratio column."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 12, 2, 4)), jnp.float32) for _ in range(3))
  area = jax.jit(area_speed.CANDIDATES['area'])(q, k, v)
  features = jax.jit(area_speed.CANDIDATES['area over features'])(q, k, v)
  chex.assert_trees_all_close(area, features, atol=1e-6, rtol=0)
  rows = [
      dict(name=name, forward_ms=1.0, both_ms=2.0, ratio=1.0, gflops=0.1, temp_mib=1.0)
      for name in area_speed.CANDIDATES
  ]
  text = area_speed.markdown(rows, repeats=3)
  assert 'ratio to standard' in text and '--repeats=3' in text
  for name in area_speed.CANDIDATES:
    assert f'| {name} |' in text
