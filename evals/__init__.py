"""The task's evaluator, run as modules from the project's venv: `.venv/bin/python -m evals.selfcheck ...`."""
import sys

SETUP_MODULES = {"torch", "triton", "numpy"}


def _missing_dependency(kind, value, traceback, previous=sys.excepthook):
    """A python without the evaluator's packages (outside the venv): one line that names make setup, no traceback."""
    if isinstance(value, ModuleNotFoundError) and (value.name or "").split(".")[0] in SETUP_MODULES:
        print(f"evals: {sys.executable} has no module {value.name!r}: run `make setup`, then use "
              "`.venv/bin/python -m evals.<module>` (or the make targets)", file=sys.stderr)
    else:
        previous(kind, value, traceback)


if sys.argv[:1] == ["-m"]:  # python -m evals.<module> is locating its module: a program, not a library import
    sys.excepthook = _missing_dependency
