"""The base room: errors (:mod:`.errors`), the checks of module fields and arguments
(:mod:`.checks`), numeric conventions (:mod:`.numerics`) and byte text (:mod:`.byte_text`).
It imports nothing else of the package (docs/architecture.md)."""
