"""The project's own error types, shared by every layer of the package.

:class:`ConfigError` marks a bad configuration value (a module field, a config
entry): its message names the field, the value and what is allowed, and
``train.py`` prints it as one line. Any other exception (a shape bug in a module
you edited, a JAX error) keeps its traceback.
"""


class ConfigError(ValueError):
  """A configuration value is not allowed; the message names field, value and choices."""


class DataError(ValueError):
  """The data a config points at exists but cannot be used (binary, too short, empty
  split); the message names the setting and the file or split."""
