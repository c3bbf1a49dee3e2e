"""The tools room: ContextPool's figures (:mod:`.viz`)."""
