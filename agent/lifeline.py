"""The leader of an evaluator command's process group: ``python -I lifeline.py AGENT_PID COMMAND...``.

``runner.run_command`` starts each command in a session of its own, so that a timeout can kill the whole group. A
group outlives the agent, though: were the agent killed (kill -9, an OOM kill, a closed terminal), an evaluator would
run on, timing its panel on the GPU while a resumed run times its own. This leader runs the command in its group and
asks Linux for a signal when the agent, AGENT_PID, dies (``PR_SET_PDEATHSIG``); then it kills the group, itself
included. Otherwise it only waits and exits as the command did: the same status, or the same signal.

The death signal comes when the thread that started the leader exits, so that thread must wait for the command (as
``run_command`` does); a SIGTERM while the agent lives is passed on to the command. Run as a script with ``-I``: it
imports only the standard library. Elsewhere than Linux there is no death signal and it only waits.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: lifeline.py AGENT_PID COMMAND [ARG...]", file=sys.stderr)
        return 2
    agent, command = int(argv[0]), argv[1:]
    child = None

    def on_term(*_: object) -> None:
        if os.getppid() != agent:  # the agent is gone: the whole group goes
            os.killpg(0, signal.SIGKILL)
        elif child is not None:  # someone else's SIGTERM: the command's to handle
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, lambda *_: None)  # a group-wide Ctrl-C or SIGINT is the command's to handle
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            print(f"lifeline: no parent-death signal (prctl: {os.strerror(ctypes.get_errno())}); the command will "
                  "not die with the agent", file=sys.stderr)
    if os.getppid() != agent:  # the agent died before the request took effect (or before this process ran)
        os.killpg(0, signal.SIGKILL)
    try:
        child = subprocess.Popen(command)  # the same stdout, stderr, cwd, environment and process group
    except OSError as exc:
        print(f"lifeline: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    code = child.wait()
    if code < 0:  # die of the command's signal, so that the runner reports it as the command's
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core of this process over the command's
        if -code != signal.SIGKILL:  # (SIGKILL's action cannot be set, and is already the default)
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to terminate
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
