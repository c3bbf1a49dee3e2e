"""Experiment configs (``get_config()``), one file per paper experiment family.

Installed as ``contextpool_jax.configs`` (``contextpool-train --config default``); in a checkout
the package ``configs``. The files import each other relatively (``from . import common``), so
they are the same in both.
"""
