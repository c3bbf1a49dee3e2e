"""Pieces shared by the model files: their fields (one config dataclass per family, which
the family's top modules subclass: :func:`bundle`) and small helpers. A model inserts ContextPool from its ``context_pool`` field with
:func:`~contextpool_jax.layers.context_pool.make_context_pool`; a model rematerialises
its blocks with :func:`remat` (its ``remat`` field: :data:`REMAT_POLICIES`)."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, TypeVar

import flax.linen as nn
import jax

from contextpool_jax.base.errors import ConfigError

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


if TYPE_CHECKING:
  from _typeshed import DataclassInstance

C = TypeVar('C', bound='DataclassInstance')


class Fields:
  """The base of the config dataclasses: a field, once set, cannot be assigned again.

  They cannot be frozen dataclasses, since their top modules subclass them
  (:func:`bundle`) and a flax module is not a frozen dataclass; this keeps the
  config passed down a module tree read-only all the same. The modules
  themselves keep flax's own rules.
  """

  def __setattr__(self, name: str, value: Any) -> None:
    if not isinstance(self, nn.Module) and name in self.__dict__:
      raise dataclasses.FrozenInstanceError(
          f'cannot assign to field {name!r} of {type(self).__name__} (read-only; use '
          'dataclasses.replace).'
      )
    super().__setattr__(name, value)


def bundle(module: nn.Module, config_cls: type[C]) -> C:
  """``module``'s values of the fields of the dataclass ``config_cls``, as one ``config_cls``.

  Each model family declares its fields once, in a config dataclass (e.g.
  ``TransformerConfig``) that is passed down its module tree, as flax's wmt example
  does. Its top modules subclass that dataclass and ``nn.Module``
  (``class ViT(ViTConfig, nn.Module)``), so the same fields are theirs, visible to a
  reader and a type checker (a subclass may redeclare one to change its default):
  ``Model(num_layers=2)``, ``model.num_layers`` and registry overrides
  (``create(name, num_layers=2)``). Their ``config`` property is this function. The
  config dataclasses hash as the frozen dataclasses they were did (``unsafe_hash``) and
  are read-only (:class:`Fields`).
  """
  return config_cls(**{f.name: getattr(module, f.name) for f in dataclasses.fields(config_cls)})


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
