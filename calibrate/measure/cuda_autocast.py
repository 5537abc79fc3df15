"""CUDA autocast's float32 policy on another device, so that a box without a GPU measures the bytes a CUDA
run keeps.

CPU autocast runs softmax, log-softmax and layer norm in their input's type; CUDA autocast runs them in fp32
(PyTorch's AMP documentation, "CUDA Ops that can autocast to float32"). Both run convolutions, linear layers
and matmuls in 16 bit, so these three are the whole difference for the zoo's models.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode


class CudaFloat32Ops(TorchFunctionMode):
    """Inside this mode (and ``torch.autocast`` on the CPU), the ops above cast their floating inputs to fp32,
    so they compute, return and save fp32 as they would on CUDA."""

    FUNCS = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax, torch.log_softmax,
             torch.nn.functional.log_softmax, torch.Tensor.log_softmax, torch.layer_norm,
             torch.nn.functional.layer_norm}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FUNCS:
            args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                         for a in args)
        return func(*args, **(kwargs or {}))
