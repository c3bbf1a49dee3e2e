"""ContextPool: adaptive context pooling (Huang et al., ICML 2022).

For every token i, ContextPool pools the features of its neighbours with learned
per-token weights ``w`` and a learned, per-token Gaussian pooling size:

    y_i = sum_j x_j w_j g^i_j / sum_j w_j g^i_j                       (Eq. 4, Eq. 6)
    g^i_j = exp(-d(i, j)^2 / (2 sigma_i^2))
    sequences: sigma_i = r * n * s_i,            r = 0.1              (Sec. 3.2)
    grids:     sigma_k = r * S_k * (h + w) / 2,  r = 0.05             (Appendix A)
    {w, s} = m(X): two convolutions with two output channels.

With softmax-normalised weights, ``w_j = exp(a_j) / Z`` and the constant ``Z``
cancels between numerator and denominator, so Eq. 4 *is* a softmax over j of

    l_ij = a_j - d(i, j)^2 / (2 sigma_i^2)

applied to X. This module computes exactly that, in log space with a
max-subtracted softmax in float32 (whatever the compute dtype), so no
denominator can reach 0. Every ablation of the paper's Tables 1-3 is a choice of
how ``l_ij`` is built:

* ``weights`` (Table 1/2 middle cell): ``'learned'`` a_j = raw weight (softmax
  weights); ``'unnormalized'`` w_j = softplus(raw weight), a positive weight with
  no normalisation (exp would be identical to softmax, since Z cancels);
  ``'uniform'`` a_j = 0 (average pooling); ``'nonlocal'`` a_ij =
  theta(x_i)^T phi(x_j) / sqrt(k) with linear maps ``theta(x) = W^theta x``,
  ``phi(x) = W^phi x`` and no bias (Eq. 3; a bias on phi would add a j-only
  term; query dependent, O(n^2) cost).
* ``locality`` (bottom cell): ``'gaussian'`` the adaptive Gaussian above;
  ``'none'`` no locality prior; ``'fixed_window'`` a hard window of radius
  ``window``; ``'adaptive_window'`` a hard window of learned radius
  rho_i = sigma_i; ``'random_sparse'`` a fixed, seeded random support
  ("random sparse locations"; our reading: each token keeps itself and each
  position within radius ``random_span`` with probability K / M, K and M the
  numbers of lattice offsets within ``window`` and ``random_span``, so it
  pools over as many positions as the fixed window in expectation, and the
  support depends on neither the padding nor, if causal, on later tokens).
* ``mapping`` (Table 3): ``'cnn'`` two convolutions; ``'mlp'`` two per-token
  dense layers; ``'attention'`` single-head self-attention followed by a dense
  layer.

Choices the paper leaves open (papers README, A1-A5) are fields, documented on
:class:`ContextPool` and in the README table.

One function, :func:`pool_block`, builds ``l_ij`` and its support for a block
of centres (:class:`Centres`: positions, validity, sigma, theta) x a block of
inputs (:class:`Context`: positions, validity, features, a_j, phi); a new
weights or locality variant is one edit there. Two implementations call it
and compute the same ``y`` (field ``implementation``); the per-call arrays
travel as one :class:`PoolInputs`:

* ``'dense'`` calls it once on every centre and input: the ``[batch, m, n]``
  pooling matrix (m outputs, n inputs), differentiated by autodiff: O(m n)
  memory.
* ``'blockwise'`` never materialises it. Since every variant's ``l_ij`` is a
  query term plus a key term plus a function of the two positions (the
  non-local ``theta_i . phi_j`` included), Eq. 4 is an attention with one head,
  and it is computed flash-attention style: queries and keys in blocks of
  ``block_size``, an online (running max / running sum) float32 softmax in the
  forward pass, and a ``jax.custom_vjp`` whose backward pass recomputes each
  block's probabilities from the saved per-row (max, sum) and differentiates
  the block's logits (:func:`pool_block` again) with ``jax.vjp``. Memory per
  example is O((m + n) d + block_size^2).
  Causal pooling skips the key blocks above the diagonal, a fixed window the
  key blocks out of its reach, and the Gaussian locality (with weights that do
  not depend on the query) at run time the key blocks whose every logit is
  more than ``gaussian_skip_nats`` (18) below the running maximum of every
  centre of the query block, visiting the nearest key blocks first (a
  bounded approximation: each row loses at most ``n exp(-18)`` of its mass).
  Every weights x locality x mapping variant is supported and gives the
  dense result up to float32 rounding; the hard adaptive window is exact too
  (its straight-through gradient only needs the final row max, which the
  backward pass has).
* ``'auto'`` (default) is ``'blockwise'`` when the number of input positions n
  exceeds :data:`AUTO_BLOCKWISE_THRESHOLD` (1024), else ``'dense'``.

Randomness is counter-based in both implementations, so they agree exactly:
the ``'random_sparse'`` support and the dropout mask on the pooling weights
are a 32-bit integer hash (murmur3's finaliser) of (seed, centre, input),
evaluated elementwise wherever needed: for the support, of the two positions'
grid coordinates (so it does not change with the input's size or padding);
for dropout, of their flat indices.

Where each part lives (a change belongs in exactly one):

* :mod:`.geometry`: pooling centres, grid coordinates, squared distances.
* :mod:`.sizes`: what the mapping's outputs become (a_j, s, sigma; the
  extent rule of ``sigma = r n s`` and its streaming form).
* :mod:`.randomness`: the counter-based hashes (random support, dropout).
* :mod:`.pool`: :class:`PoolRule`, :class:`Centres`, :class:`Context`,
  :class:`PoolInputs`, :func:`pool_block`, :func:`pool_weights` and the dense
  pooling.
* :mod:`.blocks` (which key blocks a query block visits, the Gaussian skipping
  bound) and :mod:`.blockwise` (the online softmax and its ``custom_vjp``).
* :mod:`.config`: field choices and checks.
* :mod:`.module`: :class:`ContextPool` (fields, the mapping m(X), the
  whole-sequence call, the helpers shared with the decoding step).
* :mod:`.streaming`: the ``decode=True`` cache and step.
"""

from contextpool_jax.layers.context_pool.blocks import key_block_ranges
from contextpool_jax.layers.context_pool.blockwise import GAUSSIAN_SKIP_NATS
from contextpool_jax.layers.context_pool.blockwise import blockwise_visits
from contextpool_jax.layers.context_pool.blockwise import pool_blockwise
from contextpool_jax.layers.context_pool.config import ACTIVATIONS
from contextpool_jax.layers.context_pool.config import AUTO_BLOCKWISE_THRESHOLD
from contextpool_jax.layers.context_pool.config import IMPLEMENTATIONS
from contextpool_jax.layers.context_pool.config import LOCALITIES
from contextpool_jax.layers.context_pool.config import MAPPINGS
from contextpool_jax.layers.context_pool.config import SIZE_NORMS
from contextpool_jax.layers.context_pool.config import WEIGHTS
from contextpool_jax.layers.context_pool.geometry import pool_centres
from contextpool_jax.layers.context_pool.geometry import squared_distances
from contextpool_jax.layers.context_pool.module import ContextPool
from contextpool_jax.layers.context_pool.pool import Centres
from contextpool_jax.layers.context_pool.pool import Context
from contextpool_jax.layers.context_pool.pool import PoolBlock
from contextpool_jax.layers.context_pool.pool import PoolInputs
from contextpool_jax.layers.context_pool.pool import PoolRule
from contextpool_jax.layers.context_pool.pool import masked_pool
from contextpool_jax.layers.context_pool.pool import pool_block
from contextpool_jax.layers.context_pool.pool import pool_dense
from contextpool_jax.layers.context_pool.pool import pool_weights
from contextpool_jax.layers.context_pool.randomness import dropout_keep
from contextpool_jax.layers.context_pool.sizes import DEFAULT_RATIO
from contextpool_jax.layers.context_pool.sizes import normalised_size
from contextpool_jax.layers.context_pool.sizes import pooling_sigma

# The names this package had as one module, private ones included (tests and
# benchmarks call them).
_dropout_keep = dropout_keep
_key_block_ranges = key_block_ranges
_pool_blockwise = pool_blockwise
_pool_dense = pool_dense

__all__ = [
    'ACTIVATIONS',
    'AUTO_BLOCKWISE_THRESHOLD',
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
