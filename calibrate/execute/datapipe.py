"""The executor's input pipeline: real CPU work per sample, batch assembly, and a background prefetcher.

Samples are synthetic but the work on them is real: a stored uint8 image (zlib-compressed, so each sample is
decoded like a file would be) goes through `data_prep.prepare_image` (random crop, flip, convert,
normalise) ``augment_repeats`` times; tokens are a random window of a token stream
(`data_prep.prepare_tokens`).
The same transforms are what `data_prep.measure_prep` times for the simulator, so the cost the simulator
is told about is the cost the executor pays.

Sample ``i`` of the run (global index = iteration * global batch + position) is a pure function of the seed,
the iteration and ``i``: whichever rank prepares it, it is the same tensor. That is what lets dp-gpu0 (rank 0
loads everything) and ddp (each rank loads its shard) see identical data.

`Prefetcher` is the CPU half of ``preload``: background threads prepare the next batches (``depth`` ahead)
while the training loop computes. On CUDA the executor adds the other half (pinned buffers, H2D copies on a
side stream, events) in `executor.DeviceFeeder`.
"""

from __future__ import annotations

import queue
import threading
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import torch

from trainsim.calibrate import zoo
from trainsim.calibrate.execute.config import DataConfig
from trainsim.calibrate.execute.data_prep import prepare_image, prepare_tokens, source_size

Batch = tuple[torch.Tensor, torch.Tensor]


class SyntheticSource:
    """Deterministic samples of zoo model ``model``'s input, prepared with real CPU work."""

    def __init__(self, model: str, model_cfg: dict, data: DataConfig, seed: int = 0):
        self.kind = zoo.model_spec(model).kind
        self.cfg = zoo.model_config(model, **model_cfg)
        self.data = data
        self.seed = seed
        rng = np.random.default_rng([seed, 0x5EED])
        if self.kind == "tokens":
            block = zoo.sequence_length(self.cfg)
            length = max(data.pool_size * block, 4 * block + 2)
            self.stream = rng.integers(0, self.cfg["vocab_size"], size=length, dtype=np.uint16)
            self._stored = None
        else:
            size = self.cfg["image_size"]
            side = data.source_size or source_size(size)
            if side < size:
                from trainsim.errors import TrainsimError

                raise TrainsimError(f"must be >= the model's image size {size}", field="data.source_size")
            self.side = side
            self.labels = rng.integers(0, self.cfg["num_classes"], size=data.pool_size)
            images = self._images(rng, data.pool_size, side)
            self._stored = [zlib.compress(img.tobytes(), 1) if data.compress else img for img in images]

    @staticmethod
    def _images(rng: np.random.Generator, n: int, side: int) -> np.ndarray:
        """Photo-like uint8 HWC images: smooth colour fields plus noise (so compression has work to do)."""
        cells = side // 8 + 1
        coarse = rng.integers(0, 256, size=(n, cells, cells, 3)).astype(np.float32)
        idx = np.minimum(np.arange(side) // 8, coarse.shape[1] - 1)
        smooth = coarse[:, idx][:, :, idx]
        noise = rng.normal(0.0, 12.0, size=smooth.shape)
        return np.clip(smooth + noise, 0, 255).astype(np.uint8)

    def _decode(self, i: int) -> np.ndarray:
        stored = self._stored[i % len(self._stored)]
        if not self.data.compress:
            return stored
        return np.frombuffer(zlib.decompress(stored), dtype=np.uint8).reshape(self.side, self.side, 3)

    def sample(self, iteration: int, index: int) -> tuple[np.ndarray, np.ndarray | int]:
        """Sample ``index`` (global position in the run) of ``iteration``: (input, target)."""
        rng = np.random.default_rng([self.seed, iteration, index])
        if self.kind == "tokens":
            return prepare_tokens(self.stream, zoo.sequence_length(self.cfg), rng)
        image = self._decode(index)
        for _ in range(self.data.augment_repeats):  # the per-sample cost knob: the chain runs again
            out = prepare_image(image, self.cfg["image_size"], rng)
        return out, int(self.labels[index % len(self.labels)])

    def targets(self, iteration: int, positions: Sequence[int], batch_size: int, *, pin: bool = False):
        """Only the targets of `batch` (a pipeline's last stage needs nothing else): image labels cost no
        image work; token targets are the (cheap) token windows."""
        base = iteration * batch_size
        if self.kind == "tokens":
            out = torch.from_numpy(np.stack([self.sample(iteration, base + p)[1] for p in positions]))
        else:
            out = torch.tensor([int(self.labels[(base + p) % len(self.labels)]) for p in positions],
                               dtype=torch.long)
        return out.pin_memory() if pin else out

    def batch(self, iteration: int, positions: Sequence[int], batch_size: int, *, pin: bool = False) -> Batch:
        """The samples at ``positions`` of iteration ``iteration`` (global batch ``batch_size``), stacked."""
        base = iteration * batch_size
        samples = [self.sample(iteration, base + p) for p in positions]
        inputs = torch.from_numpy(np.stack([s[0] for s in samples]))
        if self.kind == "tokens":
            targets = torch.from_numpy(np.stack([s[1] for s in samples]))
        else:
            targets = torch.tensor([s[1] for s in samples], dtype=torch.long)
        if pin:
            inputs, targets = inputs.pin_memory(), targets.pin_memory()
        return inputs, targets


class _Iterations(torch.utils.data.Dataset):
    """Item ``i`` is ``make(i)``: whole batches, so the DataLoader's workers each prepare one batch."""

    def __init__(self, make: Callable[[int], object], total: int):
        self.make, self.total = make, total

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, it: int):
        return self.make(it)


def loader_batches(make: Callable[[int], object], total: int, *, workers: int, pin: bool):
    """An iterator over ``make(0) .. make(total - 1)`` prepared by a torch DataLoader's ``workers`` worker
    processes, two batches ahead each (its default prefetch), pinned by its pin thread when ``pin``.

    ``make`` runs in forked workers: it must not touch CUDA. A worker runs torch with one thread."""
    loader = torch.utils.data.DataLoader(_Iterations(make, total), batch_size=None, shuffle=False,
                                         num_workers=workers, pin_memory=pin, prefetch_factor=2,
                                         persistent_workers=False)
    return iter(loader)


class Prefetcher:
    """Background threads calling ``make(iteration)`` ahead of the consumer, at most ``depth`` batches ahead.

    Worker ``w`` of ``workers`` prepares iterations w, w + workers, ...; ``get(i)`` must be called with
    i = 0, 1, 2, ... in order. An exception in a worker is raised by the ``get`` that wanted its batch.
    """

    def __init__(self, make: Callable[[int], object], total: int, *, depth: int = 2, workers: int = 1,
                 cores: tuple[int, ...] = ()):
        self.make = make
        self.cores = tuple(cores)  # run the workers on these cores (the host's free ones), when given
        self.total = total
        self.workers = max(1, min(workers, total)) if total else 1
        per_worker = max(1, -(-depth // self.workers))
        self._queues = [queue.Queue(maxsize=per_worker) for _ in range(self.workers)]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,), daemon=True, name=f"prefetch-{w}")
                         for w in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def _run(self, worker: int) -> None:
        if self.cores:
            import os

            os.sched_setaffinity(0, self.cores)  # Linux: 0 is this thread, not the whole process
        for it in range(worker, self.total, self.workers):
            try:
                item = (True, self.make(it))
            except BaseException as exc:  # handed to the consumer
                item = (False, exc)
            while not self._stop.is_set():
                try:
                    self._queues[worker].put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or not item[0]:
                return

    def get(self, iteration: int):
        ok, item = self._queues[iteration % self.workers].get()
        if not ok:
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        for q in self._queues:  # unblock producers waiting on a full queue
            while not q.empty():
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
