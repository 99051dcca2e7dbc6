"""The W4A16 task's adapter: its tensor encoding, cases, inputs, fp32-bound oracle, bytes moved, sealed panels,
residency allowance and the bench's peers (evals/task.py lists what an adapter provides).

Encoding (tasks/w4a16/spec.md): ``qweight`` is int32 ``(K // 8, N)``; word ``qweight[j, n]`` holds the 4-bit codes
of rows ``8j .. 8j + 7`` of column n, row ``8j + i`` in bits ``4i .. 4i + 3``. Codes are unsigned 0..15 and mean
``code - 8``. ``scales`` is fp16 ``(K // 128, N)`` and ``W[k, n] = (code[k, n] - 8) * scales[k // 128, n]``.
``out = act(x @ W + bias) + residual`` in fp16.

Everything here is plain torch; solutions never import it (they get tensors, not this module).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import torch

from evals.kernel_harness import CheckResult
from evals.task import Problem

GROUP_SIZE = 128
EPILOGUES = ("silu", "gelu_tanh")
MODES = ("normal", "adversarial")
OUTPUT_DTYPE = torch.float16

U16 = 2.0**-11  # unit roundoff of fp16
U32 = 2.0**-24  # unit roundoff of fp32
# max |d act / dz| over the reals: silu peaks at 1.0998, gelu_tanh at 1.1289.
ACT_LIPSCHITZ = 1.13
FP16_MAX = 65504.0


# ----------------------------------------------------------------------------------------------------- encoding
def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack unsigned 4-bit codes ``(K, N)`` (any integer dtype, values 0..15) into int32 ``(K // 8, N)``."""
    if codes.dim() != 2 or codes.shape[0] % 8:
        raise ValueError(f"codes must be 2-D with K divisible by 8; got shape {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError("codes must lie in 0..15")
    k, n = codes.shape
    nibbles = codes.to(torch.int64).reshape(k // 8, 8, n)
    shifts = (torch.arange(8, device=codes.device, dtype=torch.int64) * 4).view(1, 8, 1)
    words = (nibbles << shifts).sum(dim=1)  # < 2**32, fits int64
    words = torch.where(words >= 2**31, words - 2**32, words)  # reinterpret as signed int32
    return words.to(torch.int32).contiguous()


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Unpack int32 ``(K // 8, N)`` into uint8 codes ``(K, N)``."""
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"qweight must be a 2-D int32 tensor; got {qweight.dtype} {tuple(qweight.shape)}")
    kw, n = qweight.shape
    shifts = (torch.arange(8, device=qweight.device, dtype=torch.int32) * 4).view(1, 8, 1)
    codes = (qweight.unsqueeze(1) >> shifts) & 0xF  # arithmetic shift is harmless once masked
    return codes.reshape(kw * 8, n).to(torch.uint8)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The logical weight ``W (K, N)`` in ``dtype`` (exact in fp32 and fp64)."""
    codes = unpack_int4(qweight).to(dtype) - 8
    return codes * scales.to(dtype).repeat_interleave(GROUP_SIZE, dim=0)


# ----------------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    stratum: str
    m: int
    k: int
    n: int
    epilogue: str
    seed: int

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}; got {self.epilogue!r}")
        if self.m < 1 or self.k % GROUP_SIZE or self.n % 256 or self.k <= 0 or self.n <= 0:
            raise ValueError(f"case needs M >= 1, K % 128 == 0, N % 256 == 0; got M={self.m} K={self.k} N={self.n}")

    @property
    def name(self) -> str:
        return f"{self.m}x{self.k}x{self.n}-{self.epilogue}"

    @property
    def dims(self) -> dict[str, int]:
        return {"m": self.m, "k": self.k, "n": self.n}

    def bytes_moved(self) -> int:
        """The fewest bytes one call must move: int4 weight, scales, bias, x, residual and out."""
        return (self.k * self.n // 2 + (self.k // GROUP_SIZE) * self.n * 2 + self.n * 2
                + 2 * self.m * self.k + 4 * self.m * self.n)


@dataclass
class CaseTensors:
    qweight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor
    x: torch.Tensor
    residual: torch.Tensor


def _generator(device: torch.device, *parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(seed)


def _coarse_fp16(values: torch.Tensor) -> torch.Tensor:
    """fp16 with the low four mantissa bits cleared (7 significant bits).

    Then ``(code - 8) * s`` and ``code * s`` are exact in fp16 for every code, so a kernel that dequantizes to fp16
    (as Marlin and v0 do) holds the logical weight exactly and the check below measures accumulation alone.
    """
    bits = values.to(torch.float16).view(torch.int16)
    return (bits & ~0xF).view(torch.float16)


def tensors(case: Case, mode: str = "normal", device: torch.device | str = "cpu") -> CaseTensors:
    """Weights and one input pair for a case, deterministic in (case, mode, device)."""
    device = torch.device(device)
    if mode == "normal":
        return _generate_normal(case, device)
    if mode == "adversarial":
        return _generate_adversarial(case, device)
    raise ValueError(f"mode must be one of {MODES}; got {mode!r}")


def _generate_normal(case: Case, device: torch.device) -> CaseTensors:
    k, n = case.k, case.n
    gen = _generator(device, case.seed, 1)
    codes = torch.randint(0, 16, (k, n), generator=gen, device=device, dtype=torch.int32)
    # |z| ~ 1.5: scale 0.33 / sqrt(K) against codes of std 4.6 and unit x
    spread = torch.rand((k // GROUP_SIZE, n), generator=gen, device=device) + 0.5
    scales = _coarse_fp16(spread * (0.33 / math.sqrt(k)))
    bias = (torch.randn(n, generator=gen, device=device) * 0.5).half()
    x, residual = make_inputs(case, 1, seed=case.seed, device=device)[0]
    return CaseTensors(pack_int4(codes), scales, bias, x, residual)


def _generate_adversarial(case: Case, device: torch.device) -> CaseTensors:
    """Signed high-magnitude x, codes piled at 0 and 15, large scales; partial sums far past the fp16 range that cancel.

    The second half of the K groups mirrors the first (same codes and scales) while its x is the negated first half
    plus a sparse +-1: every product of the first half is cancelled exactly, and z is the small remainder. The
    residual then lifts a quarter of the outputs to 20,000-48,000, near the top of fp16, with the exact result finite.
    An odd group left over (K / 128 odd) gets small x in -2..2, so z stays in range for any K.
    """
    m, k, n = case.m, case.k, case.n
    gen = _generator(device, case.seed, 2)
    groups = k // GROUP_SIZE
    half = groups // 2
    pick = torch.rand((k, n), generator=gen, device=device)
    codes = torch.randint(0, 16, (k, n), generator=gen, device=device, dtype=torch.int32)
    codes = torch.where(pick < 0.4, 0, torch.where(pick < 0.8, 15, codes))
    exponent = torch.randint(1, 5, (groups, n), generator=gen, device=device).float()
    scales = (2.0**exponent * (1 + torch.rand((groups, n), generator=gen, device=device))).half()
    sign = torch.where(torch.rand((m, k), generator=gen, device=device) < 0.5, -1.0, 1.0)
    x = sign * torch.randint(256, 1024, (m, k), generator=gen, device=device).float()
    if half:
        rows = half * GROUP_SIZE
        codes[rows : 2 * rows] = codes[:rows]
        scales[half : 2 * half] = scales[:half]
        nudge = torch.randint(-1, 2, (m, rows), generator=gen, device=device).float()
        nudge = nudge * (torch.rand((m, rows), generator=gen, device=device) < 0.2)
        x[:, rows : 2 * rows] = -x[:, :rows] + nudge
    x[:, 2 * half * GROUP_SIZE :] = torch.randint(-2, 3, (m, k - 2 * half * GROUP_SIZE), generator=gen,
                                                  device=device).float()
    scales = _coarse_fp16(scales)
    x = x.half()
    qweight = pack_int4(codes)
    bias = (torch.randn(n, generator=gen, device=device) * 100).half()
    z = _matmul_f64(x, qweight, scales) + bias.double()
    act_z = _act(z, case.epilogue)
    lifted = torch.rand((m, n), generator=gen, device=device) < 0.25
    target = torch.sign(act_z) * (20000 + 28000 * torch.rand((m, n), generator=gen, device=device, dtype=torch.float64))
    residual = torch.where(lifted, target - act_z,
                           torch.randn((m, n), generator=gen, device=device, dtype=torch.float64))
    residual = residual.clamp(-60000, 60000).half()
    exact = act_z + residual.double()
    if not torch.isfinite(exact).all() or exact.abs().max() > 0.95 * FP16_MAX:
        raise RuntimeError(f"adversarial construction for {case.name} left fp16 range; pick another seed")
    return CaseTensors(qweight, scales, bias, x, residual)


def make_inputs(case: Case, count: int, seed: int,
                device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` distinct fresh (x, residual) pairs of the normal regime."""
    device = torch.device(device)
    gen = _generator(device, case.seed, 3, seed)
    pairs = []
    for _ in range(count):
        x = torch.randn((case.m, case.k), generator=gen, device=device).half()
        residual = torch.randn((case.m, case.n), generator=gen, device=device).half()
        pairs.append((x, residual))
    return pairs


# ----------------------------------------------------------------------------------------------------- oracle
def _act(z: torch.Tensor, epilogue: str) -> torch.Tensor:
    if epilogue == "silu":
        return z * torch.sigmoid(z)
    if epilogue == "gelu_tanh":
        return 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    raise ValueError(f"epilogue must be one of {EPILOGUES}; got {epilogue!r}")


def _matmul_f64(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, absolute: bool = False) -> torch.Tensor:
    """x @ W (or |x| @ |W|) in fp64, K in chunks so that no dense weight of the whole case is ever held."""
    k = qweight.shape[0] * 8
    step = GROUP_SIZE * 16
    acc = torch.zeros((x.shape[0], qweight.shape[1]), dtype=torch.float64, device=x.device)
    for k0 in range(0, k, step):
        w = dequantize(qweight[k0 // 8 : (k0 + step) // 8], scales[k0 // GROUP_SIZE : (k0 + step) // GROUP_SIZE],
                       torch.float64)
        xs = x[:, k0 : k0 + step].double()
        acc += xs.abs() @ w.abs() if absolute else xs @ w
    return acc


@dataclass
class Reference:
    out: torch.Tensor  # fp64 act(x @ W + bias) + residual
    tolerance: torch.Tensor  # fp64, elementwise


def oracle(x, qweight, scales, bias, residual, epilogue: str) -> Reference:
    """The oracle and the elementwise tolerance any fp32-accumulating kernel meets.

    The oracle runs in fp64, so its own error is negligible next to the bound. A kernel reads the fp16 inputs
    exactly, forms exact products (fp16 x fp16 fits fp32; the generated scales make fp16 dequantization exact) and
    sums K of them in fp32 in some order. Each addition errs by at most u32 |partial sum| (2 u32 for tensor-core
    accumulators that truncate), so the error is at most u32 * sum|partial sums| <= K u32 A, A = |x| @ |W| + |bias|.
    That worst case needs partial sums that keep one sign; every generated case draws the signs of x and of
    code - 8 at random, so partial sums walk like sqrt(k) and the sum of their sizes stays below ~1.9 sqrt(K) A even
    when every addition truncates (tests/evals: a sequential, truncating fp32 sum). We take four times that, plus
    sixteen roundings for per-group scale multiplies and split-K partials:
        gamma = (8 sqrt(K) + 16) u32
    The bound follows A, not |z|, so ill-conditioned adversarial cases (A far above |z|) stay fair to any fp32
    kernel, while an fp16 accumulator overflows there. The epilogue may round z and act(z) to fp16 once each and
    the output once more:
        tol = 1.13 (gamma A + 2 u16 |z|) + 2 u16 |act(z)| + 2 u16 |out| + 2**-24
    (1.13 bounds the slope of both activations; 2**-24 is the fp16 subnormal spacing). At K = 28672 in the normal
    regime this is about 0.02, well under a missing bias or a wrong activation.
    """
    k = qweight.shape[0] * 8
    z = _matmul_f64(x, qweight, scales) + bias.double()
    a = _matmul_f64(x, qweight, scales, absolute=True) + bias.double().abs()
    act_z = _act(z, epilogue)
    out = act_z + residual.double()
    gamma = (8 * math.sqrt(k) + 16) * U32
    tol = ACT_LIPSCHITZ * (gamma * a + 2 * U16 * z.abs()) + 2 * U16 * act_z.abs() + 2 * U16 * out.abs() + 2.0**-24
    return Reference(out, tol)


def check(out, ref: Reference, shape: tuple[int, int]) -> CheckResult:
    """Shape, dtype, contiguity, finiteness and agreement of ``out`` with the oracle."""
    if type(out) is not torch.Tensor:  # a subclass could override the very operations this check uses
        return CheckResult(False, "output must be a plain torch.Tensor; "
                                  f"got {type(out).__module__}.{type(out).__qualname__}")
    if tuple(out.shape) != tuple(shape):
        return CheckResult(False, f"output shape must be {tuple(shape)}; got {tuple(out.shape)}")
    if out.dtype != torch.float16:
        return CheckResult(False, f"output dtype must be torch.float16; got {out.dtype}")
    if out.device != ref.out.device:
        return CheckResult(False, f"output must be on {ref.out.device}; got {out.device}")
    if not out.is_contiguous():
        return CheckResult(False, "output must be contiguous")
    finite = torch.isfinite(out)
    if not finite.all():
        count = int((~finite).sum())
        return CheckResult(False, f"{count} output elements are not finite", bad_elements=count, worst_excess=math.inf)
    excess = (out.double() - ref.out).abs() / ref.tolerance
    bad = int((excess > 1).sum())
    worst = float(excess.max()) if excess.numel() else 0.0
    if bad:
        flat = int(excess.argmax())
        row, col = divmod(flat, shape[1])
        return CheckResult(
            False,
            f"{bad} elements outside the fp32 bound; worst at [{row}, {col}]: got {float(out[row, col]):.6g}, "
            f"want {float(ref.out[row, col]):.6g} +- {float(ref.tolerance[row, col]):.3g}",
            bad, worst,
        )
    return CheckResult(True, "ok", 0, worst)


# ----------------------------------------------------------------------------------------------------- the interface
def generate(case: Case, mode: str = "normal", device: torch.device | str = "cpu") -> Problem:
    """The build arguments and one call's inputs (evals/task.py's interface)."""
    t = tensors(case, mode, device)
    return Problem({"qweight": t.qweight, "scales": t.scales, "bias": t.bias, "epilogue": case.epilogue},
                   (t.x, t.residual))


def reference(weights: dict, inputs: tuple, case: Case) -> Reference:
    x, residual = inputs
    return oracle(x, weights["qweight"], weights["scales"], weights["bias"], residual, case.epilogue)


def check_output(out, ref: Reference, case: Case) -> CheckResult:
    return check(out, ref, output_shape(case))


def output_shape(case: Case) -> tuple[int, int]:
    return (case.m, case.n)


def bytes_moved(case: Case) -> int:
    return case.bytes_moved()


# ----------------------------------------------------------------------------------------------------- sealed panels
# the regime sealed cases are drawn from, within each stratum's ranges (task.json): the spec's scored M and K, and N
# from 512 (below it a weight is too small to time) to the largest visible N
DRAW = {"m": (18, 32), "k": (8192, 28672), "n": (512, 28672)}


def make_panel(seed: int, per_stratum: int, strata: dict[str, dict], visible: list[Case]) -> dict:
    """Cases from the visible regimes, disjoint from the visible tuples and seeds, both epilogues in each stratum;
    K * N at most the largest visible case's, so that no sealed case outgrows the visible memory and time.

    Seeds are not tried here (the adversarial construction of a big case is costly on CPU): a seed whose construction
    leaves fp16 range fails that case's case_setup gate at verify time, naming the verifier, and the panel is
    redrawn."""
    rng = random.Random(seed)
    taken = {(c.m, c.k, c.n, c.epilogue) for c in visible}
    seeds = {c.seed for c in visible}
    largest = max(c.k * c.n for c in visible)
    cases = []
    for stratum, ranges in strata.items():
        n_low = max(DRAW["n"][0], ranges["n"][0])
        n_high = min(DRAW["n"][1], ranges["n"][1] or DRAW["n"][1])
        epilogues = [EPILOGUES[i % 2] for i in range(per_stratum)]
        rng.shuffle(epilogues)
        for epilogue in epilogues:
            while True:
                m, k = rng.randint(*DRAW["m"]), 128 * rng.randint(DRAW["k"][0] // 128, DRAW["k"][1] // 128)
                n = 256 * rng.randint(n_low // 256, n_high // 256)
                if (m, k, n, epilogue) not in taken and k * n <= largest:
                    break
            case_seed = rng.randrange(10_000, 2**31)
            while case_seed in seeds:
                case_seed = rng.randrange(10_000, 2**31)
            taken.add((m, k, n, epilogue))
            seeds.add(case_seed)
            cases.append(asdict(Case(stratum, m, k, n, epilogue, case_seed)))
    return {"note": f"sealed panel drawn with seed {seed}; never give it to the agent", "cases": cases}


# ----------------------------------------------------------------------------------------------------- measuring tools
# What evals/profile.py, evals/bench.py and evals/qualify.py take from a task beyond the interface (each optional
# there): FLOOR_OUTPUT_SHAPE, flop(case), PEERS and skipped_peers().
FLOOR_OUTPUT_SHAPE = (32, 8192)
"""The output (OUTPUT_DTYPE) that one call of bench's host floors and of qualify's synthetic callable allocates: the
visible panel's largest M with its commonest N (an allocation's host cost barely depends on its size)."""


def flop(case: Case) -> int:
    """Floating-point operations of one call: 2 M K N (the matmul; the epilogue's are negligible beside it)."""
    return 2 * case.m * case.k * case.n


def _torch_act(z: torch.Tensor, epilogue: str) -> torch.Tensor:
    return torch.nn.functional.silu(z) if epilogue == "silu" else torch.nn.functional.gelu(z, approximate="tanh")


def _peer_dequant_addmm(weights: dict, case: Case):
    qweight, scales, bias, epilogue = (weights[name] for name in ("qweight", "scales", "bias", "epilogue"))

    def fn(x, residual):
        w = dequantize(qweight, scales, torch.float16)  # transient: allowed, but a full pass per call
        return _torch_act(torch.addmm(bias, x, w), epilogue) + residual

    return fn


def _peer_dense_fp16(weights: dict, case: Case):
    bias, epilogue = weights["bias"], weights["epilogue"]
    w = dequantize(weights["qweight"], weights["scales"], torch.float16)  # kept: breaks residency, a reference only

    def fn(x, residual):
        return _torch_act(torch.addmm(bias, x, w), epilogue) + residual

    return fn


TINYGEMM_INNER_K_TILES = 8  # gpt-fast's packing (K a multiple of 128)


def tinygemm_operands(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The task's weights as torch's int4 weight-only matmul (tinygemm, group 128) takes them: the packed codes
    (CUDA: two a byte; CPU: its own packing of int32 codes, for ``*_for_cpu``) and the bf16 (scale, zero) pairs of
    tinygemm's (q - 8) * scale + zero, zero 0."""
    codes = unpack_int4(qweight).t().contiguous().int()  # (N, K), 0..15
    if codes.is_cuda:
        packed = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
        weight = torch._convert_weight_to_int4pack(packed, TINYGEMM_INNER_K_TILES)
    else:
        weight = torch._convert_weight_to_int4pack_for_cpu(codes, TINYGEMM_INNER_K_TILES)
    scale_zero = torch.stack([scales.bfloat16(), torch.zeros_like(scales, dtype=torch.bfloat16)], dim=2).contiguous()
    return weight, scale_zero


def _peer_tinygemm(weights: dict, case: Case):
    epilogue = weights["epilogue"]
    weight, scale_zero = tinygemm_operands(weights["qweight"], weights["scales"])
    bias_f32 = weights["bias"].float()  # bias in fp32: the row's error is tinygemm's bf16 alone, none added here

    def fn(x, residual):
        z = torch._weight_int4pack_mm(x.bfloat16(), weight, GROUP_SIZE, scale_zero).float() + bias_f32
        return (_torch_act(z, epilogue) + residual.float()).half()

    return fn


PEERS = {
    "torch dequant+addmm": (_peer_dequant_addmm, "allowed peer"),
    "dense fp16 torch": (_peer_dense_fp16, "NOT allowed: keeps a dense fp16 weight"),
    "torch _weight_int4pack_mm": (_peer_tinygemm,
                                  "tinygemm, bf16 activations and weights (the fp32 bound is not expected)"),
}
"""make bench's peers: ``{name: (builder(weights, case) -> callable(*inputs), note)}``; the note says whether the peer
keeps to the rules of tasks/w4a16/spec.md (residency). A builder that fails on this torch is a row with its error."""


def skipped_peers() -> list[str]:
    """The peers make bench cannot run here, one line each for its log. gemlite is one whether installed or not: its
    API varies across releases; wire it into PEERS (found with importlib.util.find_spec, not imported, since an import
    runs its module-level setup) when a pinned version is available."""
    return ["gemlite: not installed (or not wired for this version); skipped"]


# ----------------------------------------------------------------------------------------------------- the judge's
# What evals/gates.py, evals/gate_spies.py, evals/residency.py and evals/verifier.py take from a task beyond the
# interface (each optional there): BOUND, references(), outside_bound(), PER_STRATUM_MIN, and residency() (required
# where the manifest declares the residency stage).
BOUND = "the fp32 bound"
"""What the oracle's tolerance is, in words: the verifier's evidence says an output is outside it."""
PER_STRATUM_MIN = (2, "both epilogues in each stratum")
"""The fewest cases make_panel draws per stratum, and why (the verifier's make-panel refuses fewer)."""


def references(weights: dict, inputs: list[tuple], case: Case) -> list[Reference]:
    """The oracle of each call input of ``inputs`` in one pass: the inputs stacked by rows (rows are independent)."""
    m = case.m
    ref = oracle(torch.cat([x for x, _ in inputs]), weights["qweight"], weights["scales"], weights["bias"],
                 torch.cat([residual for _, residual in inputs]), case.epilogue)
    return [Reference(ref.out[i * m:(i + 1) * m], ref.tolerance[i * m:(i + 1) * m]) for i in range(len(inputs))]


def outside_bound(outs: list[torch.Tensor], ref: Reference, case: Case) -> int:
    """How many of ``outs`` (outputs of one input, of the right structure) lie outside the bound or are not finite."""
    within = (torch.stack(outs).double() - ref.out).abs() <= ref.tolerance  # NaN compares False: counted outside
    return int((~within.flatten(1).all(dim=1)).sum())


@dataclass(frozen=True)
class Allowance:
    """The residency contract of one case (tasks/w4a16/spec.md), measured by evals/residency.py at its checkpoints:

    - total       everything the solution added <= K*N/2 + (K/128)*N*2 + max(8 MiB, 4*M*K + 8*M*N)
    - floating    fp16/bf16/fp32/fp64 storage, except one fp16 tensor of exact shape (K/128, N) or (N, K/128),
                  <= 2*M*K + 4*M*N + 1 MiB; the two limits are separate, so unused int4 bytes cannot pay for floats
    - unpacked    no int8/uint8 tensor of K*N bytes or more (nor any integer tensor: a label must not hide the codes),
                  no fp16/bf16 tensor of 2*K*N bytes or more
    - workspace   everything but one int4 repack (the largest integer storage of at most K*N/2 bytes) and the scale
                  copy <= the floating limit, whatever its dtype (stricter than the letter of the spec, so that a
                  buffer cannot escape the floating limit by its label: outputs cached as int16, floats viewed as int32)
    """
    total: int
    floating: int
    byte_codes: int  # an int8/uint8 tensor this large is a full unpacked code tensor
    half_floats: int  # an fp16/bf16 tensor this large is a full dequantized weight
    k: int
    n: int
    quoted = ("floating_bytes",)  # (no annotation: not a field) the figures the verifier's residency gate quotes

    @classmethod
    def for_case(cls, m: int, k: int, n: int) -> "Allowance":
        from evals.residency import MIB

        groups = k // GROUP_SIZE
        return cls(k * n // 2 + groups * n * 2 + max(8 * MIB, 4 * m * k + 8 * m * n), 2 * m * k + 4 * m * n + MIB,
                   k * n, 2 * k * n, k, n)

    def account(self, point, new: list) -> dict:
        """The checkpoint's figures: floating storage (unattributed bytes count as floating) and workspace, each less
        the one fp16 scale copy; the workspace less the one int4 repack too; the scale copy's shape, if one was kept."""
        from evals.residency import FLOATING_NAMES, INTEGER_NAMES

        groups = self.k // GROUP_SIZE
        scale_shapes = {(groups, self.n), (self.n, groups)}
        exempt = next((s for s in new if s.dtype == "float16" and s.shape in scale_shapes
                       and s.nbytes == groups * self.n * 2), None)
        unattributed = point.unattributed_bytes
        floating = sum(s.nbytes for s in new if s.dtype in FLOATING_NAMES | {"untyped"} and s is not exempt)
        repack = max((s for s in new if s.dtype in INTEGER_NAMES and s.nbytes <= self.k * self.n // 2),
                     key=lambda s: s.nbytes, default=None)
        workspace = sum(s.nbytes for s in new if s is not exempt and s is not repack)
        return {"floating_bytes": floating + unattributed, "workspace_bytes": workspace + unattributed,
                "scale_copy_exempt": None if exempt is None else list(exempt.shape)}

    def audit(self, point, new: list) -> list[dict]:
        """The rules broken at one checkpoint, each with the bytes over its limit."""
        from evals.residency import HALF_FLOAT_NAMES, INTEGER_NAMES, over_limit

        found = point.figures
        broken = [
            over_limit(point, "total", point.total_bytes, self.total, "retained device memory"),
            over_limit(point, "floating", found["floating_bytes"], self.floating,
                       "retained floating-point storage (besides one (K/128, N) fp16 scale copy"
                       + (f"; {point.unattributed_bytes:,} bytes unattributed" if point.unattributed_bytes else "")
                       + ")"),
            # Stricter than the letter of the floating rule, so that a label cannot hide a buffer: outputs cached as
            # int16 or float scratch viewed as int32 count here whatever their dtype.
            over_limit(point, "workspace", found["workspace_bytes"], self.floating,
                       "retained storage besides the one int4 repack and the scale copy, whatever its dtype")]
        for s in new:
            if s.dtype in INTEGER_NAMES:  # the int4 repack is K*N/2 bytes; K*N is a code a byte, however labelled
                broken.append(over_limit(point, "unpacked-int8", s.nbytes, self.byte_codes - 1,
                                         f"a full unpacked code tensor ({s.dtype} {s.shape})"))
            if s.dtype in HALF_FLOAT_NAMES:
                broken.append(over_limit(point, "unpacked-dense", s.nbytes, self.half_floats - 1,
                                         f"a full dequantized weight ({s.dtype} {s.shape})"))
        return [rule for rule in broken if rule is not None]


def residency(case: Case) -> Allowance:
    """The residency allowance of ``case`` (the manifest declares the residency stage)."""
    return Allowance.for_case(case.m, case.k, case.n)
