"""The runs room: the fields of ``config.model`` and the model they build
(:mod:`.config_fields`), and a workdir's layout and loading it back (:mod:`.workdirs`)."""
