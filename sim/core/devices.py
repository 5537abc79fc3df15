"""Device specs: peak FLOP/s per precision, memory bandwidth and capacity of the GPUs the simulator knows.

Figures are dense (no structured sparsity) peaks at boost clock, per GPU. Where docs/hardware-figures.md (the
project's hardware table) has them they come from there; the rest are NVIDIA's datasheets / architecture
whitepapers, cited next to each entry. ``fp16``/``bf16``/``tf32`` are tensor-core peaks with fp32 accumulation
(what PyTorch's matmuls and cuDNN convolutions use); a precision a device lacks is simply absent.

A calibrated box's CPU is a device too (:func:`cpu_device`), filled from measurement and stored as JSON
(``"schema": "trainsim.device/1"``) inside the calibration bundle.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

from pydantic import ValidationError

from trainsim.errors import TrainsimError, from_validation_error, unknown_name
from trainsim.formats.device import DeviceFile

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
#: GPU architectures (generations) the kernel model tells apart, oldest first
ARCHITECTURES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
#: the precisions each architecture can run a matrix product in: tensor cores run fp16 from Volta on, tf32 and
#: bf16 from Ampere on, fp8 from Ada and Hopper on (NVIDIA's architecture whitepapers); Pascal's fp16 is its
#: SIMT half2 path (P100: twice the fp32 rate), Kepler and Maxwell have no fast fp16
ARCHITECTURE_PRECISIONS = {
    "kepler": ("fp32",), "maxwell": ("fp32",), "pascal": ("fp32", "fp16"), "volta": ("fp32", "fp16"),
    "turing": ("fp32", "fp16"), "ampere": ("fp32", "tf32", "fp16", "bf16"),
    "ada": ("fp32", "tf32", "fp16", "bf16", "fp8"), "hopper": ("fp32", "tf32", "fp16", "bf16", "fp8"),
    "blackwell": ("fp32", "tf32", "fp16", "bf16", "fp8"),
}
GIB = 2**30
TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    """One device. Units: FLOP/s, bytes/s, bytes."""

    name: str
    peak_flops: dict[str, float]  # precision -> FLOP/s
    memory_bandwidth: float  # bytes/s, HBM/GDDR (or DRAM for a CPU)
    memory_bytes: int
    kind: Literal["gpu", "cpu"] = "gpu"
    sm_count: int | None = None  # streaming multiprocessors (cores for a CPU)
    source: str = ""  # where the figures come from
    aliases: tuple[str, ...] = field(default=(), compare=False)
    # the GPU's generation (`ARCHITECTURES`): which precisions its matrix units run and which fitted kernel
    # figures apply (`trainsim.sim.compute.kernels`); None for a CPU or a GPU nobody named
    architecture: str | None = None
    # board power limit (W, the datasheet's TDP / max power) and the process node (nm, the foundry's name
    # for it: TSMC 4N counts as 5): what caps a board's sustained FLOP/s when its power runs out before its
    # clocks do (the kernel model's power cap); None where not given
    tdp_watts: float | None = None
    process_nm: float | None = None

    def __post_init__(self):
        if not self.name:
            raise TrainsimError("a device needs a name", field="name")
        if "fp32" not in self.peak_flops:
            raise TrainsimError("every device needs an fp32 peak", field="peak_flops.fp32")
        for precision, value in self.peak_flops.items():
            if precision not in PRECISIONS:
                raise unknown_name("precision", precision, PRECISIONS, field="peak_flops")
            if not (value > 0 and math.isfinite(value)):
                raise TrainsimError(f"must be > 0, got {value}", field=f"peak_flops.{precision}")
        if not (self.memory_bandwidth > 0 and math.isfinite(self.memory_bandwidth)):
            raise TrainsimError(f"must be > 0, got {self.memory_bandwidth}", field="memory_bandwidth")
        if self.memory_bytes <= 0:
            raise TrainsimError(f"must be > 0, got {self.memory_bytes}", field="memory_bytes")
        for name in ("tdp_watts", "process_nm"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise TrainsimError(f"must be > 0, got {value}", field=name)
        if self.architecture is not None:
            if self.architecture not in ARCHITECTURES:
                raise unknown_name("architecture", self.architecture, ARCHITECTURES, field="architecture")
            runs = ARCHITECTURE_PRECISIONS[self.architecture]
            for precision in self.peak_flops:
                if precision not in runs:
                    raise TrainsimError(f"a {self.architecture} GPU has no {precision} matrix units; valid "
                                        f"choices: {', '.join(runs)}", field=f"peak_flops.{precision}")

    def peak(self, precision: str = "fp32") -> float:
        """Peak FLOP/s at ``precision``; a precision the device lacks lists the ones it has."""
        try:
            return self.peak_flops[precision]
        except KeyError:
            raise unknown_name(f"precision on {self.name}", precision, self.peak_flops,
                               field="precision") from None

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte above which an fp32 kernel is compute-bound."""
        return self.peak("fp32") / self.memory_bandwidth

    def to_json_dict(self) -> dict:
        """The JSON form (units in field names), e.g. for a calibration bundle; ``architecture``,
        ``tdp_watts`` and ``process_nm`` only where known."""
        record = DeviceFile(
            name=self.name, kind=self.kind,
            peak_tflops={k: v / TERA for k, v in self.peak_flops.items()},
            memory_bandwidth_gbps=self.memory_bandwidth / GIGA, memory_bytes=self.memory_bytes,
            sm_count=self.sm_count, source=self.source or None, architecture=self.architecture,
            tdp_watts=self.tdp_watts, process_nm=self.process_nm,
        ).model_dump(mode="json", by_alias=True)
        for optional in ("architecture", "tdp_watts", "process_nm"):
            if record.get(optional) is None:
                record.pop(optional, None)
        return record

    def summary(self) -> dict:
        record = asdict(self)
        record.pop("aliases")
        return record


def device_from_json(data: dict, *, file: str | None = None) -> DeviceSpec:
    """A :class:`DeviceSpec` from its JSON form; bad input names the file and field."""
    try:
        parsed = DeviceFile.model_validate(data)
    except ValidationError as exc:
        error = from_validation_error(exc, file=file)
        if error.field and error.field.endswith(".[key]"):  # pydantic's loc for a bad dict key
            field = error.field.removesuffix(".[key]")
            message = str(error).removeprefix(f"{file}: " if file else "").removeprefix(f"{error.field}: ")
            raise TrainsimError(message, file=file, field=field) from None
        raise error from None
    return device_from_file(parsed, file=file)


def device_from_file(parsed: DeviceFile, *, file: str | None = None) -> DeviceSpec:
    """The :class:`DeviceSpec` of a validated device file (units converted); bad values name the field."""
    try:
        return DeviceSpec(name=parsed.name, kind=parsed.kind,
                          peak_flops={k: v * TERA for k, v in parsed.peak_tflops.items()},
                          memory_bandwidth=parsed.memory_bandwidth_gbps * GIGA,
                          memory_bytes=parsed.memory_bytes, sm_count=parsed.sm_count,
                          source=parsed.source or "", architecture=parsed.architecture,
                          tdp_watts=parsed.tdp_watts, process_nm=parsed.process_nm)
    except TrainsimError as exc:
        # name the field as the JSON spells it
        field = exc.field.replace("peak_flops", "peak_tflops") if exc.field else None
        raise TrainsimError(str(exc).removeprefix(f"{exc.field}: "), file=file, field=field) from None


def cpu_device(cores: int, flops_per_core: float, mem_bandwidth: float, *, name: str = "cpu",
               memory_bytes: int | None = None, source: str = "measured") -> DeviceSpec:
    """The CPU of a calibrated box as a device: ``cores`` x ``flops_per_core`` fp32 FLOP/s, DRAM bandwidth."""
    if cores < 1:
        raise TrainsimError(f"must be >= 1, got {cores}", field="cores")
    if memory_bytes is None:
        try:
            import os
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            memory_bytes = 16 * GIB
    return DeviceSpec(name=name, kind="cpu", peak_flops={"fp32": cores * flops_per_core},
                      memory_bandwidth=mem_bandwidth, memory_bytes=memory_bytes, sm_count=cores,
                      source=source)


def _gpu(name, fp32, bandwidth_gbps, memory_gib, sm_count, source, *, aliases=(), architecture=None,
         tdp=None, nm=None, **tensor_tflops):
    peaks = {"fp32": fp32 * TERA, **{k: v * TERA for k, v in tensor_tflops.items()}}
    return DeviceSpec(name=name, peak_flops=peaks, memory_bandwidth=bandwidth_gbps * GIGA,
                      memory_bytes=int(memory_gib * GIB), sm_count=sm_count, source=source,
                      aliases=tuple(aliases), architecture=architecture, tdp_watts=tdp, process_nm=nm)


_REF = "docs/hardware-figures.md"
# Each GPU's ``tdp`` is its datasheet's board power (TDP / max power; a K80's 300 W board halved per GK210;
# the 75 W P4 and the 72 W L4 are the cards' maximum) and ``nm`` its process node as the architecture
# whitepapers name it (TSMC 28 nm Kepler/Maxwell, 16FF Pascal, 12FFN Volta/Turing, N7 A100, Samsung 8N
# GA102, TSMC 4N (a 5 nm-class node, counted as 5) Ada/Hopper, 4NP Blackwell).
_SPECS = [
    # K80 is two GK210s on one board; one GK210 is one CUDA device: 4.37 TFLOP/s boost, 240 GB/s, 12 GB
    # (NVIDIA Tesla K80 datasheet: 8.73 TFLOP/s, 480 GB/s, 24 GB per board). No fast fp16.
    _gpu("k80", 4.37, 240, 12, 13, f"{_REF}; Tesla K80 datasheet (per GK210)", aliases=("tesla k80",),
         architecture="kepler", tdp=150, nm=28),
    # Older GPUs of the seed papers (vendor datasheets; boost-clock peaks as above):
    # Tesla K40: 4.29 TFLOP/s fp32 (with GPU Boost), 288 GB/s GDDR5, 12 GB, 15 SMX, PCIe Gen3 x16
    _gpu("k40", 4.29, 288, 12, 15, "Tesla K40 GPU accelerator board specification / datasheet",
         aliases=("tesla k40", "tesla k40c", "tesla k40m"), architecture="kepler", tdp=235, nm=28),
    # GeForce GTX Titan X (Maxwell GM200): 3072 CUDA cores at 1075 MHz boost = 6.6 TFLOP/s fp32 (6.1 at
    # the 1000 MHz base clock), 336.5 GB/s GDDR5, 12 GB, 24 SMs, PCIe Gen3 x16 (GeForce GTX Titan X specs)
    _gpu("titanx-maxwell", 6.6, 336.5, 12, 24, "NVIDIA GeForce GTX TITAN X (Maxwell) specifications",
         aliases=("geforce gtx titan x", "gtx titan x", "titan x maxwell"), architecture="maxwell", tdp=250,
         nm=28),
    # P100 PCIe 16 GB: 9.3 fp32, 18.7 fp16, 732 GB/s, 56 SMs, PCIe Gen3 x16 (Tesla P100 PCIe datasheet)
    _gpu("p100-pcie", 9.3, 732, 16, 56, "Tesla P100 PCIe datasheet (16 GB)", fp16=18.7,
         aliases=("p100-pcie-16gb", "tesla p100-pcie-16gb"), architecture="pascal", tdp=250, nm=16),
    # V100 PCIe 16 GB: 14 fp32, 112 fp16 tensor, 900 GB/s, 80 SMs, PCIe Gen3 x16 (Tesla V100 datasheet, PCIe)
    _gpu("v100-pcie", 14, 900, 16, 80, "Tesla V100 datasheet (PCIe)", fp16=112,
         aliases=("v100-pcie-16gb", "tesla v100-pcie-16gb"), architecture="volta", tdp=250, nm=12),
    # P100 SXM2: 10.6 fp32, 21.2 fp16 (no tensor cores), 732 GB/s, 16 GB; 56 SMs (P100 whitepaper)
    _gpu("p100", 10.6, 732, 16, 56, f"{_REF}; Tesla P100 datasheet (SXM2)", fp16=21.2,
         aliases=("p100-sxm2", "tesla p100"), architecture="pascal", tdp=300, nm=16),
    # V100 SXM2: 15.7 fp32, 125 fp16 tensor, 900 GB/s, 16/32 GB, 80 SMs (V100 datasheet)
    _gpu("v100-16gb", 15.7, 900, 16, 80, f"{_REF}; Tesla V100 SXM2 datasheet", fp16=125,
         aliases=("v100", "v100-sxm2-16gb"), architecture="volta", tdp=300, nm=12),
    _gpu("v100-32gb", 15.7, 900, 32, 80, f"{_REF}; Tesla V100 SXM2 datasheet", fp16=125,
         aliases=("v100-sxm2-32gb",), architecture="volta", tdp=300, nm=12),
    # A100 SXM4: 19.5 fp32, 156 tf32, 312 fp16/bf16; 40 GB at 1555 GB/s, 80 GB at 2039 GB/s; 108 SMs
    _gpu("a100-40gb", 19.5, 1555, 40, 108, f"{_REF}; A100 datasheet (SXM4 40GB)", tf32=156, fp16=312,
         bf16=312, aliases=("a100", "a100-sxm4-40gb"), architecture="ampere", tdp=400, nm=7),
    _gpu("a100-80gb", 19.5, 2039, 80, 108, f"{_REF}; A100 datasheet (SXM4 80GB)", tf32=156, fp16=312,
         bf16=312, aliases=("a100-sxm4-80gb",), architecture="ampere", tdp=400, nm=7),
    # H100 SXM5: 67 fp32, 495 tf32 (989 with sparsity), 990 fp16/bf16 dense, 1979 fp8 dense (3958 with
    # sparsity), 3.35 TB/s, 80 GB, 132 SMs
    _gpu("h100-sxm", 67, 3350, 80, 132, f"{_REF}; H100 datasheet (SXM5)", tf32=495, fp16=990, bf16=990,
         fp8=1979, aliases=("h100", "h100-sxm5", "h100-80gb"), architecture="hopper", tdp=700, nm=5),
    # H100 PCIe: 51 fp32, 378 tf32, 756 fp16/bf16, 1513 fp8 dense, 2.0 TB/s, 80 GB, 114 SMs (H100 datasheet)
    _gpu("h100-pcie", 51, 2000, 80, 114, "H100 datasheet (PCIe)", tf32=378, fp16=756, bf16=756, fp8=1513,
         architecture="hopper", tdp=350, nm=5),
    # H200 SXM: H100's compute (fp8 1979 dense) with 141 GB HBM3e at 4.8 TB/s (H200 datasheet)
    _gpu("h200", 67, 4800, 141, 132, "H200 datasheet (SXM)", tf32=495, fp16=990, bf16=990,
         fp8=1979, aliases=("h200-sxm",), architecture="hopper", tdp=700, nm=5),
    # RTX 4090: 82.6 fp32; tensor with fp32 accumulate 82.6 tf32, 165.2 fp16/bf16 (Ada whitepaper,
    # Appendix A); 1008 GB/s GDDR6X, 24 GB, 128 SMs
    _gpu("rtx4090", 82.6, 1008, 24, 128, "NVIDIA Ada GPU architecture whitepaper, RTX 4090", tf32=82.6,
         fp16=165.2, bf16=165.2, aliases=("geforce rtx 4090", "4090"), architecture="ada", tdp=450, nm=5),
    # RTX 3090: 35.6 fp32; tensor with fp32 accumulate 35.6 tf32, 71 fp16/bf16 (Ampere GA102 whitepaper);
    # 936 GB/s GDDR6X, 24 GB, 82 SMs
    _gpu("rtx3090", 35.6, 936, 24, 82, "NVIDIA Ampere GA102 whitepaper, RTX 3090", tf32=35.6, fp16=71,
         bf16=71, aliases=("geforce rtx 3090", "3090"), architecture="ampere", tdp=350, nm=8),
    # T4: 8.1 fp32, 65 fp16 tensor (mixed), 320 GB/s, 16 GB, 40 SMs (T4 datasheet); no tf32/bf16 (Turing)
    _gpu("t4", 8.1, 320, 16, 40, "Tesla T4 datasheet", fp16=65, aliases=("tesla t4",),
         architecture="turing", tdp=70, nm=12),
    # The boards of the public kernel measurements (`trainsim.sim.compute.kernels`) and the presets users ask
    # for. Dense peaks (the datasheets' sparsity figures halved):
    # A100 PCIe 40 GB: 19.5 fp32, 156 tf32, 312 fp16/bf16, 1555 GB/s, 108 SMs, 250 W (A100 datasheet, PCIe)
    _gpu("a100-pcie-40gb", 19.5, 1555, 40, 108, "A100 datasheet (PCIe 40GB)", tf32=156, fp16=312, bf16=312,
         aliases=("a100-pcie", "nvidia a100-pcie-40gb"), architecture="ampere", tdp=250, nm=7),
    # A100 PCIe 80 GB: as above with 1935 GB/s HBM2e, 300 W (A100 datasheet, 80GB PCIe)
    _gpu("a100-pcie-80gb", 19.5, 1935, 80, 108, "A100 datasheet (80GB PCIe)", tf32=156, fp16=312, bf16=312,
         aliases=("nvidia a100 80gb pcie",), architecture="ampere", tdp=300, nm=7),
    # V100 PCIe 32 GB: the 16 GB board's figures with 32 GB (Tesla V100 datasheet, PCIe)
    _gpu("v100-pcie-32gb", 14, 900, 32, 80, "Tesla V100 datasheet (PCIe 32GB)", fp16=112,
         aliases=("tesla v100-pcie-32gb",), architecture="volta", tdp=250, nm=12),
    # Tesla P4: 5.5 fp32 at boost, 192 GB/s GDDR5, 8 GB, 2560 CUDA cores = 20 SMs, 50/75 W (Tesla P4
    # datasheet); GP104 has no fast fp16
    _gpu("p4", 5.5, 192, 8, 20, "Tesla P4 datasheet", aliases=("tesla p4",), architecture="pascal", tdp=75,
         nm=16),
    # L4: 30.3 fp32; 120 tf32, 242 fp16/bf16, 485 fp8 with sparsity (60 / 121 / 242.5 dense); 300 GB/s
    # GDDR6, 24 GB, 72 W (L4 datasheet); 58 SMs (7424 CUDA cores / 128)
    _gpu("l4", 30.3, 300, 24, 58, "NVIDIA L4 datasheet", tf32=60, fp16=121, bf16=121, fp8=242.5,
         aliases=("nvidia l4",), architecture="ada", tdp=72, nm=5),
    # L40S: 91.6 fp32; 183 tf32, 362.05 fp16/bf16, 733 fp8 dense (366 / 733 / 1466 with sparsity); 864 GB/s
    # GDDR6, 48 GB, 350 W (L40S datasheet); 142 SMs (18176 CUDA cores / 128)
    _gpu("l40s", 91.6, 864, 48, 142, "NVIDIA L40S datasheet", tf32=183, fp16=362.05, bf16=362.05, fp8=733,
         aliases=("nvidia l40s",), architecture="ada", tdp=350, nm=5),
    # B200 (HGX B200, 1000 W): 75 fp32; 2.2 PF tf32, 4.5 PF fp16/bf16, 9 PF fp8 with sparsity (1.1 / 2.25 /
    # 4.5 PF dense); 180 GB HBM3e at 7.7 TB/s (NVIDIA HGX B200 / GB200 NVL72 specifications, per GPU);
    # 148 SMs (not in NVIDIA's tables: third-party spec databases)
    _gpu("b200", 75, 7700, 180, 148, "NVIDIA HGX B200 specifications (per GPU); SM count third-party",
         tf32=1100, fp16=2250, bf16=2250, fp8=4500, aliases=("nvidia b200", "b200-sxm"),
         architecture="blackwell", tdp=1000, nm=5),
]


def _knl_7250() -> DeviceSpec:
    """Intel Xeon Phi 7250 (Knights Landing), self-hosted: a CPU that is itself the compute device.

    68 cores at 1.4 GHz, each with two AVX-512 VPUs (2 x 16 fp32 lanes x 2 for FMA = 64 fp32 FLOP/cycle):
    68 x 1.4e9 x 64 = 6.09 TFLOP/s fp32 (3.05 fp64, the 3 TFLOP/s usually quoted; NERSC's KNL partition
    peak, 29.1 PFLOP/s over 9,688 nodes, is 3.0 fp64 per node). Memory: the 16 GB of on-package MCDRAM in
    flat mode at ~450 GB/s (NERSC's figure for Cori; STREAM triad reaches ~450-490), holding weights,
    activations and the batch; the 96 GB of DDR4 (6 channels DDR4-2400, ~90 GB/s) is the topology's host
    memory (`topologies/knl-7250-node.yaml`). ``kind="cpu"``: the rank is a CPU, so its batch needs no
    host-to-device copy and its cores drive point-to-point copies (`Machine.rank_transfer`), as for a
    calibrated CPU rank; the roofline runs on the chip's own peak and MCDRAM bandwidth.
    """
    return DeviceSpec(name="knl-7250", kind="cpu", peak_flops={"fp32": 68 * 1.4e9 * 64},
                      memory_bandwidth=450 * GIGA, memory_bytes=16 * GIB, sm_count=68,
                      source="NERSC Cori configuration and KNL getting-started pages (68 cores, 1.4 GHz, "
                             "16 GB MCDRAM ~450 GB/s, 96 GB DDR4); AVX-512 2 VPUs/core, 64 fp32 FLOP/cycle",
                      aliases=("knl", "xeon phi 7250", "intel xeon phi 7250"))


_SPECS.append(_knl_7250())

DEVICES: dict[str, DeviceSpec] = {spec.name: spec for spec in _SPECS}
_ALIASES = {alias.lower(): spec.name for spec in _SPECS for alias in (spec.name, *spec.aliases)}


# Compute capability of the NVIDIA GPUs the device library knows, by spec name prefix (CUDA GPUs list,
# developer.nvidia.com/cuda-gpus): NCCL's tuning tables and PyTorch's cuBLAS workspace size depend on it.
COMPUTE_CAPABILITY = (("gh200", 90), ("h200", 90), ("h100", 90), ("h800", 90), ("a100", 80), ("a800", 80),
                      ("a10", 86), ("a40", 86), ("rtx 30", 86), ("rtx30", 86), ("l4", 89), ("l40", 89),
                      ("rtx 40", 89), ("rtx40", 89), ("v100", 70), ("t4", 75), ("p100", 60))


def compute_capability(spec: str | None) -> int | None:
    """SM version of a GPU spec name (e.g. "A100" -> 80), None where it is not a known NVIDIA GPU."""
    text = (spec or "").strip().lower()
    for prefix, cc in COMPUTE_CAPABILITY:
        if text.startswith(prefix):
            return cc
    return None


def list_devices() -> list[str]:
    """Canonical names of the built-in device specs."""
    return list(DEVICES)


def get_device(name: str | DeviceSpec) -> DeviceSpec:
    """A built-in spec by name or alias, case-insensitive (a ``DeviceSpec`` passes through)."""
    if isinstance(name, DeviceSpec):
        return name
    key = str(name).strip().lower()
    if key in _ALIASES:
        return DEVICES[_ALIASES[key]]
    raise unknown_name("device", str(name), DEVICES, field="device")


def match_cuda_name(cuda_name: str, memory_bytes: int | None = None) -> DeviceSpec | None:
    """The built-in spec for a name as ``torch.cuda.get_device_name`` reports it, or None.

    E.g. "NVIDIA A100-SXM4-80GB" -> a100-80gb, "Tesla V100-SXM2-16GB" -> v100-16gb. When the name does not
    say the memory size, ``memory_bytes`` (total device memory) picks the variant.
    """
    text = cuda_name.lower()
    pcie = "pcie" in text
    # "GeForce GTX TITAN X" is the Maxwell card; the later "TITAN X (Pascal)" and "TITAN Xp" are not
    if "gtx titan x" in text and "pascal" not in text and "xp" not in text.split():
        return DEVICES["titanx-maxwell"]
    families = [("h200", ["h200"]), ("h100", ["h100-pcie"] if pcie else ["h100-sxm"]),
                ("a100", ["a100-40gb", "a100-80gb"]),
                ("v100", ["v100-pcie"] if pcie else ["v100-16gb", "v100-32gb"]),
                ("p100", ["p100-pcie"] if pcie else ["p100"]), ("k80", ["k80"]), ("k40", ["k40"]),
                ("4090", ["rtx4090"]), ("3090", ["rtx3090"]), ("t4", ["t4"])]
    for token, candidates in families:
        if token == "t4" and not any(word == "t4" for word in text.replace("-", " ").split()):
            continue
        if token in text:
            if len(candidates) == 1:
                return DEVICES[candidates[0]]
            for candidate in candidates:
                if candidate.split("-")[-1] in text:
                    return DEVICES[candidate]
            if memory_bytes is not None:
                # nearest capacity (the driver reports a little less than the nominal size)
                return min((DEVICES[c] for c in candidates), key=lambda s: abs(s.memory_bytes - memory_bytes))
            return DEVICES[candidates[0]]
    return None


def check_topology_devices(topology) -> None:
    """Every GPU node of ``topology`` names a device this library knows (`trainsim device list`), ``cpu`` (a
    calibrated CPU rank, whose spec the bundle carries), or a GPU whose memory the topology schema knows;
    else one line naming the topology file and the node's field, with the valid names."""
    from trainsim.topologies.schema import DEFAULT_GPU_MEMORY_GIB

    for i, node in enumerate(topology.spec.nodes):
        if node.kind != "gpu" or node.spec.lower() == "cpu" or node.spec.upper() in DEFAULT_GPU_MEMORY_GIB:
            continue
        try:
            get_device(node.spec)
        except TrainsimError:
            raise unknown_name("GPU spec", node.spec, [*list_devices(), "cpu"], file=topology.source,
                               field=f"nodes[{i}].spec") from None
