"""Shared pytest set-up: tests run on the CPU in float32 unless they say otherwise."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
