"""The old home of greedy decoding and beam search, kept as an alias: the code is
:mod:`contextpool_jax.inference.decoding` (this module is that module)."""

import sys

from contextpool_jax.inference import decoding as _decoding

sys.modules[__name__] = _decoding  # `from contextpool_jax.training import decoding` gets it
