"""Progress for a person: a rich progress bar on a terminal, plain lines otherwise (logs, CI, tests)."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Display:
    def __init__(self, total: int, done: int, force_plain: bool = False):
        self.rich = sys.stdout.isatty() and not force_plain
        self.progress: Progress | None = None
        if self.rich:
            self.progress = Progress(TextColumn("[bold]iteration"), MofNCompleteColumn(), BarColumn(),
                                     TextColumn("{task.description}"), TimeElapsedColumn(), console=Console())
            self.bar = self.progress.add_task("", total=total, completed=done)
            self.progress.start()

    def line(self, text: str) -> None:
        if self.progress:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def status(self, iteration: int, best: str, last: str) -> None:
        """Iteration, best so far and last verdict: on the bar, or as a line without a terminal."""
        if self.progress:
            self.progress.update(self.bar, completed=iteration - 1, description=f"best {best} | last {last}")
        else:
            print(f"[iteration {iteration}] best {best}; last verdict: {last}", flush=True)

    def done(self, best: str, last: str) -> None:
        """An attempt is recorded (its row is already printed): advance the bar."""
        if self.progress:
            self.progress.update(self.bar, advance=1, description=f"best {best} | last {last}")

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None
