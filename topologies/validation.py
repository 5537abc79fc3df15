"""Turning pydantic's validation errors on topology files into one-line TrainsimErrors.

Fields are written the way a user finds them in the file: ``links[3].b``, ``nodes[0].memory_gib``.
"""

from __future__ import annotations

from pydantic import ValidationError

from trainsim.errors import TrainsimError, pydantic_message, unknown_name

from .schema import NODE_KINDS


def field_path(loc: tuple) -> str:
    """``("links", 3, "b")`` -> ``links[3].b``; drops the union tag pydantic puts after a node's index."""
    out = ""
    previous = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(previous, int) and part in NODE_KINDS:
            pass  # pydantic's discriminated-union tag, not a field of the file
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out


def validation_error(exc: ValidationError, *, file: str | None = None) -> TrainsimError:
    """The first error of ``exc`` as a TrainsimError naming the file and field."""
    first = exc.errors()[0]
    loc = tuple(first.get("loc", ()))
    field = field_path(loc) or None
    kind = first.get("type")
    if kind == "union_tag_invalid":
        tag = first.get("ctx", {}).get("tag", "?")
        return unknown_name("node kind", str(tag), NODE_KINDS, file=file, field=f"{field}.kind")
    if kind == "union_tag_not_found":
        return TrainsimError(f"missing kind; valid kinds: {', '.join(NODE_KINDS)}", file=file,
                             field=f"{field}.kind")
    if kind == "extra_forbidden":
        return TrainsimError("unknown field", file=file, field=field)
    return TrainsimError(pydantic_message(first), file=file, field=field)


def check_pcie_trees(spec, *, file: str | None = None) -> None:
    """A machine's PCIe fabric is a tree under each CPU socket (its root complex): a PCIe link that closes a
    cycle, or that joins the trees of two sockets (a device with two upstream ports), is refused, naming the
    link. Sockets meet by ``upi``, machines by ``ib`` or ``ethernet``. One pass over the links
    (union-find), so it costs nothing next to building the graph of a 100k-GPU cluster."""
    parent: dict[str, str] = {}
    socket: dict[str, str] = {node.name: node.name for node in spec.nodes if node.kind == "cpu"}

    def root(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for i, link in enumerate(spec.links):
        if link.kind != "pcie":
            continue
        a, b = root(link.a), root(link.b)
        if a == b:
            raise TrainsimError(f"the PCIe link {link.a} - {link.b} closes a cycle: PCIe links form a tree "
                                "under each CPU socket (a device has one upstream port)", file=file,
                                field=f"links[{i}]")
        if a in socket and b in socket:
            raise TrainsimError(f"the PCIe link {link.a} - {link.b} joins the PCIe trees of {socket[a]} and "
                                f"{socket[b]}: a device hangs under one socket (sockets meet by upi)",
                                file=file, field=f"links[{i}]")
        parent[b] = a
        if b in socket:
            socket[a] = socket.pop(b)
