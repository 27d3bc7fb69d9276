"""vLLM's periodic stats log lines: a parser (public: the simulator's tests reuse it) and a
tail that survives rotation, truncation and partial lines.

Formats (docs/vllm-logs.md; fixtures `vllm_server_v0.33.0_*.log`):

    (APIServer pid=13691) INFO 11-29 11:00:09 [loggers.py:335] Engine 000: Avg prompt
        throughput: 5.2 tokens/s, ..., Running: 54 reqs, Waiting: 6 reqs[, Deferred: ..]
        [, KV fetch: a waiting to start, b in progress, c completed waiting][, Preemptions: p],
        GPU KV cache usage: 41.3%[, Prefix cache hit rate: ..%][, Corrupted: n reqs]
        [, External prefix cache hit rate: ..%][, MM cache hit rate: ..%]
    ... 4 Engines Aggregated: <same fields>         (engine "", label aggregated_engines="4")
    ... [metrics.py:108] KV Transfer metrics: Num successful transfers=208, Avg xfer ...
        (no engine id: attached to the preceding stats line of the same pid)
    ... SpecDecoding metrics: Mean acceptance length: ..  (attached the same way)
    ... 4 Engines: vllm cache_config_info with initialization after num_gpu_blocks is: 2731

Sample names (`log:` family, contracts.md). Percentages keep the printed unit (`_pct`, 0-100);
note that `vllm:kv_cache_usage_perc` on /metrics is a 0-1 fraction.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# the record prefix; every part before the level is optional (older vLLM, custom prefixes)
PREFIX_RE = re.compile(
    r"^(?:.*?\((?P<proc>[^()\s]+) pid=(?P<pid>\d+)\) )?(?P<level>[A-Z]+) "
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[?(?P<file>[^:\]\s]+):(?P<line>\d+)\] "
    r"(?P<msg>.*)$")
# the stats line's head: "Engine 000: " or "4 Engines Aggregated: "
STATS_HEAD_RE = re.compile(
    r"^(?:Engine (?P<engine>\d+)|(?P<n>\d+) Engines Aggregated): (?P<body>Avg prompt.*)$")
KV_TRANSFER_RE = re.compile(r"^(?:KVConnectorType: [^,]*, )?KV Transfer metrics: (?P<body>.*)$")
SPEC_RE = re.compile(r"^SpecDecoding metrics: (?P<body>.*)$")
NUM_BLOCKS_RE = re.compile(
    r"^(?:Engine (?P<engine>\d+)|(?P<n>\d+) Engines): vllm cache_config_info with "
    r"initialization after num_gpu_blocks is: (?P<blocks>\d+)")
STATS_DISABLED_RE = re.compile(r"api_server_count more than 1; disabling stats logging")
_NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|n/a|nan)"

# stats-line fields: (regex on the body, names of its numbers)
STATS_FIELDS: list[tuple[re.Pattern, tuple[str, ...]]] = [
    (re.compile(rf"Avg prompt throughput: {_NUM} tokens/s"), ("prompt_throughput_tok_s",)),
    (re.compile(rf"Avg generation throughput: {_NUM} tokens/s"),
     ("generation_throughput_tok_s",)),
    (re.compile(rf"Running: {_NUM} reqs"), ("running_reqs",)),
    (re.compile(rf"Waiting: {_NUM} reqs"), ("waiting_reqs",)),
    (re.compile(rf"Deferred: {_NUM} reqs"), ("deferred_reqs",)),
    (re.compile(rf"KV fetch: {_NUM} waiting to start, {_NUM} in progress, {_NUM} completed "
                r"waiting"),
     ("kv_fetch_waiting_to_start", "kv_fetch_in_progress", "kv_fetch_completed_waiting")),
    (re.compile(rf"Preemptions: {_NUM}"), ("preemptions",)),
    (re.compile(rf"(?:GPU|[A-Z]+) KV cache usage: {_NUM}%?"), ("kv_cache_usage_pct",)),
    (re.compile(rf"(?<!External )(?<!MM )Prefix cache hit rate: {_NUM}%?"),
     ("prefix_cache_hit_rate_pct",)),
    (re.compile(rf"Corrupted: {_NUM} reqs"), ("corrupted_reqs",)),
    (re.compile(rf"External prefix cache hit rate: {_NUM}%?"),
     ("external_prefix_cache_hit_rate_pct",)),
    (re.compile(rf"MM cache hit rate: {_NUM}%?"), ("mm_cache_hit_rate_pct",)),
    # V0-era fields, kept so old logs still give their numbers
    (re.compile(rf"Swapped: {_NUM} reqs"), ("swapped_reqs",)),
    (re.compile(rf"Pending: {_NUM} reqs"), ("pending_reqs",)),
]

# KV Transfer keys (NIXL, 0.33 order) -> sample field; unknown keys are slugged
KV_TRANSFER_KEYS: dict[str, str] = {
    "Num successful transfers": "kv_num_successful_transfers",
    "Avg xfer time (ms)": "kv_avg_xfer_time_ms",
    "P90 xfer time (ms)": "kv_p90_xfer_time_ms",
    "Avg post time (ms)": "kv_avg_post_time_ms",
    "P90 post time (ms)": "kv_p90_post_time_ms",
    "Avg MB per transfer": "kv_avg_mb_per_transfer",
    "Throughput (MB/s)": "kv_throughput_mb_s",
    "Avg number of descriptors": "kv_avg_num_descriptors",
    "Num failed transfers": "kv_num_failed_transfers",
    "Num KV expired reqs": "kv_num_expired_reqs",
    "Num notifs after expiry": "kv_num_notifs_after_expiry",
}
SPEC_KEYS: dict[str, str] = {
    "Mean acceptance length": "spec_mean_acceptance_length",
    "Accepted throughput": "spec_accepted_throughput_tok_s",
    "Drafted throughput": "spec_drafted_throughput_tok_s",
    "Accepted": "spec_accepted_tokens",
    "Drafted": "spec_drafted_tokens",
    "Avg Draft acceptance rate": "spec_avg_draft_acceptance_rate_pct",
}
# every field name this module can emit (as `log:<field>`), for the docs and the dashboard
LOG_FIELDS: tuple[str, ...] = (
    *(n for _, names in STATS_FIELDS for n in names), *KV_TRANSFER_KEYS.values(),
    *SPEC_KEYS.values(), "num_gpu_blocks")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _num(text: str) -> float | None:
    t = text.strip().rstrip("%").strip()
    if t in ("n/a", ""):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_stats_body(body: str) -> dict[str, float]:
    """Fields of the part after `Engine NNN: ` (every field after Waiting is optional)."""
    out: dict[str, float] = {}
    for rx, names in STATS_FIELDS:
        m = rx.search(body)
        if not m:
            continue
        for name, g in zip(names, m.groups(), strict=True):
            v = _num(g)
            if v is not None:
                out[name] = v
    return out


def parse_kv_transfer(body: str) -> dict[str, float]:
    """`Num successful transfers=208, Avg xfer time (ms)=31.214, ...` -> fields."""
    out: dict[str, float] = {}
    for part in body.split(", "):
        key, sep, val = part.rpartition("=")
        if not sep:
            continue
        v = _num(val)
        if v is None:
            continue
        out[KV_TRANSFER_KEYS.get(key.strip(), "kv_" + _slug(key))] = v
    return out


def parse_spec(body: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in body.split(", "):
        key, sep, val = part.partition(": ")
        if not sep:
            continue
        val = val.replace("tokens/s", "").replace("tokens", "").strip()
        v = _num(val)
        if v is not None:
            out[SPEC_KEYS.get(key.strip(), "spec_" + _slug(key))] = v
    return out


@dataclass
class LogRecord:
    ts: float | None  # unix s from the record's month-day time (local time, year inferred)
    pid: str
    proc: str
    level: str
    msg: str


def parse_prefix(line: str, *, now: float | None = None) -> LogRecord | None:
    m = PREFIX_RE.match(line.rstrip("\r\n"))
    if not m:
        return None
    return LogRecord(log_time(m.group("ts"), now=now), m.group("pid") or "",
                     m.group("proc") or "", m.group("level"), m.group("msg"))


def log_time(stamp: str, *, now: float | None = None) -> float | None:
    """`MM-DD HH:MM:SS` (local time, no year) -> unix s: the latest such time not more than a
    day in the future of `now` (logs do not come from the future; a run spans New Year)."""
    now = time.time() if now is None else now
    year = time.localtime(now).tm_year
    for y in (year, year - 1):
        try:
            t = time.mktime(time.strptime(f"{y}-{stamp}", "%Y-%m-%d %H:%M:%S"))
        except ValueError:
            return None
        if t <= now + 86400:
            return t
    return t


@dataclass
class LogSample:
    ts: float
    engine: str
    name: str  # "log:<field>"
    labels: dict[str, str]
    value: float


@dataclass
class StatsLogParser:
    """Line-by-line parser; keeps, per pid, which engine printed the last stats line so the
    following `KV Transfer metrics:` / `SpecDecoding metrics:` lines attach to it."""

    now: float | None = None  # fixes the year inference (tests); None = wall clock
    _last_engine: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    lines: int = 0
    matched: int = 0

    def feed(self, line: str, *, fallback_ts: float | None = None) -> list[LogSample]:
        self.lines += 1
        rec = parse_prefix(line, now=self.now)
        if rec is None:
            return []
        ts = rec.ts if rec.ts is not None else (fallback_ts or time.time())
        msg = rec.msg
        m = STATS_HEAD_RE.match(msg)
        if m:
            engine, labels = self._who(m)
            self._last_engine[rec.pid] = (engine, labels)
            return self._emit(ts, engine, labels, parse_stats_body(m.group("body")))
        m = KV_TRANSFER_RE.match(msg)
        if m:
            engine, labels = self._last_engine.get(rec.pid, ("", {}))
            return self._emit(ts, engine, labels, parse_kv_transfer(m.group("body")))
        m = SPEC_RE.match(msg)
        if m:
            engine, labels = self._last_engine.get(rec.pid, ("", {}))
            return self._emit(ts, engine, labels, parse_spec(m.group("body")))
        m = NUM_BLOCKS_RE.match(msg)
        if m:
            engine, labels = self._who(m)
            return self._emit(ts, engine, labels, {"num_gpu_blocks": float(m.group("blocks"))})
        if STATS_DISABLED_RE.search(msg):
            note = (f"{rec.proc or 'API server'} pid={rec.pid}: stats logging disabled by vLLM "
                    "(api_server_count > 1); use /metrics, or pass --api-server-count 1")
            if note not in self.notices:
                self.notices.append(note)
        return []

    @staticmethod
    def _who(m: re.Match) -> tuple[str, dict[str, str]]:
        if m.group("engine") is not None:
            return str(int(m.group("engine"))), {}  # "000" -> "0", as /metrics' engine label
        return "", {"aggregated_engines": m.group("n")}

    def _emit(self, ts: float, engine: str, labels: dict[str, str],
              fields: dict[str, float]) -> list[LogSample]:
        if fields:
            self.matched += 1
        return [LogSample(ts, engine, "log:" + k, labels, v) for k, v in fields.items()]


def parse_log_text(text: str, *, now: float | None = None) -> list[LogSample]:
    """Every stats sample of a whole log text (tests, post-hoc parsing of a finished run)."""
    p = StatsLogParser(now=now)
    out: list[LogSample] = []
    for line in text.splitlines():
        out.extend(p.feed(line))
    return out


# --- tail ------------------------------------------------------------------------------------

class LogTail:
    """Follows one log file: yields complete new lines; survives rotation (rename + new file:
    the old file's rest is read first), truncation (copytruncate: restart at 0) and a file that
    does not exist yet. A partial last line waits for its newline (capped at `max_line`)."""

    def __init__(self, path: Path, *, from_start: bool = True, max_line: int = 1 << 20,
                 skip: int = 0) -> None:
        """`skip`: bytes of the file (as first opened) that belong to someone else: a
        study's kept engine logged them for an earlier configuration."""
        self.path = Path(path)
        self._skip = skip
        self.max_line = max_line
        self._f = None
        self._ino: tuple[int, int] | None = None
        self._buf = b""
        self._from_start = from_start
        self._head = b""  # the file's first bytes: a changed head means it was rewritten
        self.rotations = 0
        self.truncations = 0

    HEAD = 256

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - kept open across polls
        except FileNotFoundError:
            return False
        st = os.fstat(f.fileno())
        self._f, self._ino = f, (st.st_dev, st.st_ino)
        self._head = b""
        if not self._from_start:
            f.seek(0, os.SEEK_END)
            self._from_start = True  # later (rotated) files are read whole
        elif self._skip:
            f.seek(min(self._skip, st.st_size))
            self._capture_head()
        self._skip = 0
        return True

    def _read_available(self) -> bytes:
        assert self._f is not None
        chunks = []
        while True:
            b = self._f.read(1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)

    def poll(self) -> Iterator[str]:
        """New complete lines since the last poll (decoded, without the newline)."""
        if self._f is None and not self._open():
            return
        data = self._read_available()
        try:
            st = os.stat(self.path)
            cur = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            cur = None
        if cur is not None and cur != self._ino:
            # rotated: what we read finished the old file; continue with the new one
            self._f.close()
            self._f = None
            self.rotations += 1
            yield from self._lines(data)
            if self._open():
                data = self._read_available()
                self._capture_head()
                yield from self._lines(data)
            return
        if cur is not None and self._truncated(st.st_size, len(data)):
            self.truncations += 1
            self._f.seek(0)
            self._buf = b""
            self._head = b""
            data = self._read_available()
        self._capture_head()
        yield from self._lines(data)

    def _capture_head(self) -> None:
        if len(self._head) < self.HEAD and self._f is not None:
            self._head = os.pread(self._f.fileno(), self.HEAD, 0)

    def _truncated(self, size: int, just_read: int) -> bool:
        """Truncated in place (copytruncate), even if already rewritten past our offset:
        shorter than where we are, or its first bytes are not the ones we saw."""
        assert self._f is not None
        if size < self._f.tell():
            return True
        if self._head:
            return os.pread(self._f.fileno(), len(self._head), 0) != self._head
        return False

    def _lines(self, data: bytes) -> Iterator[str]:
        if not data:
            return
        buf = self._buf + data
        parts = buf.split(b"\n")
        self._buf = parts.pop()
        if len(self._buf) > self.max_line:
            self._buf = b""  # a runaway line without newline: drop it rather than grow
        for p in parts:
            yield p.decode("utf-8", "replace").rstrip("\r")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# --- model loading progress -----------------------------------------------------------------

# vLLM's checkpoint loader prints a tqdm bar per shard ("Loading safetensors checkpoint
# shards:  50% Completed | 1/2 [...]"), then "Model loading took X GiB memory and Y seconds"
# once the weights are in (docs/vllm-logs.md, "Model loading").
LOADING_RE = re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed \| (\d+)/(\d+)")
LOADED_RE = re.compile(r"Model loading took [\d.]+ GiB memory and [\d.]+ seconds")


def loading_fraction(text: str) -> float | None:
    """How far an engine is through loading its weights, from the tail of its log: 0..1, or
    None when the log shows no loading yet."""
    if LOADED_RE.search(text):
        return 1.0
    last = None
    for m in LOADING_RE.finditer(text):
        last = m
    if last is None:
        return None
    done, total = int(last.group(2)), int(last.group(3))
    return done / total if total else None


# --- the KV transport UCX picked ------------------------------------------------------------

# UCX_PROTO_INFO=y: UCX prints a table per protocol it selects; a "remote memory read by
# ucp_get*" table's rows end in `| <range> | <description> | <transport>/<device> |`
# (docs/vllm-logs.md). The KV pull of NIXL is that read.
UCX_GET_RE = re.compile(r"remote memory read by ucp_get")
UCX_ROW_RE = re.compile(r"\|\s*\S+\.\.\S+\s*\|[^|]*\|\s*([A-Za-z0-9_]+)/(\S+)\s*\|")


def ucx_transports(text: str) -> list[str]:
    """The `transport/device` configs UCX chose for KV reads, in the order they appear."""
    found: list[str] = []
    in_get = False
    for line in text.splitlines():
        if UCX_GET_RE.search(line):
            in_get = True
            continue
        if in_get:
            m = UCX_ROW_RE.search(line)
            if m:
                cfg = f"{m.group(1)}/{m.group(2)}"
                if cfg not in found:
                    found.append(cfg)
            elif "ucp_context" in line:
                in_get = False
    return found
