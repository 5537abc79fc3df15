"""Parallel strategies: the iteration each one runs on the machine, and their registry.

`base` holds the registry and the pieces every iteration is made of (`Context`); each other module registers
one or two strategies when imported, which this package does once, so `base.get_strategy` knows them all.
"""

from . import base, ddp, dp_gpu0, easgd, parameter_server, pipeline, spatial  # noqa: F401  (registration)
