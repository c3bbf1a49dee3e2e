"""Every command line of the package, one module each (``python -m contextpool_jax.commands.<name>``;
installed, the console scripts of pyproject.toml): :mod:`.train` (``contextpool-train``),
:mod:`.sample` (``contextpool-sample``), :mod:`.viz` (``contextpool-viz``), :mod:`.compile`
(``contextpool-compile``) and :mod:`.launch` (several processes on one machine)."""
