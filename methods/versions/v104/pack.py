"""The weight words in the order the kernels read them, made once at build (the contract's K*N/2 int4 allowance).

``operand_blocks`` permutes each column's 128 codes per group so that one unpacked word lands in the registers the
wgmma operand needs (``operand_order``), then lays the words out as one contiguous [block_n, 16] block per
(N tile, group) (``program_blocks``). The bytes are the caller's codes, moved; nothing is dequantized.
"""
import torch


def operand_blocks(qweight: torch.Tensor, block_n: int) -> torch.Tensor:
    """The caller's (K // 8, N) words as (N // block_n, K // 128, block_n, 16) blocks in operand order."""
    return program_blocks(operand_order(qweight), block_n)


def program_blocks(words: torch.Tensor, block_n: int) -> torch.Tensor:
    """(K // 8, N) words -> (N // block_n, K // 128, block_n, 16): the block of one program and K step contiguous."""
    words_k, n = words.shape
    return words.view(words_k // 16, 16, n // block_n, block_n).permute(2, 0, 3, 1).contiguous()


def operand_source(word: int, nibble: int) -> tuple[int, int]:
    """Where nibble ``nibble`` of word ``word`` of a group in operand order comes from: (word, nibble) of the caller's
    group. Word 4t + q, nibble 4 e0 + 2 e1 + c1 holds the group's row 32q + 16 c1 + 8 e1 + 2t + e0, which is row
    8j + i of the caller's words with j = 4q + 2 c1 + e1 and i = 2t + e0."""
    t, q = divmod(word, 4)
    e0, rest = divmod(nibble, 4)
    e1, c1 = divmod(rest, 2)
    return 4 * q + 2 * c1 + e1, 2 * t + e0


def operand_order(qweight: torch.Tensor, chunk_bytes: int = 1 << 28) -> torch.Tensor:
    """The caller's (K // 8, N) words with each group's 128 codes per column permuted into operand order.

    Works on int64 copies of about ``chunk_bytes`` at a time (groups in chunks), so a build's scratch stays bounded.
    """
    words_k, n = qweight.shape
    groups = qweight.view(words_k // 16, 16, n)
    ordered = torch.empty_like(groups)
    rows, shifts = [], []
    for nibble in range(8):
        sources = [operand_source(word, nibble) for word in range(16)]
        rows.append(torch.tensor([j for j, _ in sources], device=qweight.device))
        shifts.append(torch.tensor([4 * i for _, i in sources], device=qweight.device).view(1, 16, 1))
    step = max(1, chunk_bytes // (16 * n * 8))
    for start in range(0, groups.shape[0], step):
        src = groups[start:start + step].to(torch.int64)
        out = torch.zeros_like(src)
        for nibble in range(8):
            out |= ((src[:, rows[nibble], :] >> shifts[nibble]) & 0xF) << (4 * nibble)
        # back to int32 two's complement (nibble 7 sets bit 31)
        ordered[start:start + step] = (out - ((out >> 31) << 32)).to(torch.int32)
    return ordered.view(words_k, n)
