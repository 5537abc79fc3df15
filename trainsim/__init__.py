"""trainsim: a discrete-event simulator of multi-GPU training hardware, calibrated on real machines."""

from trainsim.errors import TrainsimError

__all__ = ["TrainsimError", "__version__"]


def __getattr__(name: str):
    # The installed version is looked up on first use: reading package metadata scans site-packages, which
    # every command would otherwise pay at start-up.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("trainsim")
        except PackageNotFoundError:  # running from a source tree that was never installed
            value = "0.0.0+source"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module 'trainsim' has no attribute {name!r}")
