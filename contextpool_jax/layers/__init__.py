"""Flax Linen layers: ContextPool, area attention, lambda layers, attention-augmented convolution."""
