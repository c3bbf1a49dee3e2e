"""Pieces shared by the model files: their fields (one config dataclass per family) and
small helpers. A model inserts ContextPool from its ``context_pool`` field with
:func:`~contextpool_jax.layers.context_pool.make_context_pool`; a model rematerialises
its blocks with :func:`remat` (its ``remat`` field: :data:`REMAT_POLICIES`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax

from contextpool_jax.errors import ConfigError

# The ``remat`` field of the models (and the run's ``config.remat``): what each block
# keeps for the backward pass -> the jax.checkpoint policy (None: no remat at all).
REMAT_POLICIES = {
    'none': None,  # no rematerialisation: every activation is kept
    'full': jax.checkpoint_policies.nothing_saveable,  # keep the block's inputs only
    # keep every matmul and convolution output (also the [batch, heads, q, kv] attention
    # logits); recompute the normalisations, activations, softmax
    'dots': jax.checkpoint_policies.dots_saveable,
    # keep the matmuls without batch dimensions (the Dense projections and MLPs);
    # recompute the attention logits (batched matmuls) and the convolutions
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Before the policies, ``remat`` was a bool (configs, saved config.json files): the
# one place the old values are read.
_REMAT_BOOLS = {False: 'none', True: 'full'}


def module_fields(config_cls: type) -> type[nn.Module]:
  """An ``nn.Module`` base class whose fields are those of the dataclass ``config_cls``.

  Each model family declares its fields once, in a frozen config dataclass
  (e.g. ``TransformerConfig``) that is passed down its module tree, as flax's
  wmt example does. Its top modules subclass ``module_fields(Config)``, so the
  same fields are also theirs (same names, types, defaults and order; a
  subclass may redeclare one to change its default): ``Model(num_layers=2)``,
  ``model.num_layers`` and registry overrides (``create(name, num_layers=2)``)
  keep working. ``model.config`` bundles the module's field values into one
  ``config_cls``.
  """
  fields = dataclasses.fields(config_cls)
  taken = [
      f.name
      for f in fields
      if hasattr(nn.Module, f.name) or f.name in ('parent', 'name', 'scope', 'config')
  ]
  if taken:
    raise TypeError(
        f'{config_cls.__name__}: field name(s) {taken} are nn.Module ' "attributes (or 'config')."
    )
  if any(f.default_factory is not dataclasses.MISSING for f in fields):
    raise TypeError(f'{config_cls.__name__}: module_fields does not support default_factory.')
  name = f'{config_cls.__name__}Fields'
  namespace = {
      '__module__': config_cls.__module__,
      '__qualname__': name,
      '__doc__': f'The fields of :class:`{config_cls.__name__}` as module fields.',
      '__annotations__': {f.name: f.type for f in fields},
      **{f.name: f.default for f in fields if f.default is not dataclasses.MISSING},
      'config': property(
          lambda self: config_cls(**{f.name: getattr(self, f.name) for f in fields}),
          doc=f"This module's fields as one frozen :class:`{config_cls.__name__}`.",
      ),
  }
  return type(name, (nn.Module,), namespace)


def count_params(params: Any) -> int:
  """Number of scalars in a parameter pytree (arrays or ``jax.eval_shape`` output)."""
  return int(sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params)))


def remat_policy(owner: str, value: Any) -> str:
  """``value`` of a ``remat`` field as a policy name of :data:`REMAT_POLICIES`.

  The booleans of configs and ``config.json`` files written before the policies
  mean ``False -> 'none'``, ``True -> 'full'``. Anything else raises a
  ConfigError naming ``owner.remat``, the value and the choices.
  """
  if isinstance(value, bool):
    return _REMAT_BOOLS[value]
  if not isinstance(value, str) or value not in REMAT_POLICIES:
    raise ConfigError(
        f'{owner}.remat={value!r} is not supported; allowed values: '
        f'{", ".join(repr(p) for p in REMAT_POLICIES)} (or False / True: the same as '
        "'none' / 'full')."
    )
  return value


def remat(module_cls: type[nn.Module], value: Any, owner: str, **kwargs) -> type[nn.Module]:
  """``module_cls`` rematerialised in the backward pass with the policy ``value``
  (a ``remat`` field: :func:`remat_policy`); ``'none'`` returns it unchanged.
  ``kwargs`` go to ``nn.remat`` (e.g. ``static_argnums``, ``prevent_cse``)."""
  name = remat_policy(owner, value)
  if name == 'none':
    return module_cls
  return nn.remat(module_cls, policy=REMAT_POLICIES[name], **kwargs)
