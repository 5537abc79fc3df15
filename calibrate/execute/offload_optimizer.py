"""Optimizer state offloaded to host memory (ZeRO-Offload / AxoNN style; TECHNIQUES.md 4).

`HostOptimizer` keeps fp32 master weights and the optimizer's state (momentum, Adam moments) in host memory
(pinned on CUDA): each step copies the gradients out, steps on the CPU, and copies the weights back, one
tensor at a time. The device then holds weights and gradients only (about 8 bytes per parameter with Adam
no longer on it), which `max_memory_allocated` shows; the price is two copies and a CPU step per iteration.
The copies are not overlapped with other work. On CPU ranks it degenerates to copies between host buffers.
"""

from __future__ import annotations

import torch


class HostOptimizer:
    """A torch optimizer ``name`` over host copies of ``params``; `step` moves gradients and weights."""

    def __init__(self, make, params, device: torch.device):
        self.params = [p for p in params if p.requires_grad]
        self.cuda = torch.device(device).type == "cuda"
        pin = self.cuda
        self.master = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach())
                       for p in self.params]
        self.host_grads = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin) for p in self.params]
        for m in self.master:
            m.requires_grad_(True)
        self.inner = make(self.master)

    def step(self) -> None:
        stepped = []
        for p, m, g in zip(self.params, self.master, self.host_grads, strict=True):
            if p.grad is None:
                m.grad = None
                continue
            g.copy_(p.grad, non_blocking=self.cuda)
            m.grad = g
            stepped.append((p, m))
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # the gradients are in host memory now
        self.inner.step()
        with torch.no_grad():
            for p, m in stepped:
                p.copy_(m, non_blocking=self.cuda)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def host_state_bytes(self) -> int:
        """Bytes of master weights and optimizer state held in host memory."""
        state = sum(t.numel() * t.element_size() for s in self.inner.state.values() for t in s.values()
                    if torch.is_tensor(t))
        return state + sum(m.numel() * 4 for m in self.master)
