"""contextpool-jax: adaptive-context attention layers and models in JAX/Flax."""

__version__ = "0.1.0"
