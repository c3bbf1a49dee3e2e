"""The io room: reading a run's config (:mod:`.config_readers`), the console
(:mod:`.console`) and writing a run's files (:mod:`.storage`)."""
