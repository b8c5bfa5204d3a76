"""Every exception clusterft raises on purpose, in one module that imports nothing.

USER_ERRORS are bad input or config: the CLI prints their message (which names the file,
line, field or params key) and exits 2 without a traceback. The others are faults.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A params file (or override) is malformed: the message names file and key."""


class DataError(ValueError):
    """Bad input data; the message names file, line and field."""


class ModelError(ValueError):
    """A model folder cannot be used; the message names the folder and what is missing."""


class LoraGradError(ModelError):
    """The adapter cannot give per-sample gradients (unsupported parameters, no moments)."""


class OutputError(OSError):
    """An output location cannot be written; the message names it."""


class BusyError(OutputError):
    """Another run holds the artifacts folder; the message names it."""


class ClusteringError(ValueError):
    """Features or K are unusable; the message says which and why."""


class SelectionError(ValueError):
    """Budget or inputs are unusable; the message names the parameter."""


class TimeBudgetError(SelectionError):
    """The time budget cannot be met; the message says the smallest one that fits."""


class AllocationError(ValueError):
    """The plan cannot be built for these workers; the message says why."""


class WorkPoolError(ValueError):
    """The grid's Prefect work pool is unknown or has no live worker; the message names it."""


class GridInputError(ValueError):
    """Grid runs on a work pool were refused for bad params or data (never retried); the
    message lists each run with its own error (which names file, line, field or key)."""


class GridRunError(RuntimeError):
    """Grid runs on a work pool failed on every attempt (lost workers, faults); the message
    lists them."""


class LaunchError(RuntimeError):
    """The torchrun workers failed; they printed their own error (exit code 1, not 2: a lost
    worker is not bad input)."""


USER_ERRORS = (AllocationError, ClusteringError, ConfigError, DataError, ModelError, OutputError,
               SelectionError, WorkPoolError, GridInputError)
