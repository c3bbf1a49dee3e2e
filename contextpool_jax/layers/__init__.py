"""Flax Linen layers: ContextPool, area attention, lambda layers, attention-augmented convolution."""

from contextpool_jax.layers.area_attention import AreaAttention
from contextpool_jax.layers.area_attention import dot_product_area_attention
from contextpool_jax.layers.area_attention.areas import area_features
from contextpool_jax.layers.augmented_conv import AugmentedConv2D
from contextpool_jax.layers.augmented_conv import relative_logits_2d
from contextpool_jax.layers.context_pool import ContextPool
from contextpool_jax.layers.lambda_layer import LambdaLayer
