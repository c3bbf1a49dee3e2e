"""contextpool-jax: adaptive-context attention layers and models in JAX/Flax (Linen).

Public layers (see README.md for the equations each implements):

* :class:`ContextPool` -- adaptive context pooling (Huang et al., ICML 2022).
* :class:`LambdaLayer` -- lambda layers (Bello, ICLR 2021).
* :class:`AugmentedConv2D` -- attention-augmented convolution (Bello et al., ICCV 2019).
"""

from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.augmented_conv import relative_logits_2d
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.lambda_layer import LambdaLayer

__version__ = '0.1.0'

__all__ = [
    'AugmentedConv2D',
    'ContextPool',
    'LambdaLayer',
    'relative_logits_2d',
]
