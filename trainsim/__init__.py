"""trainsim: a discrete-event simulator of multi-GPU training hardware, calibrated on real machines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trainsim")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

from trainsim.errors import TrainsimError

__all__ = ["TrainsimError", "__version__"]
