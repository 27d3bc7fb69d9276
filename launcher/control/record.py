"""The run's record, written best-effort: run.json (the state, rewritten as a heartbeat)
and events.jsonl. A failing write (full or read-only disk) is said once and the run goes
on; the orchestrator decides when a run directory that takes no writes ends the run."""

from __future__ import annotations

import time

from launcher.run import rundir
from launcher.run.rundir import RunRecord

SAVE_EVERY_S = 5.0  # run.json is rewritten at least this often: its `updated` is a heartbeat
RESERVE_BYTES = 1 << 20  # freed after teardown so the final record fits on a full disk


def say(msg: str) -> None:
    """A line on the orchestrator's output. That output can be a file on the full disk (the
    batch step's log): a failing print must never stop a teardown."""
    try:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
    except (OSError, ValueError):
        pass


# --- bookkeeping that never stops a run ------------------------------------------------------


class Book:
    """run.json and events.jsonl, written best-effort: a failing write (disk full, read-only)
    is said once on the orchestrator's output and in the record's notes, never raised."""

    def __init__(self, run: rundir.RunDir, record: RunRecord):
        self.run = run
        self.record = record
        self.failed: set[str] = set()
        self.failing_since: float | None = None  # run.json has not been written since
        self.last_error: str | None = None
        self.last_save = 0.0
        self.reserve = run.path / rundir.RESERVE

    def _trouble(self, what: str, e: OSError) -> None:
        self.last_error = f"{e.strerror or e} ({what})"
        if what not in self.failed:
            self.failed.add(what)
            msg = f"could not write {what}: {e.strerror or e}"
            if msg not in self.record.notes:
                self.record.notes.append(msg)
            say(f"warning: {msg} (the run goes on)")

    def save(self) -> bool:
        self.last_save = time.monotonic()
        try:
            self.run.write_record(self.record)
        except OSError as e:
            self._trouble(rundir.RUN, e)
            self.failing_since = self.failing_since or time.monotonic()
            return False
        self.failing_since = None
        return True

    def heartbeat(self) -> None:
        """Rewrite run.json when it has not been written for SAVE_EVERY_S (its `updated`
        says the orchestrator is alive; a disk that stopped taking writes is found here)."""
        if time.monotonic() - self.last_save >= SAVE_EVERY_S:
            self.save()

    def failing_for(self) -> float:
        return time.monotonic() - self.failing_since if self.failing_since else 0.0

    def make_reserve(self) -> None:
        try:
            with open(self.reserve, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
        except OSError:
            self.drop_reserve()

    def drop_reserve(self) -> None:
        try:
            self.reserve.unlink(missing_ok=True)
        except OSError:
            pass

    def event(self, kind: str, **fields) -> None:
        try:
            self.run.event(kind, **fields)
        except OSError as e:
            self._trouble(rundir.EVENTS, e)

    def note(self, message: str) -> None:
        if message not in self.record.notes:
            self.record.notes.append(message)
            say(f"note: {message}")
            self.save()
