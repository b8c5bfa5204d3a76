"""clusterft: gradient-space clustered, balanced, DP-aware data selection for fine-tuning.

Importing the package changes nothing in the caller's process; the stages that load models
switch the Hugging Face libraries offline themselves (runtime.model.offline).
"""

__version__ = "0.1.0"
