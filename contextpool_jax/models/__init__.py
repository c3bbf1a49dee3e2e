"""Models of the papers, by name: ``create(name, **overrides)``, ``available()``."""

from contextpool_jax.models.registry import available
from contextpool_jax.models.registry import create
