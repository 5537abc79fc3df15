"""Knowing which layer is running, in forward and in backward, without full backward hooks.

A *layer* is a leaf ``nn.Module`` invocation. Forward is easy: a forward pre-hook and a forward hook on every
leaf module bracket its work. Backward is where the pitfalls are, and why this module does not use
``register_full_backward_hook`` / ``register_full_backward_pre_hook``:

- they wrap the module's inputs and outputs in ``BackwardHookFunction`` nodes, so an in-place op on a
  hooked module's output raises, and the extra identity nodes change the graph being measured;
- when no input of the module requires grad (the first conv), the "after" hook fires before the module's
  weight gradient is computed, so the layer's backward would read as ~0;
- the hook fires when the gradient w.r.t. the *inputs* is ready, not when the module's backward work
  (e.g. AccumulateGrad of its weights) is done.

Instead, when a leaf module's forward ends we walk the autograd graph from its outputs back to its inputs'
``grad_fn`` and claim every node in between (including the AccumulateGrad nodes of its parameters) for the
layer. Each claimed node gets a pre-hook and a post-hook (``Node.register_prehook`` / ``register_hook``)
that bracket exactly that node's execution. Nodes created by functional glue between modules (residual add,
flatten, concat) and by the loss are claimed by no layer: their time stays visible as unattributed.

Observers receive ``start(phase, layer)`` / ``end(phase, layer)`` calls with phase "forward" or "backward",
and ``output(layer, inputs, outputs)`` (the tensors) at the end of a forward. A tied parameter's
AccumulateGrad belongs to the first layer that used it. A module invoked twice accumulates into one layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn


class LayerObserver(Protocol):
    def start(self, phase: str, layer: str) -> None: ...
    def end(self, phase: str, layer: str) -> None: ...
    def output(self, layer: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None: ...


def leaf_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) of every module without children, in registration order."""
    for name, module in model.named_modules():
        if name and not any(True for _ in module.children()):
            yield name, module


def tensors_in(obj) -> list[torch.Tensor]:
    """The tensors in a (nested) tuple/list/dict of module inputs or outputs."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in tensors_in(item)]
    return []


class LayerHooks:
    """Context manager: hooks on every leaf module of ``model`` reporting to ``observers``.

    ``current`` names the layer whose forward or backward node is running (None in between), ``order``
    lists layers in first-invocation order. ``backward=False`` skips the graph walk (forward-only use).
    Call ``new_iteration()`` before each forward.
    """

    def __init__(self, model: nn.Module, observers: list[LayerObserver], *, backward: bool = True):
        self.model = model
        self.observers = observers
        self.backward = backward
        self.current: str | None = None
        self.order: list[str] = []
        self.modules = dict(leaf_modules(model))
        self._handles: list = []
        self._generation = 0  # node hooks of an older generation (or after exit) do nothing
        self._active = False
        self._claimed: set = set()
        self._boundary: dict[str, list] = {}
        self._inputs: dict[str, list] = {}

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> LayerHooks:
        self._active = True
        for name, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(module.register_forward_hook(self._post_hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._active = False
        self.new_iteration()

    def new_iteration(self) -> None:
        """Forget the previous iteration's autograd graph (so it can be freed) and disarm its node hooks.

        Node hooks cannot be removed, and a parameter's AccumulateGrad node outlives the iteration whenever
        something still holds the old graph: such a node's hooks must not fire for a later iteration.
        """
        self._generation += 1
        self._claimed = set()
        self._boundary = {}
        self._inputs = {}
        self.current = None

    # -------------------------------------------------------------- forward
    def _pre_hook(self, name: str):
        def hook(module, args):
            self._inputs[name] = tensors_in(args)
            if self.backward:
                self._boundary[name] = [t.grad_fn for t in self._inputs[name] if t.grad_fn is not None]
            self.current = name
            for obs in self.observers:
                obs.start("forward", name)
        return hook

    def _post_hook(self, name: str):
        def hook(module, args, output):
            for obs in self.observers:
                obs.end("forward", name)
            self.current = None
            if name not in self.order:
                self.order.append(name)
            outs = tensors_in(output)
            ins = self._inputs.pop(name, [])
            for obs in self.observers:
                obs.output(name, ins, outs)
            if self.backward and torch.is_grad_enabled():
                self._claim(name, outs)
        return hook

    # -------------------------------------------------------------- backward
    def _claim(self, name: str, outputs: list[torch.Tensor]) -> None:
        """Claim for ``name`` every autograd node between its outputs and its inputs."""
        stop = set(self._boundary.pop(name, []))
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node is None or node in stop or node in self._claimed:
                continue
            self._claimed.add(node)
            node.register_prehook(self._node_pre(name, self._generation))
            node.register_hook(self._node_post(name, self._generation))
            stack.extend(next_node for next_node, _ in node.next_functions)

    def _live(self, generation: int) -> bool:
        return self._active and generation == self._generation

    def _node_pre(self, name: str, generation: int):
        def hook(grad_outputs):
            if not self._live(generation):
                return
            self.current = name
            for obs in self.observers:
                obs.start("backward", name)
        return hook

    def _node_post(self, name: str, generation: int):
        def hook(grad_inputs, grad_outputs):
            if not self._live(generation):
                return
            for obs in self.observers:
                obs.end("backward", name)
            self.current = None
        return hook
