"""Read and write MLCommons Chakra execution traces (ET): the protobuf files ASTRA-sim and Chakra's tools use.

A Chakra ET file holds one rank's workload as a stream of protobuf messages, each preceded by its length as
a base-128 varint: a ``GlobalMetadata`` (its ``version`` names the schema: ``0.0.4``), then the ``Node``s
(Chakra's ``protolib.encodeMessage`` / ``decodeMessage``; a length of 0 ends the stream). Files may be
gzip-compressed. A run is one file per rank, ``<prefix>.<rank>.et``.

The schema is MLCommons' ``et_def.proto``, vendored unchanged with its MIT licence in ``third_party/chakra``.
Its message classes are built when first needed from that file with ``protobuf``'s descriptor pool: a
reader of the few constructs it uses (messages with scalar, enum, message and repeated fields, one
``oneof``, enums) fills a ``FileDescriptorProto``. Nothing is generated at install.

A node's attributes (``AttributeProto``, by name) carry what ASTRA-sim reads: ``is_cpu_op`` (bool),
``num_ops`` (int64), ``tensor_size`` (uint64), ``comm_type`` (int64, a ``CollectiveCommType``), ``comm_size``
(int64 bytes), ``comm_src`` / ``comm_dst`` / ``comm_tag`` / ``comm_priority`` (int32), ``pg_name`` (string).
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from trainsim.errors import TrainsimError
from trainsim.formats.collectives import Collective

SCHEMA_VERSION = "0.0.4"
_VERSION_RE = re.compile(r"(?:^|chakra\.)(\d+\.\d+\.\d+)$")
_SCALARS = {"double": 1, "float": 2, "int64": 3, "uint64": 4, "int32": 5, "fixed64": 6, "fixed32": 7,
            "bool": 8, "string": 9, "bytes": 12, "uint32": 13, "sfixed32": 15, "sfixed64": 16, "sint32": 17,
            "sint64": 18}                                   # FieldDescriptorProto.Type numbers
_TYPE_MESSAGE, _TYPE_ENUM = 11, 14
_LABEL_OPTIONAL, _LABEL_REPEATED = 1, 3
MAX_MESSAGE = 1 << 30           # a length prefix larger than this is not a Chakra message


@dataclass
class Schema:
    """The message classes and enums of ``et_def.proto``."""

    GlobalMetadata: type
    Node: type
    AttributeProto: type
    node_types: dict[str, int] = field(default_factory=dict)          # NodeType name -> number
    comm_types: dict[str, int] = field(default_factory=dict)          # CollectiveCommType name -> number


def _proto_text() -> str:
    return (resources.files("trainsim.third_party.chakra") / "et_def.proto").read_text(encoding="utf-8")


def _parse_proto(text: str):
    """A FileDescriptorProto of the proto3 file ``text`` (the constructs et_def.proto uses)."""
    from google.protobuf import descriptor_pb2

    text = re.sub(r"//[^\n]*", "", text)
    tokens = re.findall(r"[A-Za-z_][\w.]*|\d+|[{}=;]|\"[^\"]*\"", text)
    fdp = descriptor_pb2.FileDescriptorProto(name="et_def.proto", syntax="proto3")
    enums = {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == "enum"}
    i = 0

    def expect(tok: str) -> None:
        nonlocal i
        if tokens[i] != tok:
            raise ValueError(f"expected {tok!r} at {tokens[i]!r}")
        i += 1

    while i < len(tokens):
        tok = tokens[i]
        if tok in ("syntax", "package"):
            if tok == "package":
                fdp.package = tokens[i + 1]
            i = tokens.index(";", i) + 1
        elif tok == "enum":
            enum = fdp.enum_type.add(name=tokens[i + 1])
            i += 2
            expect("{")
            while tokens[i] != "}":
                enum.value.add(name=tokens[i], number=int(tokens[i + 2]))
                i += 4
            i += 1
        elif tok == "message":
            msg = fdp.message_type.add(name=tokens[i + 1])
            i += 2
            expect("{")
            oneof = None
            while True:
                if tokens[i] == "}":
                    i += 1
                    if oneof is None:
                        break
                    oneof = None
                    continue
                if tokens[i] == "oneof":
                    msg.oneof_decl.add(name=tokens[i + 1])
                    oneof = len(msg.oneof_decl) - 1
                    i += 3
                    continue
                label = _LABEL_OPTIONAL
                if tokens[i] == "repeated":
                    label, i = _LABEL_REPEATED, i + 1
                kind, name, number = tokens[i], tokens[i + 1], int(tokens[i + 3])
                f = msg.field.add(name=name, number=number, label=label)
                if kind in _SCALARS:
                    f.type = _SCALARS[kind]
                else:
                    f.type = _TYPE_ENUM if kind in enums else _TYPE_MESSAGE
                    f.type_name = f".{fdp.package}.{kind}"
                if oneof is not None:
                    f.oneof_index = oneof
                i += 5
        else:
            raise ValueError(f"unexpected {tok!r}")
    return fdp


@cache
def schema() -> Schema:
    """The classes of the vendored ``et_def.proto``, built once."""
    try:
        from google.protobuf import descriptor_pool, message_factory
    except ImportError:
        raise TrainsimError("Chakra execution traces need the protobuf package: "
                            "pip install protobuf") from None
    fdp = _parse_proto(_proto_text())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)

    def cls(name: str):
        desc = pool.FindMessageTypeByName(f"{fdp.package}.{name}")
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(desc)
        return message_factory.MessageFactory(pool).GetPrototype(desc)     # protobuf < 4.21

    enums = {e.name: {v.name: v.number for v in e.value} for e in fdp.enum_type}
    return Schema(cls("GlobalMetadata"), cls("Node"), cls("AttributeProto"),
                  enums["NodeType"], enums["CollectiveCommType"])


# ---------------------------------------------------------------- attributes

def attr_value(attr):
    """The value an AttributeProto holds (a list for the ``*_list`` kinds), None when it holds none."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    value = getattr(attr, which)
    return list(value.values) if which.endswith("_list") else value


def attrs(message) -> dict:
    """A node's or metadata's attributes by name."""
    return {a.name: attr_value(a) for a in message.attr}


def add_attr(message, name: str, value, kind: str | None = None) -> None:
    """Append attribute ``name``: ``kind`` is the AttributeProto field (``int64_val``, ...); by default
    bool, int64, double or string from the Python type."""
    if kind is None:
        kind = ("bool_val" if isinstance(value, bool) else "int64_val" if isinstance(value, int)
                else "double_val" if isinstance(value, float) else "string_val")
    a = message.attr.add(name=name)
    if kind.endswith("_list"):
        getattr(a, kind).values.extend(value)
    else:
        setattr(a, kind, value)


@dataclass
class EtNode:
    """A node of an ET from anywhere, in the terms `graph_from_nodes` needs (times in seconds)."""

    id: int
    name: str
    cpu: bool
    dur: float
    start: float | None = None                   # None: the ET has no times
    deps: list[int] = field(default_factory=list)
    thread: tuple = (0, 0)                       # (pid, tid) of a CPU node
    device: int = 0                              # of a GPU node
    stream: int | None = None                    # of a GPU node; None: by its kind
    kind: str = "kernel"                         # of a GPU node: kernel | collective | memcpy | memset
    collective: Collective | None = None
    nbytes: int | None = None
    copy_kind: str | None = None
    correlation: int | None = None



# ---------------------------------------------------------------- files

@dataclass
class ChakraFile:
    """One rank's ET: its metadata and nodes (protobuf messages)."""

    path: str
    metadata: object
    nodes: list

    @property
    def version(self) -> str:
        return self.metadata.version


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise EOFError
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise ValueError("a length prefix longer than a varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(0x80 | bits)
        else:
            out.append(bits)
            return bytes(out)


def _raw(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TrainsimError("no such file", file=str(path)) from None
    except IsADirectoryError:
        raise TrainsimError("is a directory, not a Chakra execution trace", file=str(path)) from None
    except OSError as exc:
        raise TrainsimError(f"cannot read the file ({exc.strerror or exc})", file=str(path)) from None
    if data[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            raise TrainsimError(f"truncated or corrupt gzip file ({exc})", file=str(path)) from None
    return data


def read_et(path: str | Path) -> ChakraFile:
    """One Chakra ET file. Errors name the file: not protobuf, truncated, another schema version."""
    from google.protobuf.message import DecodeError

    path = Path(path)
    name = str(path)
    data = _raw(path)
    s = schema()
    messages: list[bytes] = []
    pos = 0
    while pos < len(data):
        try:
            size, start = _varint(data, pos)
        except (EOFError, ValueError):
            raise TrainsimError(f"not a Chakra execution trace: a damaged length prefix at byte {pos}",
                                file=name) from None
        if size == 0:                      # Chakra's readers stop here too
            break
        if size > MAX_MESSAGE or start + size > len(data):
            raise TrainsimError(f"not a Chakra execution trace (or truncated): message {len(messages)} at "
                                f"byte {pos} claims {size} bytes, {len(data) - start} are left", file=name)
        messages.append(data[start:start + size])
        pos = start + size
    if not messages:
        raise TrainsimError("not a Chakra execution trace: the file holds no message", file=name)
    try:
        meta = s.GlobalMetadata.FromString(messages[0])
        nodes = [s.Node.FromString(m) for m in messages[1:]]
    except DecodeError as exc:
        raise TrainsimError(f"not a Chakra execution trace: its protobuf does not parse ({exc})",
                            file=name) from None
    check_version(meta.version, name)
    return ChakraFile(name, meta, nodes)


def check_version(version: str, file: str) -> None:
    """Refuse a schema version other than the vendored one's (0.0.4)."""
    match = _VERSION_RE.search(version or "")
    if match is None or match.group(1) != SCHEMA_VERSION:
        said = f"version {version!r}" if version else "no schema version (is it a Chakra ET?)"
        raise TrainsimError(f"Chakra execution trace of another schema: {said}; trainsim reads Chakra "
                            f"{SCHEMA_VERSION} (et_def.proto)", file=file, field="GlobalMetadata.version")


def encode_et(metadata, nodes) -> bytes:
    """The bytes of an ET file: each message after its varint length."""
    out = io.BytesIO()
    for m in (metadata, *nodes):
        data = m.SerializeToString()
        out.write(_encode_varint(len(data)))
        out.write(data)
    return out.getvalue()


def is_chakra_file(path: str | Path) -> bool:
    """Whether ``path`` names a Chakra ET by its suffix (``.et``, ``.et.gz``)."""
    return str(path).endswith((".et", ".et.gz"))
