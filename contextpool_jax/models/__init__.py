"""Models of the papers, by name: ``create(name, **overrides)``, ``available()``; each
family's fields in one config dataclass (``model.config``)."""

from contextpool_jax.models.registry import available
from contextpool_jax.models.registry import create
from contextpool_jax.models.resnet import ResNetConfig
from contextpool_jax.models.transformer import TransformerConfig
from contextpool_jax.models.vit import ViTConfig
