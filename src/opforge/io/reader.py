"""Stream one tensor at a time from a file into device memory.

On CUDA, bytes go through two small pinned staging buffers: while the GPU copies one chunk
(asynchronously), the host reads the next into the other buffer. Host memory grows by the two
buffers only, never by the tensor or the file. On the CPU, bytes are read straight into the
tensor that is returned. Elsewhere (MPS), a tensor is read on the CPU, then moved.
"""
from __future__ import annotations

from typing import BinaryIO, Dict, List, Optional

import torch

from .errors import SafetensorsError
from .format import Entry

CHUNK_BYTES = 32 * 1024 * 1024


def _read_exactly(f: BinaryIO, view: memoryview, entry: Entry) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise SafetensorsError(f"truncated file: the tensor's bytes end early ({done} of {len(view)})",
                                   entry.file, entry.name)
        done += n


class TensorReader:
    """Reads entries of SafeTensors files into tensors on ``device``, keeping files open.

    Example:
        >>> import os, tempfile, torch, opforge
        >>> from opforge.io.format import read_header
        >>> from opforge.io.reader import TensorReader
        >>> p = os.path.join(tempfile.mkdtemp(), "t.safetensors")
        >>> opforge.save_safetensors({"a": torch.arange(6.0).view(2, 3)}, p)
        >>> with TensorReader(torch.device("cpu")) as r:
        ...     r.read(read_header(p).entries[0])
        tensor([[0., 1., 2.],
                [3., 4., 5.]])
    """

    def __init__(self, device: torch.device, chunk_bytes: Optional[int] = None):
        self.device = device
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self._files: Dict[str, BinaryIO] = {}
        self._staging: List[torch.Tensor] = []
        self._events: List[Optional["torch.cuda.Event"]] = []
        self._next = 0
        self._scratch: Optional[torch.Tensor] = None
        self.scratch_hint = 0  # bytes: the largest scratch read to come, allocated once
        self.bytes_read = 0

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        for e in self._events:
            if e is not None:
                e.synchronize()
        self._staging.clear()
        self._events.clear()
        self._scratch = None

    def _file(self, entry: Entry) -> BinaryIO:
        f = self._files.get(entry.file)
        if f is None:
            try:
                f = self._files[entry.file] = open(entry.file, "rb", buffering=0)
            except OSError as e:
                raise SafetensorsError(f"cannot open: {e}", entry.file, entry.name) from None
        return f

    def read(self, entry: Entry, scratch: bool = False) -> torch.Tensor:
        """The tensor of ``entry`` on the reader's device, in the file's dtype and shape.

        ``scratch``: off CUDA, read into one buffer the reader reuses (the result is valid
        until the next read): for a tensor that is converted or quantized at once, so that
        freed raw buffers do not pile up in the host allocator.
        """
        f = self._file(entry)
        f.seek(entry.begin)
        self.bytes_read += entry.nbytes
        if self.device.type == "cuda":
            return self._read_cuda(f, entry).view(entry.dtype).view(entry.shape)
        if scratch:
            if self._scratch is None or self._scratch.numel() < entry.nbytes:
                self._scratch = None
                self._scratch = torch.empty(max(entry.nbytes, self.scratch_hint), dtype=torch.uint8)
            raw = self._scratch[:entry.nbytes]
        else:
            raw = torch.empty(entry.nbytes, dtype=torch.uint8)
        if entry.nbytes:
            _read_exactly(f, memoryview(raw.numpy()), entry)
        t = raw.view(entry.dtype).view(entry.shape)
        return t if self.device.type == "cpu" else t.to(self.device)  # MPS: a blocking copy

    def _read_cuda(self, f: BinaryIO, entry: Entry) -> torch.Tensor:
        with torch.cuda.device(self.device):  # events and copies on this device's current stream
            return self._read_cuda_here(f, entry)

    def _read_cuda_here(self, f: BinaryIO, entry: Entry) -> torch.Tensor:
        out = torch.empty(entry.nbytes, dtype=torch.uint8, device=self.device)
        if not self._staging:
            size = self.chunk_bytes
            self._staging = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._events = [None, None]
        pos = 0
        while pos < entry.nbytes:
            i = self._next
            self._next ^= 1
            if self._events[i] is not None:
                self._events[i].synchronize()  # the GPU is done copying out of this buffer
            n = min(self.chunk_bytes, entry.nbytes - pos)
            buf = self._staging[i]
            _read_exactly(f, memoryview(buf.numpy())[:n], entry)
            out[pos:pos + n].copy_(buf[:n], non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._events[i] = event
            pos += n
        return out
