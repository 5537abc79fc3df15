"""The topology library: YAML presets, their schema, loader, generators and routing.

    from trainsim.topologies import load_topology, list_presets
    topo = load_topology("dgx-a100")          # a preset, a YAML path, or a mapping (incl. a generator call)
    topo.route("gpu0", "gpu1")                # [("gpu0", "nvsw0"), ("nvsw0", "gpu1")]
"""

from .loader import (
    cluster,
    list_presets,
    load_spec,
    load_topology,
    nvlink_mesh,
    nvswitch_system,
    pcie_tree,
    save_topology,
)
from .schema import SCHEMA, TopologySpec
from .topology import Topology

__all__ = ["SCHEMA", "Topology", "TopologySpec", "cluster", "list_presets", "load_spec", "load_topology",
           "nvlink_mesh", "nvswitch_system", "pcie_tree", "save_topology"]
