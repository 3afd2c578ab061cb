"""One iteration as the simulator's cost models see it (``ebctl.sim.costs``, ``ebctl.sim.gpucost``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Batch:
    """One iteration as the cost model sees it: prefill chunks (offset in their prompt, length), the
    context length (tokens attended, the new one included) of every decode row, and whether the previous
    non-idle iteration was of another kind (``switched``: prefill after decode, decode after prefill, ...)."""

    chunk_starts: list[int] = field(default_factory=list)
    chunk_lens: list[int] = field(default_factory=list)
    decode_ctx: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prefill_tokens: int = 0
    switched: bool = False

    @property
    def decode_reqs(self) -> int:
        return int(self.decode_ctx.size)

    @property
    def prefill_reqs(self) -> int:
        return len(self.chunk_lens)

    @property
    def prefill_ctx_tokens(self) -> int:
        """The keys the chunks' tokens attend to, summed (``IterationReport.prefill_ctx_tokens``): a chunk of n
        tokens at offset s of its prompt attends to n·s + n(n + 1)/2."""
        return sum(n * s + n * (n + 1) // 2 for s, n in zip(self.chunk_starts, self.chunk_lens, strict=True))
