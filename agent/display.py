"""Progress for a person: a rich progress bar on a terminal, plain lines otherwise (logs, CI, tests).

Output may go through a pipe whose reader exits first (`| tee log` and Ctrl-C, `| head`): from then on lines go to
/dev/null instead of raising, so that no attempt is lost to a closed pipe, and the run learns that no one is reading.
"""
from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def quiet_stdout() -> None:
    """Point stdout at /dev/null: its reader has gone, and what is still printed must not raise."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def say(text: str) -> bool:
    """Print a line; False when stdout's reader has gone (stdout then goes to /dev/null)."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        quiet_stdout()
        return False


class Display:
    def __init__(self, total: int, done: int, force_plain: bool = False):
        self.rich = sys.stdout.isatty() and not force_plain
        self.progress: Progress | None = None
        self.deferred: list[str] = []
        """Lines a signal handler could not print (it interrupted a print): they go out before the next line."""
        self.output_lost = False
        """Set when stdout's reader has gone: the run stops after the attempt in flight and says why."""
        if self.rich:
            self.progress = Progress(TextColumn("[bold]iteration"), MofNCompleteColumn(), BarColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(), console=Console())
            self.bar = self.progress.add_task("", total=total, completed=done)
            self.progress.start()

    def _say(self, text: str) -> None:
        while self.deferred:
            if not say(self.deferred.pop(0)):
                self.output_lost = True
        if not say(text):
            self.output_lost = True

    def notice(self, text: str) -> None:
        """A line from a signal handler: now, unless the handler interrupted a print to stdout (a buffered stream may
        not be entered again), then before the next line."""
        try:
            self.line(text)
        except RuntimeError:  # "reentrant call inside <_io.BufferedWriter name='<stdout>'>"
            self.deferred.append(text)

    def line(self, text: str) -> None:
        if self.progress:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            self._say(text)

    def status(self, iteration: int, best: str, last: str) -> None:
        """Iteration, best so far and last verdict: on the bar, or as a line without a terminal."""
        if self.progress:
            self.progress.update(self.bar, completed=iteration - 1, description=f"best {best} | last {last}")
        else:
            self._say(f"[iteration {iteration}] best {best}; last verdict: {last}")

    def done(self, best: str, last: str) -> None:
        """An attempt is recorded (its row is already printed): advance the bar."""
        if self.progress:
            self.progress.update(self.bar, advance=1, description=f"best {best} | last {last}")

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None
