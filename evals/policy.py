"""Static source policy for candidate solutions: an AST scan run before any solution code is imported.

A solution may compute with torch, triton and a few pure standard modules, and nothing else: no evaluator files,
files, sockets, processes, threads, stream changes, timers, hidden allocations or patches of shared modules. Names
are resolved through imports and simple assignments; whatever a scan cannot follow (computed names, eval,
introspection) is itself denied, so that everything an accepted file reaches is visible in its source.

Usage: .venv/bin/python -m evals.policy FILE_OR_DIR... [--json OUT]
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

RULES: dict[str, str] = {
    "syntax": "A file that does not parse cannot be checked, so it cannot be trusted.",
    "import": "A kernel needs only torch, triton and pure standard modules; any other module can reach files, "
              "processes, timers or the evaluator itself.",
    "process": "A process or compile worker can keep working after the timed region ends, or read and modify the "
               "evaluator.",
    "thread": "A thread or event loop can keep working after the timed region ends, or measure and modify the "
              "evaluator.",
    "file": "Reading files or loading native code can reach the evaluator, its panels or cached results, and writing "
            "them can change the verdict.",
    "network": "A socket can fetch answers from, or leak sealed panels to, the outside.",
    "timer": "Timers, events, profilers, sleeps and synchronization measure or distort the timed region instead of "
             "computing the result.",
    "stream": "A side stream or a CUDA graph capture moves work off the stream that the evaluator times.",
    "allocator": "Raw allocations, allocator hooks and the torch._C bindings beneath them hide memory from the "
                 "residency accounting.",
    "patch": "Changing shared modules or global torch state changes the evaluator's own timers, checks and reference.",
    "indirection": "Computed names, dynamic code and introspection hide every other rule from a source scan.",
    "evaluator": "A solution has no reason to name the evaluator's files or panels; such names only serve to read "
                 "or change them.",
}

ALLOWED_MODULES = ("torch", "triton", "math", "functools", "typing", "dataclasses", "__future__", "itertools",
                   "enum", "collections", "operator", "numbers")


def _by_rule(**groups: str) -> dict[str, str]:
    return {name: rule for rule, names in groups.items() for name in names.split()}


# Modules outside the allowlist whose purpose names a more specific rule than "import".
MODULE_RULES = _by_rule(
    process="os subprocess multiprocessing pty signal posix _posixsubprocess",
    thread="threading _thread concurrent asyncio sched",
    file="io pathlib shutil tempfile pickle marshal glob fileinput mmap shelve sqlite3 zipfile tarfile linecache "
         "json csv",
    network="socket ssl http urllib requests ftplib smtplib select selectors socketserver xmlrpc",
    timer="time timeit datetime resource cProfile profile tracemalloc",
    indirection="importlib builtins inspect types code codeop runpy pkgutil",
    # "import" names only matter as attribute and string names below; any unlisted module gets that rule.
    **{"import": "sys gc ctypes"},
)

# Qualified names under the allowed modules; the longest listed prefix of a name decides its rule.
DENIED_NAMES = _by_rule(
    stream="torch.Stream torch.cuda.Stream torch.cuda.stream torch.cuda.set_stream torch.cuda.ExternalStream "
           "torch.cuda.StreamContext torch.cuda.default_stream torch.cuda.streams torch.cuda.graph torch.cuda.graphs "
           "torch.cuda.CUDAGraph torch.cuda.make_graphed_callables torch.cuda.graph_pool_handle "
           "torch.accelerator.set_stream",
    timer="torch.Event torch.cuda.Event torch.cuda._sleep torch.cuda.synchronize torch.accelerator.synchronize "
          "torch.cuda.set_sync_debug_mode torch.profiler torch.autograd.profiler torch.utils.benchmark "
          "triton.testing triton.profiler",
    file="torch.load torch.save torch.from_file torch.hub torch.utils.cpp_extension torch.utils.data "
         "torch.ops.load_library torch.classes.load_library torch.jit.load torch.jit.save torch.package "
         "torch.serialization torch.cuda.tunable triton.runtime.cache triton.tools",
    process="torch.multiprocessing torch.distributed torch.compile torch.compiler torch._dynamo torch._inductor "
            "triton.runtime.build",
    allocator="torch._C torch.cuda.cudart torch.cuda.caching_allocator_alloc torch.cuda.caching_allocator_delete "
              "torch.cuda.memory torch.cuda.change_current_allocator torch.cuda.MemPool torch.cuda.use_mem_pool "
              "torch.cuda.CUDAPluggableAllocator",
    patch="torch.library torch._library torch.overrides torch.set_default_dtype torch.set_default_device "
          "torch.set_default_tensor_type torch.set_float32_matmul_precision torch.set_flush_denormal",
    indirection="operator.attrgetter operator.methodcaller typing.get_type_hints typing.ForwardRef "
                "torch.ops.import_module",
    # Test and utility trees that hold helpers which shell out or open files (collect_env.run, tensorboard).
    **{"import": "torch.utils torch.testing"},
)

# Exact names under a denied prefix that a kernel may use (the name itself, nothing under it): triton.tools' host-side
# tensor descriptor is a plain dataclass (a base tensor, its shape, strides and block), while the rest of
# triton.tools compiles, links and disassembles through files and processes.
ALLOWED_UNDER_DENIED = frozenset(("triton.tools.tensor_descriptor", "triton.tools.tensor_descriptor.TensorDescriptor"))

# Attribute names denied on any receiver: they catch objects that alias resolution cannot follow (torch.os,
# a module kept in a list, torch.get_device_module(), a stream returned by a call). Tensor.select stays usable.
ATTR_RULES = {name: rule for name, rule in MODULE_RULES.items() if name != "select"} | _by_rule(
    stream="Stream ExternalStream StreamContext set_stream default_stream CUDAGraph make_graphed_callables "
           "graph_pool_handle wait_stream wait_event record_stream",
    timer="Event synchronize elapsed_time sleep _sleep set_sync_debug_mode perf_counter perf_counter_ns monotonic "
          "monotonic_ns process_time time_ns do_bench do_bench_cudagraph globaltimer",
    file="open from_file load_library load_inline cpp_extension",
    patch="as_subclass _make_subclass _make_wrapper_subclass",
    process="system popen Popen fork _dynamo _inductor",
    allocator="_C cudart caching_allocator_alloc caching_allocator_delete change_current_allocator MemPool "
              "use_mem_pool _record_memory_history CUDAPluggableAllocator",
)

# Attributes that lead from any object to globals, builtins, frames, code or the import system.
ESCAPE_ATTRS = frozenset(
    "__globals__ __subclasses__ __class__ __bases__ __base__ __mro__ __dict__ __code__ __closure__ __getattribute__ "
    "__getattr__ __setattr__ __delattr__ __loader__ __spec__ __builtins__ __import__ __self__ __func__ __wrapped__ "
    "__reduce__ __reduce_ex__ __doc__ f_globals f_locals f_builtins f_back gi_frame cr_frame ag_frame tb_frame".split())

# Builtins that reach code, namespaces or files; any reference counts, so that `run = eval` is caught too.
BUILTIN_RULES = _by_rule(indirection="__import__ eval exec compile globals locals vars breakpoint getattr",
                         file="open", patch="setattr delattr",
                         # these end the evaluator's process or slip past its `except Exception` records
                         process="exit quit SystemExit KeyboardInterrupt GeneratorExit BaseException")

# Methods that make a class intercept every torch call, the evaluator's reference included.
TORCH_HOOKS = frozenset(("__torch_function__", "__torch_dispatch__"))

DENIED_STRINGS = frozenset(MODULE_RULES) | frozenset(ATTR_RULES) | frozenset(BUILTIN_RULES)
EVALUATOR_MARKERS = re.compile(r"(?<![a-z])evals(?![a-z])|kernel_harness|selfcheck|verifier|residency|visible_cases"
                               r"|smoke_cases|problems/|\.json|experiment_log|/proc|/dev/"
                               r"|(?<![a-z])tasks/|panels")  # the tasks' folders: manifests, adapters, panels
TIMER_MARKERS = re.compile(r"%globaltimer|%clock")
MAX_ALIAS_DEPTH = 8  # dots in a resolved name; bounds self-referential aliases such as `a = a.b`


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    message: str

    @property
    def rationale(self) -> str:
        return RULES[self.rule]

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "rationale": self.rationale}


def _denied_rule(qualname: str) -> str | None:
    if qualname in ALLOWED_UNDER_DENIED:
        return None
    parts = qualname.split(".")
    for end in range(len(parts), 0, -1):
        rule = DENIED_NAMES.get(".".join(parts[:end]))
        if rule:
            return rule
    return None


def _is_installed(name: str) -> bool:
    # A bare `import name` finds an installed module before a sibling file of that name, at least once imported.
    try:
        return name in sys.stdlib_module_names or importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True


def _literal_getattr_name(node: ast.AST) -> str | None:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr]]:
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        return [pair for t, v in zip(target.elts, value.elts) for pair in _pairs(t, v)]
    return []


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module, local_modules: frozenset[str]) -> None:
        # Relative imports always reach the siblings; a bare `import name` only when no installed module wins.
        self.siblings = local_modules
        self.local_modules = frozenset(m for m in local_modules if m not in ALLOWED_MODULES and not _is_installed(m))
        self.violations: list[Violation] = []
        self.docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                           if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                           and node.body and isinstance(node.body[0], ast.Expr)
                           and isinstance(node.body[0].value, ast.Constant)}
        self.aliases: dict[str, set[str]] = {}
        self._collect_aliases(tree)

    def report(self, rule: str, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(rule, getattr(node, "lineno", 0), message))

    # Name resolution: one scope-blind map from each name to every qualified name it may be bound to. Local
    # modules resolve to ".name" so that they never collide with torch or triton names.
    def _module_qualname(self, name: str, level: int = 0) -> str:
        return "." + name if level or name.split(".")[0] in self.local_modules else name

    def _collect_aliases(self, tree: ast.Module) -> None:
        assignments: list[tuple[str, ast.expr]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.split(".")[0]
                    self.aliases.setdefault(alias.asname or bound, set()).add(self._module_qualname(bound))
            elif isinstance(node, ast.ImportFrom):
                module = self._module_qualname(node.module, node.level) if node.module else ""
                for alias in node.names:  # no module means `from . import name`
                    qualname = f"{module}.{alias.name}" if module else "." + alias.name
                    self.aliases.setdefault(alias.asname or alias.name, set()).add(qualname)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    assignments += _pairs(target, node.value)
            elif isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List, ast.Set)):
                assignments += [pair for element in node.iter.elts for pair in _pairs(node.target, element)]
            elif isinstance(node, ast.arguments):
                positional = node.posonlyargs + node.args
                assignments += zip([a.arg for a in positional[len(positional) - len(node.defaults):]], node.defaults)
                assignments += [(a.arg, d) for a, d in zip(node.kwonlyargs, node.kw_defaults) if d is not None]
        changed = True
        while changed:  # aliases of aliases, bound in any order; the depth bound makes this terminate
            changed = False
            for name, value in assignments:
                known = self.aliases.setdefault(name, set())
                new = {q for q in self.resolve(value) if q.count(".") <= MAX_ALIAS_DEPTH} - known
                known |= new
                changed = changed or bool(new)

    def resolve(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, set())
        if isinstance(node, ast.Attribute):
            return {f"{q}.{node.attr}" for q in self.resolve(node.value)}
        name = _literal_getattr_name(node)
        return {f"{q}.{name}" for q in self.resolve(node.args[0])} if name is not None else set()

    def _rooted_in_shared_module(self, node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and any(not q.startswith(".") for q in self.aliases.get(node.id, ()))

    def _check_access(self, qualnames: set[str], attr: str, node: ast.AST) -> bool:
        """Report a denied name or attribute; True when the whole chain was denied, so its parts need no visit."""
        for qualname in sorted(qualnames):
            rule = _denied_rule(qualname)
            if rule:
                self.report(rule, node, f"use of '{qualname}' is not allowed")
                return True
        if attr in ESCAPE_ATTRS:
            self.report("indirection", node, f"attribute '{attr}' is an escape hatch to globals, builtins or code")
        elif attr in ATTR_RULES:
            self.report(ATTR_RULES[attr], node, f"attribute '{attr}' is not allowed on any object")
        return False

    # Imports
    def _check_module(self, name: str, node: ast.AST) -> None:
        root = name.split(".")[0]
        if root in ALLOWED_MODULES:
            rule = _denied_rule(name)
            if rule:
                self.report(rule, node, f"import of '{name}' is not allowed")
        elif root not in self.local_modules:
            shadowed = root in self.siblings
            hint = f" (a sibling {root}.py does not count: '{root}' is an installed module)" if shadowed else ""
            self.report(MODULE_RULES.get(root, "import"), node,
                        f"import of '{name}' is not allowed: solutions may import {', '.join(ALLOWED_MODULES)} "
                        f"and their own sibling modules{hint}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if any(alias.name == "*" for alias in node.names):
            self.report("import", node, "star imports hide which names a solution uses; import the names one by one")
        if node.level > 1:
            self.report("import", node, "relative imports may only reach the solution's own directory")
        elif node.level == 1:
            for module in [node.module] if node.module else [alias.name for alias in node.names]:
                if module.split(".")[0] not in self.siblings:
                    self.report("import", node, f"relative import of '.{module}' names no module checked with this "
                                                "file; check the solution's whole directory")
        else:
            self._check_module(node.module, node)
            for alias in node.names:
                if alias.name != "*":
                    self._check_access({f"{node.module}.{alias.name}"}, alias.name, node)

    # Names, attributes, calls, definitions and strings
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "builtins"):
            writes = isinstance(node.ctx, (ast.Store, ast.Del))
            self.report("patch" if writes else "indirection", node, f"name '{node.id}' reaches every builtin")
        elif isinstance(node.ctx, ast.Load) and node.id in BUILTIN_RULES:
            self.report(BUILTIN_RULES[node.id], node, f"builtin '{node.id}' is not allowed"
                        + (" (only getattr(obj, 'literal_name') is)" if node.id == "getattr" else ""))
        elif isinstance(node.ctx, ast.Load):
            self._check_access(self.resolve(node), "", node)

    def _check_write(self, node: ast.Attribute | ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            return
        if self._rooted_in_shared_module(node.value):
            self.report("patch", node, f"assigning or deleting '{ast.unparse(node)}' patches a shared module")
        elif isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "self"
                                                      and not node.attr.startswith("__")):
            # an object reached through a call, a subscript or a plain name may be torch itself (`f().isfinite = g`)
            self.report("patch", node, f"assigning or deleting '{ast.unparse(node)}': a solution may set attributes "
                                       "only on self (self.name = ...)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        reads = isinstance(node.ctx, ast.Load)
        if not self._check_access(self.resolve(node) if reads else set(), node.attr, node):
            self._check_write(node)
            self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self._check_write(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "input")):
            self.generic_visit(node)
            return
        name = _literal_getattr_name(node)
        if node.func.id == "input":
            self.report("indirection", node, "builtin 'input' is not allowed")
        elif name is None:
            self.report("indirection", node, "getattr with a computed attribute name is not allowed")
        else:
            self._check_access(self.resolve(node), name, node)
        for child in node.args + node.keywords:
            self.visit(child)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:  # `case object(__globals__=g)` reads an attribute by name
            self._check_access(set(), name, node)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            for qualname in sorted(self.resolve(base)):
                if qualname.split(".")[0] in ("torch", "triton") and qualname != "torch.nn.Module":
                    self.report("patch", node, f"class '{node.name}' subclasses '{qualname}': a subclass can override "
                                               "the very operations the evaluator checks outputs with")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in TORCH_HOOKS:
            self.report("patch", node, f"defining '{node.name}' intercepts torch calls, the evaluator's included")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) in self.docstrings or not isinstance(node.value, (str, bytes)):
            return
        text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
        parts = text.split(".") if re.fullmatch(r"[A-Za-z_][\w.]*", text) else [text]
        qualified = parts[0] in DENIED_STRINGS or parts[0] in ALLOWED_MODULES  # "os.system", not PTX "membar.sys"
        if text in DENIED_STRINGS or (qualified and DENIED_STRINGS.intersection(parts)):
            self.report("indirection", node, f"string {text!r} names a denied module or attribute")
        elif any(name in text for name in ESCAPE_ATTRS):
            self.report("indirection", node, f"string {text[:60]!r} names an escape-hatch attribute")
        if EVALUATOR_MARKERS.search(text.lower()):
            self.report("evaluator", node, f"string {text[:60]!r} names an evaluator file or panel")
        if TIMER_MARKERS.search(text):
            self.report("timer", node, f"string {text[:60]!r} reads a GPU clock register")


def check_source(source: str, filename: str = "<source>",
                 local_modules: frozenset[str] = frozenset()) -> list[Violation]:
    """Every policy violation in one file's source, sorted by line; never raises for bad input."""
    try:
        tree = ast.parse(source, filename=filename)
        checker = _Checker(tree, frozenset(local_modules))
        checker.visit(tree)
    except SyntaxError as error:
        return [Violation("syntax", error.lineno or 0, f"cannot parse {filename}: {error.msg}")]
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, absurd nesting
        return [Violation("syntax", 0, f"cannot parse {filename}: {type(error).__name__} {error}".rstrip())]
    return sorted(set(checker.violations), key=lambda v: (v.line, v.rule, v.message))


def check_files(paths: list[Path]) -> dict[str, list[Violation]]:
    """Violations per checked file. A directory means its *.py files, which may import one another; a file checked
    alone may import no sibling, since its siblings are not checked with it."""
    results: dict[str, list[Violation]] = {}
    for path in map(Path, paths):
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        local_modules = frozenset(f.stem for f in files if f.stem != "__init__") if path.is_dir() else frozenset()
        for file in files:
            try:
                source = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as error:
                results[str(file)] = [Violation("syntax", 0, f"{file} is not UTF-8 text: {error.reason}")]
                continue
            results[str(file)] = check_source(source, str(file), local_modules)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m evals.policy", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="solution .py files or directories that hold them")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write {clean, files} as JSON to OUT")
    args = parser.parse_args(argv)
    unusable = [str(p) for p in args.paths if not p.exists() or (p.is_dir() and not any(p.glob("*.py")))]
    if unusable:
        print(f"policy: no such file, or no *.py in directory: {', '.join(unusable)}; pass solution .py files or "
              "the directories that hold them (e.g. methods/main)", file=sys.stderr)
        return 2
    results = check_files(args.paths)
    for file, violations in results.items():
        for v in violations:
            print(f"{file}:{v.line}: [{v.rule}] {v.message}\n    why: {v.rationale}")
    dirty = sum(1 for violations in results.values() if violations)
    total = sum(len(violations) for violations in results.values())
    print(f"policy: {total} violation(s) in {dirty} of {len(results)} file(s)" if dirty
          else f"policy: {len(results)} file(s) clean")
    if args.json:
        report = {"clean": not dirty, "files": {f: [v.to_dict() for v in vs] for f, vs in results.items()}}
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
