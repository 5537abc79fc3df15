"""Optimizer state offloaded to host memory and streamed through the GPU in chunks (AxoNN;
docs/techniques.md, section 4).

`StreamedOptimizer` keeps the optimizer's state (momentum, Adam's moments) in host memory, pinned on CUDA.
Each step streams it to the device one chunk of parameters at a time, steps that chunk there with the
torch optimizer itself, and streams the updated state back, through two device buffers: chunk c+1's state
comes in (H2D stream) while chunk c steps (the compute stream) and chunk c-1's goes out (D2H stream). The
device holds weights, gradients and the two buffers, as the simulator models it
(`trainsim.sim.optimizations.optimizer_offload`).

The executor trains under autocast, so its weights are fp32 and are the master weights themselves: only the
optimizer's state streams (the simulator's ``state_bytes`` at fp32). A chunk holds whole parameters, up to
``chunk_bytes`` of state; a parameter with more state than that is a chunk of its own (the buffers are as
large as the largest chunk). On CPU ranks the buffers are host memory and the copies plain copies.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: the tensors of per-parameter state each optimizer keeps (what streams; Adam's step count stays host-side)
STATE_TENSORS = {"sgd": (), "momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}


def chunk_parameters(params: list[torch.Tensor], state_tensors: int, chunk_bytes: float) -> list[list[int]]:
    """Parameter indices per chunk, in order: as many parameters as keep the chunk's state within
    ``chunk_bytes`` (a parameter with more state than that is a chunk of its own)."""
    per_param = [p.numel() * 4 * state_tensors for p in params]
    chunks, current, size = [], [], 0
    for i, nbytes in enumerate(per_param):
        if current and size + nbytes > chunk_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        chunks.append(current)
    return chunks


class StreamedOptimizer:
    """Optimizer ``name`` (sgd | momentum | adam, built by ``make``) over ``params`` with its state in host
    memory, streamed through the device in chunks of about ``chunk_bytes`` of state at every `step`."""

    def __init__(self, make: Callable, name: str, params, device: torch.device, chunk_bytes: float):
        self.params = [p for p in params if p.requires_grad]
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.names = STATE_TENSORS[name]
        self.chunks = chunk_parameters(self.params, len(self.names), chunk_bytes) if self.params else []
        self.optimizers = [make([self.params[i] for i in chunk]) for chunk in self.chunks]
        sizes = [sum(self.params[i].numel() for i in chunk) for chunk in self.chunks]
        self.host = [[torch.zeros(n, dtype=torch.float32, pin_memory=self.cuda) for _ in self.names]
                     for n in sizes]
        largest = max(sizes, default=0)
        self.buffers = [[torch.empty(largest, dtype=torch.float32, device=self.device) for _ in self.names]
                        for _ in range(2)] if self.names else []
        self.steps = {i: torch.tensor(0.0) for i in range(len(self.params))}  # Adam's count, host-side
        if self.cuda:
            self.h2d, self.d2h = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
            self.freed = [None, None]  # per buffer: the event after which its last chunk went out

    def step(self) -> None:
        for c, (chunk, opt) in enumerate(zip(self.chunks, self.optimizers, strict=True)):
            buffer = self.buffers[c % 2] if self.names else []
            views = self._load(c, buffer)
            for i in chunk:
                state = {name: views[name][i] for name in self.names}
                if "exp_avg" in self.names:
                    state["step"] = self.steps[i]
                opt.state[self.params[i]] = state
            opt.step()
            self._store(c, buffer)
            opt.state.clear()  # the state's home is host memory; the buffers are reused

    def _load(self, c: int, buffer: list[torch.Tensor]) -> dict[str, dict[int, torch.Tensor]]:
        """Chunk ``c``'s state into ``buffer`` (H2D stream, after the buffer's last chunk went out); its
        per-parameter views, shaped as the parameters."""
        n = self.host[c][0].numel() if self.names else 0
        if self.cuda and self.names:
            stream = self.h2d
            if self.freed[c % 2] is not None:
                stream.wait_event(self.freed[c % 2])
            with torch.cuda.stream(stream):
                for dst, src in zip(buffer, self.host[c], strict=True):
                    dst[:n].copy_(src, non_blocking=True)
            torch.cuda.current_stream(self.device).wait_stream(stream)
        else:
            for dst, src in zip(buffer, self.host[c], strict=True):
                dst[:n].copy_(src)
        views: dict[str, dict[int, torch.Tensor]] = {name: {} for name in self.names}
        offset = 0
        for i in self.chunks[c]:
            p = self.params[i]
            for name, flat in zip(self.names, buffer, strict=True):
                views[name][i] = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return views

    def _store(self, c: int, buffer: list[torch.Tensor]) -> None:
        """Chunk ``c``'s stepped state back to host memory (D2H stream, after the step)."""
        if not self.names:
            return
        n = self.host[c][0].numel()
        if self.cuda:
            stream = self.d2h
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for dst, src in zip(self.host[c], buffer, strict=True):
                    dst.copy_(src[:n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
            self.freed[c % 2] = event
        else:
            for dst, src in zip(self.host[c], buffer, strict=True):
                dst.copy_(src[:n])

    def synchronize(self) -> None:
        """Wait until every chunk's state is back in host memory."""
        if self.cuda:
            self.d2h.synchronize()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def host_state_bytes(self) -> int:
        """Bytes of optimizer state held in host memory."""
        return sum(t.numel() * t.element_size() for chunk in self.host for t in chunk)

    def device_buffer_bytes(self) -> int:
        """Bytes of the two device buffers the state streams through."""
        return sum(t.numel() * t.element_size() for buffer in self.buffers for t in buffer)
