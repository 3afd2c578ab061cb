"""Pure-torch stand-in for the CPU build of ``sgl_kernel`` -- TEST INFRASTRUCTURE ONLY.

sglang 0.5.23 on CPU (``SGLANG_USE_CPU_ENGINE=1``) imports ``sgl_kernel`` and, on the plain
non-speculative dense-model path, calls exactly one of its ops: ``assign_req_to_token_pool_cpu``.
No CPU build of sgl-kernel / sglang-kernel exists on PyPI, so the tests put ``tools/sglang_cpu`` on
``PYTHONPATH`` and get this module instead. The one op is implemented for real (slowly, in Python);
any other name resolves to a function that raises ``NotImplementedError`` naming the op, so a code path
this stand-in does not cover (speculative decoding, KV moves, ...) fails loudly instead of silently.
Never ship this, never use it for timings. See docs/sglang-cpu.md.
"""

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    max_context_len: int | None = None,
) -> None:
    """For each row i: req_to_token[req_pool_indices[i], start[i]:end[i]] = the next end-start slots."""
    pt = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[pt : pt + n].to(req_to_token.dtype)
        pt += n


def __getattr__(name: str):
    if name.startswith("__"):  # keep hasattr(module, "__path__") etc. honest
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not implemented by the test stand-in "
                                  f"(tools/sglang_cpu/sgl_kernel): only assign_req_to_token_pool_cpu is")

    _missing.__name__ = name
    return _missing
