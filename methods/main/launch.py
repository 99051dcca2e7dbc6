"""The host path: one call per M, built once from the plan, that allocates the output and launches one kernel.

On CUDA the kernel is compiled for the M at its first call (``warmup`` specializes on the real arguments: 16-byte
aligned pointers, M's divisibility by 16) and later calls go straight to the C entry of the compiled kernel's launcher
on the current stream (``compiled_launcher``). The launcher of triton 3.6 takes every kernel parameter in declaration
order, constexpr ones included (their values are parsed and ignored), exactly as ``JITFunction.run`` passes them.
Elsewhere (the CPU interpreter) a call is the normal ``kernel[grid](...)`` dispatch. Where a call's host time goes,
and the least the contract allows (a fresh output and one launch): reports/examples/h200-host-path.
"""
import functools

import torch
import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from .kernels import w4a16_splitk_kernel, w4a16_stream_kernel
from .ws import shared_layouts, w4a16_ws_kernel, words_layout


def make_call(cfg, M, K, N, activation, weights, x, residual, check):
    """``call(x, residual) -> out`` for one M. ``weights`` is (words, scales, bias); ``x`` and ``residual`` are a
    call's real arguments (what the compiled kernel specializes on); ``check(x, residual)`` returns them fit for the
    kernel (contiguous, aligned copies where needed) or raises with what is wrong. A split tile or a stream-K grid
    keeps an fp32 (M, N) accumulator and one counter per tile, both left at zero by every launch."""
    stream = cfg["GRID"] == 1
    tiles = cfg["M_TILES"] * cfg["N_TILES"]
    device = x.device
    kept = None
    if keeps_accumulator(cfg):
        kept = (torch.zeros((M, N), dtype=torch.float32, device=device),
                torch.zeros(tiles, dtype=torch.int32, device=device))
    compiled = device.type == "cuda" and isinstance(w4a16_splitk_kernel, JITFunction)
    # the warp-specialized loop (Gluon, Hopper's wgmma and copy engine); elsewhere, the interpreter included, the
    # split-K kernel below runs the plan
    if cfg["WS"] and compiled and torch.cuda.get_device_capability(device)[0] == 9:
        return ws_call(cfg, M, K, N, activation, weights, kept, x, residual, check)
    dequant = cfg["DEQUANT"] if compiled else 1  # inline PTX needs a compiled kernel: the interpreter runs pure Triton
    blocks = (cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"])
    if stream:
        kernel, tail = w4a16_stream_kernel, (M, N, K, activation, cfg["SCALE_AFTER_DOT"], dequant, *blocks)
        grid = (max(1, cfg["PROGRAMS"]), 1, 1)  # PROGRAMS 0: set below from what the compiled kernel fits at once
    else:
        kernel = w4a16_splitk_kernel
        tail = (M, N, K, activation, cfg["SPLIT_K"], cfg["SCALE_AFTER_DOT"], dequant, *blocks)
        grid = (tiles, cfg["SPLIT_K"], 1)
    options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    if cfg["MAXNREG"]:
        options["maxnreg"] = cfg["MAXNREG"]
    if not compiled:
        return interpreted_call(kernel, grid, options, (M, N), weights, kept, tail, check)
    out = torch.empty((M, N), dtype=torch.float16, device=device)
    accumulator, counters = kept or (out, out)
    # warmup compiles without launching: the accumulator and the counters stay at zero
    compiled_kernel = kernel.warmup(x, *weights, residual, out, accumulator, counters, *tail, grid=grid, **options)
    if stream and cfg["PROGRAMS"] <= 0:
        steps = tiles * (K // cfg["BLOCK_SIZE_K"])
        grid = (min(steps, resident_programs(compiled_kernel, cfg["num_warps"], device.index)), 1, 1)
    launcher = compiled_launcher(compiled_kernel, grid, device.index)
    return address_call(launcher, grid, (M, K), (M, N), device, weights, kept, tail, check)


def ws_call(cfg, M, K, N, activation, weights, kept, x, residual, check):
    """WS 1 on compiled CUDA (Hopper): ``ws.w4a16_ws_kernel`` with the plan's split, on the lean host path
    (``fit_pointers`` instead of the full check, integer addresses). The descriptors of the words and the scales are
    made and encoded once, here; x's on each call, as a ``Based`` (no checks: ``fit_pointers`` or ``check`` has made
    x what it needs). Triton's own launcher encodes every descriptor on every call (``descriptor_call``, where
    ``encoded_launcher`` cannot make one for the encoded arguments; 17.8-36.9 us of host a call against 13.8-23.4:
    reports/examples/h200-host-margin)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as Descriptor
    words, scales, bias = weights
    block_m, block_n, block_k = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
    q_layout, x_layout, s_layout = shared_layouts(block_m, block_n, block_k)
    q_desc = Descriptor.from_tensor(words.view(-1, block_k // 8), [block_n, block_k // 8], q_layout)
    s_desc = Descriptor.from_tensor(scales, [1, block_n], s_layout)
    x_desc = Descriptor(x, [M, K], [K, 1], [block_m, block_k], x_layout)
    grid = (cfg["M_TILES"] * cfg["N_TILES"], cfg["SPLIT_K"], 1)
    # the constexprs in declaration order: the launcher takes them with the other arguments
    constants = {"ACTIVATION": activation, "SPLIT_K": cfg["SPLIT_K"], "BLOCK_M": block_m, "BLOCK_N": block_n,
                 "BLOCK_K": block_k, "STAGES": cfg["WS_STAGES"], "WORDS_LAYOUT": words_layout(block_n)}
    options = {"num_warps": block_n // 16}
    if cfg["WS_MAXNREG"]:
        options["maxnreg"] = cfg["WS_MAXNREG"]
    device = x.device
    out = torch.empty((M, N), dtype=torch.float16, device=device)
    accumulator, counters = kept or (out, out)
    compiled_kernel = w4a16_ws_kernel.warmup(q_desc, x_desc, s_desc, bias, residual, out, accumulator, counters, M, N,
                                             K, grid=grid, **constants, **options)
    tail = (M, N, K, *constants.values())
    encoded = encoded_launcher(compiled_kernel, device.index)
    if encoded is not None:
        return encoded_call(*encoded, grid, (q_desc, x_desc, s_desc), (M, K), (M, N), device, bias, kept, tail, check)
    launcher = compiled_launcher(compiled_kernel, grid, device.index)
    return descriptor_call(launcher, grid, (q_desc, x_desc, s_desc), (M, K), (M, N), device, bias, kept, tail, check)


def descriptor_call(launcher, grid, descriptors, x_shape, out_shape, device, bias, kept, tail, check):
    """The warp-specialized kernel's call through triton's own launcher: ``address_call``'s guard and bare addresses,
    with the words', x's and the scales' descriptors first. x's descriptor is made for each call (a ``Based`` with
    the shape, strides and padding of the one the kernel was compiled for), so nothing holds a caller's x after its
    call and concurrent calls never share one; the call holds the accumulator and counters behind their addresses,
    as ``address_call`` does."""
    q_desc, x_desc, s_desc = descriptors
    x_dims, x_strides, padding = list(x_desc.shape), list(x_desc.strides), x_desc.padding
    b_ptr = bias.data_ptr()
    a_ptr, c_ptr = (kept[0].data_ptr(), kept[1].data_ptr()) if kept else (0, 0)
    device_index = device.index
    entry, rest, stream = launcher
    g0, g1, g2 = grid

    def call(x, residual):
        ptrs = fit_pointers(x, residual, x_shape, out_shape, device_index)
        if ptrs is None:
            x, residual = check(x, residual)
            ptrs = x.data_ptr(), residual.data_ptr()
        out = torch.empty_like(residual)
        o_ptr = out.data_ptr()
        entry(g0, g1, g2, stream(), *rest, q_desc, Based(x, x_dims, x_strides, padding), s_desc, b_ptr, ptrs[1], o_ptr,
              a_ptr if kept else o_ptr, c_ptr if kept else o_ptr, *tail)
        return out
    return call


def encoded_call(launcher, encode, metas, grid, descriptors, x_shape, out_shape, device, bias, kept, tail, check):
    """As ``descriptor_call``, but the words' and the scales' descriptors are encoded once, here (the
    tensors behind them are build's and never move), and only x's on each call: ``encode(descriptor, meta)`` with
    the i-th descriptor's ``metas[i]`` (what triton's launcher does for every descriptor on every call). ``launcher``
    is the C entry for the encoded arguments (``encoded_launcher``). The encoded maps hold bare addresses, as
    ``address_call``'s do: build holds the words and the scales behind them."""
    q_desc, x_desc, s_desc = descriptors
    q_args, s_args, x_meta = encode(q_desc, metas[0]), encode(s_desc, metas[2]), metas[1]
    x_dims, x_strides, padding = list(x_desc.shape), list(x_desc.strides), x_desc.padding
    b_ptr = bias.data_ptr()
    a_ptr, c_ptr = (kept[0].data_ptr(), kept[1].data_ptr()) if kept else (0, 0)
    device_index = device.index
    entry, rest, stream = launcher
    g0, g1, g2 = grid

    def call(x, residual):
        ptrs = fit_pointers(x, residual, x_shape, out_shape, device_index)
        if ptrs is None:
            x, residual = check(x, residual)
            ptrs = x.data_ptr(), residual.data_ptr()
        out = torch.empty_like(residual)
        o_ptr = out.data_ptr()
        entry(g0, g1, g2, stream(), *rest, *q_args, *encode(Based(x, x_dims, x_strides, padding), x_meta), *s_args,
              b_ptr, ptrs[1], o_ptr, a_ptr if kept else o_ptr, c_ptr if kept else o_ptr, *tail)
        return out
    return call


def encoded_signature(signature, tensordesc_meta):
    """A kernel's launcher signature (its parameters' types in order) with each tensor descriptor spelled as the
    arguments its encoding gives (``nvTmaDesc``, then the dims as i32 and the strides as i64), which is how triton
    3.6's ``make_launcher`` expands a descriptor lowered to the copy engine; None when a descriptor is not lowered so
    (no metadata of its own)."""
    metas = iter(tensordesc_meta or ())
    expanded = []
    for ty in signature:
        if isinstance(ty, str) and ty.startswith("tensordesc"):
            if next(metas, None) is None:
                return None
            ndim = ty[ty.index("[") + 1:ty.index("]")].count(",") + 1
            expanded += ["nvTmaDesc"] + ["i32"] * ndim + ["i64"] * ndim
        else:
            expanded.append(ty)
    return expanded


class _EncodedSource:
    """What triton's launcher class reads of a kernel's source (``constants``, ``signature``, ``fn.arg_names``),
    with the descriptors spelled as their encoded arguments: the launcher it makes has no per-call encoding."""

    def __init__(self, src, signature):
        self.constants, self.fn = getattr(src, "constants", {}), src.fn
        self.signature = dict(enumerate(signature))


def encoded_launcher(kernel, device_index):
    """``(launcher, encode, metas)`` for a compiled kernel with tensor descriptor parameters: ``launcher`` is
    ``compiled_launcher``'s (entry, rest, stream) with the C entry of a launcher made for the encoded arguments (the
    same source triton makes for the kernel, so the same cached module); ``encode(descriptor, metas[i])`` gives the
    i-th descriptor's encoded arguments. None where that cannot be made (another triton, a descriptor not on the copy
    engine, scratch to allocate): the caller takes the normal path."""
    try:
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except ImportError:
        return None
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    try:
        kernel._init_handles()
        metadata, src, run = kernel.metadata, kernel.src, kernel.run
        metas = metadata.tensordesc_meta
        signature = encoded_signature(list(src.signature.values()), metas)
        if signature is None or run.global_scratch_size != 0 or run.profile_scratch_size != 0:
            return None
        # the metadata (a named tuple) less the descriptors' metadata: their arguments come encoded
        launcher = driver.active.launcher_cls(_EncodedSource(src, signature), metadata._replace(tensordesc_meta=None))
    except (AttributeError, TypeError, KeyError, ValueError):  # another triton: the normal path
        return None
    rest = (kernel.function, launcher.launch_cooperative_grid, launcher.launch_pdl, None, None,
            kernel.packed_metadata, None, None, None)
    return (launcher.launch, rest, current_stream(device_index)), make_tensordesc_arg, metas


class Based:
    """A tensor descriptor as triton 3.6's launcher reads it (base, shape, strides, padding) and nothing more: made
    per call for that call's x, where the kernel was compiled for a real descriptor of the same shape, strides,
    block and layout, whose checks ``fit_pointers`` (or ``check``) stands in for."""
    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base, shape, strides, padding):
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


def keeps_accumulator(cfg):
    """Whether a plan's tiles meet in the kept accumulator: split tiles, or a stream-K grid."""
    return cfg["GRID"] == 1 or cfg["SPLIT_K"] > 1


def interpreted_call(kernel, grid, options, out_shape, weights, kept, tail, check):
    words, scales, bias = weights

    def call(x, residual):
        x, residual = check(x, residual)
        out = torch.empty(out_shape, dtype=torch.float16, device=x.device)
        accumulator, counters = kept or (out, out)
        kernel[grid](x, words, scales, bias, residual, out, accumulator, counters, *tail, **options)
        return out
    return call


def fit_pointers(x, residual, x_shape, out_shape, device_index):
    """x's and residual's addresses where both are what the compiled kernel assumes (fp16, the call's shapes,
    contiguous, on the device, 16-byte aligned: the copy engine's alignment too), else None; a few attribute reads,
    each address read once (and only of tensors that passed the rest), cheaper than the full check."""
    f16 = torch.float16
    try:
        if not (x.dtype is f16 and residual.dtype is f16 and x.shape == x_shape and residual.shape == out_shape
                and x.is_contiguous() and residual.is_contiguous() and x.get_device() == device_index
                and residual.get_device() == device_index):
            return None
        x_ptr, r_ptr = x.data_ptr(), residual.data_ptr()
    except AttributeError:  # not a tensor: the full check says what it is
        return None
    return None if (x_ptr | r_ptr) & 15 else (x_ptr, r_ptr)


def address_call(launcher, grid, x_shape, out_shape, device, weights, kept, tail, check):
    """The lean host path: integer addresses straight to the launcher's C entry (``compiled_launcher``), skipping a
    data_ptr() call and a driver pointer query per tensor argument (4.5-6 us of host a call:
    reports/examples/h200-stability). The weights' and the accumulator's addresses are taken once, here: build holds
    the weights, and this closure ``kept`` (it reads it on every call, so the tensors behind the addresses live as
    long as the call). A bare address says nothing of its tensor, so each call first asks ``fit_pointers``; where it
    says no, ``check`` decides (a copy fit for the kernel, or a clear error)."""
    w_ptr, s_ptr, b_ptr = (w.data_ptr() for w in weights)
    a_ptr, c_ptr = (kept[0].data_ptr(), kept[1].data_ptr()) if kept else (0, 0)
    device_index = device.index
    entry, rest, stream = launcher
    g0, g1, g2 = grid

    def call(x, residual):
        ptrs = fit_pointers(x, residual, x_shape, out_shape, device_index)
        if ptrs is None:
            x, residual = check(x, residual)
            ptrs = x.data_ptr(), residual.data_ptr()
        out = torch.empty_like(residual)  # (M, N) fp16 contiguous on the device: cheaper than torch.empty's arguments
        o_ptr = out.data_ptr()
        entry(g0, g1, g2, stream(), *rest, ptrs[0], w_ptr, s_ptr, b_ptr, ptrs[1], o_ptr, a_ptr if kept else o_ptr,
              c_ptr if kept else o_ptr, *tail)
        return out
    return call


def compiled_launcher(kernel, grid, device_index):
    """``(entry, rest, stream)`` for a compiled kernel: ``entry(g0, g1, g2, stream(), *rest, *args)`` launches it
    with ``grid`` = (g0, g1, g2) on the device's current stream, ``args`` being every kernel parameter in order.

    Where the kernel needs no global or profile scratch (triton 3.6), ``entry`` is the launcher's C entry itself and
    ``rest`` what CudaLauncher.__call__ passes it (the function, the cooperative and PDL flags, no scratch, the packed
    metadata, no hooks): no per-call device query or launch-hook lookup (so launch hooks, such as a profiler's, do not
    see these launches), and for a kernel without descriptor parameters no Python between a call and the driver's
    launch (with them the entry is triton's wrapper that encodes each descriptor). With scratch to allocate, the
    launcher object; on other triton versions, the public ``kernel[grid]`` (which finds the stream itself).
    """
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    stream = current_stream(device_index)
    init = getattr(kernel, "_init_handles", None)
    if init is not None:
        init()  # loads the module and sets function and run
    run, function = getattr(kernel, "run", None), getattr(kernel, "function", None)
    packed = getattr(kernel, "packed_metadata", None)
    if init is None or run is None or function is None or packed is None:
        public = kernel[grid]
        return (lambda g0, g1, g2, stream, *args: public(*args)), (), stream
    entry = getattr(run, "launch", None)
    if entry is not None and getattr(run, "global_scratch_size", None) == 0 \
            and getattr(run, "profile_scratch_size", None) == 0:
        return entry, (function, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None,
                       None), stream
    return run, (function, packed, None, None, None), stream


def current_stream(device_index):
    """The device's current stream, as a call's launch reads it (a stream the caller set is the one launched on)."""
    return functools.partial(driver.active.get_current_stream, device_index)


def resident_programs(kernel, num_warps, device_index):
    """How many programs of a compiled kernel the whole GPU holds at once."""
    if hasattr(kernel, "result"):
        kernel = kernel.result()
    kernel._init_handles()
    props = driver.active.utils.get_device_properties(device_index)
    return props["multiprocessor_count"] * programs_per_sm(kernel.n_regs, kernel.metadata.shared, num_warps,
                                                           props["max_shared_mem"])


def programs_per_sm(regs_per_thread, shared_bytes, num_warps, max_shared, regs_per_sm=65536, max_warps=64):
    """Programs per SM as registers (allocated per warp in units of 256), shared memory (1 KiB reserved per block)
    and the 64-warp limit allow."""
    regs_per_warp = triton.cdiv(max(1, regs_per_thread) * 32, 256) * 256
    by_regs = regs_per_sm // (regs_per_warp * num_warps)
    by_shared = (max_shared + 1024) // (shared_bytes + 1024)
    return max(1, min(by_regs, by_shared, max_warps // num_warps))
