"""Activation offloading for the executor: saved activations go to host memory in forward and come back for
backward (vDNN and its multi-GPU, prefetching successors; docs/techniques.md, section 2).

Two modes, both `torch.autograd.graph.saved_tensors_hooks`:

- ``save_on_cpu``: PyTorch's ``save_on_cpu(pin_memory=True)``: a blocking copy out when a tensor is saved and
  a blocking copy back when backward unpacks it. The no-prefetch baseline.
- ``prefetch`` (`PrefetchOffload`): forward copies each saved activation into a pinned host buffer on a side
  stream (the compute stream does not wait; the GPU tensor is released once the copy is done, via
  ``record_stream``). Saved tensors are grouped by the layer (leaf module) that saved them. Backward keeps
  the activations of the next ``distance`` layers on their way back: `start_backward` (called after the
  loss) issues the last ``distance`` layers, and each time backward first unpacks a tensor of layer L, the
  copies for the ``distance`` saving layers before L are issued. An unpack waits only on its own copy's event.

Parameters (weights a layer saves for backward) stay where they are: offloading them saves nothing.
A tensor saved again while it is still alive (a layer's output, saved by it and by the next layer as its
input) is copied once: the second pack shares the first copy, as the simulator counts distinct bytes. The
match is the same live tensor object at the same version, never an address alone: the caching allocator
hands a freed tensor's address to the next one within the same forward.
On the CPU there is no second memory to offload to: the same code runs, "copies" become host-to-host clones
and there are no side streams; it exercises the logic and measures the copy cost, nothing more.
"""

from __future__ import annotations

import bisect
import contextlib
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

MIN_BYTES = 4096  # tiny saved tensors (shapes, masks of a few elements) are not worth a copy


@dataclass(eq=False)  # one copy is one object: compared by identity
class _Saved:
    layer: int
    host: torch.Tensor
    event: object = None  # CUDA event: the D2H copy is done
    device_copy: torch.Tensor | None = None  # brought back by a prefetch
    ready: object = None  # CUDA event: the H2D prefetch is done
    uses: int = 1  # packs sharing this copy; the device copy is dropped after the last unpack


@dataclass
class OffloadStats:
    offloaded_bytes: int = 0
    prefetched: int = 0  # unpacks served by a prefetch issued ahead
    on_demand: int = 0  # unpacks that had to copy back synchronously
    shared: int = 0  # packs of a tensor already offloaded and still alive: no second copy
    layers: set = field(default_factory=set)


class PrefetchOffload:
    """Offload saved activations of ``model``'s leaf modules; bring them back ``distance`` layers ahead."""

    def __init__(self, model: nn.Module, device: torch.device, distance: int = 1):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # compare with tensor.device, which has an index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.distance = distance
        self.cuda = self.device.type == "cuda"
        self.side = torch.cuda.Stream(device=self.device) if self.cuda else None
        self.param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.current_layer = -1
        self.layers: dict[int, list[_Saved]] = {}
        self.issued: set[int] = set()
        self.stats = OffloadStats()
        self._handles = [m.register_forward_pre_hook(self._enter_layer)
                         for m in model.modules() if not list(m.children())]
        self._layer_counter = 0
        self._saved_order: list[int] | None = None
        self._live: dict[tuple, tuple[weakref.ref, _Saved]] = {}  # offloaded tensors, by what they hold

    def _enter_layer(self, module, args) -> None:
        self.current_layer = self._layer_counter
        self._layer_counter += 1

    # ---- saved_tensors_hooks

    def pack(self, tensor: torch.Tensor):
        nbytes = tensor.numel() * tensor.element_size()
        if (nbytes < MIN_BYTES or tensor.untyped_storage().data_ptr() in self.param_storages
                or tensor.layout != torch.strided or tensor.device != self.device):
            return tensor
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype, tensor._version)
        earlier = self._live.get(key)
        if earlier is not None and earlier[0]() is tensor:
            saved = earlier[1]
            saved.uses += 1
            self.stats.shared += 1
            if saved.layer != self.current_layer:  # backward reaches the last saver first: prefetch it there
                first = self.layers[saved.layer]
                first.remove(saved)
                if not first:
                    del self.layers[saved.layer]
                saved.layer = self.current_layer
                self.layers.setdefault(saved.layer, []).append(saved)
            return saved
        layer = self.current_layer
        if self.cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                host.copy_(tensor, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.side)
            tensor.record_stream(self.side)  # the allocator may reuse it only after the copy
            saved = _Saved(layer, host, event)
        else:
            saved = _Saved(layer, tensor.detach().clone())
        self.layers.setdefault(layer, []).append(saved)
        self._live[key] = (weakref.ref(tensor), saved)
        self.stats.offloaded_bytes += nbytes
        self.stats.layers.add(layer)
        return saved

    def unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        if saved.device_copy is None:  # backward reached a tensor nobody prefetched
            self._bring_one(saved)
            self.stats.on_demand += 1
        else:
            self.stats.prefetched += 1
        self.issued.add(saved.layer)
        self._issue_ahead(saved.layer)
        out = saved.device_copy
        saved.uses -= 1
        if saved.uses == 0:
            saved.device_copy = None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(saved.ready)
            out.record_stream(current)
        return out

    # ---- prefetching

    def _bring_one(self, saved: _Saved) -> None:
        if self.cuda:
            with torch.cuda.stream(self.side):
                self.side.wait_event(saved.event)
                saved.device_copy = saved.host.to(self.device, non_blocking=True)
                saved.ready = torch.cuda.Event()
                saved.ready.record(self.side)
        else:
            saved.device_copy = saved.host.clone()

    def _bring_back(self, layer: int) -> None:
        self.issued.add(layer)
        for saved in self.layers.get(layer, []):
            if saved.device_copy is None:
                self._bring_one(saved)

    def _order(self) -> list[int]:
        """The layers that saved something, in forward order (fixed once forward is over)."""
        if self._saved_order is None:
            self._saved_order = sorted(self.layers)
        return self._saved_order

    def _issue_ahead(self, layer: int) -> None:
        """Bring back the ``distance`` layers that saved something and come before ``layer``."""
        order = self._order()
        below = bisect.bisect_left(order, layer)
        for ahead in order[max(0, below - self.distance):below]:
            if ahead not in self.issued:
                self._bring_back(ahead)

    def start_backward(self) -> None:
        """Forward is over: bring back the last ``distance`` layers that saved something."""
        self._saved_order = None
        for layer in self._order()[-self.distance:]:
            if layer not in self.issued:
                self._bring_back(layer)

    def reset(self) -> None:
        """Before the next forward."""
        self.layers.clear()
        self._live.clear()
        self.issued.clear()
        self._saved_order = None
        self._layer_counter = 0
        self.current_layer = -1

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def offload_context(mode: str, offloader: PrefetchOffload | None, device: torch.device):
    """The context the forward and backward of one iteration run in, for offload ``mode``."""
    if mode == "save_on_cpu":
        return torch.autograd.graph.save_on_cpu(pin_memory=torch.device(device).type == "cuda")
    if mode == "prefetch" and offloader is not None:
        return offloader.hooks()
    return contextlib.nullcontext()
