"""Every command line of the package, one module each (e.g.
``python -m contextpool_jax.commands.sample``; installed, the console scripts of
pyproject.toml): :mod:`.train` (``contextpool-train``), :mod:`.sample` (``contextpool-sample``),
:mod:`.viz` (``contextpool-viz``), :mod:`.compile` (``contextpool-compile``) and :mod:`.launch`
(several processes on one machine)."""
