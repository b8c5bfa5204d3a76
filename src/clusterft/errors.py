"""The errors that mean bad input or config (exit code 2, no traceback), in one place."""

from clusterft.allocation import AllocationError
from clusterft.artifacts import OutputError
from clusterft.clustering import ClusteringError
from clusterft.config import ConfigError
from clusterft.data import DataError
from clusterft.model import ModelError
from clusterft.selection import SelectionError

USER_ERRORS = (AllocationError, ClusteringError, ConfigError, DataError, ModelError, OutputError,
               SelectionError)
