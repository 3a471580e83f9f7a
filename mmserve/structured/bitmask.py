"""Token bitmasks on logits rows: bit ``t % 32`` of word ``t // 32`` set = token t allowed.

``apply_bitmask`` is row-wise and elementwise, so batch invariant: on CUDA one Triton
launch (:mod:`mmserve.kernels.triton_bitmask`), elsewhere plain torch (the reference).
``MaskBuffer`` is the host buffer the grammar library fills, pinned on CUDA so its copy to
the device does not wait for the step's forward.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_dispatch import use_triton

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed tokens of ``logits`` (R, V) to -inf in place; ``bitmask`` (R, W) int32
    on the logits' device, W >= ceil(V / 32). Returns ``logits``."""
    if use_triton(logits) and logits.stride(-1) == 1:
        from mmserve.kernels.triton_bitmask import cuda_apply_bitmask

        return cuda_apply_bitmask(logits, bitmask)
    rows, vocab = logits.shape
    shifts = _SHIFTS.get(logits.device)
    if shifts is None:
        shifts = _SHIFTS[logits.device] = torch.arange(32, dtype=torch.int32, device=logits.device)
    bits = (bitmask[:, : bitmask_words(vocab), None] >> shifts) & 1  # (R, W, 32)
    allowed = bits.reshape(rows, -1)[:, :vocab].bool()  # (R, V)
    return logits.masked_fill_(~allowed, float("-inf"))


class MaskBuffer:
    """A reusable host bitmask of up to ``rows`` rows (grown on demand). On CUDA it is
    pinned, and ``to_device`` records when its copy is done so the next fill waits for it
    rather than overwrite bytes still in flight."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.words, self.device = bitmask_words(vocab_size), device
        self.host = torch.empty(0, self.words, dtype=torch.int32)
        self.copied: torch.cuda.Event | None = None

    def take(self, rows: int) -> torch.Tensor:
        """A host (rows, W) view, all bits set (every token allowed), ready to fill."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        if self.host.shape[0] < rows:
            self.host = torch.empty(
                max(rows, 2 * self.host.shape[0]),
                self.words,
                dtype=torch.int32,
                pin_memory=self.device.type == "cuda",
            )
        view = self.host[:rows]
        # through numpy: torch fills a tensor this size on its intra-op thread pool, and
        # waking those threads (busy beside the grammar library's own pool) can cost
        # milliseconds on a loaded host, against microseconds on one thread
        view.numpy().fill(-1)
        return view

    def to_device(self, view: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return view
        out = view.to(self.device, non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return out
