"""The one error type a user can cause: the CLI prints its message and exits 2, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message is one sentence naming what to change.
    Several problems found together: `problems` is (a heading, one sentence each), which
    the CLI lists a line each; the message holds them all, numbered, on one line."""

    exit_code = 2

    def __init__(self, message: str = "", *,
                 problems: tuple[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def of(cls, head: str, each: list[str], *, head_on_one: bool = False) -> UserError:
        """One problem as its sentence (after `head` with `head_on_one`); several as `head`
        and a line each (never joined by a newline inside one message, which the CLI would
        print as a literal \\n)."""
        if len(each) == 1:
            return cls(f"{head} {each[0]}" if head_on_one else each[0])
        head = f"{head.rstrip(': ')}: {len(each)} problems:"  # as format_error heads them
        return cls(f"{head} " + "; ".join(f"({i}) {t}" for i, t in enumerate(each, 1)),
                   problems=(head, list(each)))


class Problem(str):
    """One problem's sentence, with whom it is about kept as data (`node`, `processes`), so
    a culprit is never parsed back out of the text."""

    node: str | None
    processes: tuple[str, ...]

    def __new__(cls, text: str, *, node: str | None = None, processes: tuple[str, ...] = ()):
        self = super().__new__(cls, text)
        self.node, self.processes = node, tuple(processes)
        return self

    @property
    def culprit(self) -> str | None:
        """The first process named, else the node."""
        return self.processes[0] if self.processes else self.node


class RunFailed(Exception):
    """The run cannot go on; the message is what run.json and `status` say, culprit first."""

    def __init__(self, message: str, culprit: str | None = None, stage: str | None = None):
        super().__init__(message)
        self.culprit = culprit
        self.stage = stage  # the stage that failed, when it is not the one running now


class Cancelled(Exception):
    pass
