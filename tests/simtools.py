"""Tiny machines and workloads with known figures, for the simulator's hand-computable tests."""

from __future__ import annotations

from trainsim.formats.workload import Workload

GB = 1e9


def tiny_topology(
    *,
    gpus: int = 2,
    nvlink: bool = True,
    pcie_gbps: float = 10.0,
    uplink_gbps: float | None = None,
    memory_gib: float = 40,
    p2p: bool = True,
    cores: int = 8,
    dram_gbps: float = 100.0,
) -> dict:
    """``gpus`` A100s under one PCIe switch (uplink to one socket), optionally an NVLink pair 0-1, all link
    latencies 0 (the DRAM edge keeps the loader's default 0.1 us)."""
    nodes = [
        {"name": "cpu0", "kind": "cpu", "cores": cores, "dram_bandwidth_gbps": dram_gbps},
        {"name": "sw0", "kind": "pcie_switch"},
    ]
    links = [
        {"a": "cpu0", "b": "sw0", "kind": "pcie", "bandwidth_gbps": uplink_gbps or pcie_gbps, "latency_us": 0}
    ]
    for i in range(gpus):
        nodes.append({"name": f"gpu{i}", "kind": "gpu", "spec": "A100", "memory_gib": memory_gib})
        links.append(
            {"a": "sw0", "b": f"gpu{i}", "kind": "pcie", "bandwidth_gbps": pcie_gbps, "latency_us": 0}
        )
    if nvlink and gpus >= 2:
        links.append({"a": "gpu0", "b": "gpu1", "kind": "nvlink", "bandwidth_gbps": 100.0, "latency_us": 0})
    return {"schema": "trainsim.topology/1", "name": "tiny", "p2p": p2p, "nodes": nodes, "links": links}


def tiny_workload(
    layers: list[dict],
    *,
    batch: int,
    input_bytes: int = 1_000_000,
    step_s: float | None = 0.002,
    prep_s: float | None = None,
    device_spec: str = "a100-40gb",
) -> dict:
    """A workload measured on ``device_spec`` at exactly ``batch`` per GPU.

    ``layers``: dicts with name, fwd, bwd (seconds at ``batch``), params (bytes), saved (bytes per sample).
    """
    out = []
    for spec in layers:
        out.append(
            {
                "name": spec["name"],
                "kind": "linear",
                "param_bytes": spec.get("params", 0),
                "saved_activation_bytes_per_sample": spec.get("saved", 0),
                "output_bytes_per_sample": spec.get("output", 1000),
                "flops_forward_per_sample": 1.0,
                "flops_backward_per_sample": 2.0,
                "memory_bytes_forward_per_sample": 1.0,
                "memory_bytes_backward_per_sample": 1.0,
                "forward": {"points": [[batch, spec["fwd"], 0.0]]},
                "backward": {"points": [[batch, spec["bwd"], 0.0]]},
            }
        )
    data = {
        "schema": "trainsim.workload/1",
        "name": "tiny-measured",
        "dtype": "float32",
        "input": {
            "shape": [input_bytes],
            "dtype": "uint8",
            "bytes_per_sample": input_bytes,
            "prep_s_per_sample": prep_s,
        },
        "layers": out,
        "provenance": {"device": "test", "device_spec": device_spec},
    }
    if step_s is not None:
        data["optimizer_step"] = {"points": [[batch, step_s, 0.0]]}
    Workload.model_validate(data)  # fail early in the test, not inside the simulator
    return data


def scenario(topology: dict | str, workload_path: str, strategy: str, batch: int, **extra) -> dict:
    base = {
        "schema": "trainsim.scenario/1",
        "name": f"test-{strategy}",
        "topology": topology,
        "workload": workload_path,
        "strategy": {"name": strategy},
        "batch_size": batch,
        "iterations": 2,
        "warmup_iterations": 1,
        "optimizer": {"name": "sgd"},
        "precision": "fp32",
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def stalls_per_call(machine) -> dict:
    """Wrap ``machine``'s gloo latency model's charge: per call key (None: a call charged on its own),
    whether each part charged stalled (over 1 ms); filled as the simulation runs."""
    parts: dict = {}
    model = machine.latency
    charge = model._charge

    def recorded(latency, nbytes, now, skew_s=None, key=None):
        paid = charge(latency, nbytes, now, skew_s, key)
        parts.setdefault(key, []).append(paid > 1e-3)
        return paid

    model._charge = recorded
    return parts


def simulate_mirrored(scenario: dict, mirror: bool):
    """The result of a scenario dict, with symmetry mirroring on or off (sim/symmetry.py), no records."""
    from trainsim.resolve import resolve
    from trainsim.sim.simulation import Simulation

    return Simulation(resolve(scenario), record=False, mirror=mirror).run()


def assert_same_result(full, mirrored) -> None:
    """Two results agree in every field but ``stats`` (wall time, events, ranks simulated)."""
    a, b = full.to_dict(), mirrored.to_dict()
    for key in a:
        if key != "stats":
            assert a[key] == b[key], key
