"""The tests' model inits: keys (:func:`init_key`) and variables (:func:`init_variables`).

A model's ``init`` draws twice per parameter (Flax folds the parameter's path into
the key, then its initializer draws), and on the CPU each threefry draw is a
while loop that XLA compiles on its own. So compiling a tiny Transformer's
``jax.jit(model.init)`` took 4-6 times as long as compiling its forward pass, and the
inits were about half of the model tests' XLA compile time
(``benchmarks/results/test_costs.md``).

:data:`HASH_PRNG` is a counter hash (a few integer operations per value, no loop).
Keys of it go through the same Flax initializers as users' threefry keys (same
zeros, ones, fan-in scales and custom inits), and draw different values from
the same distributions. Tests of model properties hold for any parameters, so
they do not depend on which values; the training loop, and every test of it,
keeps JAX's default PRNG.

:func:`init_variables` gives ``model.init``'s variables without computing the
forward that ``init`` runs: the forward is traced on the inputs' shapes, and only
the draws run, each a small program that later tests of the same shapes reuse
(an eager ``init`` runs the whole forward op by op; a jitted one compiles a
program per model). Their own checks: ``tests/repo/test_tiers.py``.
"""

import math

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core
from jax.extend import random as jex_random

# Dead-code elimination of a jaxpr: no public API has it.
from jax._src.interpreters import partial_eval as pe  # pylint: disable=g-direct-jax-src-import


def _mix(x):
  """lowbias32 (C. Wellons): a bijective 32-bit hash with low bias."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _hash(key, counter):
  """32 bits per element of ``counter`` (uint32) under ``key`` (``[2]`` uint32)."""
  return _mix(_mix(counter ^ key[0]) + key[1] * jnp.uint32(0x9E3779B9))


def _seed(seed):
  s = jnp.asarray(seed).astype(jnp.uint32)
  return jnp.stack([_mix(s), _mix(s ^ jnp.uint32(0x5BD1E995))])


def _random_bits(key, bit_width, shape):
  n = math.prod(shape)
  if bit_width == 64:
    words = _hash(key, jax.lax.iota(jnp.uint32, 2 * n)).reshape(2, n).astype(jnp.uint64)
    return ((words[0] << 32) | words[1]).reshape(shape)
  dtype = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[bit_width]
  return _hash(key, jax.lax.iota(jnp.uint32, n)).astype(dtype).reshape(shape)


def _split(key, shape):
  counters = jax.lax.iota(jnp.uint32, 2 * math.prod(shape)) + jnp.uint32(0x68E31DA4)
  return _hash(key, counters).reshape(*shape, 2)


def _fold_in(key, data):
  d = jnp.asarray(data).astype(jnp.uint32)
  return jnp.stack([_hash(key, d), _hash(key, d ^ jnp.uint32(0xB5297A4D))])


HASH_PRNG = jex_random.define_prng_impl(
    key_shape=(2,),
    seed=jax.jit(_seed),
    split=jax.jit(_split, static_argnums=1),
    random_bits=jax.jit(_random_bits, static_argnums=(1, 2)),
    fold_in=jax.jit(_fold_in),
    name='tests_hash',
    tag='hsh',
)


def init_key(seed: int = 0) -> jax.Array:
  """A typed PRNG key of :data:`HASH_PRNG`, for ``init_variables(model, init_key(), ...)``."""
  return jax.random.key(seed, impl=HASH_PRNG)


def init_variables(model, key, *args, **kwargs):
  """``model.init(key, *args, **kwargs)`` without computing the forward.

  ``init`` is traced on the shapes of ``args`` (arrays become abstract, other
  arguments stay as given), the trace is cut down to what the variables depend on
  (JAX's dead-code elimination, which also prunes the bodies of scanned layers),
  and that runs op by op: only the draws, each a small program that later tests
  of the same shapes reuse. Flax's ``lazy_init`` ran every operation that depends
  on shapes alone (masks, position tables: the forward's bookkeeping), each a
  program of its own; a jitted ``init`` compiles a program per model."""
  leaves, tree = jax.tree.flatten((args, kwargs))
  traced = [i for i, a in enumerate(leaves) if hasattr(a, 'shape')]

  def init(k, *arrays):
    filled = list(leaves)
    for i, a in zip(traced, arrays):
      filled[i] = a
    a, kw = jax.tree.unflatten(tree, filled)
    return model.init(k, *a, **kw)

  shapes = [jax.ShapeDtypeStruct(leaves[i].shape, leaves[i].dtype) for i in traced]
  closed, out_shape = jax.make_jaxpr(init, return_shape=True)(key, *shapes)
  jaxpr, used = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  if any(used[1:]):
    raise ValueError(
        f'init_variables: the variables of {type(model).__name__} depend on the values of '
        'its inputs (or its forward has side effects, e.g. a debug callback); use model.init'
    )
  flat = jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, closed.consts))(
      *([key] if used[0] else [])
  )
  return jax.tree.unflatten(jax.tree.structure(out_shape), flat)
