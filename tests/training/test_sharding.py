"""Shardings of a run (``training/sharding.py``): batches split over ``'data'``; parameters and
optimizer state replicated, or with FSDP split along their largest axis the device count
divides (small arrays and arrays no axis of which divides stay replicated); host reads through
``fetch``. Four devices: an abstract TPU v5e 2x2 slice (libtpu, nothing allocated); runs on many
devices and processes: tests/training/test_multi_device.py and test_scale.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from contextpool_jax.training import aot, sharding


@pytest.fixture(scope='module')
def mesh():
  aot.compile_only()
  return sharding.make_mesh(aot.devices(aot.parse_topology('v5e:2x2')))


def test_the_mesh_is_one_data_axis_over_every_device(mesh):
  assert mesh.axis_names == ('data',) and mesh.devices.shape == (4,)
  assert sharding.batch_sharding(mesh).spec == P('data')
  assert sharding.replicated(mesh).spec == P()


def test_fsdp_splits_the_largest_axis_four_divides_and_keeps_small_arrays_whole(mesh):
  state = {
      'embedding': jax.ShapeDtypeStruct((256, 128), jnp.float32),  # 32,768 values: rows
      'kernel': jax.ShapeDtypeStruct((6, 4096), jnp.float32),  # the larger axis
      'odd': jax.ShapeDtypeStruct((130, 130), jnp.float32),  # no axis divisible by 4
      'odd_rows': jax.ShapeDtypeStruct((4098, 8), jnp.float32),  # 4,098 % 4 != 0: columns
      'bias': jax.ShapeDtypeStruct((4096,), jnp.float32),  # under 2**14 values
      'step': jax.ShapeDtypeStruct((), jnp.int32),
  }
  fsdp = {k: s.spec for k, s in sharding.state_shardings(state, mesh, 'fsdp').items()}
  assert fsdp == {
      'embedding': P('data', None),
      'kernel': P(None, 'data'),
      'odd': P(),
      'odd_rows': P(None, 'data'),
      'bias': P(),
      'step': P(),
  }
  replicated = sharding.state_shardings(state, mesh, 'replicated')
  assert all(s.spec == P() for s in replicated.values())


def test_pad_rows_appends_zero_rows_up_to_a_multiple_and_says_how_many_are_real():
  batch = {'x': np.ones((5, 2), np.float32), 'y': np.arange(5)}
  padded, real = sharding.pad_rows(batch, 4)
  assert real == 5 and padded['x'].shape == (8, 2) and padded['y'].dtype == batch['y'].dtype
  np.testing.assert_array_equal(padded['y'], [0, 1, 2, 3, 4, 0, 0, 0])
  assert not padded['x'][5:].any()
  same, real = sharding.pad_rows(batch, 5)
  assert real == 5 and same is batch


def test_fetch_reads_every_leaf_into_numpy():
  tree = {'a': jnp.arange(3.0), 'b': (np.int32(4), jnp.ones((2, 2), jnp.bfloat16))}
  got = sharding.fetch(tree)
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(got))
  np.testing.assert_array_equal(got['a'], [0.0, 1.0, 2.0])
  assert got['b'][0] == 4 and got['b'][1].dtype == jnp.bfloat16
