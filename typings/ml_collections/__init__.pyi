# ml_collections ships no type information, so pyright infers a ConfigDict entry's type from the
# assignments it happens to see first (a different guess per file order). This stub says what
# the package relies on: an entry of a ConfigDict is Any (the readers in contextpool_jax.io
# check it at run time).
from typing import Any

from ml_collections.config_dict import ConfigDict as ConfigDict
from ml_collections.config_dict import FieldReference as FieldReference
from ml_collections.config_dict import FrozenConfigDict as FrozenConfigDict

def __getattr__(name: str) -> Any: ...
