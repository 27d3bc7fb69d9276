"""The run's processes as run.json records them (ProcessRecord): each one started here, or
taken over loaded from an earlier configuration of a study (its log linked here and read
from where it stood), which of them answered healthy, where each log stood when it was told
to stop, which were left loaded for the next configuration; and the last lines of their
logs. Who starts, keeps or stops what is decided elsewhere (the orchestrator's stages, the
engines' lifetime: launcher.control.lifetime); this is its one record.
"""

from __future__ import annotations

import os

from launcher.control.backends import Backend, Handle
from launcher.control.record import Book
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.rundir import ProcessRecord, tail
from launcher.run.vocab import Kind

TAIL_LINES = 8


class Processes:
    """The run's processes and their record; the orchestrator's and the engines' lifetime's
    one list of them."""

    def __init__(self, run: rundir.RunDir, book: Book, backend: Backend):
        self.run = run
        self.book = book
        self.backend = backend
        self.handles: list[Handle] = []
        self.healthy: set[str] = set()  # processes that answered healthy here
        self.stop_marks: dict[str, int] = {}  # process -> its log's size when told to stop
        self.started_by: dict[str, str] = {}  # kept process -> the run that started it
        self.start_marks: dict[str, int] = {}  # kept process -> its log's size here at start
        self.left_loaded: set[str] = set()  # processes left running for the next configuration
        # a study's configuration visited again: its processes of earlier visits, as recorded
        self.earlier: dict[str, ProcessRecord] = {}

    def start(self, proc: Process, argv: list[str] | None = None) -> Handle:
        missing = [n for n in proc.env_from_host if n not in os.environ]
        if missing:
            self.book.event("warning", process=proc.name, message=f"not set here: {missing}")
        h = self.backend.start(proc, argv)
        self.handles.append(h)
        self.book.event("process_started", process=proc.name, node=proc.node, pid=h.pid)
        self.write()
        return h

    def adopt(self, proc: Process, old: Handle, started_by: str) -> Handle:
        """A loaded engine of an earlier configuration (`started_by`), as this run's process:
        its log is linked here and read from where it stands now."""
        link = self.run.path / proc.log
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(os.path.relpath(old.log_path, link.parent), link)
        try:
            self.start_marks[proc.name] = old.log_path.stat().st_size
        except OSError:
            self.start_marks[proc.name] = 0
        self.started_by[proc.name] = started_by
        h = Handle(proc, old.popen, old.log_path, started=old.started, argv=old.argv)
        self.handles.append(h)
        self.book.event("process_kept", process=proc.name, node=proc.node, pid=h.pid,
                        started_by=started_by)
        self.write()
        return h

    def remove(self, handles: list[Handle]) -> None:
        """Processes stopped to be started again (a restart): no longer healthy nor this
        run's; a kept one is this run's own from here on (its log goes on where it was)."""
        for h in handles:
            self.healthy.discard(h.proc.name)
            self.started_by.pop(h.proc.name, None)
        self.handles = [h for h in self.handles if h not in handles]

    def mark_stops(self) -> None:
        """Before teardown: a process still running now logs its shutdown from here on."""
        for h in self.handles:
            if h.exit_code() is None:
                try:
                    self.stop_marks[h.proc.name] = h.log_path.stat().st_size
                except OSError:
                    pass

    def write(self) -> None:
        self.book.record.processes = {**self.earlier, **{
            h.proc.name: ProcessRecord(
                node=h.proc.node, kind=h.proc.kind, pid=h.pid, started=h.started,
                exit_code=h.exit_code(), stopped=h.stopped and not h.died, log=h.proc.log,
                lost=h.lost, log_bytes_at_stop=self.stop_marks.get(h.proc.name),
                started_by=self.started_by.get(h.proc.name),
                log_bytes_at_start=self.start_marks.get(h.proc.name),
                kept=h.proc.name in self.left_loaded,
            )  # fmt: skip
            for h in self.handles
        }}
        self.book.save()

    def tails(self, kinds: tuple[Kind, ...] = (Kind.ENGINE, Kind.ROUTER)) -> str:
        """The last lines of every process of these kinds on every node: where a hung NCCL
        or MNNVL initialisation on a headless rank shows, not only on the head."""
        out = []
        for h in self.handles:
            if h.proc.kind in kinds:
                lines = tail(h.log_path, TAIL_LINES)
                out.append(
                    f"last lines of {h.proc.log} ({h.proc.node}):\n"
                    + ("\n".join(f"  | {x}" for x in lines) or "  | (empty)")
                )
        return "\n".join(out)
