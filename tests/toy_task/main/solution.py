"""colscale v0: out = x * gain, one Triton program per BLOCK_SIZE elements of x.

Contract (the task's spec.md):
    build(gain) -> fn;  fn(x) -> out
    gain fp32 (N,);  x fp32 (M, N);  out fp32 (M, N), a fresh tensor on every call, out[m, n] = x[m, n] * gain[n]
"""
import torch
import triton
import triton.language as tl


def get_config():
    return {"BLOCK_SIZE": 64, "num_warps": 4}


SEARCH_SPACE = {
    "knobs": {
        "BLOCK_SIZE": {"values": [32, 64, 128, 256],
                       "reason": {"up": "a larger block gives each program more elements and fewer launches of them",
                                  "down": "a smaller block makes more programs for a small matrix"}},
        "num_warps": {"values": [1, 2, 4], "reason": "warps per program"},
    },
}


@triton.jit
def colscale_kernel(
    # Pointers
    x_ptr, gain_ptr, out_ptr,
    # Sizes
    n_elements, N,
    # Meta-parameters
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    gain = tl.load(gain_ptr + offs % N, mask=mask)
    tl.store(out_ptr + offs, x * gain, mask=mask)


def build(gain):
    config = get_config()
    block = config["BLOCK_SIZE"]

    def fn(x):
        out = torch.empty_like(x)
        colscale_kernel[(triton.cdiv(x.numel(), block),)](x, gain, out, x.numel(), x.shape[1], BLOCK_SIZE=block,
                                                          num_warps=config["num_warps"])
        return out

    return fn
