"""The decoder that evals/e2e.py times: Llama-3 shaped, random weights (no checkpoint, no tokenizer), a static KV cache
and one decode step whose linear layers a backend serves.

Weights. Every projection of a layer (qkv fused, o, gate_up fused, down) is drawn N(0, 1/K) and quantized groupwise
(128 rows of K per scale, symmetric: codes 0..15 meaning code - 8) into the W4A16 task's encoding (qweight int32
(K // 8, N), scales fp16 (K // 128, N); tasks/w4a16/adapter.py packs and unpacks it). That store is the one source of
every backend's weights: the dense bf16 and fp16 models hold its dequantized weights, tinygemm repacks its codes with
its scales in bf16, and the W4A16 solutions take it as it is. Scales are rounded up to 4 significant bits, so every
dequantized weight (code - 8) * scale has at most 7 and is exact in fp16 and in bf16: every backend holds the very
same weight values, and each is checked against a dense model of those values in its own dtype. The embedding and
lm_head are random bf16, dense in every backend (lm_head through F.linear), as in gpt-fast's int4 model.

The step. One token per sequence at position ``pos`` (a device tensor, so that a CUDA graph replays every step):
embedding, per layer RMSNorm -> qkv -> RoPE -> the cache write -> grouped-query attention over the cache (a plain
matmul-softmax-matmul, scores in fp32, positions past ``pos`` masked) -> o + the residual -> RMSNorm -> gate_up ->
SiLU(gate) * up -> down + the residual, then RMSNorm, lm_head (fp32 logits), the greedy next token into ``tokens``
and ``pos`` + 1. Batch rows never interact. Each residual add goes into the projection's kernel where the backend
fuses it (``fuses_residual``: the W4A16 solutions), else into the RMSNorm that follows it (``Glue.add_norm``: one
kernel with the compiled glue, as a serving stack fuses add and RMSNorm).
"""
from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from evals import graph_timing
from evals import task as tasks

GROUP_SIZE = 128
SCALE_BITS = 4  # significant bits of a scale: (code - 8) * scale then fits fp16 and bf16 exactly
PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def shapes(self) -> dict[str, tuple[int, int]]:
        """(K, N) of each projection: K inputs, N outputs."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"qkv": (self.hidden, q + 2 * kv), "o": (q, self.hidden), "gate_up": (self.hidden, 2 * self.mlp),
                "down": (self.mlp, self.hidden)}

    def check(self) -> None:
        """The W4A16 encoding's rules on every projection (K % 128, N % 256) and whole query groups per KV head."""
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads}) and head_dim "
                             f"({self.head_dim}) even")
        for name, (k, n) in self.shapes().items():
            if k % GROUP_SIZE or n % 256:
                raise ValueError(f"projection {name} is K={k}, N={n}: the W4A16 encoding needs K % 128 == 0 and "
                                 "N % 256 == 0")


CONFIGS = {
    # Llama-3-8B (and 3.1): 32 layers, hidden 4096, 32 heads of 128 with 8 KV heads, MLP 14336, vocabulary 128256
    "llama3-8b": Config(32, 4096, 32, 8, 128, 14336, 128256),
    # the CPU tests' shape: every projection still K % 128 == 0 and N % 256 == 0 (qkv N = 256 + 2 * 128 = 512)
    "tiny": Config(2, 256, 4, 2, 64, 512, 512),
}


@functools.cache
def w4a16_adapter():
    """The W4A16 task's adapter (loaded once): its encoding (pack_int4, unpack_int4, dequantize) is the store's."""
    return tasks.load("w4a16").adapter


# ------------------------------------------------------------------------------------------------ the weights
@dataclass
class Projection:
    """One linear layer in the W4A16 encoding: W[k, n] = (code[k, n] - 8) * scales[k // 128, n]."""

    qweight: torch.Tensor  # int32 (K // 8, N)
    scales: torch.Tensor  # fp16 (K // 128, N), 4 significant bits

    @property
    def k(self) -> int:
        return self.qweight.shape[0] * 8

    @property
    def n(self) -> int:
        return self.qweight.shape[1]

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight (N, K), as nn.Linear holds it, in ``dtype`` (exact in fp32, fp16 and bf16)."""
        return w4a16_adapter().dequantize(self.qweight, self.scales, dtype).t().contiguous()


@dataclass
class Weights:
    config: Config
    layers: list[dict[str, Projection]]
    embed: torch.Tensor  # bf16 (vocab, hidden)
    lm_head: torch.Tensor  # bf16 (vocab, hidden)


def coarse_scales(values: torch.Tensor) -> torch.Tensor:
    """``values`` (positive) rounded up to SCALE_BITS significant bits."""
    mantissa, exponent = torch.frexp(values)
    steps = 2 ** SCALE_BITS
    return torch.ldexp(torch.ceil(mantissa * steps) / steps, exponent)


def quantize(weight: torch.Tensor) -> Projection:
    """A (K, N) fp32 weight quantized groupwise: scale = absmax / 7 of each 128 rows of a column (coarsened), code =
    round(w / scale) + 8."""
    k, n = weight.shape
    groups = weight.reshape(k // GROUP_SIZE, GROUP_SIZE, n)
    scales = coarse_scales(groups.abs().amax(dim=1).clamp_min(2.0**-14) / 7)
    codes = torch.round(groups / scales[:, None, :]).clamp(-8, 7) + 8
    return Projection(w4a16_adapter().pack_int4(codes.reshape(k, n).to(torch.int32)), scales.half())


def random_weights(config: Config, device: torch.device, seed: int = 0) -> Weights:
    """The store: every projection N(0, 1/K) then quantized; embedding N(0, 1) and lm_head N(0, 1/hidden) in bf16."""
    config.check()
    gen = torch.Generator(device=device).manual_seed(seed)

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return torch.randn((rows, cols), generator=gen, device=device) * std

    layers = [{name: quantize(normal(k, n, 1 / math.sqrt(k))) for name, (k, n) in config.shapes().items()}
              for _ in range(config.layers)]
    embed = normal(config.vocab, config.hidden, 1.0).bfloat16()
    lm_head = normal(config.vocab, config.hidden, 1 / math.sqrt(config.hidden)).bfloat16()
    return Weights(config, layers, embed, lm_head)


# ------------------------------------------------------------------------------------------------ linear layers
class Linear(Protocol):
    fuses_residual: bool  # whether the model hands it the residual stream (else the glue adds it)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x (M, K) -> x @ W (M, N) in the model's dtype, plus ``residual`` (M, N) where given."""


class Dense:
    """torch.nn.functional.linear on a dense (N, K) weight: the bf16 backend, and every reference (any dtype)."""

    fuses_residual = False

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def __call__(self, x, residual=None):
        y = F.linear(x, self.weight)
        return y if residual is None else y + residual


class Tinygemm:
    """torch's int4 weight-only matmul (tinygemm; gpt-fast's int4 path), group 128, bf16 activations. CUDA packs the
    codes two a byte (as the bench's peer does); CPU has its own packing of int32 codes (``*_for_cpu``)."""

    fuses_residual = False

    def __init__(self, projection: Projection) -> None:
        self.weight, self.scale_zero = w4a16_adapter().tinygemm_operands(projection.qweight, projection.scales)
        self.matmul = torch._weight_int4pack_mm if self.weight.is_cuda else torch._weight_int4pack_mm_for_cpu

    def __call__(self, x, residual=None):
        y = self.matmul(x, self.weight, GROUP_SIZE, self.scale_zero)
        return y if residual is None else y + residual


class W4A16:
    """A W4A16 solution's build(qweight, scales, bias, "identity"[, config]): out = x @ W + bias + residual in one
    kernel, bias zero; the residual is the block's residual stream for o and down (the add fused), else zeros.
    ``config``: tuning overrides, for a build that takes them (``--w4a16-config``)."""

    fuses_residual = True

    def __init__(self, module, projection: Projection, zeros: dict, config: dict | None = None) -> None:
        bias = torch.zeros(projection.n, dtype=torch.float16, device=projection.qweight.device)
        extra = {"config": config} if config is not None else {}
        self.fn = module.build(projection.qweight, projection.scales, bias, "identity", **extra)
        self.n, self.zeros = projection.n, zeros

    def __call__(self, x, residual=None):
        if residual is None:
            key = (x.shape[0], self.n)
            if key not in self.zeros:  # made at the first (eager) call, so a captured graph reads the same tensor
                self.zeros[key] = torch.zeros(key, dtype=torch.float16, device=x.device)
            residual = self.zeros[key]
        return self.fn(x, residual)


class LLGemm:
    """An LL-GEMM solution's build(weight) on the dense bf16 (N, K) weight: y = x @ W.T (M > 16 is its F.linear)."""

    fuses_residual = False

    def __init__(self, module, projection: Projection) -> None:
        self.weight = projection.dense(torch.bfloat16)
        self.fn = module.build(self.weight)

    def __call__(self, x, residual=None):
        y = self.fn(x)
        return y if residual is None else y + residual


class Unservable(Exception):
    """A solution whose contract cannot serve a plain linear layer."""


UNSERVABLE = ("not servable: its build takes only the contract's epilogues ({}), none of which is a plain linear "
              "layer (a W4A16 solution serves a model through epilogue \"identity\")")


def linear_maker(kind: str, module=None, config: dict | None = None) -> Callable[[Projection], Linear]:
    """``make_linear`` of a backend kind (bf16, tinygemm, w4a16, llgemm), the last two with their solution's module,
    a W4A16 one with ``config`` (tuning overrides) where given. Unservable for a W4A16 module whose ACTIVATIONS lacks
    "identity", or whose build takes no config where one is given."""
    if kind == "bf16":
        return lambda p: Dense(p.dense(torch.bfloat16))
    if kind == "tinygemm":
        return Tinygemm
    if kind == "llgemm":
        return functools.partial(LLGemm, module)
    accepted = getattr(module, "ACTIVATIONS", None)
    if accepted is not None and "identity" not in accepted:
        raise Unservable(UNSERVABLE.format(", ".join(sorted(accepted))))
    if config is not None and not takes_config(module.build):
        raise Unservable("not servable with --w4a16-config: its build(qweight, scales, bias, epilogue) takes no config")
    zeros = {}  # one zero residual per shape, shared by the backend's layers
    return lambda p: W4A16(module, p, zeros, config)


def projection_bytes(kind: str, k: int, n: int) -> int:
    """One (K, N) projection as a backend kind stores it."""
    groups = k // GROUP_SIZE
    return {"bf16": 2 * k * n, "llgemm": 2 * k * n,
            "tinygemm": k * n // 2 + groups * n * 4,  # bf16 scale and zero per group and column
            "w4a16": k * n // 2 + groups * n * 2 + 2 * n}[kind]  # fp16 scales, the zero bias


def takes_config(build: Callable) -> bool:
    """Whether a W4A16 build accepts the keyword ``config`` (a parameter of that name, or ``**kwargs``)."""
    parameters = inspect.signature(build).parameters.values()
    return any((p.name == "config" and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD for p in parameters)


def stored_bytes(kind: str, config: Config) -> int:
    """The projections as a backend kind stores them, plus the dense lm_head (2 bytes a weight in bf16 and fp16)."""
    total = sum(projection_bytes(kind, k, n) for k, n in config.shapes().values())
    return total * config.layers + 2 * config.vocab * config.hidden


# ------------------------------------------------------------------------------------------------ the glue
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x (B, heads, head_dim) at one position (cos, sin: (1, head_dim // 2)), in fp32."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rotate(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int,
           head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The qkv projection's output (B, (heads + 2 kv_heads) head_dim) split, RoPE on q and k: q (B, kv_heads,
    heads // kv_heads, head_dim), k and v (B, kv_heads, 1, head_dim). Query head h reads KV head
    h // (heads // kv_heads), as a repeat_interleave of the KV heads would."""
    batch, q_size, kv_size = qkv.shape[0], heads * head_dim, kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = rope(q.reshape(batch, heads, head_dim), cos, sin)
    k = rope(k.reshape(batch, kv_heads, head_dim), cos, sin)
    return (q.reshape(batch, kv_heads, heads // kv_heads, head_dim), k.unsqueeze(2),
            v.reshape(batch, kv_heads, 1, head_dim))


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention of q (B, kv_heads, group, head_dim) over the cache, positions not ``visible`` masked,
    scores and softmax in fp32: (B, kv_heads * group * head_dim). The products are torch.matmul's (cuBLAS's batched
    GEMMs): as fp32 multiply-sums that Inductor fuses they took 2.8x as long (reports/examples/e2e-decode)."""
    scores = torch.matmul(q, k_cache.transpose(-1, -2)).float() * q.shape[-1]**-0.5
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).to(q.dtype)
    return torch.matmul(probs, v_cache).reshape(q.shape[0], -1)


def add_norm(y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it: (y + residual, its RMSNorm)."""
    h = y + residual
    return h, rms_norm(h, weight, eps)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class Glue:
    """The step's work between the projections (RMSNorm, the residual add with it, RoPE, attention, SwiGLU), the same
    functions either eager, a kernel per torch op, or each compiled by torch.compile (Inductor), which fuses a
    function's elementwise ops into a few kernels as gpt-fast's compiled step does. The projections and the cache
    writes (index_copy_, in place) stay eager outside them: each backend's own kernels, unchanged."""

    name: str
    norm: Callable = rms_norm
    add_norm: Callable = add_norm
    rotate: Callable = rotate
    attend: Callable = attend
    swiglu: Callable = swiglu


GLUES = ("eager", "compiled")


@functools.cache
def make_glue(name: str) -> Glue:
    """The glue by name, made once: every backend of a run shares the compiled functions (and their compile cache)."""
    if name == "eager":
        return Glue(name)
    if name == "compiled":
        # fullgraph: a graph break would leave part of a function eager without saying so
        return Glue(name, *(torch.compile(f, fullgraph=True) for f in (rms_norm, add_norm, rotate, attend, swiglu)))
    raise ValueError(f"glue must be one of {', '.join(GLUES)}; got {name!r}")


# ------------------------------------------------------------------------------------------------ the model
@dataclass
class Model:
    config: Config
    dtype: torch.dtype
    layers: list[dict[str, Linear]]
    embed: torch.Tensor
    lm_head: Dense
    norm_weight: torch.Tensor  # RMSNorm weights: ones, fp32 (one tensor serves every norm)
    glue: Glue = Glue("eager")


def build_model(weights: Weights, make_linear: Callable[[Projection], Linear], dtype: torch.dtype,
                glue: Glue = Glue("eager")) -> Model:
    """The decoder in ``dtype`` with every projection served by ``make_linear``, the rest by ``glue``."""
    config = weights.config
    layers = [{name: make_linear(layer[name]) for name in PROJECTIONS} for layer in weights.layers]
    norm = torch.ones(config.hidden, dtype=torch.float32, device=weights.embed.device)
    return Model(config, dtype, layers, weights.embed.to(dtype), Dense(weights.lm_head.to(dtype)), norm, glue)


@dataclass
class State:
    """What one batch's decode steps read and write in place (a CUDA graph replays on these very tensors)."""

    tokens: torch.Tensor  # int64 (B,): this step's input token; the step leaves its greedy next token here
    pos: torch.Tensor  # int64 (1,): this step's position
    caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, K and V (B, kv_heads, max_len, head_dim)
    logits: torch.Tensor  # fp32 (B, vocab): the last step's
    cos: torch.Tensor  # fp32 (max_len, head_dim // 2)
    sin: torch.Tensor
    positions: torch.Tensor = field(repr=False)  # int64 (max_len,)

    def reset(self) -> None:
        self.pos.zero_()
        for k, v in self.caches:
            k.zero_()
            v.zero_()


def new_state(model: Model, batch: int, max_len: int) -> State:
    config, device = model.config, model.embed.device
    cache = (batch, config.kv_heads, max_len, config.head_dim)
    caches = [(torch.zeros(cache, dtype=model.dtype, device=device), torch.zeros(cache, dtype=model.dtype,
                                                                                  device=device))
              for _ in range(config.layers)]
    positions = torch.arange(max_len, device=device)
    inv_freq = config.rope_theta ** -(torch.arange(0, config.head_dim, 2, device=device).float() / config.head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return State(torch.zeros(batch, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device),
                 caches, torch.zeros((batch, config.vocab), dtype=torch.float32, device=device), angles.cos(),
                 angles.sin(), positions)


def residual_add(model: Model, linear: Linear, inp: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + linear(inp), its RMSNorm): the add in the projection's kernel where the backend fuses it, else with the
    RMSNorm in the glue."""
    glue, c = model.glue, model.config
    if linear.fuses_residual:
        h = linear(inp, x)
        return h, glue.norm(h, model.norm_weight, c.norm_eps)
    return glue.add_norm(linear(inp), x, model.norm_weight, c.norm_eps)


def attention(model: Model, layer: dict, x: torch.Tensor, normed: torch.Tensor, state: State, cache, cos, sin,
              visible) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention block on x (``normed``: its RMSNorm): x + o(GQA attention of this step's query over the cache,
    the cache written at pos), and that sum's RMSNorm."""
    c, glue = model.config, model.glue
    q, k, v = glue.rotate(layer["qkv"](normed), cos, sin, c.heads, c.kv_heads, c.head_dim)
    k_cache, v_cache = cache
    k_cache.index_copy_(2, state.pos, k)
    v_cache.index_copy_(2, state.pos, v)
    return residual_add(model, layer["o"], glue.attend(q, k_cache, v_cache, visible), x)


def feed_forward(model: Model, layer: dict, x: torch.Tensor, normed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP block: x + down(SiLU(gate) * up), and that sum's RMSNorm."""
    return residual_add(model, layer["down"], model.glue.swiglu(layer["gate_up"](normed)), x)


def decode_step(model: Model, state: State) -> None:
    """One token per sequence at ``state.pos``: logits into ``state.logits``, the greedy next token into
    ``state.tokens``, pos + 1. Only device tensors change, so a CUDA graph of it replays step after step."""
    cos, sin = state.cos[state.pos], state.sin[state.pos]
    visible = state.positions <= state.pos
    x = model.embed[state.tokens]
    normed = model.glue.norm(x, model.norm_weight, model.config.norm_eps)
    for layer, cache in zip(model.layers, state.caches):
        x, normed = attention(model, layer, x, normed, state, cache, cos, sin, visible)
        x, normed = feed_forward(model, layer, x, normed)
    logits = model.lm_head(normed).float()
    state.logits.copy_(logits)
    state.tokens.copy_(logits.argmax(dim=-1))
    state.pos.add_(1)


def linear_calls(model: Model, batch: int, names: tuple[str, ...] = PROJECTIONS) -> Callable[[], None]:
    """The served projections ``names`` of one step (every layer's), alone, on static inputs of the step's shapes, o
    and down with the residual where the backend fuses it: what a graph of the linear layers replays (their share of
    a step). lm_head is not among them: it is the same dense F.linear everywhere."""
    c, device = model.config, model.embed.device
    gen = torch.Generator(device=device).manual_seed(1)

    def static(width: int) -> torch.Tensor:
        return torch.randn((batch, width), generator=gen, device=device).to(model.dtype)

    hidden, attn, mlp, residual = static(c.hidden), static(c.heads * c.head_dim), static(c.mlp), static(c.hidden)
    inputs = {"qkv": hidden, "o": attn, "gate_up": hidden, "down": mlp}
    calls = [(layer[name], inputs[name], residual if name in ("o", "down") and layer[name].fuses_residual else None)
             for layer in model.layers for name in names]

    def run() -> None:
        for linear, x, res in calls:
            linear(x, res)

    return run


class Stepper:
    """The decode step on ``state``: with ``graphs``, its CUDA graph, captured after graph_timing's eager warm-up calls
    on a side stream (they compile, autotune and make each solution's per-M launcher); the state is then reset."""

    def __init__(self, model: Model, state: State, graphs: bool) -> None:
        self.step = functools.partial(decode_step, model, state)  # eager
        self.graph = graph_timing.Graph(self.step, [()], "decode step") if graphs else None
        state.reset()
        self.run = self.graph.run if graphs else self.step


def teacher_forced(stepper: Stepper, state: State, tokens: torch.Tensor, checked: int) -> torch.Tensor:
    """Feed ``tokens`` (B, P) one position a step; the logits of the last ``checked`` steps (checked, B, vocab)."""
    kept = []
    for t in range(tokens.shape[1]):
        state.tokens.copy_(tokens[:, t])
        stepper.run()
        if t >= tokens.shape[1] - checked:
            kept.append(state.logits.clone())
    return torch.stack(kept)
