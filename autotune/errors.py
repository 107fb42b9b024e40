"""One small exception tree. Only cli/ turns these into messages and exit codes (one line, no traceback).

    AutotuneError                 exit 1; never raised itself
    ├── SpecError                 exit 2; a file (or a command-line option) and the key in it that is wrong:
    │                             config/toml.py and config/study_file.py (study and objective files),
    │                             measure/workload.py (datasets and length tables), engine/flag_checks.py (flag
    │                             names and values), engine/models.py and fit/model_shape.py (a model's config.json),
    │                             fit/hardware.py (GPU profile names), fit/memcap.py (the memory cap),
    │                             fit/estimate.py (a configuration's values), cli/ (options)
    ├── ModelError                exit 2; also a ValueError: a model name that names nothing to serve
    │                             (engine/models.py: an unknown tiny:KIND)
    ├── EngineError               exit 1; the vLLM server or build itself, not a configuration's failure:
    │                             engine/server.py (start, stop), engine/flags.py (build, version),
    │                             engine/flag_checks.py (the server's argument parser), search/one_trial.py (a model
    │                             vLLM cannot find, a GPU held by another process)
    └── StorageError              exit 2; the study storage cannot be reached or opened: search/storage.py, cli/

A configuration that fails to boot or run is not an exception here: it is a FailureKind recorded on its trial.
"""

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
