"""The device file format ``trainsim.device/1``: one GPU or CPU rank's peak FLOP/s per precision, memory
bandwidth and capacity (the simulator's `trainsim.sim.core.devices.DeviceSpec` in file units)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainsim.units import GBps


class DeviceFile(BaseModel):
    """The JSON form of a :class:`DeviceSpec` (``"schema": "trainsim.device/1"``)."""

    # strict: no bool for a number; numbers must be finite
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True, allow_inf_nan=False)

    schema_: Literal["trainsim.device/1"] = Field(default="trainsim.device/1", alias="schema")
    name: str = Field(min_length=1)
    kind: Literal["gpu", "cpu"] = "gpu"
    peak_tflops: dict[Literal["fp32", "tf32", "fp16", "bf16", "fp8"], float]
    memory_bandwidth_gbps: GBps = Field(gt=0)
    memory_bytes: int = Field(gt=0)
    sm_count: int | None = Field(default=None, ge=1)
    source: str | None = None
    # the GPU's generation (`trainsim.sim.core.devices.ARCHITECTURES`); absent where unknown
    architecture: Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper",
                          "blackwell"] | None = None
    # board power limit (W) and process node (nm): what caps sustained FLOP/s (the kernel model's power cap)
    tdp_watts: float | None = Field(default=None, gt=0)
    process_nm: float | None = Field(default=None, gt=0)
