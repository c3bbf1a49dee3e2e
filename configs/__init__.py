"""Experiment configs (``get_config()``), one file per paper experiment family."""
