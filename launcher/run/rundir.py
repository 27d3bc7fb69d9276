"""The run directory: the only interface between launcher, telemetry and dashboard.

Safe on NFS/Lustre: every file has one writer and is either append-only or replaced whole by
write-then-rename, so readers see an old or a new file, never half of one.

    runs/<run-id>/                      writer
      recipe.yaml  plan.json            the planner (submit time; again inside the allocation)
      commands.sh  job.sbatch           the planner
      submission.json                   prepare + submit (login node, before the job exists)
      run.json  events.jsonl            the orchestrator (inside the allocation)
      cancel.json                       `launcher cancel`
      reconciled.json                   `launcher status/runs/cancel`, when the orchestrator
                                        died without recording its end
      summary.json                      the orchestrator's report stage (or `launcher report`)
      logs/<process>.log                each process (its stdout/stderr)
      telemetry/<node>/                 that node's agent (layout: launcher.telemetry.store)
      bench/c<NNNNN>.json               the benchmark client of that sweep point
      accuracy/gsm8k.json               the accuracy gate
      slurm/                            submitit (the script as Slurm got it, the batch
                                        step's own output)
      .reserve                          the orchestrator, while it runs: space it frees after
                                        teardown so its final record fits on a full disk

A study (`submit --sweep`) is a directory holding its own files and one run directory per
configuration (their records: launcher.run.studydoc):

    <study>/                            writer
      study.json                        the planner (submit time): its axes, its runs' values;
                                        in one allocation also the plan of its turns
      allocation.json                   the study's orchestrator (control/study.py), in its one
                                        allocation: replaced whole on every change
      job.sbatch  slurm/                a study in one allocation: its one job
      <run-id>/                         one run directory per configuration

`launcher.run.listing` is the one way to list runs and studies.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.run.vocab import FINAL_STATES, Kind, Stage, State

RECIPE = "recipe.yaml"
PLAN = "plan.json"
SBATCH = "job.sbatch"
COMMANDS = "commands.sh"
INPUTS = "inputs"  # files the run reads, copied in: GSM8K data, the setup_script
SUBMISSION = "submission.json"
RUN = "run.json"
EVENTS = "events.jsonl"
CANCEL = "cancel.json"
RECONCILED = "reconciled.json"
SUMMARY = "summary.json"
STUDY = "study.json"
ALLOCATION = "allocation.json"  # a study in one allocation: its record
LOGS = "logs"
TELEMETRY = "telemetry"
BENCH = "bench"
ACCURACY = "accuracy"
# a custom benchmark's outcome (benchmark.custom): its command, exit status, time, last lines
CUSTOM_BENCH = "custom-bench.json"
SLURM = "slurm"
REPORT = "report.html"
RESERVE = ".reserve"  # the orchestrator's 1 MiB of room for its final record on a full disk


# --- file primitives ----------------------------------------------------------------------


def write_atomic(path: Path, text: str, sync: bool = True) -> None:
    """Replace `path` whole: readers see the old or the new file, never half of one. `sync`
    also survives a crash of this host; files rendered again from the plan skip it (an fsync
    costs tens of ms on a parallel file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # one name per writer: processes and threads may replace the same file at once
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_json(path: Path, obj: Any, sync: bool = True) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", sync)


def read_json(path: Path, default: Any = None) -> Any:
    """The JSON at `path`, or `default` when it is missing, torn, corrupt or unreadable (a run
    directory is read while its writers run; a reader must never fail on that)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line; a torn last line (writer killed mid-write) is skipped."""
    rows = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except OSError:
        pass
    return rows


# Terminal colour codes: vllm-router writes them even into a file, whatever NO_COLOR says.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain(text: str) -> str:
    """A log line as a person reads it: without terminal colour codes."""
    return ANSI.sub("", text)


def tail(path: Path, lines: int = 20, max_bytes: int = 256 * 1024) -> list[str]:
    """The last lines of a log without reading all of it (logs of long runs are big),
    without colour codes."""
    try:
        with open(path, "rb") as f:
            return tail_of(f, lines, max_bytes)
    except OSError:
        return []


def tail_of(f, lines: int = 20, max_bytes: int = 256 * 1024, whole: bool = False) -> list[str]:
    """The last lines of the open binary file `f`, which is left just after them, so a
    follower goes on from exactly there: nothing appended meanwhile is skipped. `whole`:
    a last line without its newline yet is left for the follower to print whole."""
    size = f.seek(0, os.SEEK_END)
    start = f.seek(max(0, size - max_bytes))
    data = f.read(size - start)
    if whole and data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        f.seek(start + cut)
        data = data[:cut]
    out = data.splitlines()
    if start > 0 and out:
        out = out[1:]  # the first one is probably cut
    return [plain(x.decode("utf-8", "replace")) for x in out[-lines:]]


def _pick(cls, d: Any) -> dict:
    """The keys of `d` that are fields of dataclass `cls` (older/newer files read fine)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in (d or {}).items() if k in names} if isinstance(d, dict) else {}


class RecordError(ValueError):
    """A record file that is valid JSON but not what its dataclass says: one sentence."""


_ENUMS = {"State": State, "Stage": Stage, "Kind": Kind}


def _fits(v: Any, t: str) -> bool:
    """Whether JSON value `v` is of annotation `t` (a field's type, as text)."""
    for alt in t.split(" | "):
        if alt == "Any" or (alt == "None" and v is None):
            return True
        if alt in ("str", "bool") and type(v) is {"str": str, "bool": bool}[alt]:
            return True
        if alt == "int" and type(v) is int:
            return True
        # a number reaches arithmetic and time formatting: NaN and infinity mean nothing there
        if alt == "float" and type(v) in (int, float) and math.isfinite(v):
            return True
        if alt == "real" and type(v) in (int, float):  # NaN allowed: vLLM writes it
            return True
        if alt in _ENUMS and isinstance(v, str) and v in set(_ENUMS[alt]):
            return True
        if _is_record(alt) and isinstance(v, dict):
            return True  # a named record's own fields are checked by its reader
        if alt in ("dict", "dict[str, Any]") and isinstance(v, dict):
            return True
        if alt.startswith("dict[str, ") and isinstance(v, dict):
            inner = alt.removeprefix("dict[str, ").removesuffix("]")
            if _is_record(inner) or all(_fits(x, inner) for x in v.values()):
                return True  # a named record's own fields are checked by its reader
        if alt.startswith("list[") and isinstance(v, list):
            inner = alt.removeprefix("list[").removesuffix("]")
            if _is_record(inner) or all(_fits(x, inner) for x in v):
                return True  # likewise: each named record is checked by its reader
    return False


def _is_record(t: str) -> bool:
    """Whether annotation `t` names a record dataclass (ProcessRecord, StudyRun, ...): its
    JSON is an object, whose fields that record's reader checks."""
    return t[:1].isupper() and t.isidentifier() and t not in _ENUMS and t not in ("Any", "None")


def shape_problem(d: Any, spec: dict[str, str], where: str = "") -> str | None:
    """What in the JSON object `d` is not of `spec` (key -> type as annotation text, e.g.
    "float | None"; absent keys pass), in words; None when it fits. For record files that
    are not dataclasses here (summary.json, results), so every reader says it one way."""
    if not isinstance(d, dict):
        return f"{where.rstrip('.') or 'the file'} is {_shown(d)}, not a JSON object"
    for key, t in spec.items():
        if key in d and not _fits(d[key], t):
            return f"{where}{key} is {_shown(d[key])}, not {_wanted(t)}"
    return None


def _wanted(t: str) -> str:
    """A field's type as a reader of the message knows it."""
    words = {"str": "text", "int": "a whole number", "float": "a finite number", "real": "a number",
             "bool": "true or false", "None": "null", "Any": "anything",
             "dict": "a mapping", "list[str]": "a list of text",
             "list[int]": "a list of whole numbers", "list[real]": "a list of numbers",
             "list[dict]": "a list of mappings", "dict[str, int]": "a mapping to whole numbers",
             "dict[str, float]": "a mapping to numbers",
             "dict[str, list[Any]]": "a mapping of keys to lists"}  # fmt: skip
    out = []
    for alt in t.split(" | "):
        if alt in _ENUMS:
            out.append("one of " + ", ".join(_ENUMS[alt]))
        elif _is_record(alt):
            out.append("a mapping")
        elif alt.startswith("list[") and (_is_record(alt[5:-1]) or alt[5:-1].startswith("dict")):
            out.append("a list of mappings")
        else:
            out.append(words.get(alt) or ("a mapping" if alt.startswith("dict[") else
                                          "a list" if alt.startswith("list[") else alt))
    return " or ".join(out)


def _typed(cls, d: Any, where: str = "") -> dict:
    """The fields of dataclass `cls` in `d`, each checked against its type; RecordError
    naming the field otherwise. Unknown keys are left out (other versions)."""
    if not isinstance(d, dict):
        raise RecordError(f"{where.rstrip('.') or 'the file'} is {_shown(d)}, not a JSON object")
    kw = _pick(cls, d)
    for f in fields(cls):
        if f.name not in kw:
            if f.default is MISSING and f.default_factory is MISSING:
                raise RecordError(f"{where}{f.name} is missing")
        elif not _fits(kw[f.name], str(f.type)):
            raise RecordError(f"{where}{f.name} is {_shown(kw[f.name])}, "
                              f"not {_wanted(str(f.type))}")
    return kw


def _shown(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_record(path: Path, parse) -> tuple[Any, str | None]:
    """(parse(JSON at path), None); (None, None) when the file is missing; (None, why) when
    it is damaged: unreadable, not JSON, or of the wrong shape. A damaged record is read as
    missing (readers must go on) and named (a person must learn which file it was)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path.name} cannot be read ({getattr(e, 'strerror', None) or e})"
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        return None, f"{path.name} is damaged (not valid JSON: {str(e)[:80]})"
    try:
        return parse(d), None
    except RecordError as e:
        return None, f"{path.name} is damaged ({e})"


# --- records --------------------------------------------------------------------------------


@dataclass
class ProcessRecord:
    """One started process as the orchestrator last saw it."""

    node: str
    kind: Kind
    pid: int | None = None
    started: float | None = None
    exit_code: int | None = None
    stopped: bool = False  # stopped on purpose (teardown, a client that finished)
    log: str = ""
    lost: bool = False  # its node was lost: whatever it did last is unknown
    # its log's size when teardown asked it to stop: what follows is its shutdown (a DP head
    # that sees a headless part go first logs an engine death), not a fault of the run
    log_bytes_at_stop: int | None = None
    # A study in one allocation: an engine started by an earlier configuration (its run id)
    # and used here as it was, its log read from where it stood then; an engine left
    # running for the next configuration at this one's end.
    started_by: str | None = None
    log_bytes_at_start: int | None = None
    kept: bool = False

    @property
    def status(self) -> str:
        if self.lost:
            return "lost"
        if self.kept:
            return "kept loaded"
        if self.exit_code is None:
            return "running"
        return "stopped" if self.stopped else f"exit {self.exit_code}"


@dataclass
class RunRecord:
    """run.json: written by the orchestrator only, replaced whole on every change."""

    state: State = State.RUNNING
    stage: Stage | None = None
    started: float | None = None
    ended: float | None = None
    updated: float | None = None
    host: str | None = None
    orchestrator_pid: int | None = None
    slurm_job_id: str | None = None
    error: str | None = None
    culprit: str | None = None  # the process or node the error names
    failed_stage: Stage | None = None  # where it failed or was cancelled
    serving: bool = False
    router_url: str | None = None
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)  # sweep point i of N, loading
    accuracy: float | None = None
    accuracy_passed: bool | None = None
    notes: list[str] = field(default_factory=list)  # what bookkeeping could not do
    identity: dict[str, Any] = field(default_factory=dict)  # what exactly ran (preflight)

    @classmethod
    def from_json(cls, d: Any) -> RunRecord:
        """run.json's content; RecordError naming the field of a wrong type."""
        stages = {k: d.get(k) for k in ("stage", "failed_stage")} if isinstance(d, dict) else {}
        if isinstance(d, dict):  # a stage of another launcher version reads as none
            d = {**d, **{k: None for k, v in stages.items() if isinstance(v, str)
                         and v not in set(Stage)}}  # fmt: skip
        kw = _typed(cls, d)
        kw["state"] = State(kw.get("state", State.RUNNING))
        for key in ("stage", "failed_stage"):
            kw[key] = Stage(kw[key]) if kw.get(key) is not None else None
        kw["processes"] = {
            name: ProcessRecord(**{**_typed(ProcessRecord, p, f"processes.{name}."),
                                   "kind": Kind(p["kind"])})
            for name, p in (kw.get("processes") or {}).items()
            if not (isinstance(p, dict) and isinstance(p.get("kind"), str)
                    and p["kind"] not in set(Kind))  # a kind of another version: left out
        }
        return cls(**kw)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Submission:
    """submission.json: how the run was asked for (prepare, then submit; login node)."""

    created: float | None = None
    study: str | None = None
    by: str | None = None
    slurm_job_id: str | None = None
    submitted: float | None = None
    error: str | None = None  # why the submission was refused (a blocker, --check, sbatch)
    checked: str | None = None  # `submit --check`: the scheduler took it (its words)
    dry_run: bool = False  # `submit --dry-run`: planned and written, never to be submitted
    launcher: str | None = None  # "pd-launcher 0.1.0, git 4c1d233 (dirty), submitit 1.5.2"
    command: str | None = None  # the command line that asked for it
    one_allocation: bool = False  # a configuration of a study run in one allocation
    blockers: list[str] = field(default_factory=list)  # a dry-run's: what submit would refuse


@dataclass
class CancelRecord:
    """cancel.json: `launcher cancel` asked for teardown (the orchestrator polls for it)."""

    by: str
    ts: float
    outcome: str = "requested"  # requested | scancel | signalled | marked (nothing was running)


@dataclass
class Reconciled:
    """reconciled.json: the run's end as found from outside, when the orchestrator died
    without recording it (Slurm's record, or a local orchestrator pid that is gone)."""

    state: State
    error: str
    ts: float
    source: str  # "slurm" | "pid"


@dataclass
class RunStatus:
    """What a run is now, merged from its files: the one answer every reader shows."""

    state: State
    stage: Stage | None
    error: str | None
    record: RunRecord | None
    submission: Submission
    cancel: CancelRecord | None
    reconciled: Reconciled | None
    slurm_job_id: str | None
    # record files read as missing because they are damaged: file name -> one sentence
    damaged: dict[str, str] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def dry_run(self) -> bool:
        """A dry-run's directory: planned, and nothing will ever run it."""
        return self.state == State.PLANNED and self.submission.dry_run

    @property
    def shown_state(self) -> str:
        """The state as lists show it: "dry-run" for a dry-run's planned directory."""
        return "dry-run" if self.dry_run else str(self.state)


# --- the directory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    # file names, one place
    recipe = property(lambda self: self.path / RECIPE)
    plan = property(lambda self: self.path / PLAN)
    sbatch = property(lambda self: self.path / SBATCH)
    commands = property(lambda self: self.path / COMMANDS)
    submission_file = property(lambda self: self.path / SUBMISSION)
    state_file = property(lambda self: self.path / RUN)
    events_file = property(lambda self: self.path / EVENTS)
    cancel_file = property(lambda self: self.path / CANCEL)
    reconciled_file = property(lambda self: self.path / RECONCILED)
    summary = property(lambda self: self.path / SUMMARY)
    report = property(lambda self: self.path / REPORT)
    logs = property(lambda self: self.path / LOGS)
    bench = property(lambda self: self.path / BENCH)
    accuracy = property(lambda self: self.path / ACCURACY)
    custom_result = property(lambda self: self.path / CUSTOM_BENCH)
    slurm = property(lambda self: self.path / SLURM)

    def telemetry(self, node: str | None = None) -> Path:
        base = self.path / TELEMETRY
        return base / node if node else base

    def log(self, process: str) -> Path:
        return self.logs / f"{process}.log"

    def exists(self) -> bool:
        return any((self.path / n).exists() for n in (PLAN, RUN, RECIPE, EVENTS))

    # run.json (orchestrator)
    def read_record(self) -> RunRecord | None:
        return _read_record(self.state_file, RunRecord.from_json)[0]

    def write_record(self, record: RunRecord) -> None:
        record.updated = time.time()
        write_json(self.state_file, record.to_json())

    # submission.json (prepare, submit)
    def read_submission(self) -> Submission:
        return _read_record(self.submission_file, _submission)[0] or Submission()

    def write_submission(self, sub: Submission) -> None:
        write_json(self.submission_file, asdict(sub))

    # cancel.json (cancel)
    def read_cancel(self) -> CancelRecord | None:
        return _read_record(self.cancel_file, _cancel)[0]

    def write_cancel(self, rec: CancelRecord) -> None:
        write_json(self.cancel_file, asdict(rec))

    # reconciled.json (status/runs/cancel)
    def read_reconciled(self) -> Reconciled | None:
        return _read_record(self.reconciled_file, _reconciled)[0]

    def write_reconciled(self, rec: Reconciled) -> None:
        write_json(self.reconciled_file, asdict(rec))

    # events.jsonl (orchestrator)
    def event(self, kind: str, **fields_: Any) -> None:
        """Append one line: stage changes and notable events."""
        self.events_file.parent.mkdir(parents=True, exist_ok=True)
        row = {"ts": round(time.time(), 3), "event": kind, **fields_}
        with open(self.events_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def events(self) -> list[dict]:
        return read_jsonl(self.events_file)

    # results
    def bench_result(self, concurrency: int) -> Path:
        return self.bench / f"c{concurrency:05d}.json"

    def accuracy_result(self, task: str = "gsm8k") -> Path:
        return self.accuracy / f"{task}.json"

    def status(self) -> RunStatus:
        """The run's state from its files alone (no Slurm call: see control.runs). A damaged
        record file counts as missing and is named in `damaged`."""
        damaged: dict[str, str] = {}

        def read(path: Path, parse):
            obj, why = _read_record(path, parse)
            if why:
                damaged[path.name] = why
            return obj

        record = read(self.state_file, RunRecord.from_json)
        sub = read(self.submission_file, _submission) or Submission()
        cancel = read(self.cancel_file, _cancel)
        rec = read(self.reconciled_file, _reconciled)
        job = (record.slurm_job_id if record else None) or sub.slurm_job_id
        if record is not None and record.state in FINAL_STATES:
            state, error = record.state, record.error
        elif rec is not None:
            state, error = rec.state, rec.error
        elif record is not None:
            state, error = record.state, record.error
        elif cancel is not None and cancel.outcome != "requested":
            state, error = State.CANCELLED, f"cancelled by {cancel.by} before it started"
        elif sub.error:
            state, error = State.REFUSED, sub.error
        elif sub.slurm_job_id:
            state, error = State.SUBMITTED, None
        else:
            state, error = State.PLANNED, None
        if record is None:
            stage = None
        elif state == State.RUNNING:
            stage = record.stage
        else:  # where it failed; for an end found from outside, where it last was
            stage = record.failed_stage or (record.stage if rec is not None else None)
        return RunStatus(
            state=state,
            stage=stage,
            error=error,
            record=record,
            submission=sub,
            cancel=cancel,
            reconciled=rec,
            slurm_job_id=job,
            damaged=damaged,
        )


def _submission(d: Any) -> Submission:
    return Submission(**_typed(Submission, d))


def _cancel(d: Any) -> CancelRecord:
    return CancelRecord(**_typed(CancelRecord, d))


def _reconciled(d: Any) -> Reconciled:
    kw = _typed(Reconciled, d)
    return Reconciled(**{**kw, "state": State(kw["state"])})


def concurrency_of(result: str | Path) -> int:
    """The sweep point of a result file named by `RunDir.bench_result`."""
    return int(Path(result).stem.lstrip("c"))


def new_run_id(recipe_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{recipe_name}"


def create(runs_root: Path, name: str) -> RunDir:
    """A fresh directory; a second one in the same second gets a suffix, never a clash."""
    runs_root.mkdir(parents=True, exist_ok=True)
    base = new_run_id(name)
    for i in range(1000):
        path = runs_root / (base if i == 0 else f"{base}.{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path)
    raise OSError(f"could not create a run directory under {runs_root}: 1000 names taken")
