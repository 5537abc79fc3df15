"""Library workspaces: the GPU memory a PyTorch training process holds that none of its tensors does.

PyTorch gives every (cuBLAS handle, CUDA stream) pair its own cuBLAS workspace. The pair's first matmul
allocates it through PyTorch's caching allocator and it stays for the life of the process
(``aten/src/ATen/cuda/CublasHandlePool.cpp``), so ``torch.cuda.max_memory_allocated`` counts it. cuBLASLt
(addmm with a bias: every linear layer) reuses that allocation, ``TORCH_CUBLASLT_UNIFIED_WORKSPACE`` being
the default of PyTorch's CUDA builds (``torch.backends.cuda.blas_workspace_size``'s documentation).

Handles belong to host threads. A training process runs its forward on its Python thread and its backward
on autograd's worker thread for the device, each on the current stream: two pairs on every GPU that trains
(DataParallel's replica threads come and go but reuse the pooled handle on the device's stream; side streams
that only copy make no pair).

One pair's size is ``CUBLAS_WORKSPACE_CONFIG``'s default in PyTorch: ``:4096:8`` (32 MiB) on compute
capability 9.0 (H100, H200: cuBLAS's documentation asks 32 MiB for Hopper), ``:4096:2:16:8``
(8 MiB + 128 KiB) on every other GPU. A process that sets the variable (deterministic training asks
``:4096:8`` or ``:16:8``) gets what it says: ``:SIZE:COUNT`` pairs, SIZE in KiB, summed, as PyTorch parses it.
A CPU rank holds none.
"""

from __future__ import annotations

from trainsim.formats.scenario import cublas_workspace_config_bytes
from trainsim.sim.core.devices import DeviceSpec, compute_capability

KIB = 1024
#: one (handle, stream) pair's workspace: PyTorch's default for compute capability 9.0, and for the others
HOPPER_WORKSPACE_BYTES = 4096 * KIB * 8
OTHER_WORKSPACE_BYTES = 4096 * KIB * 2 + 16 * KIB * 8
#: the threads that run matmuls on a training GPU: the Python thread (forward) and autograd's (backward)
MATMUL_THREADS = 2


def cublas_workspace_bytes(device: DeviceSpec, config: str | None = None) -> int:
    """One (cuBLAS handle, stream) pair's workspace on ``device`` under ``CUBLAS_WORKSPACE_CONFIG`` =
    ``config`` (None: PyTorch's default for the device); 0 on a CPU."""
    if device.kind != "gpu":
        return 0
    if config is not None:
        return cublas_workspace_config_bytes(config)
    names = (device.name, *device.aliases)
    if any(compute_capability(name) == 90 for name in names):
        return HOPPER_WORKSPACE_BYTES
    return OTHER_WORKSPACE_BYTES


def training_workspace_bytes(device: DeviceSpec, config: str | None = None) -> int:
    """What a training process's matmul threads hold in workspaces on ``device`` (`MATMUL_THREADS` pairs)."""
    return MATMUL_THREADS * cublas_workspace_bytes(device, config)
