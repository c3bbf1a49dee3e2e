"""ContextPool: adaptive context pooling (Huang et al., ICML 2022).

For every token i, ContextPool pools its neighbours' features with learned
per-token weights ``w`` and a learned per-token Gaussian size ``sigma_i`` (Eq. 4
for sequences, Eq. 6 for grids), so that attention reads features of a context
whose extent the model chooses. With softmax weights the normaliser cancels, and
Eq. 4 is a softmax over j of ``l_ij = a_j - d(i, j)^2 / (2 sigma_i^2)``: every
ablation of the paper's Tables 1-3 (``weights``, ``locality``, ``mapping``) is a
way of building ``l_ij``, in one function, :func:`pool_block`. Two
implementations compute the same output: ``'dense'`` (the ``[batch, m, n]``
pooling matrix) and ``'blockwise'`` (flash-attention style, memory
O((m + n) d + block_size^2)).

The layer is :class:`ContextPool`. The equations, the memory, and every choice
the paper leaves open: docs/context_pool.md; which module of this package holds
what: docs/architecture.md#where-a-change-belongs.
"""

from contextpool_jax.layers.context_pool.blockwise import GAUSSIAN_SKIP_NATS
from contextpool_jax.layers.context_pool.blockwise import blockwise_visits
from contextpool_jax.layers.context_pool.blockwise import pool_blockwise
from contextpool_jax.layers.context_pool.geometry import pool_centres
from contextpool_jax.layers.context_pool.geometry import squared_distances
from contextpool_jax.layers.context_pool.module import CONTEXT_POOL_MODEL_FIELDS
from contextpool_jax.layers.context_pool.module import ContextPool
from contextpool_jax.layers.context_pool.module import make_context_pool
from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolBlock
from contextpool_jax.layers.context_pool.pool import PoolInputs
from contextpool_jax.layers.context_pool.pool import PoolRule
from contextpool_jax.layers.context_pool.pool import masked_pool
from contextpool_jax.layers.context_pool.pool import pool_block
from contextpool_jax.layers.context_pool.pool import pool_dense
from contextpool_jax.layers.context_pool.pool import pool_weights
from contextpool_jax.layers.context_pool.sizes import DEFAULT_RATIO
from contextpool_jax.layers.context_pool.sizes import normalised_size
from contextpool_jax.layers.context_pool.sizes import pooling_sigma
from contextpool_jax.layers.context_pool.validate import ACTIVATIONS
from contextpool_jax.layers.context_pool.validate import AUTO_BLOCKWISE_THRESHOLD
from contextpool_jax.layers.context_pool.validate import IMPLEMENTATIONS
from contextpool_jax.layers.context_pool.validate import LOCALITIES
from contextpool_jax.layers.context_pool.validate import MAPPINGS
from contextpool_jax.layers.context_pool.validate import SIZE_NORMS
from contextpool_jax.layers.context_pool.validate import WEIGHTS

__all__ = [
    'ACTIVATIONS',
    'AUTO_BLOCKWISE_THRESHOLD',
    'CONTEXT_POOL_MODEL_FIELDS',
    'DEFAULT_RATIO',
    'GAUSSIAN_SKIP_NATS',
    'IMPLEMENTATIONS',
    'LOCALITIES',
    'MAPPINGS',
    'SIZE_NORMS',
    'WEIGHTS',
    'Centres',
    'Context',
    'ContextPool',
    'PoolBlock',
    'PoolInputs',
    'PoolRule',
    'blockwise_visits',
    'make_context_pool',
    'masked_pool',
    'normalised_size',
    'pool_block',
    'pool_blockwise',
    'pool_centres',
    'pool_dense',
    'pool_weights',
    'pooling_sigma',
    'squared_distances',
]
