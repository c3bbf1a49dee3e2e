"""``load(workdir, step=None) -> (model, variables, config)`` and the rest of
:mod:`contextpool_jax.training.workdirs` under their old module path.

This module is callable: ``contextpool_jax.training.load`` is the same object
whether it is reached as the package's attribute or imported as a module, and
calling it is :func:`contextpool_jax.training.workdirs.load`. So
``from contextpool_jax.training import load; load(workdir)`` and
``from contextpool_jax.training.load import export_params`` both work, in any
order (the function no longer shadows the module).

With ``/tmp/cp`` a workdir of ``python train.py --config configs/default.py --workdir /tmp/cp``
(tests/test_readme.py runs these examples against a short run of it):

  >>> import jax.numpy as jnp
  >>> from contextpool_jax.training import export_params, load
  >>> model, variables, config = load('/tmp/cp')           # the latest step
  >>> tokens = jnp.asarray([list(b'def main():')], jnp.int32)
  >>> model.apply(variables, tokens).shape                  # [batch, length, 256]
  (1, 11, 256)
  >>> export_params('/tmp/cp', '/tmp/cp_params')
  PosixPath('/tmp/cp_params')
  >>> model, variables, config = load('/tmp/cp_params')    # an export loads like a workdir
"""

import sys
import types

from contextpool_jax.training import workdirs
from contextpool_jax.training.workdirs import (  # pylint: disable=unused-import
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    EXPORT_FILE,
    RESTORED_FIELDS,
    STATE_ITEM,
    WorkdirError,
    checkpoint_steps,
    export_params,
    load,
    load_variables,
    read_config,
)


class _CallableModule(types.ModuleType):
  """This module, callable as :func:`contextpool_jax.training.workdirs.load`."""

  def __call__(self, workdir, step=None):
    return workdirs.load(workdir, step)


sys.modules[__name__].__class__ = _CallableModule
