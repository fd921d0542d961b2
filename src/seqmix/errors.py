"""The error a bad configuration raises, low in the stack so that every layer (training
included) can raise it without importing the config loader; ``seqmix.study.load`` re-exports it."""


class ConfigError(ValueError):
    """A configuration that is not valid; the message names every bad key and the fix."""


class CodeChanged(ConfigError):
    """A job's code differs from the code the workflow planned it with (an edit while the
    workflow ran): its results would name code that did not make them."""
