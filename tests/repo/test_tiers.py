"""The run's set-up (``tests/conftest.py``), the tests' init keys (``tests/init_keys.py``) and
what ``--costs`` reports.

The fast tier (``-m "not slow"``) keeps the first case of every sweep; with ``-n`` the files
go to the workers whole, the longest first; MLIR contexts are shared, the programs unchanged."""

import json
import types
import warnings

import pytest

from conftest import mark_sweep_cases_slow
from conftest import reusing
from conftest import order_by_file_seconds
from conftest import pytest_xdist_make_scheduler


class _Item:
  """What the rule reads of a collected test: its node id and marks."""

  def __init__(self, nodeid, *marks):
    self.nodeid, self.marks = nodeid, [getattr(pytest.mark, name).mark for name in marks]

  def get_closest_marker(self, name):
    return next((m for m in self.marks if m.name == name), None)

  def add_marker(self, marker):
    self.marks.append(marker.mark)

  def slow(self):
    return self.get_closest_marker('slow') is not None


def test_a_sweep_keeps_its_first_case_fast_and_other_tests_are_untouched():
  items = [
      _Item('t.py::test_a[x]', 'sweep'),
      _Item('t.py::test_b[x]'),
      _Item('t.py::test_a[y]', 'sweep'),
      _Item('t.py::test_b[y]'),
      _Item('t.py::test_c', 'slow'),
      _Item('t.py::test_a[z]', 'sweep'),
      _Item('u.py::test_a[x]', 'sweep'),
  ]
  mark_sweep_cases_slow(items)
  assert [i.slow() for i in items] == [False, False, True, False, True, True, False]


def test_costs_add_up_by_file_with_the_most_core_seconds_first():
  import costs  # pylint: disable=g-import-not-at-top

  def report(nodeid, **seconds):
    r = type('Report', (), {})()
    r.nodeid, r.user_properties = nodeid, [('explained', True), ('costs', seconds)]
    return r

  zero = dict.fromkeys(costs.COLUMNS, 0.0)
  reports = [
      report('a.py::t1', **{**zero, 'wall': 3.0, 'cpu': 1.0, 'compile': 0.5}),
      report('b.py::t1', **{**zero, 'wall': 9.0, 'cpu': 1.0, 'children': 7.0}),
      report('a.py::t2', **{**zero, 'wall': 2.0, 'cpu': 2.0, 'trace': 0.25}),
  ]
  files = costs.by_file(reports)
  assert files['a.py'] == dict(tests=2, wall=5.0, cpu=3.0, children=0.0, trace=0.25, compile=0.5)
  rows = costs.table(files)
  assert [r.split(' | ')[0] for r in rows[2:]] == ['| b.py', '| a.py', '| total']
  assert rows[-1] == '| total | 3 | 14 | 11 | 7 | 0 | 0 |'


def test_costs_name_each_workers_busy_and_idle_seconds():
  import costs  # pylint: disable=g-import-not-at-top

  def report(worker, start, end):
    r = type('Report', (), {})()
    r.user_properties = [('costs', {}), ('span', (worker, start, end))]
    return r

  reports = [report('gw0', 100.0, 130.0), report('gw1', 102.0, 110.0), report('gw0', 131.0, 140.0)]
  workers = costs.by_worker(reports)
  assert workers['gw0'] == dict(tests=2, busy=39.0, first=100.0, last=140.0)
  assert costs.worker_lines(workers) == [
      'gw0: 2 tests, 39 s in tests, idle 0 s before its first and 0 s after its last',
      'gw1: 1 tests, 8 s in tests, idle 2 s before its first and 30 s after its last',
  ]


def test_files_longest_first_each_files_tests_together_in_their_order():
  items = [
      _Item(n) for n in ('a.py::t1', 'a.py::t2', 'b.py::t1', 'c.py::t1', 'c.py::t2', 'd.py::t')
  ]
  order_by_file_seconds(items, {'a.py': 5.0, 'b.py': 1.0, 'c.py': 20.0, 'old.py': 3.0})
  # d.py was not measured: it counts as the median file (4 s), after a.py and before b.py.
  assert [i.nodeid for i in items] == [
      'c.py::t1',
      'c.py::t2',
      'a.py::t1',
      'a.py::t2',
      'd.py::t',
      'b.py::t1',
  ]


def test_the_recorded_seconds_are_written_longest_first_and_name_existing_files():
  import costs  # pylint: disable=g-import-not-at-top

  written = costs.file_seconds_json({'a.py': {'wall': 2.04}, 'b.py': {'wall': 7.0}})
  assert list(json.loads(written).items()) == [('b.py', 7.0), ('a.py', 2.0)]
  recorded = json.loads(costs.FILE_SECONDS.read_text())
  root = costs.FILE_SECONDS.parents[1]
  assert [f for f in recorded if not (root / f).is_file()] == []


@pytest.mark.parametrize('dist', ['load', 'loadscope', 'worksteal'])
def test_with_n_files_go_whole_to_workers_in_the_collections_order(dist):
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  option = types.SimpleNamespace(dist=dist, loadscopereorder=True, tx=['2*popen'])
  read = lambda name: getattr(option, name)
  config = types.SimpleNamespace(option=option, getoption=read, getvalue=read)
  scheduler = pytest_xdist_make_scheduler(config, log=None)
  if dist == 'load':  # what -n sets: file by file, not reordered by the number of tests
    assert isinstance(scheduler, LoadFileScheduling) and not option.loadscopereorder
  else:  # an explicit --dist is kept
    assert scheduler is None and option.loadscopereorder


def test_one_mlir_context_serves_several_lowerings_then_a_new_one():
  made = []
  reused = reusing(lambda: made.append(object()) or made[-1], lowerings_per_context=3)
  contexts = [reused() for _ in range(7)]
  assert contexts == [made[0]] * 3 + [made[1]] * 3 + [made[2]] and len(made) == 3


def test_a_program_lowered_in_a_shared_context_is_the_one_a_fresh_context_gives(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top

  fresh = getattr(mlir.make_ir_context, 'fresh', mlir.make_ir_context)
  x, w = jax.numpy.ones((5, 3)), jax.numpy.ones((3, 4))

  def lower(make, f):
    made = []
    monkeypatch.setattr(mlir, 'make_ir_context', lambda: made.append(make()) or made[-1])
    return jax.jit(f).lower(x, w).as_text(), made

  # New functions each time: traced and lowered again, not read from a cache.
  shared = reusing(fresh, lowerings_per_context=500)
  _, first = lower(shared, lambda x, w: (x - 1) @ w)
  text_shared, then = lower(shared, lambda x, w: jax.nn.softmax(x @ w, axis=-1).sum(0))
  text_fresh, _ = lower(fresh, lambda x, w: jax.nn.softmax(x @ w, axis=-1).sum(0))
  assert first and then and all(c is first[0] for c in then)  # one context served both
  assert text_shared == text_fresh


def test_init_keys_draw_the_initializers_distributions_and_compile_no_loop():
  """``init_key`` (tests/init_keys.py): keys that split and fold into distinct
  streams, uniform and normal draws with their moments, a layer's initializers
  at the scales threefry keys give, and a jitted init without threefry's loops."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from init_keys import init_key  # pylint: disable=g-import-not-at-top

  key = init_key(0)
  keys = [key, init_key(1), *jax.random.split(key), jax.random.fold_in(key, 1)]
  keys.append(jax.random.fold_in(key, 2))
  draws = [np.asarray(jax.random.bits(k, (64,))) for k in keys]
  assert len({d.tobytes() for d in draws}) == len(keys)
  u = np.asarray(jax.random.uniform(key, (100_000,)), np.float64)
  assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
  assert abs(np.histogram(u, 10, (0, 1))[0] / u.size - 0.1).max() < 0.005
  z = np.asarray(jax.random.normal(key, (100_000,)), np.float64)
  assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01

  dense, x = nn.Dense(256), np.ones((1, 400), np.float32)
  ours, theirs = (dense.init(k, x)['params'] for k in (key, jax.random.key(0)))
  np.testing.assert_array_equal(ours['bias'], theirs['bias'])  # zeros
  assert abs(np.std(ours['kernel']) / np.std(theirs['kernel']) - 1) < 0.02  # lecun normal
  lowered = lambda k: jax.jit(dense.init).lower(k, x).as_text()
  assert 'while' in lowered(jax.random.key(0)) and 'while' not in lowered(key)


def test_init_variables_equal_the_init_and_do_not_compute_the_forward():
  """``init_variables`` (tests/init_keys.py): the variables ``model.init`` gives, with
  either kind of key, for a layer and a model; the forward is traced, never run."""
  import chex  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from contextpool_jax import ContextPool  # pylint: disable=g-import-not-at-top
  from contextpool_jax.models import transformer  # pylint: disable=g-import-not-at-top
  from init_keys import init_key, init_variables  # pylint: disable=g-import-not-at-top

  lm = transformer.TransformerLM(
      vocab_size=13, num_layers=2, emb_dim=16, mlp_dim=32, num_heads=2, context_pool={}
  )
  tokens = jnp.ones((2, 6), jnp.int32)
  x = jax.random.normal(jax.random.key(0), (2, 5, 4))
  for key in (init_key(3), jax.random.key(3)):
    for model, args in ((lm, (tokens,)), (ContextPool(mapping='mlp'), (x,))):
      chex.assert_trees_all_close(
          init_variables(model, key, *args), jax.jit(model.init)(key, *args), rtol=1e-6
      )

  calls = []

  class Probe(nn.Module):

    @nn.compact
    def __call__(self, x):
      y = nn.Dense(3)(x)
      record = lambda v: calls.append(v.shape) or v
      return jax.pure_callback(record, jax.ShapeDtypeStruct(y.shape, y.dtype), y)

  variables = init_variables(Probe(), init_key(), x)
  chex.assert_shape(variables['params']['Dense_0']['kernel'], (4, 3))
  assert not calls
  Probe().init(init_key(), x)
  assert calls == [(2, 5, 3)]

  class Effect(nn.Module):  # a side effect of the forward cannot be left out: a clear error

    @nn.compact
    def __call__(self, x):
      y = nn.Dense(3)(x)
      jax.debug.callback(lambda v: calls.append(v.shape), y)
      return y

  with pytest.raises(ValueError, match='Effect depend on the values of its inputs'):
    init_variables(Effect(), init_key(), x)
  assert calls == [(2, 5, 3)]


@pytest.mark.parametrize('category', [DeprecationWarning, PendingDeprecationWarning, FutureWarning])
def test_a_deprecated_api_the_package_calls_fails_its_test(category):
  """pyproject.toml's filterwarnings: a deprecation warned at a call in ``contextpool_jax``
  (where jax, flax and numpy attribute theirs) is an error; one warned elsewhere is not."""
  call = compile(f'warnings.warn("old API", {category.__name__})', 'caller.py', 'exec')
  with pytest.raises(category, match='old API'):
    exec(call, {'__name__': 'contextpool_jax.layers.some_layer', 'warnings': warnings})
  with warnings.catch_warnings(record=True) as caught:  # the filters stay as they are
    exec(call, {'__name__': 'some_library', 'warnings': warnings})
  assert [w.category for w in caught] == [category]
