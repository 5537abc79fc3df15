"""What a run plugs into its strategy's passes, as Protocols: the data-movement optimizations of
docs/techniques.md (activation offload, gradient compression, optimizer-state streaming) and the host
plug-in of a calibrated box. A strategy calls them through the `Context`; each is None when the run does not
use it. `sim/optimizations/` and `sim/hosts/` hold the implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trainsim.sim.core.devices import DeviceSpec
    from trainsim.sim.core.jitter import JitterSpec
    from trainsim.sim.core.latency import CallLatencyModel

__all__ = ["ActivationOffload", "GradientCodec", "HostModel", "OptimizerStateStream", "Plugins"]

Process = Generator[Any, Any, None]


class ActivationOffload(Protocol):
    """Saved activations of some layers kept in host memory between forward and backward (vDNN): the
    rank's forward and backward passes with the copies out and back."""

    def forward(self, gpu: str, iteration: int) -> Process: ...

    def backward(self, gpu: str, iteration: int, stops: dict[int, Callable[[], None]]) -> Process: ...


class GradientCodec(Protocol):
    """Gradients compressed before they cross the wire (fp16, bf16, int8, top-k, PowerSGD): what encoding
    and decoding cost, and the bytes the wire carries, for a set of layers of a gradient."""

    spec: Any  # trainsim.formats.scenario_options.CompressionSpec: ``method``, ``label()``

    def encode_s(self, grad_bytes: list[float], layers: list[int]) -> float: ...

    def decode_s(self, grad_bytes: list[float], layers: list[int]) -> float: ...

    def wire_bytes(self, grad_bytes: list[float], layers: list[int]) -> float: ...

    def powersgd_phases(self, grad_bytes: list[float], layers: list[int]) -> Any: ...


class OptimizerStateStream(Protocol):
    """Optimizer state held in host memory and streamed through the GPU in chunks at every step."""

    def hold(self, gpu: str, state_bytes: float) -> None: ...

    def step(self, gpu: str, iteration: int, state_bytes: float, step_s: float,
             before_step: Any = None) -> Process: ...


class HostModel(Protocol):
    """What a calibrated host measured beyond the hardware graph (`trainsim.sim.hosts`)."""

    latency: CallLatencyModel

    def step_scale(self, device: DeviceSpec, batch: int, sharing: int) -> float: ...

    def prep_s_per_sample(self, given: float | None, devices: list[DeviceSpec], loaded: int,
                          sharing: int) -> float: ...

    def jitter(self, devices: list[DeviceSpec], batch: int) -> JitterSpec | None: ...


@dataclass(frozen=True)
class Plugins:
    """The run's plug-ins; None where the run does not use one."""

    offload: ActivationOffload | None = None
    codec: GradientCodec | None = None
    state_stream: OptimizerStateStream | None = None
    host: HostModel | None = None
