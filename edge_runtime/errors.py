"""One named exception per boundary. Every message is a sentence a user can act on.

The CLI prints `EdgeError` subclasses as one line and exits non-zero; anything else is a bug and
keeps its traceback.
"""


class EdgeError(Exception):
    """Base of every error the user can fix (bad input, bad config, missing file)."""


class ConfigError(EdgeError, ValueError):
    """A YAML budget or setting is invalid or impossible."""


class ModelLoadError(EdgeError):
    """A model path, file or architecture cannot be loaded."""


class RequestError(EdgeError, ValueError):
    """A request is invalid (prompt too long, bad sampling parameters...)."""


class OutOfPages(EdgeError):
    """The page pool cannot satisfy an allocation; nothing was changed."""


class MemoryPressure(EdgeError):
    """The memory guard refuses new work for now."""


class InputError(EdgeError):
    """An input file (audio, trace, text) is missing or unreadable."""
