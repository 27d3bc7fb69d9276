"""Failure signals counted in one process log: engine crashes, CUDA out of memory, NCCL
errors and warnings, NIXL KV transfer failures and timeouts, Python tracebacks and
preemptions, each with up to three lines of evidence.

Pure standard library. The patterns, the upstream lines they match and what logs cannot
tell are in docs/log-signals.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.telemetry.statslog import STATS_HEAD_RE, parse_stats_body

SIGNALS: dict[str, str] = {
    "engine_crashes": "engine crashes",
    "cuda_oom": "CUDA out of memory",
    "nccl_errors": "NCCL errors",
    "nccl_warnings": "NCCL warnings",
    "kv_transfer_failures": "KV transfer failures",
    "kv_transfer_timeouts": "KV transfer timeouts",
    "tracebacks": "Python tracebacks",
    "preemptions": "preemptions",
}
MAX_EVIDENCE = 3
MAX_EVIDENCE_CHARS = 1000
DEFAULT_MAX_BYTES = 64 * 2**20

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM's record prefix (docs/vllm-logs.md); both parts optional: up to ~0.10 there was no
# "(proc pid=N) ", and raw prints of those versions had only that part
_VLLM_PREFIX_RE = re.compile(
    r"^(?:.{0,64}?\((?P<proc>[^()]+?) pid=(?P<pid>\d+)(?:, ip=[^()]*)?\) )?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
    r"\[?[^\]\s]+:\d+\] ?)?")
# c10 (glog) prefix of torch's C++ logs: "[rank0]:[E1218 20:27:21.426415540 File.cpp:629] "
_C10_PREFIX_RE = re.compile(
    r"^(?:\d+: )?(?:\[rank(?P<rank>\d+)\]:)?\[[EWIF](?:\d{4} \d\d:\d\d:\d\d(?:\.\d+)?)?"
    r"(?: \d+)? [^\]\s]+:\d+\] ?")
_EXC = r"(?:[A-Za-z_][\w.]*: )?"  # an exception class before the message ("torch.OutOfMemoryError: ")

_TB_HEADER_RE = re.compile(r"^Traceback \(most recent call last\):\s*$")
_TB_CHAIN = frozenset({
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
})
# the engine reporting its own death; and the death seen by its client
_ENGINE_SELF_RE = re.compile(r"^EngineCore (?:encountered a fatal error|failed to start)\.")
_ENGINE_SEEN_RE = re.compile(
    r"^(?:\[shutdown\] MPClient: engine core exited unexpectedly"
    r"|Engine core proc \S+ died unexpectedly"
    rf"|{_EXC}Engine core process \S+ died unexpectedly"
    rf"|{_EXC}Engine core initialization failed\.)")
_OOM_RE = re.compile(
    rf"^{_EXC}(?:CUDA out of memory\. Tried to allocate (?P<alloc>.*)|CUDA error: out of memory)")
# allocation, GPU, capacity, free: tells ranks apart, and copies of one error alike
_OOM_KEY_RE = re.compile(
    r"^(\S+ \S+?)\. GPU (\d+) has a total capacity of (\S+ \S+) of which (\S+ \S+) is free"
    r"|^(\S+ \S+) \(GPU (\d+); ([^)]*)\)")
_NCCL_ERR_RE = re.compile(
    rf"^{_EXC}(?P<kind>NCCL error in: |NCCL error: |NCCL communicator was aborted on rank )"
    r"(?P<rest>.*)")
_NCCL_CODE_RE = re.compile(
    rf"^{_EXC}(?P<code>nccl(?:SystemError|InternalError|UnhandledCudaError|RemoteError"
    r"|InvalidUsage|InvalidArgument))\b")
_WATCHDOG_RE = re.compile(
    r"(?P<rank>\[[^\[\]]*Rank \d+\] )?Watchdog caught collective operation timeout: "
    r"(?P<work>.*?) ran for ")
# NCCL's own debug line: "[time] host:pid:tid [dev] file:line (func) NCCL WARN msg"
_NCCL_WARN_RE = re.compile(
    r"(?:^|[\s\]])[\w.\-]+:\d+:\d+ \[\d+\] (?:\S+:\d+ (?:\([^()]*\) )?)?NCCL WARN ")
_KV_FAIL_RE = re.compile(
    r"^(?:NIXL transfer failure: "
    r"|NIXL transfer (?:failed|exception|setup/initiation failed) for request "
    r"|Handshake failed for request |NIXL send_notif failed for request )")
_KV_LOAD_FAIL_RE = re.compile(
    r"^(?:Failing \d+ request\(s\) due to KV load failure|Recovered from KV load failure: )")
_KV_TIMEOUT_RE = re.compile(
    r"^(?:Releasing expired KV blocks for request |Declining expired remote read for )")
# vLLM's "Model loading took %s GiB memory and %.6f seconds" (each rank once; the engine's
# load is its slowest rank's)
_LOADED_RE = re.compile(r"Model loading took [\d.]+ GiB memory and (?P<s>[\d.]+) seconds")
_STATS_FIRST = frozenset("E123456789")  # "Engine 000: ..." or "4 Engines Aggregated: ..."
_NCCL_CODE_WINDOW = 3  # lines after an "NCCL error" line that still belong to its message


@dataclass
class _Block:
    record: str
    line: str
    saw_frame: bool = False


@dataclass
class _Stream:
    last_nonblank: str = ""
    open: _Block | None = None
    last_counted: tuple[str, str | None] | None = None
    line_no: int = 0
    last_nccl_error: int = -(10**9)


@dataclass
class _Scan:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNALS, 0))
    evidence: dict[str, list[str]] = field(
        default_factory=lambda: {k: [] for k in SIGNALS})
    # engine deaths and KV failures are reported from two sides; the count is the larger tally
    engine_self: int = 0
    engine_seen: int = 0
    kv_connector: int = 0
    kv_scheduler: int = 0
    stats_lines: int = 0
    load_s: float | None = None
    streams: dict[str | None, _Stream] = field(default_factory=dict)
    seen: dict[tuple, set[str | None]] = field(default_factory=dict)
    prefixed_sigs: set[str] = field(default_factory=set)

    def hit(self, key: str, line: str, n: int = 1) -> None:
        self.counts[key] += n
        self._evidence(key, line)

    def first_time(self, key: tuple, stream: str | None) -> bool:
        """Whether this error text is new: per process, and a raw (unprefixed) copy only when
        no process logged it (multiprocessing prints an engine's uncaught error again)."""
        streams = self.seen.setdefault(key, set())
        new = not streams if stream is None else stream not in streams
        streams.add(stream)
        return new

    def feed(self, raw: str) -> None:
        line = (_ANSI_RE.sub("", raw) if "\x1b" in raw else raw).rstrip()
        stream, record, msg = _split(line)
        st = self.streams.setdefault(stream, _Stream())
        st.line_no += 1
        self._traceback(stream, st, record, msg, line)
        if msg.strip():
            st.last_nonblank = msg.strip()
        self._match(stream, st, msg, line)

    def _traceback(self, stream, st: _Stream, record: str, msg: str, line: str) -> None:
        if st.open is not None and stream is not None and record != st.open.record:
            self._close(stream, st, None)
        if _TB_HEADER_RE.match(msg):
            if st.last_nonblank in _TB_CHAIN:
                return  # a chained exception: the same report
            if st.open is not None:
                self._close(stream, st, None)
            st.open = _Block(record, line)
        elif st.open is not None:
            if msg.startswith("  File "):
                st.open.saw_frame = True
            elif st.open.saw_frame and msg and not msg[0].isspace():
                self._close(stream, st, msg.strip())  # the first exception line

    def _close(self, stream, st: _Stream, sig: str | None) -> None:
        blk, st.open = st.open, None
        if sig is not None:
            # vLLM's WorkerProc adds the formatted traceback as a note: one record prints it
            # twice
            if stream is not None and st.last_counted == (blk.record, sig):
                return
            # multiprocessing reprints raw what the engine already logged
            if stream is None and sig in self.prefixed_sigs:
                return
            if stream is not None:
                self.prefixed_sigs.add(sig)
        st.last_counted = (blk.record, sig)
        self.hit("tracebacks", blk.line)

    def _match(self, stream, st: _Stream, msg: str, line: str) -> None:
        if _ENGINE_SELF_RE.match(msg):
            self.engine_self += 1
            self._evidence("engine_crashes", line)
        elif _ENGINE_SEEN_RE.match(msg) and self.first_time(("engine", msg), stream):
            self.engine_seen += 1
            self._evidence("engine_crashes", line)
        if m := _OOM_RE.match(msg):
            alloc = m.group("alloc")
            k = _OOM_KEY_RE.match(alloc) if alloc is not None else None
            key = ("oom", *(g for g in k.groups() if g is not None)) if k else ("oom", msg)
            if self.first_time(key, stream):
                self.hit("cuda_oom", line)
        if m := _NCCL_ERR_RE.match(msg):
            st.last_nccl_error = st.line_no
            if self.first_time(("nccl", m.group("kind"), m.group("rest")), stream):
                self.hit("nccl_errors", line)
        elif _NCCL_CODE_RE.match(msg) and st.line_no - st.last_nccl_error > _NCCL_CODE_WINDOW:
            if self.first_time(("nccl", msg), stream):
                self.hit("nccl_errors", line)
        elif "Watchdog caught" in msg and (m := _WATCHDOG_RE.search(msg)):
            if self.first_time(("watchdog", m.group("rank"), m.group("work")), stream):
                self.hit("nccl_errors", line)
        if "NCCL WARN" in line and _NCCL_WARN_RE.search(line):
            self.hit("nccl_warnings", line)
        if _KV_FAIL_RE.match(msg):
            self.kv_connector += 1
            self._evidence("kv_transfer_failures", line)
        elif _KV_LOAD_FAIL_RE.match(msg):
            self.kv_scheduler += 1
            self._evidence("kv_transfer_failures", line)
        if _KV_TIMEOUT_RE.match(msg):
            self.hit("kv_transfer_timeouts", line)
        if "Model loading took" in msg and (m := _LOADED_RE.search(msg)):
            self.load_s = max(self.load_s or 0.0, float(m.group("s")))
        if msg[:1] in _STATS_FIRST and (m := STATS_HEAD_RE.match(msg)):
            self.stats_lines += 1
            body = m.group("body")
            n = int(parse_stats_body(body).get("preemptions", 0)) if "Preemptions" in body else 0
            if n:
                self.hit("preemptions", line, n)

    def _evidence(self, key: str, line: str) -> None:
        if len(self.evidence[key]) < MAX_EVIDENCE:
            self.evidence[key].append(line[:MAX_EVIDENCE_CHARS])

    def result(self) -> tuple[dict[str, int | None], dict[str, list[str]]]:
        for stream, st in self.streams.items():
            if st.open is not None:
                self._close(stream, st, None)
        counts: dict[str, int | None] = dict(self.counts)
        counts["engine_crashes"] = max(self.engine_self, self.engine_seen)
        counts["kv_transfer_failures"] = max(self.kv_connector, self.kv_scheduler)
        # preemptions are only printed on stats lines: without any, the log cannot tell
        if not self.stats_lines:
            counts["preemptions"] = None
        return counts, self.evidence


def _split(line: str) -> tuple[str | None, str, str]:
    """(stream, record prefix, message). The stream is the process (pid, or torch rank for c10
    lines); None for raw output. Lines of one log record share the record prefix."""
    m = _VLLM_PREFIX_RE.match(line)
    if m and (m.group("pid") or m.group("level")):
        stream = f"pid{m.group('pid')}" if m.group("pid") else "vllm"
        return stream, m.group(0), line[m.end():]
    m = _C10_PREFIX_RE.match(line)
    if m:
        return f"rank{m.group('rank')}" if m.group("rank") else "c10", m.group(0), line[m.end():]
    return None, "", line


def _lines(chunks: Iterable[str]) -> Iterable[str]:
    # tqdm bars rewrite with "\r"; vLLM's multi-line records use "\r\n"
    for chunk in chunks:
        yield from chunk.splitlines()


def _scan(lines: Iterable[str]) -> _Scan:
    scan = _Scan()
    for line in _lines(lines):
        scan.feed(line)
    return scan


def count_signals(lines: Iterable[str]) -> dict[str, int | None]:
    """Every key of SIGNALS, 0 when not seen; `preemptions` is None when the log has no stats
    line (it is printed nowhere else)."""
    return _scan(lines).result()[0]


def scan_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, until: int | None = None,
              since: int | None = None) -> dict:
    """{"counts": {...}, "evidence": {key: [line, ...]}, "truncated": bool} for a log file.
    A file that cannot be read gives None for every count (absent, not zero). A file larger
    than max_bytes is read from its end, where a crash is. `until`: read only its first
    bytes (what the process logged before it was told to stop); `since`: from there on (an
    engine a study kept from an earlier configuration: what it logged before is that one's)."""
    try:
        with Path(path).open("rb") as f:
            size = f.seek(0, 2)
            if until is not None:
                size = min(size, max(until, 0))
            start = min(max(since or 0, 0), size)
            truncated = size - start > max_bytes
            f.seek(max(start, size - max_bytes))
            data = f.read(min(size - start, max_bytes))
    except OSError:
        return {"counts": dict.fromkeys(SIGNALS), "evidence": {k: [] for k in SIGNALS},
                "truncated": False, "model_load_s": None}
    text = data.decode("utf-8", errors="replace")
    if truncated:
        text = text.partition("\n")[2]  # the first line is cut
    scan = _scan([text])
    counts, evidence = scan.result()
    return {"counts": counts, "evidence": evidence, "truncated": truncated,
            "model_load_s": scan.load_s}


def scan_run(run_dir: Path, plan=None) -> dict:
    """Every process log of a run (the plan's processes, else logs/*.log): per process its
    counts and evidence, and the run's totals (a count is None when no log had it: absent).
    Kept when zero: a clean run shows every count at 0. A log is read up to where teardown
    told its process to stop (run.json): its shutdown is not a fault."""
    run_dir = Path(run_dir)
    if plan is None:
        from launcher.run.plandoc import PlanError, read_plan

        try:
            plan = read_plan(run_dir / "plan.json")
        except PlanError:
            plan = None
    if plan is not None:
        logs = {p.name: run_dir / p.log for p in plan.processes}
    else:
        logs = {p.stem: p for p in sorted((run_dir / "logs").glob("*.log"))}
    from launcher.run.rundir import RunDir

    rec = RunDir(run_dir).read_record()
    procs = rec.processes if rec else {}
    marks = {k: (p.log_bytes_at_start, p.log_bytes_at_stop) for k, p in procs.items()}
    per: dict[str, dict] = {}
    evidence: dict[str, dict] = {}
    loads: dict[str, float] = {}
    for name, path in logs.items():
        if not path.is_file():
            continue
        since, until = marks.get(name, (None, None))
        got = scan_file(path, until=until, since=since)
        per[name] = got["counts"]
        if got["model_load_s"] is not None:
            loads[name] = round(got["model_load_s"], 2)
        if any(got["evidence"].values()):
            evidence[name] = {k: v for k, v in got["evidence"].items() if v}
    totals: dict[str, int | None] = {}
    for key in SIGNALS:
        vals = [c[key] for c in per.values() if c.get(key) is not None]
        totals[key] = sum(vals) if vals else None
    return {"labels": dict(SIGNALS), "totals": totals, "processes": per, "evidence": evidence,
            "model_load_s": loads}
