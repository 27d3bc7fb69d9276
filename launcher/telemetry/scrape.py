"""vLLM /metrics: a fast, vLLM-specific text parser and a concurrent scraper that never stalls.

Why not prometheus_client's parser: on a DP-8 payload it costs ~150 ms per scrape (~15% of a
core per endpoint at 1 Hz); a line split costs ~3 ms (docs/telemetry-costs.md). vLLM's exposition
is regular (one sample per line, `name{labels} value`, labels sorted, no timestamps), so:

- each line is split once at its last space into a *series key* and a value string;
- the key is parsed (name, `engine` label, other labels as canonical JSON, 0.33 renames) once
  and cached, since the same keys come back every scrape;
- unchanged value strings are dropped before any float conversion (the store's change-point
  rule, fused into the same pass);
- histogram `_bucket` series are taken every `bucket_every_s` (default 5 s) while `_sum`,
  `_count`, counters and gauges are taken every scrape: buckets are ~80% of the lines and
  quantiles are read over windows of tens of seconds, while means (`_sum/_count`) keep 1 s;
  a bucket's first sight and its last observation (at a gap or the stop) are always written,
  so a histogram that appears or moves after the last pass is kept.

Rules (docs/contracts.md, docs/vllm-metrics.md): `<family>_created` companion gauges are dropped;
`le` buckets are kept as a label (verbatim, e.g. `"+Inf"`); `engine` leaves the labels and fills
the row's engine column; pre-0.33 names are mapped to their 0.33 names (`RENAMES`); everything
else (router `vllm_router_*`, `process_*`, `http_*`) is kept verbatim. The multiprocess form
(`--api-server-count > 1`: families grouped by type, no `_created`, no `process_*`) needs nothing
special: the parser does not depend on line order or HELP/TYPE lines.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

# old name -> 0.33 name (docs/vllm-metrics.md, "Renames and removals"); suffixes `_total/_bucket/_sum/_count` follow.
RENAMES: dict[str, str] = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries": "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits": "vllm:prefix_cache_hits",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESC_RE = re.compile(r'\\[\\"n]')


def canonical_name(name: str) -> str:
    """The 0.33 name of a sample name (old names mapped, others unchanged)."""
    for old, new in RENAMES.items():
        if name.startswith(old) and name[len(old):] in _SUFFIXES:
            return new + name[len(old):]
    return name


def parse_series_key(key: str) -> tuple[str, str, str] | None:
    """`name{a="x",engine="0"}` -> (name, engine, '{"a":"x"}'); None for dropped series."""
    brace = key.find("{")
    if brace < 0:
        name, labels = key.strip(), {}
    else:
        name = key[:brace].strip()
        body = key[brace + 1: key.rfind("}")]
        labels = {}
        for k, v in _LABEL_RE.findall(body):
            labels[k] = _ESC_RE.sub(lambda m: _UNESCAPE[m.group(0)], v) if "\\" in v else v
    if name.endswith("_created"):
        return None  # creation-time companions of counters/histograms carry no signal
    engine = labels.pop("engine", "")
    return canonical_name(name), engine, json.dumps(labels, sort_keys=True,
                                                    separators=(",", ":"))


def split_line(line: str) -> tuple[str, str] | None:
    """(series key, value string) of one exposition line; None for comments and blanks."""
    if not line or line[0] == "#":
        return None
    key, _, val = line.rpartition(" ")
    if not key:
        return None
    if key[-1] != "}" and (" " in key or "\t" in key):
        # an optional timestamp after the value (legal, vLLM never sends it)
        if "}" in key:
            brace = key.rfind("}")
            key, val = key[: brace + 1], key[brace + 1:].split()[0]
        else:
            parts = line.split()
            if len(parts) < 2:
                return None
            key, val = parts[0], parts[1]
    return key, val


@dataclass
class Sample:
    name: str
    engine: str
    labels: str  # canonical JSON
    value: float


class MetricsParser:
    """Stateful parser: caches parsed series keys across scrapes of one endpoint."""

    def __init__(self) -> None:
        self._keys: dict[str, tuple[str, str, str] | None] = {}

    def key(self, key: str) -> tuple[str, str, str] | None:
        try:
            return self._keys[key]
        except KeyError:
            parsed = self._keys[key] = parse_series_key(key)
            return parsed

    def items(self, text: str) -> list[tuple[str, str]]:
        """(series key, value string) of every kept sample line."""
        out = []
        append = out.append
        keys = self._keys
        get = keys.get
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            k, _, v = line.rpartition(" ")
            parsed = get(k, 0)  # hot path: a key seen before, no timestamp
            if parsed == 0:
                kv = split_line(line)
                if kv is None:
                    continue
                k, v = kv
                parsed = get(k, 0)
                if parsed == 0:
                    parsed = self.key(k)
            if parsed is not None:
                append((k, v))
        return out

    def parse(self, text: str) -> list[Sample]:
        out = []
        for k, v in self.items(text):
            try:
                value = float(v)
            except ValueError:
                continue
            name, engine, labels = self._keys[k]  # type: ignore[misc]
            out.append(Sample(name, engine, labels, value))
        return out


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of one /metrics payload (stateless convenience wrapper)."""
    return MetricsParser().parse(text)


def samples_by(samples: Iterable[Sample], name: str, engine: str | None = None,
               **labels: str) -> list[Sample]:
    """Filter helper for tests and notebooks."""
    out = []
    for s in samples:
        if s.name != name or (engine is not None and s.engine != engine):
            continue
        lab = json.loads(s.labels)
        if all(lab.get(k) == v for k, v in labels.items()):
            out.append(s)
    return out


# --- scraping --------------------------------------------------------------------------------

@dataclass
class Target:
    process: str  # plan process name, or "router"
    url: str  # full /metrics URL


_SPECIAL = frozenset(("+Inf", "-Inf", "Inf", "NaN", "nan", "inf", "-inf"))


def value_text(v: str) -> str | None:
    """The value string as stored: verbatim when it is a plain float literal (no reformatting
    cost), normalised otherwise; None if it is not a number."""
    try:
        f = float(v)
    except ValueError:
        return None
    if ("_" not in v and v[-1].isdigit()) or v in _SPECIAL:
        return v
    return repr(f)


@dataclass
class TargetState:
    """One endpoint's scrape state: parsed-key cache plus the change-point filter, fused into
    one pass over the lines (the generic `store.ChangeFilter` rule, same rows, less work)."""

    target: Target
    node: str
    keyframe_s: float = 60.0
    bucket_every_s: float = 0.0
    parser: MetricsParser = field(default_factory=MetricsParser)
    # series key -> [value str | None, ts str of that observation, written?, row middle,
    # is a bucket?, value as stored, (ts str, value str) of a bucket's last skipped
    # observation or None]; None for a dropped key (e.g. `_created`)
    series: dict[str, list | None] = field(default_factory=dict)
    next_keyframe: float = 0.0
    next_buckets: float = 0.0
    failing: bool = False
    failures: int = 0
    last_ok: float = 0.0
    last_raw: float = 0.0
    last_error: str = ""
    scrapes: int = 0

    def _new(self, line: str) -> tuple[str, str, list | None] | None:
        kv = split_line(line)
        if kv is None:
            return None
        k, v = kv
        st = self.series.get(k, 0)
        if st == 0:
            parsed = self.parser.key(k)
            if parsed is None:
                st = None
            else:
                name, engine, labels = parsed
                st = [None, "", True, f"\t{self.node}\t{self.target.process}\t{engine}\t"
                                      f"{name}\t{labels}\t", name.endswith("_bucket"), "", None]
            self.series[k] = st
        return k, v, st

    def ingest(self, ts: float, text: str) -> list[str]:
        """Store-ready text rows (store.format_row layout) for one scrape's changes."""
        out: list[str] = []
        append = out.append
        get = self.series.get
        ts_s = f"{ts:.3f}"
        keyframe = ts >= self.next_keyframe
        if keyframe:
            self.next_keyframe = ts + self.keyframe_s
        buckets = keyframe or ts >= self.next_buckets
        if buckets:
            self.next_buckets = ts + self.bucket_every_s
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            k, _, v = line.rpartition(" ")
            st = get(k, 0)
            if st == 0:  # first sight of this key (or a line with a timestamp)
                new = self._new(line)
                if new is None:
                    continue
                k, v, st = new
            if st is None:
                continue
            if st[4] and not buckets and st[0] is not None:
                # between bucket passes; kept for a flush, so a run's last buckets (a
                # histogram that appeared or moved after the last pass) are not lost
                st[6] = (ts_s, v)
                continue
            st[6] = None
            if st[0] == v and not keyframe:
                st[1] = ts_s
                st[2] = False
                continue
            # inline value_text(): this loop is the agent's hot path
            try:
                f = float(v)
            except ValueError:
                continue
            vt = v if (v[-1].isdigit() and "_" not in v) or v in _SPECIAL else repr(f)
            if not st[2] and st[0] != v:  # hold point: the end of the unchanged run
                append(f"{st[1]}{st[3]}{st[5]}\n")
            st[0] = v
            st[1] = ts_s
            st[2] = True
            st[5] = vt
            append(f"{ts_s}{st[3]}{vt}\n")
        return out

    def pending(self, *, reset: bool = True) -> list[str]:
        """Unwritten last observations (before a gap, at shutdown); `reset` makes the next
        scrape a keyframe, so series restart cleanly after a gap."""
        out = []
        for st in self.series.values():
            if st is None:
                continue
            skipped, st[6] = st[6], None
            if skipped is not None and st[0] is not None:
                ts_s, v = skipped
                vt = value_text(v) if v != st[0] else None
                if vt is not None:  # a bucket moved after the last pass
                    if not st[2]:
                        out.append(f"{st[1]}{st[3]}{st[5]}\n")
                    out.append(f"{ts_s}{st[3]}{vt}\n")
                    st[0], st[1], st[2], st[5] = v, ts_s, True, vt
                elif v == st[0]:  # unchanged since the pass: its hold extends to here
                    st[1], st[2] = ts_s, False
            if not st[2] and st[0] is not None:
                out.append(f"{st[1]}{st[3]}{st[5]}\n")
            st[2] = True
            if reset:
                st[0] = None
        if reset:
            self.next_keyframe = 0.0
            self.next_buckets = 0.0
        return out


def rows_from_text(state: TargetState, ts: float, text: str) -> list[str]:
    """Store-ready text rows for the changed samples of one scrape."""
    return state.ingest(ts, text)


def pending_rows(state: TargetState) -> list[str]:
    return state.pending()


def describe_error(e: BaseException, timeout: float) -> str:
    """One short reason for a failed scrape (what a gap record says)."""
    import errno

    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return f"timeout after {timeout:g} s"
    os_err = e if isinstance(e, OSError) else e.__cause__  # http.client: the socket's own
    code = getattr(os_err, "errno", None)
    if code == errno.ECONNREFUSED or isinstance(os_err, ConnectionRefusedError):
        return "connection refused"
    if code == errno.EHOSTUNREACH:
        return "host unreachable"
    if code == errno.ECONNRESET or isinstance(e, ConnectionResetError):
        return "connection reset"
    name = type(e).__name__
    text = str(e).strip()
    if "Connect" in name or isinstance(e, OSError):
        return f"cannot connect: {text or name}"
    if name == "IncompleteRead":  # http.client: the body ended before its length
        return f"endpoint closed the connection ({name})"
    return f"{name}: {text}" if text else name


class Scraper:
    """Scrapes every target concurrently, each with a hard timeout, so one slow or dead
    endpoint costs at most `timeout` of wall time and never delays the others.

    Each GET is the standard library's http.client in a thread of its own, on the target's
    kept-alive connection: an agent starts on every node of every run, and aiohttp's import
    alone costs it ~0.15 s of CPU (docs/telemetry-costs.md). No Accept-Encoding is sent, so
    the exposition comes uncompressed (nothing to gzip on the engine, nothing to gunzip here)."""

    def __init__(self, node: str, targets: list[Target], *, timeout: float = 2.0,
                 raw_every_s: float = 60.0, keyframe_s: float = 60.0,
                 bucket_every_s: float = 5.0) -> None:
        self.node = node
        self.timeout = timeout
        self.raw_every_s = raw_every_s
        self.states = [TargetState(t, node, keyframe_s, bucket_every_s) for t in targets]
        self._idle: dict[str, object] = {}  # url -> its kept-alive connection, not in use
        self._pool = None

    def _get(self, url: str) -> str:
        """GET `url` (blocking; a pool thread). A kept connection the endpoint closed while it
        was idle (vLLM's uvicorn drops one after 5 s) fails before any answer: once more, on
        a new one. A GET still running after its timeout keeps its own connection, so the
        next scrape opens another."""
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")

        def connect() -> http.client.HTTPConnection:
            return http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout)

        def ask(conn):
            conn.request("GET", path)
            return conn.getresponse()

        kept = self._idle.pop(url, None)
        conn = kept or connect()
        try:
            try:
                resp = ask(conn)
            except (ConnectionResetError, BrokenPipeError):  # RemoteDisconnected is one
                if kept is None:
                    raise
                conn.close()
                conn = connect()
                resp = ask(conn)
            body = resp.read()
        except BaseException:
            conn.close()
            raise
        if resp.will_close or self._idle.setdefault(url, conn) is not conn:
            conn.close()  # the endpoint ends it, or a newer GET kept one meanwhile
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        return body.decode("utf-8", "replace")

    async def _fetch(self, url: str) -> str:
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            # two threads a target: one may still wait out its timeout on a dead endpoint
            self._pool = ThreadPoolExecutor(max(2, 2 * len(self.states)),
                                            thread_name_prefix="scrape")
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._get, url)

    async def scrape_once(self, writer, ts: float | None = None) -> dict[str, str | None]:
        """Scrape all targets; write rows, raw text and gap records through `writer`
        (a store.SampleWriter). Returns {process: error or None}."""
        ts = time.time() if ts is None else ts
        results = await asyncio.gather(
            *(asyncio.wait_for(self._fetch(s.target.url), self.timeout + 0.5)
              for s in self.states),
            return_exceptions=True)
        status: dict[str, str | None] = {}
        for state, res in zip(self.states, results, strict=True):
            proc = state.target.process
            if isinstance(res, BaseException):
                reason = describe_error(res, self.timeout)
                state.failures += 1
                status[proc] = reason
                if not state.failing:
                    state.failing = True
                    writer.write_lines(pending_rows(state))  # close the series before the gap
                if state.failures == 1 or reason != state.last_error:
                    # one record per new reason (e.g. reset, then refused), not per failure
                    writer.gap(ts=ts, node=self.node, process=proc, source="scrape",
                               target=state.target.url, reason=reason)
                state.last_error = reason
                continue
            status[proc] = None
            if state.failing:
                writer.gap(ts=ts, node=self.node, process=proc, source="scrape",
                           target=state.target.url, reason="recovered", state="closed",
                           failures=state.failures)
                state.failing = False
                state.failures = 0
            state.scrapes += 1
            state.last_ok = ts
            writer.write_lines(rows_from_text(state, ts, res))
            if self.raw_every_s > 0 and ts - state.last_raw >= self.raw_every_s:
                state.last_raw = ts
                writer.write_raw(ts, proc, res)
        return status

    def flush_pending(self, writer) -> None:
        """At stop: unwritten change points, and the failure count of gaps still open."""
        for state in self.states:
            writer.write_lines(pending_rows(state))
            if state.failing:
                writer.gap(ts=time.time(), node=self.node, process=state.target.process,
                           source="scrape", target=state.target.url, reason=state.last_error,
                           state="still_open", failures=state.failures)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        while self._idle:
            self._idle.popitem()[1].close()
