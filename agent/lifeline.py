"""The leader of an evaluator command's process group: ``python lifeline.py COMMAND...``.

``runner.run_command`` starts each command in a session of its own, so that a timeout can kill the whole group. A
group outlives the agent, though: were the agent killed (kill -9, an OOM kill, a closed terminal), an evaluator would
run on, timing its panel on the GPU while a resumed run times its own. This leader runs the command in its group and
asks Linux for a signal when the agent (its parent) dies (``PR_SET_PDEATHSIG``); on it, it kills the group, itself
included. Otherwise it only waits and exits as the command did: the same status, or the same signal.

Run as a script, not as ``-m agent.lifeline``, so that it imports nothing beyond the standard library. Elsewhere than
Linux there is no death signal and it only waits.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def kill_group(*_: object) -> None:
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: lifeline.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    signal.signal(signal.SIGTERM, kill_group)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the agent died before the request took effect
            kill_group()
    try:
        child = subprocess.Popen(argv)  # the same stdout, stderr, cwd, environment and process group
    except OSError as exc:
        print(f"lifeline: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    code = child.wait()
    if code < 0:  # die of the command's signal, so that the runner reports it as the command's
        if -code != signal.SIGKILL:  # (SIGKILL's action cannot be set, and is already the default)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to terminate
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
