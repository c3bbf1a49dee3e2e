"""The jitted programs a run executes (``training/programs.py``), as the trainer and the compile
command build them: the train state's abstract init (nothing computed) placed with the run's
shardings, and the global batches as abstract arrays split over the batch axis. Four devices:
an abstract TPU v5e 2x2 slice (libtpu, nothing allocated)."""

import jax
from jax.sharding import PartitionSpec as P

from configs import default as default_config
from contextpool_jax.training import aot, optim, programs, sharding, spec, tasks


def test_the_abstract_state_and_batches_carry_the_runs_shardings():
  config = default_config.get_config()
  config.model.num_layers = 1
  specs = spec.read(config)
  task = tasks.make_task(specs.task, specs.model, specs.data, '')
  tx, _ = optim.make_optimizer(specs.optimizer, specs.run.num_train_steps)
  init_fn = programs.make_init_fn(task, tx, specs.run)
  abstract = programs.abstract_state(init_fn, jax.random.key(0))
  leaves = jax.tree.leaves(abstract)
  assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
  aot.compile_only()
  mesh = sharding.make_mesh(aot.devices(aot.parse_topology('v5e:2x2')))
  shardings = sharding.state_shardings(abstract, mesh, 'fsdp')
  placed = programs.with_shardings(abstract, shardings)
  for x, s, a in zip(jax.tree.leaves(placed), jax.tree.leaves(shardings), leaves):
    assert (x.shape, x.dtype, x.sharding) == (a.shape, a.dtype, s)
  assert any(s.spec != P() for s in jax.tree.leaves(shardings))  # the embedding, split
  train, evaluation = programs.abstract_batches(task, specs.run, sharding.batch_sharding(mesh))
  # configs/default.py: batch 16 of 256 bytes (+ 1 target), evaluation 16 windows of 256.
  assert train['tokens'].shape == (16, 257) and train['weights'].shape == (16, 256)
  assert evaluation['tokens'].shape == (16, 257)
  assert {x.sharding.spec for x in [*train.values(), *evaluation.values()]} == {P('data')}
