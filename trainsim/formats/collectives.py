"""What a trace says about each collective: its kind, message size, element type and process group.

Three places in a PyTorch profiler (Kineto) trace can say it, trusted in this order:

1. **The kernel's own args** (PyTorch >= 2.1 copies them from the launching call): ``Collective name``,
   ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name`` and
   ``Process Group Ranks``.
2. **The launching call**, the CPU events around the runtime call that launched the kernel:
   ``record_param_comms`` with the same args; the ``c10d::`` op (``c10d::allreduce_``,
   ``c10d::_allgather_base_``, ...) whose name is the collective and whose recorded shapes give the output
   and input of the ``_base`` forms; the backend's annotation (``nccl:all_reduce``, ``nccl:all_to_all``,
   ``nccl:_all_gather_base``, ...) whose name is the collective and whose ``Input Dims`` / ``Input type``
   give the input message and its element type.
3. **The kernel's name** (``ncclKernel_AllReduce_...``, ``ncclDevKernel_SendRecv(...)``), the fallback: NCCL
   runs collectives of several kinds in one kernel, so an all-reduce or an all-to-all may run in a kernel
   named ``SendRecv`` (traces of NCCL 2.12 and later), and the element type in a name (``_int8_t``) is the
   kernel's, not the message's.

`merge` combines them field by field, innermost call first, and records where the kind, the size and the
group came from (`Collective.kind_from`, ``size_from``, ``group_from``), so that a replay can say which
collectives it had to guess.

It stays one module: the vocabularies of the three sources and the rule that merges them change together.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace

# Bytes per element of the dtypes NCCL kernels and c10d ops name in their args (lower case): Kineto's
# ("Float", "Half", "BFloat16", ...) and those of recorded shapes ("float", "c10::Half", "long int", ...).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "short int": 2, "unsigned char": 1, "signed char": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "unsigned int": 4, "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}

# Collective names (lower case, separators removed) as Kineto args, c10d ops and backend annotations spell
# them -> the names of trainsim.sim.collectives.ops. A barrier is a one-element all-reduce under NCCL.
COLLECTIVE_NAMES = {
    "allreduce": "allreduce", "allreducecoalesced": "allreduce", "barrier": "allreduce",
    "broadcast": "broadcast", "reduce": "reduce",
    "allgather": "allgather", "allgatherbase": "allgather", "allgatherintotensorcoalesced": "allgather",
    "allgathercoalesced": "allgather", "allgatherintotensor": "allgather",
    "reducescatter": "reduce_scatter", "reducescatterbase": "reduce_scatter",
    "reducescattertensorcoalesced": "reduce_scatter", "reducescattertensor": "reduce_scatter",
    "alltoall": "alltoall", "alltoallbase": "alltoall", "alltoallv": "alltoall",
    "sendrecv": "sendrecv", "send": "sendrecv", "recv": "sendrecv", "recvanysource": "sendrecv",
}
# c10d ops whose first two tensors are (output, input): their shapes give both message sizes.
_OUTPUT_INPUT = {"allgatherbase", "reducescatterbase", "alltoallbase"}
_BACKENDS = ("nccl:", "gloo:", "ucc:", "mpi:", "xccl:")
_NCCL_KERNEL_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")


@dataclass(frozen=True, slots=True)
class Collective:
    """What a collective's kernel and its launching call say about it (see the module doc)."""

    op: str                        # "allreduce", "broadcast", ... (lower case, no separators)
    nelems: int | None = None      # input message elements, None when the trace does not carry them
    dtype: str | None = None
    group_size: int | None = None
    group: str | None = None       # process group name
    ranks: tuple[int, ...] | None = None
    out_nelems: int | None = None  # output message elements (all-gather: the whole gathered array)
    channels: int | None = None    # the kernel's blocks (grid x): NCCL runs one block per channel
    threads: int | None = None     # threads per block (block x): tells the protocol (nccl_split)
    # where the kind, the size and the group came from: "kernel" (its args), "call" (the launching call's
    # args, name or recorded shapes), "kernel name" (the kind only); None: the trace does not say
    kind_from: str = field(default="kernel", compare=False)
    size_from: str | None = field(default=None, compare=False)
    group_from: str | None = field(default=None, compare=False)
    kernel_op: str | None = field(default=None, compare=False)   # what the kernel's name says it runs

    @property
    def element_bytes(self) -> int | None:
        return DTYPE_BYTES.get((self.dtype or "").lower())

    @property
    def nbytes(self) -> int | None:
        """Input message size in bytes, None when unknown."""
        if self.nelems is None or self.element_bytes is None:
            return None
        return self.nelems * self.element_bytes

    @property
    def array_bytes(self) -> int | None:
        """S in nccl-tests terms, the whole array: the output for all-gather, the input otherwise."""
        if self.op.startswith("allgather") and self.out_nelems is not None and self.element_bytes is not None:
            return self.out_nelems * self.element_bytes
        return self.nbytes

    @property
    def guessed(self) -> bool:
        """Whether the kind came from the kernel's name only, or the size is unknown."""
        return self.kind_from == "kernel name" or self.nbytes is None


def normalise(name: str) -> str:
    """A collective's name in one spelling: lower case, no separators (``all_reduce`` -> ``allreduce``)."""
    return str(name).lower().replace("_", "").replace("-", "")


def _as_int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _parse_ranks(value) -> tuple[int, ...] | None:
    if isinstance(value, list):
        items = value
    elif isinstance(value, str):
        try:
            items = json.loads(value)
        except (json.JSONDecodeError, RecursionError):  # not a list of ranks (nested past the decoder too)
            return None
    else:
        return None
    if not isinstance(items, list):
        return None
    ranks = tuple(r for r in (_as_int(x) for x in items) if r is not None)
    return ranks or None


def _first_dim(value) -> int | None:
    """x of a kernel's ``grid`` or ``block`` arg ([x, y, z]); None when absent or not positive."""
    if isinstance(value, list | tuple) and value:
        x = _as_int(value[0])
        return x if x is not None and x > 0 else None
    return None


def kernel_name_op(kernel_name: str) -> str | None:
    """The collective an NCCL kernel's name says it runs (normalised), None for other kernels."""
    match = _NCCL_KERNEL_RE.match(kernel_name)
    return normalise(match.group(1)) if match else None


def collective_from_args(args: dict, kernel_name: str = "", *, source: str = "kernel") -> Collective | None:
    """The collective an NCCL kernel (or a call, ``source="call"``) describes by its args, else by the
    kernel's name."""
    op = args.get("Collective name")
    name_op = kernel_name_op(kernel_name) if kernel_name else None
    kind_from = source
    if not op:
        if name_op is None:
            return None
        op, kind_from = name_op, "kernel name"
    nelems = _as_int(args.get("In msg nelems"))
    out_nelems = _as_int(args.get("Out msg nelems"))
    nelems = nelems if nelems is not None and nelems >= 0 else None
    group_size = _as_int(args.get("Group size"))
    ranks = _parse_ranks(args.get("Process Group Ranks"))
    return Collective(
        op=normalise(op), nelems=nelems,
        dtype=str(args["dtype"]) if args.get("dtype") is not None else None,
        group_size=group_size,
        group=str(args["Process Group Name"]) if args.get("Process Group Name") is not None else None,
        ranks=ranks,
        out_nelems=out_nelems if out_nelems is not None and out_nelems >= 0 else None,
        channels=_first_dim(args.get("grid")), threads=_first_dim(args.get("block")),
        kind_from=kind_from, size_from=source if nelems is not None else None,
        group_from=source if (group_size is not None or ranks) else None, kernel_op=name_op)


def _tensors(args: dict) -> list[tuple[int, str]]:
    """(elements, dtype) of each tensor among a call's recorded inputs (``Input Dims``, ``Input type``):
    entries whose type is an element type; lists, scalars and absent arguments are left out."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return []
    out = []
    for shape, dtype in zip(dims, types, strict=False):
        if not isinstance(dtype, str) or dtype.lower() not in DTYPE_BYTES or not isinstance(shape, list):
            continue
        sizes = [_as_int(d) for d in shape]
        if any(s is None or s < 0 for s in sizes):
            continue
        out.append((math.prod(sizes), dtype))
    return out


def call_collective(name: str, args: dict) -> Collective | None:
    """The collective a CPU event describes: by its args (``record_param_comms`` and newer c10d ops), or
    by its name (``c10d::allreduce_``, ``nccl:all_reduce``) with sizes from its recorded shapes; None for
    other events."""
    if "Collective name" in args:
        return collective_from_args(args, source="call")
    if name.startswith("c10d::"):
        op = normalise(name[len("c10d::"):].rstrip("_"))
    elif name.startswith(_BACKENDS):
        op = normalise(name.split(":", 1)[1].split()[0] if name.split(":", 1)[1].split() else "")
    else:
        return None
    if op not in COLLECTIVE_NAMES:
        return None
    tensors = _tensors(args)
    nelems = out_nelems = dtype = group_size = None
    if name.startswith("c10d::") and op in _OUTPUT_INPUT:
        if len(tensors) >= 2:
            (out_nelems, dtype), (nelems, _) = tensors[0], tensors[1]
            small, big = sorted((nelems, out_nelems))
            if op != "alltoallbase" and small > 0 and big % small == 0 and big // small > 1:
                group_size = big // small        # the gathered (scattered) array is one input per rank
    elif tensors:
        nelems, dtype = sum(n for n, _ in tensors), tensors[0][1]
    return Collective(op=op, nelems=nelems, dtype=dtype, group_size=group_size, out_nelems=out_nelems,
                      kind_from="call", size_from="call" if nelems is not None else None,
                      group_from="call" if group_size is not None else None)


def merge(kernel: Collective | None, calls: list[Collective] | tuple[Collective, ...]) -> Collective | None:
    """One collective from what the kernel says and what its launching calls say (innermost first): the
    kind from the kernel's args, else the calls, else the kernel's name; each other field from the first
    source that has it (the kernel's args, then the calls); the grid and block from the kernel."""
    if not calls:
        return kernel
    by_args = kernel is not None and kernel.kind_from == "kernel"
    sources = [kernel] if by_args else []
    sources += [*calls, *([kernel] if kernel is not None and not by_args else [])]
    first = sources[0]

    def pick(attr: str):
        return next((getattr(c, attr) for c in sources if getattr(c, attr) is not None), None)

    def pick_with_source(attr: str, source_attr: str):
        for c in sources:
            if getattr(c, attr) is not None:
                return getattr(c, attr), getattr(c, source_attr)
        return None, None

    nelems, size_from = pick_with_source("nelems", "size_from")
    dtype = next((c.dtype for c in sources if c.nelems is not None and c.dtype is not None), pick("dtype"))
    group_size, group_from = pick_with_source("group_size", "group_from")
    ranks = pick("ranks")
    if group_from is None and ranks:
        group_from = next(c.group_from for c in sources if c.ranks)
    out = Collective(
        op=first.op, nelems=nelems, dtype=dtype, group_size=group_size, group=pick("group"), ranks=ranks,
        out_nelems=pick("out_nelems"), kind_from=first.kind_from, size_from=size_from, group_from=group_from,
        kernel_op=kernel.kernel_op if kernel is not None else None)
    if kernel is not None:
        out = replace(out, channels=kernel.channels, threads=kernel.threads)
    return out
