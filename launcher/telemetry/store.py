"""Telemetry storage under `runs/<run-id>/telemetry/<node>/`: one writer (the node's agent),
any number of readers (dashboard, tests, notebooks), safe on NFS/Lustre.

Files in a node directory (the agent is the only writer of each):

    samples-<start_ms>-<pid>.tsv      the active segment: append-only text rows
    samples-<start_ms>-<pid>.parquet  a rotated segment, compacted (write-then-rename); one
                                      under the writer's `compact_min_bytes` stays text
    raw-<start_ms>-<pid>.zraw         raw /metrics text, zlib, append-only records
    gaps.jsonl                        one line per gap opened / closed, with the reason
    agent.json                        what the agent collects and what it could not (replaced whole)

Row shape (contracts.md): `(ts, node, process, engine, name, labels, value)`. A text row is
`ts \\t node \\t process \\t engine \\t name \\t labels \\t value \\n`; canonical JSON never holds a raw
tab or newline, so a row cannot contain a separator. A writer killed mid-write leaves at most a
torn last line without its newline: readers stop at the last newline, and skip any row that does
not parse (NFS can expose zero-filled tails).

**Change-point encoding** (what keeps a 72-GPU run readable). Most series (histogram buckets,
idle counters, totals) do not change between two scrapes. `ChangeFilter` writes a series'
observation only when

1. its value differs from the previous observation (the change), or
2. the next observation changes it and this one was not written (the *hold point*: the last
   sample of an unchanged run, at its own timestamp), or
3. a keyframe is due (every `KEYFRAME_S`, and the first observation after a start or a gap), or
4. the writer closes or the source goes away (its pending hold points are written).

The scraper applies the same rule with one refinement: histogram `_bucket` series are taken
every `bucket_every_s` (agent default max(interval, 5 s)) while `_sum`, `_count`, counters and
gauges are taken every scrape (buckets are ~80% of a vLLM scrape; quantiles are read over
windows, means keep full resolution), except a bucket's first sight and its last observation
before a gap or the close, which are always written. GPU and host series go through `ChangeFilter` as is.

Consequence for readers: linear interpolation between two consecutive rows of one series gives
back every sampled value exactly (constant runs are stored as their two ends). Counter rates
from consecutive rows are exact averages over their interval; the value of any series at time t
is the last row at or before t (at most `KEYFRAME_S` old while the source is alive).
`read_samples(start=...)` therefore also returns, per series, the last row before `start`.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import zlib
from collections.abc import Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from launcher.run.rundir import read_jsonl

if TYPE_CHECKING:  # heavy imports stay lazy: the agent's hot path never needs them
    import pandas as pd

FORMAT_VERSION = 1
KEYFRAME_S = 60.0
ROTATE_S = 600.0
ROTATE_BYTES = 64 * 1024 * 1024
MAX_PENDING_BYTES = 32 * 1024 * 1024  # rows kept in memory while the directory cannot be written
MAX_PENDING_GAPS = 10000
COLUMNS = ("ts", "node", "process", "engine", "name", "labels", "value")
AGENT_INFO = "agent.json"
GAPS = "gaps.jsonl"
STORE_META = "store.json"

Row = tuple[float, str, str, str, str, "dict | str", float]


def canonical_labels(labels: dict | str | None) -> str:
    """Sorted-key compact JSON; a string is taken as already canonical."""
    if labels is None:
        return "{}"
    if isinstance(labels, str):
        return labels or "{}"
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def format_row(ts: float, node: str, process: str, engine: str, name: str,
               labels: dict | str | None, value: float) -> str:
    return (f"{ts:.3f}\t{node}\t{process}\t{engine or ''}\t{name}\t"
            f"{canonical_labels(labels)}\t{float(value)!r}\n")


# --- change-point filter ---------------------------------------------------------------------

class ChangeFilter:
    """Drops unchanged observations of a set of series observed together (one source).

    `step(ts, items)` takes every `(key, value)` observed at `ts` and returns the
    `(ts, key, value)` triples to store, by the rule in the module docstring. Values are
    compared with `==`, so a scraper can pass the raw value strings and skip float parsing
    of unchanged lines."""

    def __init__(self, keyframe_s: float = KEYFRAME_S) -> None:
        self.keyframe_s = keyframe_s
        # key -> [value, ts of that observation, written?]
        self._last: dict[Hashable, list] = {}
        self._next_keyframe = 0.0

    def step(self, ts: float, items: Iterable[tuple[Hashable, Any]]) -> list[tuple]:
        out: list[tuple] = []
        last = self._last
        if ts >= self._next_keyframe:
            self._next_keyframe = ts + self.keyframe_s
            for key, value in items:
                prev = last.get(key)
                if prev is not None and not prev[2] and prev[0] != value:
                    out.append((prev[1], key, prev[0]))
                last[key] = [value, ts, True]
                out.append((ts, key, value))
            return out
        for key, value in items:
            prev = last.get(key)
            if prev is None:
                last[key] = [value, ts, True]
                out.append((ts, key, value))
            elif prev[0] == value:
                prev[1] = ts
                prev[2] = False
            else:
                if not prev[2]:
                    out.append((prev[1], key, prev[0]))  # hold point
                prev[0] = value
                prev[1] = ts
                prev[2] = True
                out.append((ts, key, value))
        return out

    def pending(self, reset: bool = True) -> list[tuple]:
        """Unwritten last observations (call on a gap or at close); `reset` makes the next
        observation a keyframe, so the series restart cleanly after the gap."""
        out = [(v[1], k, v[0]) for k, v in self._last.items() if not v[2]]
        if reset:
            self._last.clear()
            self._next_keyframe = 0.0
        else:
            for v in self._last.values():
                v[2] = True
        return out


# --- writer ----------------------------------------------------------------------------------

class SampleWriter:
    """Append-only writer of one node directory. Thread-safe: collectors in several threads may
    call `write`; `flush` puts buffered rows into the file (one `write` syscall per flush),
    so a killed agent loses at most the rows buffered since the last flush (one interval).

    A write that fails (disk full, read-only or vanished directory, I/O error) never raises:
    the rows stay in memory (up to `max_pending_bytes`, the oldest whole rows are dropped
    beyond that) and every flush tries again; a segment left mid-row by a partial write is
    completed first. `status()` counts what failed and what was given up on."""

    def __init__(self, node_dir: Path, *, rotate_s: float = ROTATE_S,
                 rotate_bytes: int = ROTATE_BYTES, keyframe_s: float = KEYFRAME_S,
                 compact: bool = True, compact_min_bytes: int = 0,
                 max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        self.node_dir = Path(node_dir)
        self.rotate_s = rotate_s
        self.rotate_bytes = rotate_bytes
        self.keyframe_s = keyframe_s
        self.compact = compact
        self.compact_min_bytes = compact_min_bytes
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.Lock()
        self._buf: list[str] = []
        self._pending = b""  # rows formatted but not yet in a file (a write failed)
        self._pending_rows = 0
        self._gap_pending: list[bytes] = []
        self._fd = -1
        self._seg_path: Path | None = None
        self._seg_started = 0.0
        self._seg_bytes = 0
        self._torn = False  # the open segment ends mid-row (a partial write)
        self._raw_fd = -1
        self._compactors: list[threading.Thread] = []
        self._closed = False
        self.bytes_written = 0  # text rows, all segments (what compaction will have to read)
        self.compact_cpu_s = 0.0  # CPU time spent compacting (all threads of this process)
        # what could not be written: failed attempts (each retried), rows/records given up on
        self.write_errors = 0
        self.dropped_rows = 0
        self.dropped_raw = 0
        self.dropped_gaps = 0
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self.first_failure: float | None = None
        try:
            self.node_dir.mkdir(parents=True, exist_ok=True)
            meta = {"format": FORMAT_VERSION, "encoding": "change-points",
                    "keyframe_s": keyframe_s, "columns": list(COLUMNS)}
            _write_atomic(self.node_dir / STORE_META, json.dumps(meta, indent=1) + "\n")
        except OSError as e:
            self._trouble(e, STORE_META)
        # Text segments left by a killed predecessor: compact them now (one writer per dir).
        orphans = self._to_compact(sorted(self.node_dir.glob("samples-*.tsv")))
        if orphans:
            self._compact_async(orphans)
        try:
            self._open_segment()
        except OSError as e:
            self._trouble(e, "a new samples segment")

    # failures
    def _trouble(self, e: OSError, what: object) -> None:
        now = time.time()
        self.write_errors += 1
        self.last_error = f"{e.strerror or e} ({Path(str(what)).name})"
        if self.failing_since is None:
            self.failing_since = now
        if self.first_failure is None:
            self.first_failure = now

    def status(self) -> dict[str, Any]:
        """What could not be written so far (agent.json's `writes`, the exporter's
        pd_telemetry_* series)."""
        with self._lock:
            return {"write_errors": self.write_errors, "dropped_rows": self.dropped_rows,
                    "pending_rows": self._pending_rows + len(self._buf),
                    "dropped_raw": self.dropped_raw, "dropped_gaps": self.dropped_gaps,
                    "failing": self.failing_since is not None,
                    "failing_since": self.failing_since, "first_failure": self.first_failure,
                    "last_error": self.last_error}

    # segments
    def _segment_path(self, now: float) -> Path:
        # a new name even within the same millisecond (rotation reopens right away)
        self._last_ms = max(int(now * 1000), getattr(self, "_last_ms", 0) + 1)
        return self.node_dir / f"samples-{self._last_ms:013d}-{os.getpid()}.tsv"

    def _open_segment(self) -> None:
        now = time.time()
        path = self._segment_path(now)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._seg_path = path
        self._seg_started = now
        self._seg_bytes = 0
        self._torn = False

    def _rotate_locked(self) -> None:
        old = self._seg_path
        try:
            self._open_new_locked()
        except OSError as e:  # no new segment: keep appending to the old one
            self._trouble(e, "a new samples segment")
            return
        todo = self._to_compact([old]) if old is not None else []
        if todo:
            self._compact_async(todo)

    def _open_new_locked(self) -> None:
        old_fd = self._fd
        now = time.time()
        path = self._segment_path(now)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if old_fd >= 0:
            _close_quietly(old_fd, sync=True)
        self._fd, self._seg_path, self._seg_started, self._seg_bytes = fd, path, now, 0
        if self._torn and self._pending:
            # the rest of a row whose start is in the old segment cannot start this one
            nl = self._pending.find(b"\n")
            self._pending = self._pending[nl + 1:] if nl >= 0 else b""
            if nl >= 0:
                self._pending_rows -= 1
                self.dropped_rows += 1
        self._torn = False

    def _to_compact(self, paths: list[Path]) -> list[Path]:
        """The closed segments to compact: those of at least `compact_min_bytes` (a smaller one
        reads as fast as text, and the columnar writer costs its process 0.3 s of CPU to load).
        An empty one is removed here, as compaction would, without loading it."""
        if not self.compact:
            return []
        out = []
        for path in paths:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size == 0:
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    pass
            elif size >= self.compact_min_bytes:
                out.append(path)
        return out

    def _compact_async(self, paths: list[Path]) -> None:
        t = threading.Thread(target=_compact_quietly, args=(paths,), daemon=True,
                             name="telemetry-compact")
        t.start()
        self._compactors = [c for c in self._compactors if c.is_alive()] + [t]

    # rows
    def write(self, rows: Iterable[Sequence]) -> int:
        """Buffer rows `(ts, node, process, engine, name, labels, value)`; returns how many."""
        lines = [format_row(*r) for r in rows]
        with self._lock:
            self._buf.extend(lines)
        return len(lines)

    def write_lines(self, lines: list[str]) -> None:
        """Buffer rows already made by `format_row` (the scraper's fast path)."""
        with self._lock:
            self._buf.extend(lines)

    def flush(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._buf:
                self._pending += "".join(self._buf).encode()
                self._pending_rows += len(self._buf)
                self._buf.clear()
            if self._pending:
                self._drain_locked()
            if self._gap_pending:
                self._gaps_locked()
            if self._fd >= 0 and not self._pending and (
                    self._seg_bytes >= self.rotate_bytes
                    or (self._seg_bytes and time.time() - self._seg_started >= self.rotate_s)):
                self._rotate_locked()

    def _drain_locked(self) -> None:
        """Write what is pending; on failure keep it (bounded) for the next flush."""
        if self._fd < 0:
            try:
                self._open_new_locked()
            except OSError as e:
                self._trouble(e, "a new samples segment")
                self._bound_locked()
                return
        data = self._pending
        done, err = _write_upto(self._fd, data)
        if done:
            written = data[:done]
            self._pending_rows -= written.count(b"\n")
            self._seg_bytes += done
            self.bytes_written += done
            self._torn = not written.endswith(b"\n")
            self._pending = data[done:]
        if err is None:
            self.failing_since = None
            return
        self._trouble(err, self._seg_path or "samples segment")
        if err.errno in (errno.EBADF, errno.ESTALE, errno.EIO, errno.ENOENT):
            # the file itself may be gone or broken: the next attempt opens a new segment
            _close_quietly(self._fd)
            self._fd = -1
        self._bound_locked()

    def _bound_locked(self) -> None:
        """Give up on the oldest whole rows beyond `max_pending_bytes` (counted)."""
        extra = len(self._pending) - self.max_pending_bytes
        if extra <= 0:
            return
        start = self._pending.find(b"\n") + 1 if self._torn else 0  # finish a torn row first
        cut = self._pending.find(b"\n", start + extra)
        if cut < 0:
            cut = len(self._pending) - 1
        dropped = self._pending[start:cut + 1]
        n = dropped.count(b"\n")
        self._pending = self._pending[:start] + self._pending[cut + 1:]
        self._pending_rows -= n
        self.dropped_rows += n

    def write_raw(self, ts: float, process: str, text: str | bytes, level: int = 1) -> None:
        """Keep one raw /metrics payload, zlib-compressed, for re-parsing later (dropped and
        counted when it cannot be written: raw copies are a convenience)."""
        payload = zlib.compress(text.encode() if isinstance(text, str) else text, level)
        head = f"R\t{ts:.3f}\t{process}\t{len(payload)}\n".encode()
        with self._lock:
            if self._closed:
                return
            path = "raw file"
            try:
                if self._raw_fd < 0:
                    path = self.node_dir / f"raw-{int(time.time() * 1000):013d}-{os.getpid()}.zraw"
                    self._raw_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                _write_all(self._raw_fd, head + payload + b"\n")
            except OSError as e:
                self.dropped_raw += 1
                self._trouble(e, path)
                if self._raw_fd >= 0:  # a torn record ends that file; the next one starts anew
                    _close_quietly(self._raw_fd)
                    self._raw_fd = -1

    def gap(self, *, ts: float, node: str, process: str, source: str, target: str,
            reason: str, state: str = "open", failures: int | None = None) -> None:
        """Record a gap opening (`state="open"`; again when the reason changes), closing
        (`"closed"`, with how many attempts failed) or still open at agent stop
        (`"still_open"`, with the count so far) for one source."""
        row = {"ts": round(ts, 3), "node": node, "process": process, "source": source,
               "target": target, "state": state, "reason": reason}
        if failures is not None:
            row["failures"] = failures
        with self._lock:
            self._gap_pending.append((json.dumps(row) + "\n").encode())
            self._gaps_locked()

    def _gaps_locked(self) -> None:
        try:
            with open(self.node_dir / GAPS, "ab") as f:
                f.write(b"".join(self._gap_pending))
            self._gap_pending.clear()
        except OSError as e:
            self._trouble(e, GAPS)
            if len(self._gap_pending) > MAX_PENDING_GAPS:
                n = len(self._gap_pending) - MAX_PENDING_GAPS
                del self._gap_pending[:n]
                self.dropped_gaps += n

    def close(self, *, wait_compaction: float = 30.0) -> None:
        """Flush, fsync, compact the last segment (a clean stop leaves no text segment of
        `compact_min_bytes` or more). Rows that still cannot be written are given up on and
        counted."""
        self.flush()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            last = self._seg_path
            self.dropped_rows += self._pending_rows
            self.dropped_gaps += len(self._gap_pending)
            self._pending, self._pending_rows, self._gap_pending = b"", 0, []
            if self._fd >= 0:
                _close_quietly(self._fd, sync=True)
            if self._raw_fd >= 0:
                _close_quietly(self._raw_fd, sync=True)
        if last is not None:
            _compact_quietly(self._to_compact([last]))
        deadline = time.time() + wait_compaction
        for t in self._compactors:
            t.join(max(0.0, deadline - time.time()))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_upto(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write as much of `data` as the file takes: (bytes written, the error that stopped it)."""
    done = 0
    view = memoryview(data)
    while done < len(data):
        try:
            done += os.write(fd, view[done:])
        except OSError as e:
            return done, e
    return done, None


def _close_quietly(fd: int, sync: bool = False) -> None:
    try:
        if sync:
            os.fsync(fd)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def _write_atomic(path: Path, text: str) -> None:
    from launcher.run.rundir import write_atomic

    write_atomic(path, text, sync=False)  # rewritten every few seconds: no fsync


def write_agent_info(node_dir: Path, info: dict) -> None:
    """Replace `agent.json` whole (the agent is its only writer)."""
    Path(node_dir).mkdir(parents=True, exist_ok=True)
    _write_atomic(Path(node_dir) / AGENT_INFO, json.dumps(info, indent=1, default=str) + "\n")


# --- compaction ------------------------------------------------------------------------------

compaction_errors: list[str] = []  # kept for the agent's info file


def _compact_quietly(paths: list[Path]) -> None:
    for p in paths:
        try:
            compact_segment(p)
        except Exception as e:  # noqa: BLE001 - a failed compaction keeps the readable text file
            compaction_errors.append(f"{p.name}: {e}")


def compact_segment(tsv: Path) -> Path | None:
    """Text segment -> parquet sorted by (name, ts), so name filters prune row groups.
    Write-then-rename, then the text file goes; readers prefer the parquet when both exist."""
    import pyarrow.parquet as pq

    # one thread: the agent compacts in the background; pyarrow's pool (one thread per core,
    # 72 on a Grace host) costs more CPU in overhead than it saves on a 64 MiB segment
    table = _read_tsv(tsv, threads=False)
    if table is None:
        return None
    out = tsv.with_suffix(".parquet")
    if table.num_rows:
        import pyarrow as pa
        import pyarrow.compute as pc

        idx = pc.sort_indices(table, sort_keys=[("name", "ascending"), ("ts", "ascending")])
        # dictionary-encode before the take: moving int codes is ~40x cheaper than strings
        table = pa.table({c: (pc.dictionary_encode(table.column(c)) if c in _KEYS
                              else table.column(c)) for c in table.column_names})
        table = table.take(idx)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        pq.write_table(table, tmp, compression="zstd", row_group_size=65536)
        os.replace(tmp, out)
    tsv.unlink(missing_ok=True)
    return out if table.num_rows else None


# --- readers ---------------------------------------------------------------------------------

def _arrow_schema():
    import pyarrow as pa

    return pa.schema([("ts", pa.float64()), ("node", pa.string()), ("process", pa.string()),
                      ("engine", pa.string()), ("name", pa.string()), ("labels", pa.string()),
                      ("value", pa.float64())])


def _read_tsv(path: Path, *, threads: bool = False, problems: list | None = None):
    """A text segment as an arrow table: complete lines only, bad lines skipped (and said in
    `problems` as (path, why) when a list is given)."""
    import io

    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    schema = _arrow_schema()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:  # an I/O error: this segment is lost to readers, the others are not
        if problems is not None:
            problems.append((path, f"it cannot be read: {e.strerror or e}"))
        return schema.empty_table()
    end = data.rfind(b"\n")
    if end < 0:
        return schema.empty_table()
    data = data[: end + 1]
    try:  # pyarrow would decode a bad row's text inside its callback and swallow the error
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", "replace").encode("utf-8")
    ropt = pcsv.ReadOptions(column_names=list(COLUMNS), block_size=1 << 22, use_threads=threads)
    popt = pcsv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                             newlines_in_values=False,
                             invalid_row_handler=lambda _row: "skip")
    copt = pcsv.ConvertOptions(column_types=schema, strings_can_be_null=False,
                               null_values=[""], quoted_strings_can_be_null=False)
    try:
        table = pcsv.read_csv(io.BytesIO(data), read_options=ropt, parse_options=popt,
                              convert_options=copt)
    except Exception:  # noqa: BLE001 - a damaged segment: fall back to a line-by-line parse
        table = _read_tsv_slow(data)
    mask = pc.and_(pc.is_valid(table["ts"]), pc.is_valid(table["value"]))
    table = table.filter(mask)
    if problems is not None:
        lines = data.count(b"\n")
        bad = lines - table.num_rows
        if bad > 0:
            problems.append((path, f"{bad} of {lines} line(s) are not telemetry rows and "
                                   "were left out"))
    return table


def _read_tsv_slow(data: bytes):
    import pyarrow as pa

    cols: dict[str, list] = {c: [] for c in COLUMNS}
    for line in data.split(b"\n"):
        parts = line.decode("utf-8", "replace").split("\t")
        if len(parts) != 7:
            continue
        try:
            ts, value = float(parts[0]), float(parts[6])
        except ValueError:
            continue
        for c, v in zip(COLUMNS, (ts, *parts[1:6], value), strict=True):
            cols[c].append(v)
    return pa.table(cols, schema=_arrow_schema())


def _telemetry_root(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    return run_dir / "telemetry" if (run_dir / "telemetry").is_dir() else run_dir


def node_dirs(run_dir: Path, nodes: Iterable[str] | None = None) -> list[Path]:
    root = _telemetry_root(run_dir)
    if not root.is_dir():
        return []
    wanted = set(nodes) if nodes is not None else None
    try:
        return sorted(p for p in root.iterdir()
                      if p.is_dir() and not p.name.startswith(".")
                      and (wanted is None or p.name in wanted))
    except OSError:  # an unreadable telemetry directory holds nothing a reader can use
        return []


def _segments(node_dir: Path) -> tuple[list[Path], list[Path]]:
    """(parquet files, text files); a text segment already compacted is left out. Text is
    listed first: a segment compacted between the two listings is then in the second (the
    other order missed it), and one compacted after is read from its parquet by the caller."""
    listed = sorted(node_dir.glob("samples-*.tsv"))
    parquet = sorted(node_dir.glob("samples-*.parquet"))
    done = {p.stem for p in parquet}
    return parquet, [p for p in listed if p.stem not in done]


def _filter_expr(names, name_prefix, processes, start, end):
    import pyarrow.dataset as ds

    expr = None

    def _and(e):
        return e if expr is None else expr & e

    if names is not None:
        expr = _and(ds.field("name").isin(list(names)))
    if name_prefix is not None:
        prefixes = [name_prefix] if isinstance(name_prefix, str) else list(name_prefix)
        pe = None
        for p in prefixes:
            # a range filter prunes row groups by their min/max statistics; the string ends
            # with the highest code point so every name starting with `p` is inside
            e = (ds.field("name") >= p) & (ds.field("name") < p + "\U0010ffff")
            pe = e if pe is None else pe | e
        expr = _and(pe)
    if processes is not None:
        expr = _and(ds.field("process").isin(list(processes)))
    if start is not None:
        expr = _and(ds.field("ts") >= float(start))
    if end is not None:
        expr = _and(ds.field("ts") <= float(end))
    return expr


_KEYS = ("node", "process", "engine", "name", "labels")


def read_samples(run_dir: Path, *, names: Iterable[str] | None = None,
                 name_prefix: str | Sequence[str] | None = None,
                 nodes: Iterable[str] | None = None, processes: Iterable[str] | None = None,
                 start: float | None = None, end: float | None = None,
                 state_at_start: bool = True, categorical: bool = False,
                 problems: list | None = None) -> pd.DataFrame:
    """Samples of a run (or of one `telemetry/` dir) as a DataFrame with columns
    ts (float unix s), node, process, engine ("" if none), name, labels (canonical JSON),
    value (float), sorted by ts. Rows are change points (module docstring). With `start` and
    `state_at_start`, each series' last row before `start` is included too, so the value of
    every series at `start` is known. Name, process and time filters are pushed down to the
    parquet scan. `categorical=True` returns the five key columns as pandas categoricals
    (fastest on millions of rows); otherwise they are plain str (object) columns.

    A damaged segment (a parquet file that does not open, text lines that are not rows) costs
    only its own rows: it is left out, and (path, why) goes to `problems` when a list is given
    (also `df.attrs["damaged"]`)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    names = list(names) if names is not None else None
    processes = list(processes) if processes is not None else None
    lookback = None
    if start is not None and state_at_start:
        lookback = float(start) - _keyframe_s(run_dir, nodes) - 5.0
    lo = lookback if lookback is not None else start
    expr = _filter_expr(names, name_prefix, processes, lo, end)
    tables = []
    fmt = ds.ParquetFileFormat(read_options={"dictionary_columns": list(_KEYS)})
    damaged: list = []
    for nd in node_dirs(run_dir, nodes):
        try:
            parquet, text = _segments(nd)
        except OSError as e:  # a node directory that cannot be listed (I/O error)
            damaged.append((nd, f"the directory cannot be read: {e.strerror or e}"))
            continue
        if parquet:
            tables += _read_parquet(parquet, fmt, expr, damaged)
        for t in text:
            tab = _read_tsv(t, problems=damaged)
            if tab is None:  # compacted while we listed: read its parquet
                pq_path = t.with_suffix(".parquet")
                if not pq_path.exists():
                    continue
                tab = ds.dataset([str(pq_path)], format=fmt).to_table()
            if expr is not None and tab.num_rows:
                tab = tab.filter(expr)
            tables.append(tab)
    cols: dict[str, Any] = {}
    if tables:
        for c in ("ts", *_KEYS, "value"):
            chunks = []
            for t in tables:
                col = t.column(c)
                if c in _KEYS and not pa.types.is_dictionary(col.type):
                    col = pc.dictionary_encode(col)
                elif c in _KEYS:
                    col = col.cast(pa.dictionary(pa.int32(), pa.string()))
                chunks.extend(col.chunks)
            cols[c] = (pa.chunked_array(chunks) if chunks else
                       pa.chunked_array([], pa.float64() if c in ("ts", "value")
                                        else pa.dictionary(pa.int32(), pa.string())))
        table = pa.table(cols)
    else:
        table = pa.table({c: pa.array([], pa.float64() if c in ("ts", "value")
                                      else pa.dictionary(pa.int32(), pa.string()))
                          for c in ("ts", *_KEYS, "value")})
    df = table.to_pandas()  # dictionary columns arrive as categoricals (no per-row strings)
    for c in _KEYS:
        if not isinstance(df[c].dtype, pd.CategoricalDtype):
            df[c] = df[c].astype("category")
    if lookback is not None and len(df):
        ts = df["ts"].to_numpy()
        before = ts < float(start)
        if before.any():
            # the last row per series before `start`, found on integer codes
            code = np.zeros(len(df), dtype=np.int64)
            for c in _KEYS:
                code = code * (len(df[c].cat.categories) + 1) + \
                    df[c].cat.codes.to_numpy().astype(np.int64)
            idx = np.flatnonzero(before)
            order = idx[np.lexsort((ts[idx], code[idx]))]
            last = np.ones(len(order), dtype=bool)
            last[:-1] = code[order][1:] != code[order][:-1]
            keep = np.concatenate([order[last], np.flatnonzero(~before)])
            df = df.iloc[keep]
    df = df.iloc[np.argsort(df["ts"].to_numpy(), kind="stable")].reset_index(drop=True)
    if not categorical:
        for c in _KEYS:
            cat = df[c].cat
            # object column sharing one str per distinct value: no per-row string copies
            df[c] = pd.Series(np.asarray(cat.categories, dtype=object)[cat.codes.to_numpy()],
                              dtype=object, index=df.index)
    if problems is not None:
        problems.extend(damaged)
    df.attrs["damaged"] = [(str(p), why) for p, why in damaged]
    return df


def _read_parquet(paths: list[Path], fmt, expr, damaged: list) -> list:
    """Rows of these parquet segments; one that does not open or read is left out and said
    in `damaged`, the others still count."""
    import pyarrow.dataset as ds

    try:
        return [ds.dataset([str(p) for p in paths], format=fmt).to_table(filter=expr)]
    except FileNotFoundError:  # compacted again under us: read them one by one
        pass
    except Exception:  # noqa: BLE001 - a damaged file among them: find it
        pass
    out = []
    for p in paths:
        try:
            out.append(ds.dataset([str(p)], format=fmt).to_table(filter=expr))
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 - arrow raises several kinds for a bad file
            why = " ".join(str(e).replace(f"'{p}'", "it").replace(str(p), "it").split())
            damaged.append((p, f"{type(e).__name__}: {why[:300]}"))
    return out


def _keyframe_s(run_dir: Path, nodes: Iterable[str] | None) -> float:
    best = KEYFRAME_S
    for nd in node_dirs(run_dir, nodes):
        try:
            best = max(best, float(json.loads((nd / STORE_META).read_text())["keyframe_s"]))
        except (OSError, KeyError, ValueError, TypeError):
            continue
    return best


def read_gaps(run_dir: Path, *, nodes: Iterable[str] | None = None) -> pd.DataFrame:
    """Gaps as intervals: columns node, process, source ("scrape" | "log" | "gpu" | ...),
    target (URL, file, GPU), start, end (NaN while still open), reason (the distinct reasons
    in order, "; "-joined, e.g. "connection reset; connection refused"), failures (how many
    failed attempts it spans)."""
    import pandas as pd

    out = []
    for nd in node_dirs(run_dir, nodes):
        open_: dict[tuple, dict] = {}
        for r in read_jsonl(nd / GAPS):
            key = (r.get("node", nd.name), r.get("process", ""), r.get("source", ""),
                   r.get("target", ""))
            if r.get("state") == "closed":
                g = open_.pop(key, None)
                if g is not None:
                    g["end"] = r["ts"]
                    g["failures"] = max(g["failures"], int(r.get("failures") or 0))
                    out.append(g)
            elif r.get("state") == "still_open":  # written at agent stop: the count so far
                if key in open_:
                    open_[key]["failures"] = max(open_[key]["failures"],
                                                 int(r.get("failures") or 0))
            elif key in open_:
                g = open_[key]
                g["failures"] += 1
                reason = r.get("reason", "")
                if reason and reason not in g["reason"].split("; "):
                    g["reason"] += "; " + reason
            else:
                open_[key] = {"node": key[0], "process": key[1], "source": key[2],
                              "target": key[3], "start": r["ts"], "end": float("nan"),
                              "reason": r.get("reason", ""), "failures": 1}
        out.extend(open_.values())
    cols = ["node", "process", "source", "target", "start", "end", "reason", "failures"]
    df = pd.DataFrame(out, columns=cols)
    return df.sort_values("start", kind="stable").reset_index(drop=True)


def read_agent_info(run_dir: Path) -> dict[str, dict]:
    """Per node: the agent's `agent.json` (what NVML/the driver supported and what was missing,
    a `notices` list such as the "no NVML" line, scrape targets, log files, processes)."""
    out: dict[str, dict] = {}
    for nd in node_dirs(run_dir):
        try:
            out[nd.name] = json.loads((nd / AGENT_INFO).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return out


def read_raw(run_dir: Path, *, nodes: Iterable[str] | None = None,
             processes: Iterable[str] | None = None, start: float | None = None,
             end: float | None = None) -> Iterator[tuple[str, float, str, str]]:
    """Raw /metrics payloads kept by the agent: yields (node, ts, process, text) in file order;
    a torn last record is skipped."""
    wanted = set(processes) if processes is not None else None
    for nd in node_dirs(run_dir, nodes):
        try:
            paths = sorted(nd.glob("raw-*.zraw"))
        except OSError:
            continue
        for path in paths:
            try:
                data = path.read_bytes()
            except OSError:
                continue
            pos = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break
                head = data[pos:nl].decode("utf-8", "replace").split("\t")
                if len(head) != 4 or head[0] != "R":
                    break  # damaged: nothing after it can be framed
                ts, proc, n = float(head[1]), head[2], int(head[3])
                body = data[nl + 1: nl + 1 + n]
                pos = nl + 1 + n + 1
                if len(body) < n:
                    break  # torn
                if wanted is not None and proc not in wanted:
                    continue
                if (start is not None and ts < start) or (end is not None and ts > end):
                    continue
                yield nd.name, ts, proc, zlib.decompress(body).decode("utf-8", "replace")
