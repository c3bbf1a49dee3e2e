"""contextpool-jax: adaptive-context attention layers and models in JAX/Flax (Linen).

Layers (each page of docs/ cites the equations its layer implements):

* :class:`ContextPool` -- adaptive context pooling (Huang et al., ICML 2022).
* :class:`AreaAttention`, :func:`dot_product_area_attention`, :func:`area_features`
  -- area attention (Li et al., ICML 2019).
* :class:`LambdaLayer` -- lambda layers (Bello, ICLR 2021).
* :class:`AugmentedConv2D`, :func:`relative_logits_2d` -- attention-augmented
  convolution (Bello et al., ICCV 2019).

Models by name: ``contextpool_jax.models.create(name, **overrides)`` and
``contextpool_jax.models.available()``.
"""

from contextpool_jax.layers.area_attention import AreaAttention
from contextpool_jax.layers.area_attention import dot_product_area_attention
from contextpool_jax.layers.area_attention.areas import area_features
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.augmented_conv import relative_logits_2d
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.lambda_layer import LambdaLayer

__version__ = '0.1.0'

__all__ = [
    'AreaAttention',
    'AugmentedConv2D',
    'ContextPool',
    'LambdaLayer',
    'area_features',
    'dot_product_area_attention',
    'relative_logits_2d',
]
