"""The shared checks now live in :mod:`contextpool_jax.checks` (one module for the
layers, models, training and data); this name is kept until every import moves."""

from contextpool_jax.checks import as_tuple, check_choice, check_positive  # noqa: F401
from contextpool_jax.checks import check_probability, check_rank  # noqa: F401
