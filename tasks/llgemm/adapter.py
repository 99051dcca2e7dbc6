"""The LL-GEMM task's adapter: cases, input regimes, the fp32-bound oracle, bytes moved, sealed panels of open
models' decode projections, and the residency allowance (evals/task.py lists what an adapter provides).

The operation (tasks/llgemm/spec.md): ``y = x @ W.T``, what ``torch.nn.functional.linear(x, W)`` computes without a
bias. ``W`` is contiguous bf16 ``(N, K)`` as ``nn.Linear`` holds it, ``x`` contiguous bf16 ``(M, K)``, ``y`` contiguous
bf16 ``(M, N)``. Allowed shapes: ``M >= 1``, ``N >= 1``, ``K >= 8`` with ``K % 8 == 0``; scored cases have
``1 <= M <= 16``.

Everything here is plain torch; solutions never import it (they get tensors, not this module).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

from evals.kernel_harness import CheckResult, structure_problem
from evals.task import Problem

MODES = ("normal", "cancel", "extreme", "outlier")
OUTPUT_DTYPE = torch.bfloat16

U32 = 2.0**-24  # unit roundoff of fp32
BF16_ULP = 2.0**-7  # bf16's spacing relative to the value's binade (8 significant bits): one rounding in any mode
TINY = 2.0**-126  # the smallest normal fp32 and bf16: what flushing one subnormal to zero may lose
ACCUMULATION = 3  # roundings of u32 per product and addition that the bound allows (oracle() says why)
ORACLE_CHUNK = 1 << 25  # weight elements converted to fp64 at once by the oracle (256 MiB of fp64 scratch)


# ----------------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    stratum: str
    m: int
    n: int
    k: int
    seed: int

    def __post_init__(self) -> None:
        if self.m < 1 or self.n < 1 or self.k < 8 or self.k % 8:
            raise ValueError(f"an llgemm case needs M >= 1, N >= 1, K >= 8 and K % 8 == 0 (rows of x and W 16-byte "
                             f"aligned); got M={self.m} N={self.n} K={self.k}")

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def dims(self) -> dict[str, int]:
        return {"m": self.m, "n": self.n, "k": self.k}


def _generator(device: torch.device, *parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(seed)


def _signs(gen: torch.Generator, shape: tuple, device: torch.device) -> torch.Tensor:
    return torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0)


def _magnitudes(gen: torch.Generator, shape: tuple, low: int, high: int, device: torch.device) -> torch.Tensor:
    """Values ``2**e * (1 + f)``: e a random integer in ``low .. high``, f uniform in [0, 1)."""
    exponents = torch.randint(low, high + 1, shape, generator=gen, device=device).float()
    return torch.exp2(exponents) * (1 + torch.rand(shape, generator=gen, device=device))


# ----------------------------------------------------------------------------------------------------- input regimes
def tensors(case: Case, mode: str = "normal", device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, x)`` of one regime, deterministic in (case, mode, device); everything made on ``device``."""
    device = torch.device(device)
    makers = {"normal": _normal, "cancel": _cancel, "extreme": _extreme, "outlier": _outlier}
    if mode not in makers:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    weight, x = makers[mode](case, device, _generator(device, case.seed, 1 + MODES.index(mode)))
    return weight.contiguous(), x.contiguous()


def _normal(case: Case, device: torch.device, gen: torch.Generator):
    """W ~ N(0, 1/K) and x ~ N(0, 1): outputs of about unit size, as a trained layer's."""
    weight = (torch.randn((case.n, case.k), generator=gen, device=device) * case.k**-0.5).bfloat16()
    return weight, make_inputs(case, 1, seed=case.seed, device=device)[0][0]


def _cancel(case: Case, device: torch.device, gen: torch.Generator):
    """Large products of one sign per output in the first half of K, cancelled by the second half.

    ``W[:, h + j] = W[:, j]`` and ``x[:, h + j]`` is ``-x[:, j]`` moved by 0 to 2 of its bf16 ulps, so the result is
    the small remainder while every partial sum in K order climbs to about ``A/2`` (``A = |x| @ |W|.T``) and comes
    back. The signs are ``a_m * s_k`` in x and ``b_n * s_k`` in W, so each output's products keep one sign: an
    accumulator that rounds to bf16 stagnates on the climb and misses by a large fraction of ``A``; fp32 stays within
    the bound, which follows A.
    """
    m, n, k = case.m, case.n, case.k
    h = k // 2
    shared = _signs(gen, (1, h), device)
    w_half = (_signs(gen, (n, 1), device) * shared * _magnitudes(gen, (n, h), -4, 0, device)).bfloat16()
    x_first = (_signs(gen, (m, 1), device) * shared * _magnitudes(gen, (m, h), 5, 7, device)).bfloat16()
    ulp = torch.exp2(torch.floor(torch.log2(x_first.float().abs())) - 7)
    steps = torch.randint(-2, 3, (m, h), generator=gen, device=device).float()
    steps = steps * (torch.rand((m, h), generator=gen, device=device) < 0.3)
    x_second = (-x_first.float() + steps * ulp).bfloat16()
    return torch.cat([w_half, w_half], dim=1), torch.cat([x_first, x_second], dim=1)


def _extreme(case: Case, device: torch.device, gen: torch.Generator):
    """Signed values spread over many binades: rows of x scaled by 2**-32 .. 2**32, rows of W likewise, elements
    spread by 2**+-8 more, so x and W reach from about 2**-40 to 2**45 (far outside fp16's and fp8's range and any
    one fixed scale) and outputs span about 2**+-80. The first quarter of K holds larger products of one sign per
    output (as in "cancel"), and the last quarter repeats it with x negated, cancelling it exactly: the result is the
    middle half's sum, while an accumulator that rounds to bf16 loses the middle under the large partial sums."""
    m, n, k = case.m, case.n, case.k
    q = k // 4
    mid = k - 2 * q
    row_scale = torch.exp2(torch.randint(-32, 33, (m, 1), generator=gen, device=device).float())
    col_scale = torch.exp2(torch.randint(-32, 33, (n, 1), generator=gen, device=device).float())
    shared = _signs(gen, (1, q), device)
    x_big = _signs(gen, (m, 1), device) * shared * _magnitudes(gen, (m, q), 10, 12, device)
    w_big = _signs(gen, (n, 1), device) * shared * _magnitudes(gen, (n, q), 4, 6, device)
    x_mid = _signs(gen, (m, mid), device) * _magnitudes(gen, (m, mid), -8, 8, device)
    w_mid = _signs(gen, (n, mid), device) * _magnitudes(gen, (n, mid), -8, 8, device)
    x = (torch.cat([x_big, x_mid], dim=1) * row_scale).bfloat16()
    weight = (torch.cat([w_big, w_mid], dim=1) * col_scale).bfloat16()
    return torch.cat([weight, weight[:, :q]], dim=1), torch.cat([x, -x[:, :q]], dim=1)


def _outlier(case: Case, device: torch.device, gen: torch.Generator):
    """Normal W and x, except that one channel of x (the same in every row, as the outlier features of LLM
    activations) is about 2**20: each output is then nearly one product ``x[m, j] * W[n, j]``, ``A`` is about
    ``|y|``, and the bound is about 1% of y. A kernel that reads W or x in fewer bits than bf16 (fp8, int8 with
    scales, fp16's range) errs by more."""
    weight, x = _normal(case, device, gen)
    channel = int(torch.randint(0, case.k, (1,), generator=gen, device=device))
    x = x.clone()
    x[:, channel] = (_signs(gen, (case.m,), device) * _magnitudes(gen, (case.m,), 20, 20, device)).bfloat16()
    return weight, x


def make_inputs(case: Case, count: int, seed: int, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor]]:
    """``count`` distinct fresh ``(x,)`` of the normal regime: bf16 N(0, 1), contiguous ``(M, K)``."""
    device = torch.device(device)
    gen = _generator(device, case.seed, 7, seed)
    return [(torch.randn((case.m, case.k), generator=gen, device=device).bfloat16(),) for _ in range(count)]


# ----------------------------------------------------------------------------------------------------- oracle
def _dots_f64(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x @ W.T`` and ``|x| @ |W|.T`` in fp64, W's rows in chunks (each converted once for both) so that no fp64
    copy of a large weight is held."""
    xs = x.double()
    xa = xs.abs()
    n, k = weight.shape
    step = max(1, ORACLE_CHUNK // k)
    y = torch.empty((x.shape[0], n), dtype=torch.float64, device=x.device)
    a = torch.empty_like(y)
    for n0 in range(0, n, step):
        w = weight[n0:n0 + step].to(torch.float64, copy=True)  # a copy: abs_ below must not touch W
        y[:, n0:n0 + step] = xs @ w.T
        a[:, n0:n0 + step] = xa @ w.abs_().T
    return y, a


@dataclass
class Reference:
    out: torch.Tensor  # fp64 x @ W.T
    tolerance: torch.Tensor  # fp64, elementwise


def oracle(x: torch.Tensor, weight: torch.Tensor) -> Reference:
    """The oracle and the elementwise tolerance any fp32-accumulating kernel meets, whatever its summation order.

    The oracle runs in fp64 (exact products, error about K 2**-53 A), negligible next to the bound. A kernel reads
    the bf16 inputs exactly and forms exact products (8 x 8 significant bits fit fp32's 24). It sums the K products
    in fp32 in any order (any tiling, split-K, atomics): each addition errs by at most 2 u32 of its partial sum when
    it truncates, and every partial sum is at most ``A = |x| @ |W|.T``; tensor cores that align a block's products to
    the largest before adding lose at most about 1 u32 of that more per product. Allowing three roundings per
    product covers both and the second-order terms, for any order and any data:
        e_acc <= 3 K u32 A
    The output is the kernel's fp32 sum rounded to bf16 once, in any rounding mode: at most one bf16 ulp, 2**-7 of
    its size (to nearest needs half that, but the Triton interpreter truncates, so CPU runs of an honest kernel
    would fail a half-ulp rule). Flushing a subnormal product, partial sum or output to zero loses at most 2**-126
    each. So
        tol = 2**-7 |y| + 3 K u32 A + (K + 1) 2**-126
    (the 2**-7 e_acc of rounding an erring sum is within the slack of the 3). The bound follows A, not |y|: on
    "cancel" and "extreme" inputs (A far above |y|) any fp32 kernel passes and a bf16 accumulator does not; on
    "outlier" inputs A is about |y| and the bound is about 1% of y.
    """
    k = weight.shape[1]
    y, a = _dots_f64(x, weight)
    tol = BF16_ULP * y.abs() + ACCUMULATION * k * U32 * a + (k + 1) * TINY
    return Reference(y, tol)


def check(out, ref: Reference, shape: tuple[int, int]) -> CheckResult:
    """Structure (plain tensor, shape, dtype, device, contiguity, finiteness) and agreement of ``out`` with the
    oracle."""
    if type(out) is not torch.Tensor:  # a subclass could override the very operations this check uses
        return CheckResult(False, "output must be a plain torch.Tensor; "
                                  f"got {type(out).__module__}.{type(out).__qualname__}")
    if tuple(out.shape) != tuple(shape):
        return CheckResult(False, f"output shape must be {tuple(shape)}; got {tuple(out.shape)}")
    if out.dtype != OUTPUT_DTYPE:
        return CheckResult(False, f"output dtype must be torch.bfloat16; got {out.dtype}")
    if out.device != ref.out.device:
        return CheckResult(False, f"output must be on {ref.out.device}; got {out.device}")
    if not out.is_contiguous():
        return CheckResult(False, "output must be contiguous")
    finite = torch.isfinite(out)
    if not finite.all():
        count = int((~finite).sum())
        return CheckResult(False, f"{count} output elements are not finite", bad_elements=count,
                           worst_excess=float("inf"))
    excess = (out.double() - ref.out).abs() / ref.tolerance
    bad = int((excess > 1).sum())
    worst = float(excess.max()) if excess.numel() else 0.0
    if bad:
        row, col = divmod(int(excess.argmax()), shape[1])
        return CheckResult(
            False,
            f"{bad} elements outside the fp32 bound; worst at [{row}, {col}]: got {float(out[row, col]):.6g}, "
            f"want {float(ref.out[row, col]):.6g} +- {float(ref.tolerance[row, col]):.3g}",
            bad, worst,
        )
    return CheckResult(True, "ok", 0, worst)


def check_many(outs: list, refs: list[Reference], shape: tuple[int, int]) -> list[CheckResult]:
    """``check`` of each of ``outs`` against its ``refs``, the values of all compared in one pass with one wait for
    the device; an output with any fault gets ``check``'s own result (its message)."""
    results: list[CheckResult | None] = [None] * len(outs)
    plain = []
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        if structure_problem(out, shape, OUTPUT_DTYPE, ref.out.device) is None and out.device == ref.out.device:
            plain.append(i)
        else:
            results[i] = check(out, ref, shape)
    if plain:
        got = torch.stack([outs[i] for i in plain]).double()
        outside = ~torch.isfinite(got)  # a NaN output must not compare as within
        excess = got.sub_(torch.stack([refs[i].out for i in plain])).abs_()  # in place: 64 outputs of fp64 are large
        excess = excess.div_(torch.stack([refs[i].tolerance for i in plain])).masked_fill_(outside, float("inf"))
        excess = excess.flatten(1)
        for i, (bad, worst) in zip(plain, torch.stack([(excess > 1).sum(1).double(), excess.amax(1)], 1).tolist()):
            results[i] = check(outs[i], refs[i], shape) if bad else CheckResult(True, "ok", 0, worst)
    return results


# ----------------------------------------------------------------------------------------------------- the interface
def generate(case: Case, mode: str = "normal", device: torch.device | str = "cpu") -> Problem:
    """The build argument and one call's input (evals/task.py's interface)."""
    weight, x = tensors(case, mode, device)
    return Problem({"weight": weight}, (x,))


def reference(weights: dict, inputs: tuple, case: Case) -> Reference:
    return oracle(inputs[0], weights["weight"])


def check_output(out, ref: Reference, case: Case) -> CheckResult:
    return check(out, ref, output_shape(case))


def check_outputs(outs: list, refs: list[Reference], case: Case) -> list[CheckResult]:
    return check_many(outs, refs, output_shape(case))


def output_shape(case: Case) -> tuple[int, int]:
    return (case.m, case.n)


def bytes_moved(case: Case) -> int:
    """The fewest bytes one call moves: the weight, x and y, each bf16 and each once."""
    return 2 * (case.n * case.k + case.m * case.k + case.m * case.n)


def baseline(weights: dict, case: Case):
    """The yardstick: torch.nn.functional.linear on the same weight (cuBLAS on a GPU)."""
    weight = weights["weight"]
    return lambda x: torch.nn.functional.linear(x, weight)


# ----------------------------------------------------------------------------------------------------- sealed panels
# Decode projections of open models at full size: (model, projection, N, K, how tensor parallelism splits it, the
# largest TP it splits at). Column-parallel layers split N across ranks, row-parallel ones split K; a fused qkv
# splits only as far as its KV heads do; a router is replicated.
PROJECTIONS = (
    ("Llama-3-8B", "qkv_proj", 6144, 4096, "column", 8),
    ("Llama-3-8B", "o_proj", 4096, 4096, "row", 8),
    ("Llama-3-8B", "gate_up_proj", 28672, 4096, "column", 8),
    ("Llama-3-8B", "down_proj", 4096, 14336, "row", 8),
    ("Llama-3-8B", "lm_head", 128256, 4096, "column", 8),
    ("Llama-3-70B", "qkv_proj", 10240, 8192, "column", 8),
    ("Llama-3-70B", "o_proj", 8192, 8192, "row", 8),
    ("Llama-3-70B", "gate_up_proj", 57344, 8192, "column", 8),
    ("Llama-3-70B", "down_proj", 8192, 28672, "row", 8),
    ("Llama-3-70B", "lm_head", 128256, 8192, "column", 8),
    ("Llama-3.2-1B", "qkv_proj", 3072, 2048, "column", 8),
    ("Llama-3.2-1B", "o_proj", 2048, 2048, "row", 8),
    ("Llama-3.2-1B", "gate_up_proj", 16384, 2048, "column", 8),
    ("Llama-3.2-1B", "down_proj", 2048, 8192, "row", 8),
    ("Llama-3.2-3B", "qkv_proj", 5120, 3072, "column", 8),
    ("Qwen2.5-0.5B", "qkv_proj", 1152, 896, "column", 2),
    ("Qwen2.5-0.5B", "o_proj", 896, 896, "row", 8),
    ("Qwen2.5-0.5B", "gate_up_proj", 9728, 896, "column", 8),
    ("Qwen2.5-0.5B", "down_proj", 896, 4864, "row", 8),
    ("Qwen2.5-7B", "qkv_proj", 4608, 3584, "column", 4),
    ("Qwen2.5-7B", "o_proj", 3584, 3584, "row", 8),
    ("Qwen2.5-7B", "gate_up_proj", 37888, 3584, "column", 8),
    ("Qwen2.5-7B", "down_proj", 3584, 18944, "row", 8),
    ("Qwen2.5-7B", "lm_head", 152064, 3584, "column", 8),
    ("Qwen2.5-72B", "gate_up_proj", 59136, 8192, "column", 8),
    ("Qwen2.5-72B", "down_proj", 8192, 29568, "row", 8),
    ("Qwen3-30B-A3B", "qkv_proj", 5120, 2048, "column", 4),
    ("Qwen3-30B-A3B", "o_proj", 2048, 4096, "row", 8),
    ("Qwen3-30B-A3B", "router", 128, 2048, "replicated", 1),
    ("Qwen3-30B-A3B", "expert gate_up_proj", 1536, 2048, "column", 8),
    ("Qwen3-30B-A3B", "expert down_proj", 2048, 768, "row", 8),
    ("Mistral-7B", "lm_head", 32000, 4096, "column", 8),
    ("Mixtral-8x7B", "router", 8, 4096, "replicated", 1),
    ("Mixtral-8x7B", "expert w1", 14336, 4096, "column", 8),
    ("Gemma-2-9B", "qkv_proj", 8192, 3584, "column", 8),
    ("Gemma-2-9B", "o_proj", 3584, 4096, "row", 8),
    ("Gemma-2-9B", "gate_up_proj", 28672, 3584, "column", 8),
    ("Gemma-2-9B", "down_proj", 3584, 14336, "row", 8),
    ("Gemma-2-9B", "lm_head", 256000, 3584, "column", 8),
    ("Phi-3-mini", "qkv_proj", 9216, 3072, "column", 8),
    ("Phi-3-mini", "o_proj", 3072, 3072, "row", 8),
    ("Phi-3-mini", "gate_up_proj", 16384, 3072, "column", 8),
    ("Phi-3-mini", "down_proj", 3072, 8192, "row", 8),
)
TP_DEGREES = (1, 2, 4, 8)
WEIGHT_CAP = 512 << 20  # bytes of one sealed case's weight: the visible panel's largest is 318 MB


def local_shapes(visible: list[Case]) -> list[tuple[int, int, str]]:
    """Every distinct local ``(N, K, source)`` of PROJECTIONS at the TP degrees that split it evenly (K % 8 == 0
    after the split) with a weight of at most WEIGHT_CAP bytes, except the visible panel's (N, K) pairs; a shape
    two projections share keeps the first one's name."""
    taken = {(c.n, c.k) for c in visible}
    found: dict[tuple[int, int], str] = {}
    for model, projection, n, k, split, max_tp in PROJECTIONS:
        for tp in (d for d in TP_DEGREES if d <= max_tp):
            if split == "column" and n % tp == 0:
                shape = (n // tp, k)
            elif split == "row" and k % tp == 0:
                shape = (n, k // tp)
            elif split == "replicated" and tp == 1:
                shape = (n, k)
            else:
                continue
            if shape[1] % 8 or 2 * shape[0] * shape[1] > WEIGHT_CAP or shape in taken or shape in found:
                continue
            found[shape] = f"{model} {projection}" + (f" TP={tp}" if split != "replicated" else "")
    return [(n, k, source) for (n, k), source in found.items()]


def make_panel(seed: int, per_stratum: int, strata: dict[str, dict], visible: list[Case]) -> dict:
    """Per stratum, ``per_stratum`` cases: an M drawn in the stratum's range and a local decode shape of an open
    model (local_shapes), disjoint from the visible (N, K) pairs and seeds; no shape repeats within the panel until
    every shape has been drawn. ``sources`` names each case's projection, in the cases' order."""
    rng = random.Random(seed)
    shapes = local_shapes(visible)
    seeds = {c.seed for c in visible}
    unused = list(shapes)
    cases, sources = [], []
    for stratum, ranges in strata.items():
        low, high = ranges["m"]
        for _ in range(per_stratum):
            if not unused:
                unused = list(shapes)
            n, k, source = unused.pop(rng.randrange(len(unused)))
            case_seed = rng.randrange(10_000, 2**31)
            while case_seed in seeds:
                case_seed = rng.randrange(10_000, 2**31)
            seeds.add(case_seed)
            cases.append(asdict(Case(stratum, rng.randint(low, high), n, k, case_seed)))
            sources.append(source)
    return {"note": f"sealed panel drawn with seed {seed}; never give it to the agent", "cases": cases,
            "sources": sources}


# ----------------------------------------------------------------------------------------------------- measuring tools
FLOOR_OUTPUT_SHAPE = (16, 320)
"""The output (OUTPUT_DTYPE) that one call of bench's host floors and of qualify's synthetic callable allocates: the
visible panel's largest M with its commonest N (an allocation's host cost barely depends on its size)."""


def flop(case: Case) -> int:
    """Floating-point operations of one call: 2 M N K."""
    return 2 * case.m * case.n * case.k


# ----------------------------------------------------------------------------------------------------- the judge's
BOUND = "the fp32 bound"
"""What the oracle's tolerance is, in words: the verifier's evidence says an output is outside it."""


def references(weights: dict, inputs: list[tuple], case: Case) -> list[Reference]:
    """The oracle of each call input of ``inputs`` in one pass: the inputs stacked by rows (rows are independent)."""
    m = case.m
    ref = oracle(torch.cat([x for (x,) in inputs]), weights["weight"])
    return [Reference(ref.out[i * m:(i + 1) * m], ref.tolerance[i * m:(i + 1) * m]) for i in range(len(inputs))]


def outside_bound(outs: list[torch.Tensor], ref: Reference, case: Case) -> int:
    """How many of ``outs`` (outputs of one input, of the right structure) lie outside the bound or are not finite."""
    within = (torch.stack(outs).double() - ref.out).abs() <= ref.tolerance  # NaN compares False: counted outside
    return int((~within.flatten(1).all(dim=1)).sum())


@dataclass(frozen=True)
class Allowance:
    """The residency contract of one case (tasks/llgemm/spec.md), measured by evals/residency.py at its checkpoints:

    - total       everything the solution added <= 2*N*K + 64*N + 65536 (one re-laid copy of W and a workspace)
    - workspace   everything but the one copy (the largest storage of at most 2*N*K bytes, whatever its dtype), and
                  any bytes no object explains, <= 64*N + 65536: room for fp32 partial sums of 16 rows and a counter
                  per output tile, not for a second copy, an fp32 copy or a padded copy of W
    - copies      at most one storage of 2*N*K bytes or more, whatever its dtype (a label cannot hide a second copy,
                  even where the workspace limit would hold one)
    """
    copy: int
    workspace: int
    quoted = ("workspace_bytes",)  # (no annotation: not a field) the figures the verifier's residency gate quotes

    @classmethod
    def for_case(cls, n: int, k: int) -> "Allowance":
        return cls(2 * n * k, 64 * n + 65536)

    def exempt(self, new: list):
        """The storage taken as the one copy of W: the largest of at most 2*N*K bytes (whatever it holds: where no
        copy is kept, the largest buffer), or None. Taking the largest makes the workspace rule the most lenient
        reading of "one copy plus a workspace"."""
        return max((s for s in new if s.nbytes <= self.copy), key=lambda s: s.nbytes, default=None)

    def account(self, point, new: list) -> dict:
        """The checkpoint's figures: the exempt storage's bytes and shape, and the workspace (everything else,
        unattributed bytes included)."""
        exempt = self.exempt(new)
        workspace = sum(s.nbytes for s in new if s is not exempt) + point.unattributed_bytes
        return {"exempt_bytes": 0 if exempt is None else exempt.nbytes, "workspace_bytes": workspace,
                "exempt_shape": None if exempt is None else list(exempt.shape)}

    def audit(self, point, new: list) -> list[dict]:
        """The rules broken at one checkpoint, each with the bytes over its limit."""
        from evals.residency import over_limit

        found = point.figures or self.account(point, new)
        weight_sized = sorted((s.nbytes for s in new if s.nbytes >= self.copy), reverse=True)
        broken = [
            over_limit(point, "total", point.total_bytes, self.copy + self.workspace,
                       "retained device memory (one copy of W and the workspace)"),
            over_limit(point, "workspace", found["workspace_bytes"], self.workspace,
                       "retained storage besides one copy of W of at most 2*N*K bytes"
                       + (f" ({point.unattributed_bytes:,} bytes unattributed)" if point.unattributed_bytes else "")),
            over_limit(point, "copies", sum(weight_sized[1:]), 0,
                       f"{len(weight_sized)} storages of W's size or more (one copy allowed)"),
        ]
        return [rule for rule in broken if rule is not None]


def residency(case: Case) -> Allowance:
    """The residency allowance of ``case`` (the manifest declares the residency stage)."""
    return Allowance.for_case(case.n, case.k)
