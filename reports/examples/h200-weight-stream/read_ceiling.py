"""How fast this GPU reads the 117 MB weight with no work on it: torch's copy (read and write), and a Triton kernel
that only reads, in the family's blocks (4 KB of words a block, each program a contiguous run of blocks, as the
split-K grid reads them), folding them by xor so that nothing is left out.

    python read_ceiling.py        on a CUDA GPU: do_bench medians (the L2 flushed between calls)
"""
import torch
import triton
import triton.language as tl


@triton.jit
def read_blocks(q_ptr, out_ptr, blocks_per_program, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program p reads blocks [p * blocks_per_program, (p + 1) * blocks_per_program), UNROLL blocks an iteration."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * blocks_per_program * BLOCK
    offs = tl.arange(0, BLOCK)
    fold = tl.zeros((BLOCK,), dtype=tl.int32)
    for b in range(0, blocks_per_program, UNROLL):
        for u in tl.static_range(UNROLL):
            fold ^= tl.load(q_ptr + base + (b + u) * BLOCK + offs)
    tl.store(out_ptr + pid * BLOCK + offs, fold)


def main():
    K, N = 8192, 28672
    words = torch.randint(-2**31, 2**31 - 1, (K * N // 8,), dtype=torch.int32, device="cuda")
    nbytes = words.numel() * 4

    def bench(fn):
        return 1e3 * triton.testing.do_bench(fn, warmup=30, rep=300, return_mode="median")
    src = words.view(torch.uint8)
    dst = torch.empty_like(src)
    us = bench(lambda: dst.copy_(src))
    print(f"torch copy of the {nbytes / 1e6:.1f} MB: {us:.2f} us, {2 * nbytes / us / 1e3:.0f} GB/s read + write",
          flush=True)
    BLOCK = 1024  # 4 KB of words: one block of the family's 64-column tile, one K step
    blocks = words.numel() // BLOCK
    # 896 programs: the split-K grid of 24x8192x28672 (448 tiles x 2 splits)
    for programs, warps, unroll in [(896, 4, 1), (896, 4, 2), (896, 4, 4), (896, 4, 8), (1792, 4, 4), (3584, 4, 4),
                                    (7168, 4, 2), (896, 8, 4), (448, 4, 8), (14336, 4, 2)]:
        per = blocks // programs
        if per * programs != blocks or per % unroll:  # every block read once, whole iterations only
            raise SystemExit(f"{programs} programs x {unroll} blocks an iteration do not divide {blocks} blocks")
        out = torch.empty(programs * BLOCK, dtype=torch.int32, device="cuda")
        us = bench(lambda: read_blocks[(programs,)](words, out, per, BLOCK=BLOCK, UNROLL=unroll, num_warps=warps))
        print(f"read_blocks: {programs} programs of {warps} warps, {per} blocks each, {unroll} an iteration: "
              f"{us:.2f} us, {programs * per * BLOCK * 4 / us / 1e3:.0f} GB/s read", flush=True)


if __name__ == "__main__":
    main()
