"""The error a bad configuration raises, low in the stack so that every layer (training
included) can raise it without importing the config loader; ``seqmix.study.load`` re-exports it."""


class ConfigError(ValueError):
    """A configuration that is not valid; the message names every bad key and the fix."""
