"""One small exception tree. Only cli.py turns these into messages and exit codes."""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune reports to a user."""

    exit_code = 1


class SpecError(AutotuneError):
    """A study or objective file (or a command-line value) is invalid: names the file and key."""

    exit_code = 2

    def __init__(self, source: str, key: str | None, message: str):
        self.source, self.key, self.message = source, key, message
        where = f"{source}: {key}" if key else source
        super().__init__(f"{where}: {message}")


class ModelError(AutotuneError, ValueError):
    """A model name names nothing autotune can serve (an unknown tiny:KIND). A ValueError too, as before."""

    exit_code = 2


class EngineError(AutotuneError):
    """The vLLM server could not be started or stopped (not a configuration's failure)."""


class StorageError(AutotuneError):
    """The study storage cannot be reached or opened."""

    exit_code = 2


class ModelUnavailable(AutotuneError):
    """A model named by a hub id whose config.json is neither in the local cache nor reachable now."""

    exit_code = 2
