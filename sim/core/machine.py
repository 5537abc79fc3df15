"""The machine: GPUs (streams, copy engines, a communication channel, memory), host sockets (cores, DRAM) and
the flow network of the topology's links, inside one SimPy environment.

Everything that moves bytes is a flow on a topology route, so transfers contend where they share a link.

- A GPU has a compute stream, an H2D and a D2H copy engine and a communication channel, each a
  ``simpy.Resource`` of capacity 1 (work on one stream is serial; different streams overlap, as with CUDA
  streams and NCCL's own stream), and a `MemoryTracker`.
- A host socket has its cores as a ``simpy.Resource(capacity=cores)``; data preparation, pageable-copy
  staging and CPU-side optimizer work each hold a core for their duration. Its DRAM is the ``cpuX.dram``
  node of the topology, joined to the socket by a link with the DRAM bandwidth: host buffers live there, so
  copies from and to host memory load that link.
- Pinned copies are DMA: a flow at whatever the links give. A pageable copy is staged by a CPU core through a
  pinned bounce buffer: the core is held for the whole copy and the flow is capped at the socket's
  ``pageable_rate`` (the topology's ``pageable_gbps``, which `trainsim calibrate` measures on the copies a
  training loop makes; default ``PAGEABLE_COPY_RATE`` = 10.5 GB/s, the pageable figure on PCIe Gen4 in
  docs/hardware-figures.md, where the link, at 25.8 GB/s pinned, is not what limits it: the CPU memcpy is).

Compute and communication kernels on one GPU share its SMs and HBM (`interference`): with
`Machine.enable_interference`, work on a compute stream slows while a collective holds some of them.

Every piece of work is recorded as an `Op` (what, where, when, how many bytes, which route) for the result,
the flat records and the trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import simpy

from trainsim.topologies.links import GB, PAGEABLE_GBPS

from .devices import DeviceSpec, get_device
from .flows import FlowNetwork
from .interference import HBM_STREAM_FRACTION, MATRIX, Contention, Load, run_pieces
from .latency import CallLatencyModel, CallSite, RouteLatency
from .memory import MemoryTracker

PAGEABLE_COPY_RATE = PAGEABLE_GBPS * GB  # bytes/s: one core copying memory (docs/hardware-figures.md)
STREAMS = ("compute", "h2d", "d2h", "comm")

#: breakdown categories of ops (see result.py): compute > communication > host-device transfer > data
COMPUTE, COMM, TRANSFER, DATA = "compute", "communication", "transfer", "data"


@dataclass(slots=True)
class Op:
    """One piece of work on one resource: a kernel, a copy, a collective, data preparation."""

    iteration: int
    resource: str  # a GPU or cpu node name
    stream: str  # compute | h2d | d2h | comm | data (GPUs); cores (hosts)
    op: str  # forward, backward, optimizer, h2d_input, allreduce, data_prep, data_wait, ...
    start: float
    end: float
    category: str | None = None  # for the breakdown; None: not counted (host-side work)
    layer: str | None = None
    nbytes: float = 0.0
    route: tuple = ()
    peer: str | None = None  # the other GPU of a peer copy (counts for its breakdown too)
    args: dict = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start


class Gpu:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        index: int,
        device: DeviceSpec,
        capacity: float,
        host_memory: str,
        *,
        record_memory: bool = True,
    ):
        self.name = name
        self.index = index
        self.device = device
        self.host_memory = host_memory
        self.memory = MemoryTracker(capacity, name, record=record_memory)
        self._env = env
        # the communication in flight that compute shares the GPU with (`Machine.enable_interference`); None:
        # compute runs at its nominal time whatever overlaps it
        self.contention: Contention | None = None

    @cached_property
    def streams(self) -> dict[str, simpy.Resource]:
        """The GPU's streams, made when first used: where identical machines are mirrored
        (sim/symmetry.py) most GPUs of a cluster never run anything."""
        return {s: simpy.Resource(self._env, capacity=1) for s in STREAMS}


class Host:
    def __init__(self, env: simpy.Environment, name: str, cores: int, dram: str, dram_bandwidth: float,
                 copy_rate: float = PAGEABLE_COPY_RATE, pageable_rate: float = PAGEABLE_COPY_RATE):
        self.name = name
        self.dram = dram
        self.dram_bandwidth = dram_bandwidth
        self.num_cores = cores
        self.cores = simpy.Resource(env, capacity=cores)
        self.copy_rate = copy_rate  # bytes/s one core copies memory (CPU-side updates)
        self.pageable_rate = pageable_rate  # bytes/s of a pageable copy to or from a GPU, one core staging it


class Machine:
    """GPUs, hosts and the flow network of one topology. ``devices`` maps a GPU spec name to a DeviceSpec
    when the built-in library does not know it (a calibrated box)."""

    def __init__(
        self,
        topology,
        env: simpy.Environment | None = None,
        *,
        devices: dict | None = None,
        record_link_rates: bool = True,
        record_flows: bool = True,
        record_memory: bool = True,
    ):
        self.env = env or simpy.Environment()
        self.topology = topology
        self.net = FlowNetwork.from_topology(
            self.env, topology, record_link_rates=record_link_rates, record_flows=record_flows
        )
        devices = {k.lower(): v for k, v in (devices or {}).items()}
        self.gpus: dict[str, Gpu] = {}
        for i, name in enumerate(topology.gpus):
            spec_name = topology.gpu_spec(name)
            device = devices.get(spec_name.lower()) or get_device(spec_name)
            self.gpus[name] = Gpu(
                self.env,
                name,
                i,
                device,
                topology.gpu_memory(name),
                topology.host_memory(name),
                record_memory=record_memory,
            )
        self.hosts: dict[str, Host] = {}
        for cpu in topology.cpus:
            attrs = topology.graph.nodes[cpu]
            self.hosts[cpu] = Host(self.env, cpu, attrs["cores"], attrs["dram"], attrs["dram_bandwidth"],
                                   pageable_rate=attrs["pageable_rate"])
        self._host_of_dram = {h.dram: h for h in self.hosts.values()}
        self.ops: list[Op] = []
        # what a call pays before its bytes move (a host plug-in's measurements); default: the routes' own
        self.latency: CallLatencyModel = RouteLatency()

    # ---- lookups --------------------------------------------------------------------------------------
    def gpu(self, index_or_name: int | str) -> Gpu:
        if isinstance(index_or_name, int):
            return self.gpus[self.topology.gpus[index_or_name]]
        return self.gpus[index_or_name]

    def host_of(self, gpu: str) -> Host:
        return self._host_of_dram[self.gpus[gpu].host_memory]

    def host_sharing(self, ranks: list[str]) -> dict[str, int]:
        """Per rank: how many CPU ranks of ``ranks`` compute on the cores of its host (1 for a GPU, which has
        its own SMs). They share the socket's cache and DRAM (a host plug-in's `step_scale`)."""
        per_host: dict[str, int] = {}
        for gpu in ranks:
            if self.gpus[gpu].device.kind == "cpu":
                per_host[self.host_of(gpu).name] = per_host.get(self.host_of(gpu).name, 0) + 1
        return {gpu: per_host[self.host_of(gpu).name] if self.gpus[gpu].device.kind == "cpu" else 1
                for gpu in ranks}

    def host_by_dram(self, dram: str) -> Host:
        return self._host_of_dram[dram]

    def message_latencies(self, legs: list[list], nbytes: float,
                          call: CallSite | None = None) -> list[float | None]:
        """Per leg of a point-to-point message, part of ``call`` if named: the latency it pays (None: its
        route's). A latency the model gives is paid once, on the first leg."""
        paid = self.latency.message_cost(call, nbytes, now=self.env.now)
        return [paid] + [None if paid is None else 0.0] * (len(legs) - 1)

    @property
    def now(self) -> float:
        return self.env.now

    def record(self, **kwargs) -> Op:
        op = Op(**kwargs)
        self.ops.append(op)
        return op

    def record_since(self, start: float, resource: str, stream: str, op: str, iteration: int, **fields) -> Op:
        """Record work on ``resource``'s ``stream`` that ran from ``start`` until now."""
        return self.record(iteration=iteration, resource=resource, stream=stream, op=op, start=start,
                           end=self.env.now, **fields)

    def enable_interference(self, gpus) -> None:
        """Compute on ``gpus`` (GPU devices with a known SM count) shares the GPU with the communication
        kernels that overlap it (`interference`); a CPU rank's compute is held by gloo's copies instead."""
        for g in gpus:
            gpu = self.gpus[g]
            if gpu.device.kind == "gpu" and gpu.device.sm_count and gpu.contention is None:
                gpu.contention = Contention(self.env, gpu.device.sm_count,
                                            gpu.device.memory_bandwidth * HBM_STREAM_FRACTION)

    # ---- work -----------------------------------------------------------------------------------------
    def run(
        self,
        gpu: str,
        stream: str,
        duration: float,
        *,
        op: str,
        iteration: int,
        layer: str | None = None,
        category: str | None = COMPUTE,
        load: Load = MATRIX,
        **args,
    ):
        """A SimPy process body: ``duration`` seconds of work on a GPU stream (waits for the stream). On the
        compute stream, work of ``load`` (`interference.Load`) slows while communication overlaps it."""
        with self.gpus[gpu].streams[stream].request() as req:
            yield req
            start = self.env.now
            contention = self.gpus[gpu].contention if stream == "compute" else None
            if contention is not None:
                yield from run_pieces(self.env, contention, start, start + duration, (duration,), (load,))
            elif duration > 0:
                yield self.env.timeout(duration)
            self.record_since(start, gpu, stream, op, iteration, category=category, layer=layer, args=args)

    def transfer(
        self,
        legs: list[list],
        nbytes: float,
        *,
        gpu: str,
        stream: str,
        op: str,
        iteration: int,
        category: str,
        peer: str | None = None,
        pinned: bool = True,
        host: Host | None = None,
        tag: str | None = None,
        latencies: list[float | None] | None = None,
    ):
        """A process body: move ``nbytes`` over ``legs`` (routes done one after the other, e.g. staged through
        host memory) holding ``gpu``'s ``stream`` engine; pageable copies also hold a core of ``host``."""
        with self.gpus[gpu].streams[stream].request() as req:
            yield req
            start = self.env.now
            core = None
            if not pinned and host is not None:
                core = host.cores.request()
                yield core
            staging = host.pageable_rate if host is not None else PAGEABLE_COPY_RATE
            max_rate = math.inf if pinned else staging
            for leg, latency in zip(legs, latencies or [None] * len(legs), strict=True):
                yield from self.rank_transfer([gpu, peer], leg, nbytes, latency=latency, max_rate=max_rate,
                                              tag=tag or f"it{iteration}:{op}:{gpu}")
            if core is not None:
                host.cores.release(core)
                self.record_since(start, host.name, "cores", f"{op}_staging", iteration, category=None,
                                  nbytes=nbytes)
            route = tuple(edge for leg in legs for edge in leg)
            self.record_since(start, gpu, stream, op, iteration, category=category, nbytes=nbytes,
                              route=route, peer=peer, args={"pinned": pinned} if host is not None else {})

    def h2d(self, gpu: str, nbytes: float, *, iteration: int, op: str = "h2d_input", pinned: bool = True,
            src: str | None = None, category: str = TRANSFER, call: CallSite | None = None):
        """Host memory (``src``, default the GPU's nearest DRAM) to a GPU on its H2D engine; ``call``: the
        call this copy is part of (the latency model may charge it instead of the route's latency)."""
        yield from self._host_copy(gpu, nbytes, "h2d", src, iteration=iteration, op=op, pinned=pinned,
                                   category=category, call=call)

    def d2h(self, gpu: str, nbytes: float, *, iteration: int, op: str = "d2h", pinned: bool = True,
            dst: str | None = None, category: str = TRANSFER, call: CallSite | None = None):
        """A GPU to host memory (``dst``, default its nearest DRAM) on its D2H engine; ``call`` as for h2d."""
        yield from self._host_copy(gpu, nbytes, "d2h", dst, iteration=iteration, op=op, pinned=pinned,
                                   category=category, call=call)

    def _host_copy(self, gpu: str, nbytes: float, stream: str, dram: str | None, *, iteration: int, op: str,
                   pinned: bool, category: str, call: CallSite | None):
        dram = dram or self.gpus[gpu].host_memory
        route = self.topology.route(dram, gpu) if stream == "h2d" else self.topology.route(gpu, dram)
        paid = self.latency.cost(call, nbytes, now=self.env.now) if call is not None else None
        yield from self.transfer([route], nbytes, gpu=gpu, stream=stream, op=op, iteration=iteration,
                                 category=category, pinned=pinned, host=self.host_by_dram(dram),
                                 latencies=None if paid is None else [paid])

    def peer_copy(
        self,
        src: str,
        dst: str,
        nbytes: float,
        *,
        iteration: int,
        op: str,
        engine_gpu: str,
        stream: str,
        category: str = COMM,
        call: CallSite | None = None,
    ):
        """GPU to GPU (P2P, or staged through host memory where the topology has no P2P) on the engine of
        ``engine_gpu``; counts for both GPUs' breakdowns. ``call``: the call the copy is part of."""
        legs = self.topology.gpu_copy_legs(src, dst)
        peer = dst if engine_gpu == src else src
        yield from self.transfer(
            legs,
            nbytes,
            gpu=engine_gpu,
            stream=stream,
            op=op,
            iteration=iteration,
            category=category,
            peer=peer,
            latencies=self.message_latencies(legs, nbytes, call),
        )

    def rank_transfer(self, ranks: list[str | None], leg: list, nbytes: float, *,
                      latency: float | None = None, max_rate: float = math.inf, tag: str = ""):
        """A process body: one leg of a copy between ``ranks``. A CPU rank moves gloo's bytes with its own
        core (TCP through the kernel: the copy *is* CPU work), so while the bytes move, the compute streams of
        the CPU ranks involved are held: their layers wait, as they do for the core's time. The latency
        before the first byte (the peer waking up) holds nothing. GPUs copy on their engines: nothing held."""
        cpu = self.cpu_ranks(ranks)
        if not cpu:
            yield self.net.transfer(leg, nbytes, latency=latency, max_rate=max_rate, tag=tag)
            return
        if latency:
            yield self.env.timeout(latency)
        held = yield from self.hold_compute(cpu)
        yield self.net.transfer(leg, nbytes, latency=0.0 if latency is not None else None, max_rate=max_rate,
                                tag=tag)
        self.release_compute(held)

    def cpu_ranks(self, ranks) -> list[str]:
        """The CPU ranks among ``ranks``, in one global order (so two copies never wait on each other)."""
        return sorted({r for r in ranks if r in self.gpus and self.gpus[r].device.kind == "cpu"},
                      key=lambda r: self.gpus[r].index)

    def hold_compute(self, ranks: list[str]):
        """A process body: the compute streams of ``ranks``, requested in the order given; returns them."""
        held = []
        for r in ranks:
            req = self.gpus[r].streams["compute"].request()
            yield req
            held.append((r, req))
        return held

    def release_compute(self, held: list) -> None:
        for r, req in held:
            self.gpus[r].streams["compute"].release(req)

    def host_update(self, host: Host, reads: float, writes: float, *, cores: int = 1, op: str, iteration: int,
                    **args):
        """A memory-bound update on ``cores`` cores of ``host`` (a parameter server's or an EASGD centre's):
        ``reads`` and ``writes`` bytes stream over the socket's DRAM link at the cores' copy rate, shared
        between reads and writes in proportion to their bytes, so it contends with copies using that DRAM."""
        cores = min(cores, host.num_cores)
        requests = [host.cores.request() for _ in range(cores)]
        yield self.env.all_of(requests)
        start = self.env.now
        rate = cores * host.copy_rate
        total = reads + writes
        if total > 0:
            yield self.env.all_of([
                self.net.transfer([(host.dram, host.name)], reads, max_rate=rate * reads / total,
                                  tag=f"it{iteration}:{op}_read"),
                self.net.transfer([(host.name, host.dram)], writes, max_rate=rate * writes / total,
                                  tag=f"it{iteration}:{op}_write"),
            ])
        for req in requests:
            host.cores.release(req)
        self.record_since(start, host.name, "cores", op, iteration, category=None, nbytes=total,
                          args={"cores": cores, **args})

    def host_work(self, host: Host, duration: float, *, cores: int = 1, op: str, iteration: int, **args):
        """``duration`` seconds of CPU work holding ``cores`` cores of ``host``."""
        requests = [host.cores.request() for _ in range(min(cores, host.num_cores))]
        yield self.env.all_of(requests)
        start = self.env.now
        if duration > 0:
            yield self.env.timeout(duration)
        for req in requests:
            host.cores.release(req)
        self.record_since(start, host.name, "cores", op, iteration, category=None,
                          args={"cores": len(requests), **args})


def build_machine(topology, env: simpy.Environment | None = None, **kwargs) -> Machine:
    """The machine of a loaded `Topology` (`trainsim.topologies.load_topology` reads one)."""
    return Machine(topology, env, **kwargs)
