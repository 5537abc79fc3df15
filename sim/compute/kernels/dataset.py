"""Kernel-level measurements as tidy rows: the public NeuSight dataset, and trainsim's own kernel tables.

Each row is one measured op: its kernel class and spec (`specs`: shape, precision, FLOPs, bytes), the GPU
(its name as CUDA reports it and the device spec it maps to), the measured latency in seconds, the kernels
it launched (cuDNN's Winograd transforms around an SGEMM, ...), and where it came from (file and line), so
that every fitted figure can say which rows it rests on.

Two formats:

- **NeuSight** (Lee et al., "Forecasting GPU Performance for Deep Learning Training and Inference", ASPLOS
  2025; MIT licence; the CSVs of its repository's ``scripts/asplos/data/dataset/``, gzipped or not): columns
  ``OPName, Latency, Device, ..., Kernel Name, ..., Kernels`` then the op's dimensions. ``Latency`` is in
  milliseconds (the mean of the 5 fastest of 25 calls, each timed by CUDA events around one eager call on
  an idle GPU). The ops: ``bmm`` (``torch.bmm`` of ``B x M x N`` by ``B x N x K``), ``linear``
  (``nn.Linear(N, K)`` on ``B x M x N``), ``conv`` (``nn.Conv2d``, no bias, square input), elementwise
  ``add mul div pow`` (two ``B x H`` tensors) and ``addu mulu divu powu relu gelu tanh`` (one, and a
  scalar), ``ln`` (``nn.LayerNorm(H)``) and ``softmax`` (over rows of H). All float32, TF32 off.
- **trainsim kernel table** (``trainsim.kernels/1``, what a GPU kernel sweep writes): a CSV whose header
  has ``op``, ``device``, ``dtype``, the op's dimensions and the latency with its unit in the column name
  (``latency_s``, ``latency_ms`` or ``latency_us``); ``kernels`` optional. Ops and their dimensions:
  ``gemm``/``bmm`` (m, n, k, batch), ``linear`` (m, n, k), ``conv`` (batch, in_channels, out_channels,
  height, width, kernel, stride, padding; ``pass`` optional: forward, backward_data or backward_weight),
  ``elementwise``/``layernorm``/``softmax`` (elements, reads, writes, row), ``attention`` (batch, heads,
  q_len, kv_len, head_dim, causal, fused; ``backward`` optional, true for the backward kernels alone). Other
  columns (``gpu``, ``what``, ``timing``, ...) are kept out of the rows.

A file that is not one of them, lacks a column, gives a value that is not a number or names an op or dtype
not known raises one TrainsimError naming the file (and line) and the column.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainsim.errors import TrainsimError, unknown_name

from .specs import CONV_PASSES, DTYPES, Attention, Conv2d, Gemm, Streaming

#: NeuSight's GPUs as CUDA names them -> the device spec each is (trainsim's presets for those boards)
BOARDS = {
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb", "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-40GB": "a100-40gb", "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla P100-PCIE-16GB": "p100-pcie", "Tesla T4": "t4", "Tesla P4": "p4",
    "NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA L4": "l4",
}
#: NeuSight's op names -> kernel class
NEUSIGHT_OPS = {"bmm": "matmul", "linear": "matmul", "conv": "conv", "ln": "layernorm", "softmax": "softmax",
                **{op: "elementwise" for op in ("add", "mul", "div", "pow", "addu", "mulu", "divu", "powu",
                                                 "relu", "gelu", "tanh")}}
BINARY = ("add", "mul", "div", "pow")
NEUSIGHT_COLUMNS = ("OPName", "Latency", "Device", "Kernel Name")
_NEUSIGHT_DIMS = {"bmm": ("B", "M", "N", "K"), "linear": ("B", "M", "N", "K"),
                  "conv": ("B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride",
                           "Padding")}
LATENCY_UNITS = {"latency_s": 1.0, "latency_ms": 1e-3, "latency_us": 1e-6}
TABLE_DIMS = {
    "gemm": ("m", "n", "k", "batch"), "bmm": ("m", "n", "k", "batch"), "linear": ("m", "n", "k"),
    "conv": ("batch", "in_channels", "out_channels", "height", "width", "kernel", "stride", "padding"),
    "elementwise": ("elements", "reads", "writes"), "layernorm": ("elements", "reads", "writes", "row"),
    "softmax": ("elements", "reads", "writes", "row"),
    "attention": ("batch", "heads", "q_len", "kv_len", "head_dim", "causal", "fused"),
}
#: columns an op of a trainsim kernel table may give (their defaults: a forward pass)
OPTIONAL_DIMS = {"conv": ("pass",), "attention": ("backward",)}
#: the kernel class of each op of a trainsim kernel table
TABLE_CLASSES = {"gemm": "matmul", "bmm": "matmul", "linear": "matmul", "conv": "conv",
                 "elementwise": "elementwise", "layernorm": "layernorm", "softmax": "softmax",
                 "attention": "attention"}


@dataclass(frozen=True)
class KernelRow:
    """One measured op."""

    source: str  # file (as given, relative to the dataset root where there is one) and split
    line: int  # line in the file (the header is line 1)
    op: str  # the op as the file names it (bmm, linear, conv, add, ln, ...)
    kernel_class: str  # matmul, conv, elementwise, layernorm, softmax, attention
    gpu: str  # the GPU as CUDA names it
    device: str | None  # the device spec it maps to (`BOARDS`), None where trainsim has none
    spec: Gemm | Conv2d | Attention | Streaming
    latency_s: float
    kernel: str = ""  # the op's main kernel
    kernels: tuple[str, ...] = field(default=(), compare=False)  # every kernel it launched
    split: str = ""  # the dataset's own split (train / test) where it has one

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def flops(self) -> float:
        return self.spec.flops

    @property
    def bytes(self) -> float:
        return self.spec.bytes

    @property
    def winograd(self) -> bool:
        return any("winograd" in k.lower() for k in (self.kernel, *self.kernels))


def _open_text(path: Path):
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return io.StringIO(raw.decode("utf-8"))


def read_rows(path: str | Path, *, shown: str | None = None, split: str = "") -> list[KernelRow]:
    """The rows of one kernel-data file (NeuSight or trainsim format, gzipped or not); ``shown``: how errors
    and rows name it (default: the path as given)."""
    path = Path(path)
    name = shown or str(path)
    try:
        handle = _open_text(path)
    except OSError as exc:
        raise TrainsimError(f"cannot read: {exc.strerror or exc}", file=name) from None
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise TrainsimError(f"not a text CSV ({exc})", file=name) from None
    reader = csv.DictReader(handle)
    header = reader.fieldnames or []
    if all(column in header for column in NEUSIGHT_COLUMNS):
        return list(_neusight(reader, name, split))
    if "op" in header:
        return list(_table(reader, header, name, split))
    raise TrainsimError("not a kernel-data CSV: a NeuSight file has the columns "
                        f"{', '.join(NEUSIGHT_COLUMNS)}; a trainsim kernel table has op, device, dtype, its "
                        f"dimensions and one of {', '.join(LATENCY_UNITS)}", file=name, field="header")


def _number(row: dict, column: str, name: str, line: int, *, whole: bool = True, positive: bool = True):
    text = row.get(column)
    if text is None or text == "":
        raise TrainsimError("missing (required)", file=f"{name}:{line}", field=column)
    try:
        value = float(text)
    except ValueError:
        raise TrainsimError(f"should be a number, got {text!r}", file=f"{name}:{line}",
                            field=column) from None
    if not math.isfinite(value) or (value <= 0 if positive else value < 0):
        raise TrainsimError(f"should be a number {'> 0' if positive else '>= 0'}, got {text!r}",
                            file=f"{name}:{line}", field=column)
    if whole:
        if value != int(value):
            raise TrainsimError(f"should be a whole number, got {text!r}", file=f"{name}:{line}",
                                field=column)
        return int(value)
    return value


def _dtype_of(kernels: Iterable[str]) -> str:
    """The precision kernel names show (NeuSight's are fp32: SGEMM, scudnn, f32f32)."""
    text = " ".join(kernels).lower()
    if "bf16" in text:
        return "bf16"
    if any(tag in text for tag in ("f16f16", "h884", "h1688", "h16816", "fp16", "hgemm")):
        return "fp16"
    if any(tag in text for tag in ("tf32", "s1688", "s16816")):
        return "tf32"
    return "fp32"


def _neusight(reader: csv.DictReader, name: str, split: str) -> Iterator[KernelRow]:
    for line, row in enumerate(reader, start=2):
        op = row["OPName"]
        if op not in NEUSIGHT_OPS:
            raise unknown_name("op", op, NEUSIGHT_OPS, file=f"{name}:{line}", field="OPName")
        latency = _number(row, "Latency", name, line, whole=False) * 1e-3  # milliseconds (module doc)
        kernel = row.get("Kernel Name") or ""
        kernels = tuple(k for k in (row.get("Kernels") or "").split(";") if k)
        kernels = kernels or ((kernel,) if kernel else ())
        dtype = _dtype_of(kernels or (kernel,))
        if op in ("bmm", "linear"):
            b, m, n, k = (_number(row, c, name, line) for c in _NEUSIGHT_DIMS[op])
            spec = (Gemm(m=m, n=k, k=n, batch=b, dtype=dtype) if op == "bmm"
                    else Gemm(m=b * m, n=k, k=n, dtype=dtype, shared_b=True))
        elif op == "conv":
            b, ic, oc, ks, size, stride, pad = (_number(row, c, name, line, positive=c != "Padding")
                                                for c in _NEUSIGHT_DIMS["conv"])
            spec = _checked(Conv2d, name, line, batch=b, in_channels=ic, out_channels=oc, height=size,
                            width=size, kernel=(ks, ks), stride=stride, padding=pad, dtype=dtype)
        else:
            b, h = _number(row, "B", name, line), _number(row, "H", name, line)
            kind = NEUSIGHT_OPS[op]
            spec = Streaming(kind, elements=b * h, reads=2 if op in BINARY else 1, writes=1, dtype=dtype,
                             row=h if kind in ("layernorm", "softmax") else None)
        gpu = row["Device"].strip()
        yield KernelRow(source=name, line=line, op=op, kernel_class=NEUSIGHT_OPS[op], gpu=gpu,
                        device=BOARDS.get(gpu), spec=spec, latency_s=latency, kernel=kernel, kernels=kernels,
                        split=split)


def _checked(make, name, line, *args, **kwargs):
    """``make(*args, **kwargs)``, a bad value named with the file and line."""
    try:
        return make(*args, **kwargs)
    except TrainsimError as exc:
        raise TrainsimError(exc.reason, file=f"{name}:{line}", field=exc.field) from None


def _table(reader: csv.DictReader, header: list[str], name: str, split: str) -> Iterator[KernelRow]:
    units = [column for column in header if column in LATENCY_UNITS]
    if len(units) != 1:
        given = [c for c in header if c.lower().startswith("latency")]
        what = f"got {', '.join(given)}" if given else "none given"
        raise TrainsimError(f"one latency column with its unit is required ({what}); valid choices: "
                            f"{', '.join(LATENCY_UNITS)}", file=name, field="latency")
    scale = LATENCY_UNITS[units[0]]
    for column in ("device", "dtype"):
        if column not in header:
            raise TrainsimError("missing (required)", file=name, field=column)
    for line, row in enumerate(reader, start=2):
        op = row["op"]
        if op not in TABLE_DIMS:
            raise unknown_name("op", op, TABLE_DIMS, file=f"{name}:{line}", field="op")
        dtype = row["dtype"]
        if dtype not in DTYPES:
            raise unknown_name("dtype", dtype, DTYPES, file=f"{name}:{line}", field="dtype")
        for column in TABLE_DIMS[op]:
            if column not in header:
                raise TrainsimError(f"missing (required for {op} rows)", file=name, field=column)
        latency = _number(row, units[0], name, line, whole=False) * scale
        dims = {c: row[c] for c in TABLE_DIMS[op] + OPTIONAL_DIMS.get(op, ()) if c in row}
        spec = _checked(_table_spec, name, line, op, dims, dtype, name, line)
        kernels = tuple(k for k in (row.get("kernels") or "").split(";") if k)
        gpu = row["device"].strip()
        yield KernelRow(source=name, line=line, op=op, kernel_class=TABLE_CLASSES[op], gpu=gpu,
                        device=BOARDS.get(gpu, gpu or None), spec=spec, latency_s=latency,
                        kernel=kernels[0] if kernels else "", kernels=kernels, split=split)


def _table_spec(op, dims, dtype, name, line):
    row = dict(dims)

    def whole(column, positive=True):
        return _number(row, column, name, line, positive=positive)

    def flag(column):
        text = str(row[column]).strip().lower()
        if text not in ("true", "false", "1", "0"):
            raise TrainsimError(f"should be true or false, got {row[column]!r}", file=f"{name}:{line}",
                                field=column)
        return text in ("true", "1")

    if op in ("gemm", "bmm"):
        return Gemm(m=whole("m"), n=whole("n"), k=whole("k"), batch=whole("batch"), dtype=dtype)
    if op == "linear":
        return Gemm(m=whole("m"), n=whole("n"), k=whole("k"), dtype=dtype, shared_b=True)
    if op == "conv":
        size = whole("kernel")
        pass_ = (row.get("pass") or "forward").strip()
        if pass_ not in CONV_PASSES:
            raise unknown_name("convolution pass", pass_, CONV_PASSES, file=f"{name}:{line}", field="pass")
        return Conv2d(batch=whole("batch"), in_channels=whole("in_channels"),
                      out_channels=whole("out_channels"), height=whole("height"), width=whole("width"),
                      kernel=(size, size), stride=whole("stride"), padding=whole("padding", positive=False),
                      dtype=dtype, pass_=pass_)
    if op == "attention":
        return Attention(batch=whole("batch"), heads=whole("heads"), q_len=whole("q_len"),
                         kv_len=whole("kv_len"), head_dim=whole("head_dim"), causal=flag("causal"),
                         fused=flag("fused"), dtype=dtype,
                         backward=flag("backward") if row.get("backward") not in (None, "") else False)
    rows = row.get("row")
    return Streaming(op, elements=whole("elements"), reads=whole("reads", positive=False),
                     writes=whole("writes", positive=False), dtype=dtype,
                     row=whole("row") if rows not in (None, "", "0") else None)


#: the NeuSight files that hold distinct rows (``test/vec`` and ``test/habitat`` repeat elem, ln, softmax)
NEUSIGHT_TRAIN = "train/collect/{op}/p2.1.0/*.csv*"
NEUSIGHT_TEST = ("test/bmm.csv", "test/linear.csv", "test/elem.csv", "test/ln.csv", "test/softmax.csv")
_TRAIN_OPS = ("bmm", "linear", "conv", "add", "mul", "div", "pow", "addu", "mulu", "divu", "powu", "relu",
              "gelu", "tanh", "ln", "softmax")


def neusight_files(root: str | Path) -> list[tuple[Path, str]]:
    """The NeuSight files under ``root`` (the dataset folder: ``train/``, ``test/``), each with its split."""
    root = Path(root)
    if not root.is_dir():
        raise TrainsimError("no such folder (the NeuSight dataset: train/, test/)", file=str(root))
    files = []
    for op in _TRAIN_OPS:
        files += [(p, "train") for p in sorted(root.glob(NEUSIGHT_TRAIN.format(op=op)))]
    for test in NEUSIGHT_TEST:
        files += [(p, "test") for p in sorted(root.glob(test + "*"))[:1]]
    if not files:
        raise TrainsimError("holds no NeuSight CSV (train/collect/<op>/p2.1.0/<GPU>.csv[.gz], "
                            "test/<op>.csv[.gz])", file=str(root))
    return files


def load_neusight(root: str | Path) -> list[KernelRow]:
    """Every distinct row of the NeuSight dataset under ``root``; rows name their file relative to it."""
    root = Path(root)
    rows = []
    for path, split in neusight_files(root):
        rows += read_rows(path, shown=str(path.relative_to(root)), split=split)
    return rows
