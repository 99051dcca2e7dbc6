"""Load a solution directory (``solution.py`` plus optional helper modules) as a fresh, private package."""
from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

_counter = itertools.count()


COMPILED_SUFFIXES = (".so", ".pyd", ".pyc", ".pyo")


def resolve_solution_dir(path: str | Path) -> Path:
    """The directory holding ``solution.py``; accepts the directory or the file itself."""
    path = Path(path)
    if path.is_file() and path.name == "solution.py":
        path = path.parent
    if not (path / "solution.py").is_file():
        raise FileNotFoundError(f"no solution.py in {path}; "
                                "pass a solution directory (one holding solution.py)")
    return path.resolve()


def compiled_files(directory: Path) -> list[Path]:
    """Extension modules and bytecode under a solution: Python would import them ahead of the checked sources."""
    return sorted(p for p in directory.rglob("*") if p.suffix in COMPILED_SUFFIXES)


class PolicyViolation(ImportError):
    """The solution's source breaks the source policy (evals/policy.py); none of its code was run."""


def policy_violations(directory: Path) -> list[str]:
    from evals.policy import check_files

    return [f"{Path(file).name}:{v.line}: [{v.rule}] {v.message}"
            for file, found in check_files([directory]).items() for v in found]


def load_solution(path: str | Path, enforce_policy: bool = True, entry: str = "build") -> ModuleType:
    """Import ``solution.py`` of ``path`` under a unique package name, so helpers load with ``from . import x``
    or ``import x`` and two solutions (candidate and baseline) never share module state.

    With ``enforce_policy`` (the default) the source policy runs first and a violation raises PolicyViolation before
    any candidate code runs. Only the verifier's role process passes False: its parent has run the policy already,
    and the isolated role collects dynamic evidence against code that the policy rejected. ``entry`` is the task's
    entry point, which the module must define."""
    directory = resolve_solution_dir(path)
    if enforce_policy:
        found = policy_violations(directory)
        if found:
            raise PolicyViolation(f"the source policy rejects {directory.name}: " + "; ".join(found[:5])
                                  + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
                                  + " (.venv/bin/python -m evals.policy shows why)")
    compiled = compiled_files(directory)
    if compiled:
        raise ImportError(f"{directory} holds compiled modules ({', '.join(p.name for p in compiled[:3])}); "
                          "a solution is Python source only: remove them")
    sys.dont_write_bytecode = True  # so that no later load can pick up bytecode instead of the checked source
    package_name = f"_kloop_solution_{next(_counter)}"
    package_spec = importlib.util.spec_from_loader(package_name, loader=None, is_package=True)
    package = importlib.util.module_from_spec(package_spec)
    package.__path__ = [str(directory)]
    sys.modules[package_name] = package
    spec = importlib.util.spec_from_file_location(f"{package_name}.solution", directory / "solution.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(directory))  # bare `import helper` of a sibling file
    try:
        spec.loader.exec_module(module)
    except BaseException:
        unload_solution(module)
        raise
    finally:
        sys.path.remove(str(directory))
    if not callable(getattr(module, entry, None)):
        unload_solution(module)
        raise AttributeError(f"{directory / 'solution.py'} defines no callable {entry}() (the task's entry point)")
    return module


def unload_solution(module: ModuleType) -> None:
    """Drop the solution's package and its helper modules from ``sys.modules``."""
    package = module.__name__.rpartition(".")[0]
    directory = str(Path(module.__file__).parent)
    for name in list(sys.modules):
        loaded = sys.modules[name]
        if name == package or name.startswith(package + ".") or \
                str(getattr(loaded, "__file__", "") or "").startswith(directory + "/"):
            del sys.modules[name]
