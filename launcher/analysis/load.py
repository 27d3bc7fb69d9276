"""Reading run directories: pure functions, no Streamlit (the app wraps them in caches).

Everything here tolerates missing, empty or half-written files: a run directory is read
while its writers are still running, and a dashboard that raises on a torn file is useless.
A damaged file costs only what it holds: a bad plan.json is `RunInfo.plan_error` (the panels
that need the plan say so), a bad telemetry segment is left out and named in the frame's
`attrs["damaged"]` / `TelemetryReader.damaged` (the panels drawing telemetry say so).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.run import engines, listing
from launcher.run.plandoc import PlanDoc, PlanError, read_plan
from launcher.run.rundir import RunDir, read_json, read_jsonl
from launcher.run.rundir import tail as rundir_tail
from launcher.run.vocab import State

if TYPE_CHECKING:  # pandas is imported lazily: importing this module stays cheap
    import pandas as pd

# The vLLM series the KV and TTFT pages need (0.33 names; the store maps older ones).
KV_NAMES = (
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_requests_kv_fetch_by_stage",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:generation_tokens_total",
    "vllm:nixl_xfer_time_seconds_sum",
    "vllm:nixl_xfer_time_seconds_count",
    "vllm:nixl_bytes_transferred_sum",
    "vllm:nixl_bytes_transferred_count",
    "vllm:nixl_num_failed_transfers_total",
    "vllm:nixl_num_kv_expired_reqs_total",
    "vllm:cache_config_info",
    # the stats log's view (statslog.LOG_FIELDS): observed capacity at the top sweep point
    "log:kv_cache_usage_pct",
    "log:running_reqs",
    "log:num_gpu_blocks",
)
TTFT_NAMES = (
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_prefill_time_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:nixl_xfer_time_seconds_sum",
    "vllm:nixl_xfer_time_seconds_count",
    "vllm:nixl_xfer_time_seconds_bucket",
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:num_requests_running",
    "vllm:num_preemptions_total",
    "vllm:nixl_num_failed_transfers_total",
    "vllm:nixl_num_kv_expired_reqs_total",
    "gpu:energy_mj",  # NVML's energy counter: joules per token over each window
    # speculative decoding (MTP and the like): the acceptance per point
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
)
# Where prompt tokens came from and the KV store's health (launcher.analysis.kv_tiers)
TIER_NAMES = (
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_by_source_total",
    # a vLLM without the two: the prefix-cache counters of new requests
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:request_prefill_time_seconds_sum",
    *(f"vllm:mooncake_store_operation_{s}" for s in (
        "total", "keys_total", "bytes_total", "failed_keys_total", "time_seconds_sum",
        "time_seconds_count", "time_seconds_bucket")),
    *(f"vllm:kv_offload_{way}_{what}_total" for way in ("store", "load")
      for what in ("bytes", "time")),
    "vllm:kv_offload_total_bytes_total",  # the deprecated names (0.33 emits both)
    "vllm:kv_offload_total_time_total",
    "vllm:kv_offload_allocation_failure_total",  # the CPU tier had no room for a store
    # mooncake_master's admin /metrics (tests/data/mooncake_master)
    "master_allocated_bytes", "master_total_capacity_bytes", "master_key_count",
    "master_evicted_key_count", "master_evicted_size_bytes",
    "master_successful_evictions_total", "master_attempted_evictions_total",
    "master_put_start_requests_total", "master_put_start_alloc_failures_total",
    "total_get_nums_", "valid_get_nums_",
)
FAMILIES = {"kv": KV_NAMES, "ttft": TTFT_NAMES, "tiers": TIER_NAMES}


@dataclass
class RunInfo:
    """What the runs page lists and every page's header shows."""

    run_id: str
    path: Path
    state: str
    stage: str | None
    recipe: str | None
    engine: str | None
    mode: str | None
    topology: str
    gpus: int | None
    started: float | None
    ended: float | None
    error: str | None
    points: int
    has_telemetry: bool
    slurm_job_id: str | None = None
    notes: list[str] = field(default_factory=list)  # run.json's: a dead agent, partial telemetry
    study: str | None = None  # the study directory's name, for a run of a --sweep study
    # its study's files that are damaged (study.json, allocation.json): one sentence each
    study_problems: list[str] = field(default_factory=list)
    has_plan: bool = True
    progress: dict = field(default_factory=dict)
    identity: dict = field(default_factory=dict)  # what exactly ran (run.json, preflight)
    engine_platform: str | None = None  # plan.json's: "cpu" is real vLLM on a host CPU
    plan_error: str | None = None  # plan.json exists but cannot be read: the sentence why
    processes: dict[str, str] = field(default_factory=dict)  # name -> "stopped", "exit 137", ...
    dry_run: bool = False  # `submit --dry-run`'s directory: never runs, never refreshed

    @property
    def engine_kind(self) -> engines.EngineKind:
        """What its engines were: how the run is marked and what its figures are."""
        return engines.of(self.engine, self.engine_platform)

    @property
    def live(self) -> bool:
        return not self.dry_run and self.state in (State.PLANNED, State.SUBMITTED, State.RUNNING)


# --- fingerprints --------------------------------------------------------------------------


def fingerprint(*paths: Path) -> str:
    """Hash of every file's name, size and mtime under `paths`: changes iff a file changed.

    Cheap (one stat per file, no reads), so pages can call it on every rerun and let the
    cache decide whether anything has to be read again.
    """
    h = hashlib.blake2b(digest_size=12)
    for root in paths:
        if root.is_file():
            st = root.stat()
            h.update(f"{root}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            continue
        stack = [str(root)]
        while stack:
            d = stack.pop()
            try:
                entries = sorted(os.scandir(d), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            for e in entries:
                if e.name.startswith(".") and e.name.endswith(".tmp"):
                    continue  # write-then-rename temporaries come and go
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    h.update(f"{e.path}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


# --- runs ----------------------------------------------------------------------------------


def list_run_dirs(runs_dir: Path) -> list[Path]:
    """Run directories under `runs_dir`, newest first, studies' runs included (the CLI's
    `launcher runs` lists the same, through launcher.run.listing)."""
    return [r.path for r in listing.all_runs(Path(runs_dir))]


def studies(runs_dir: Path) -> list[listing.Study]:
    return [e for e in listing.entries(Path(runs_dir)) if isinstance(e, listing.Study)]


def read_plan_safe(path: Path) -> tuple[PlanDoc | None, str | None]:
    """The run's plan, or None and why (a bad plan.json costs its own panels, not the page)."""
    try:
        return read_plan(Path(path)), None
    except PlanError as e:
        return None, str(e)


def run_info(path: Path) -> RunInfo:
    rd = RunDir(Path(path))
    plan, why = read_plan_safe(rd.path)
    st = rd.status()
    rec = st.record
    notes: list[str] = list(rec.notes) if rec else []
    notes += [f"{why}: left out" for why in st.damaged.values()]  # named, not raised
    plan_error = f"{why}." if plan is None and rd.plan.exists() else None
    bench_files = sorted(rd.bench.glob("*.json")) if rd.bench.is_dir() else []
    tel = rd.telemetry()
    try:
        has_tel = tel.is_dir() and any(tel.iterdir())
    except OSError:
        has_tel = False
    study = listing.study_of(rd)
    return RunInfo(
        run_id=rd.run_id,
        path=rd.path,
        state=st.state,
        dry_run=st.dry_run,
        stage=st.stage,
        recipe=plan.recipe if plan else None,
        engine=plan.engine if plan else None,
        engine_platform=plan.engine_platform if plan else None,
        mode=plan.mode if plan else None,
        topology=plan.topology() if plan else "—",
        gpus=plan.gpus() if plan else None,
        started=rec.started if rec else None,
        ended=rec.ended if rec else None,
        error=st.error,
        points=len([f for f in bench_files if not f.name.endswith(".window.json")]),
        has_telemetry=has_tel,
        slurm_job_id=st.slurm_job_id,
        notes=notes,
        study=study.name if study else None,
        study_problems=study.problems() if study else [],
        progress=dict(rec.progress) if rec else {},
        has_plan=plan is not None,
        identity=dict(rec.identity) if rec else {},
        plan_error=plan_error,
        processes={n: _shown(p.status, study) for n, p in rec.processes.items()} if rec else {},
    )


def _shown(status: str, study: listing.Study | None) -> str:
    """An engine is kept loaded only while its study's allocation lives (its record says)."""
    if status != "kept loaded" or study is None:
        return status
    rec, why = study.allocation_or_why()
    if why:
        return status  # not known: the record is damaged (run_info's study_problems says so)
    return status if rec is not None and rec.running else "stopped"


def progress_view(progress: dict | None, now: float) -> dict:
    """What a person reads of run.json's `progress` (the orchestrator's `sweep` and
    `loading`), at `now`: sweep point i of N, how long it has run, the time left counted
    down from the estimate made when the point started, and each engine's loading fraction.
    Keys are absent when the record does not say."""
    out: dict[str, Any] = {}
    p = progress if isinstance(progress, dict) else {}
    sw = p.get("sweep")
    if isinstance(sw, dict) and isinstance(sw.get("total"), int) and sw["total"] > 0:
        idx = sw.get("index") if isinstance(sw.get("index"), int) else 0
        started = sw.get("started")
        running = (now - float(started)) if isinstance(started, (int, float)) else None
        left = sw.get("seconds_left")
        left_now = None
        if isinstance(left, (int, float)):
            left_now = max(float(left) - (running or 0.0), 0.0)
        out["sweep"] = {"index": idx, "total": sw["total"], "concurrency": sw.get("concurrency"),
                        "running_s": running, "left_s": left_now,
                        "estimated": isinstance(left, (int, float)),
                        "fraction": max(0.0, min(1.0, (idx - 1) / sw["total"]))}
    lo = p.get("loading")
    if isinstance(lo, dict) and lo:
        rows = sorted((str(k), float(v)) for k, v in lo.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool))
        out["loading"] = rows
        out["loaded"] = sum(1 for _, f in rows if f >= 1.0)
    return out


def read_json_safe(path: Path) -> Any:
    """JSON or None: a missing, empty or torn file is 'not there yet', not an error."""
    return read_json(path)


def read_events(path: Path) -> list[dict]:
    return read_jsonl(RunDir(Path(path)).events_file)


def read_accuracy(path: Path) -> dict | None:
    """The newest GSM8K result (`launcher.run.figures.load_accuracy`, the one reader)."""
    from launcher.run.figures import load_accuracy

    try:
        return load_accuracy(Path(path))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None


# --- bench results -------------------------------------------------------------------------


def load_bench(path: Path) -> list[dict]:
    """Sweep points in vLLM bench-serve schema, ordered by concurrency.

    `launcher.run.results.load_results` is the one reader of bench/ (both drivers, windows,
    status).
    """
    from launcher.run.results import load_results

    rows = list(load_results(Path(path)))

    def conc(r: dict) -> float:
        c = r.get("max_concurrency")
        return float(c) if isinstance(c, (int, float)) else float("inf")

    return sorted(rows, key=lambda r: (conc(r), r.get("window_start") or 0))


# --- logs ----------------------------------------------------------------------------------

_ERR = re.compile(rb"\b(ERROR|CRITICAL|FATAL|Traceback|Exception|exited with)\b|\bError:")
_WARN = re.compile(rb"\b(WARNING|WARN)\b")


def log_signals(path: Path) -> dict:
    """Crash, OOM, NCCL, KV-transfer, traceback and preemption counts per process log."""
    from launcher.telemetry import signals

    return signals.scan_run(Path(path))


def list_logs(path: Path) -> list[Path]:
    return sorted(RunDir(Path(path)).logs.glob("*.log"))


def tail(path: Path, max_lines: int = 200, max_bytes: int = 512 * 1024) -> list[str]:
    return rundir_tail(path, max_lines, max_bytes=max_bytes)


def scan_log(path: Path, max_hits: int = 200) -> dict:
    """Counts of error and warning lines plus the last `max_hits` of each (whole file)."""
    errors: list[str] = []
    warnings: list[str] = []
    n_err = n_warn = n_lines = 0
    try:
        with open(path, "rb") as f:
            for raw in f:
                n_lines += 1
                if _ERR.search(raw):
                    n_err += 1
                    errors.append(raw.rstrip().decode("utf-8", "replace"))
                    if len(errors) > max_hits:
                        del errors[0]
                elif _WARN.search(raw):
                    n_warn += 1
                    warnings.append(raw.rstrip().decode("utf-8", "replace"))
                    if len(warnings) > max_hits:
                        del warnings[0]
    except FileNotFoundError:
        pass
    return {"lines": n_lines, "errors": n_err, "warnings": n_warn,
            "error_lines": errors, "warning_lines": warnings}


# --- telemetry -----------------------------------------------------------------------------


def telemetry_available() -> bool:
    try:
        import launcher.telemetry.store  # noqa: F401
    except ImportError:
        return False
    return True


def telemetry_fingerprint(path: Path) -> str:
    return fingerprint(RunDir(Path(path)).telemetry())


def read_telemetry(path: Path, names: tuple[str, ...] | None = None,
                   prefix: str | None = None, start: float | None = None) -> pd.DataFrame:
    """Samples from the store as a compact frame: categorical keys, float64 ts/value.

    Adds `series` (an int id per (process, engine, name, labels)) so derivations can group
    on one integer column instead of four strings.
    """
    import pandas as pd

    empty = pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("ts", "float64"), ("node", "category"), ("process", "category"),
        ("engine", "category"), ("name", "category"), ("labels", "category"),
        ("value", "float64"), ("series", "int64"))})
    tel = RunDir(Path(path)).telemetry()
    if not tel.is_dir() or not telemetry_available():
        return empty
    from launcher.telemetry import store

    kwargs: dict[str, Any] = {}
    if names is not None:
        kwargs["names"] = list(names)
    if prefix is not None:
        kwargs["name_prefix"] = prefix
    if start is not None:  # only rows from `start` on (incremental reads)
        kwargs.update(start=start, state_at_start=False)
    damaged: list = []
    # categorical keys: the store's fastest path on millions of rows
    df = store.read_samples(Path(path), categorical=True, problems=damaged, **kwargs)
    bad = [(str(p), why) for p, why in damaged]
    if df is None or len(df) == 0:
        empty.attrs["damaged"] = bad
        return empty
    out = compact(df)
    out.attrs["damaged"] = bad
    return out


class TelemetryReader:
    """Incremental reads of one name family of a (live) run: the first read takes
    everything, later ones only rows from `REREAD_S` before the newest row seen, so a live
    2-hour run does not re-read two hours every refresh. The overlap covers agents that
    flush a few intervals late."""

    REREAD_S = 150.0

    def __init__(self, path: Path, names: tuple[str, ...] | None = None,
                 prefix: str | None = None) -> None:
        self.path = Path(path)
        self.names = names
        self.prefix = prefix
        self.df: pd.DataFrame | None = None
        self.reads = 0  # full reads + increments (tests check that increments happen)
        self.damaged: dict[str, str] = {}  # telemetry files left out: path -> why
        self._lock = threading.Lock()  # shared by every browser session of the server

    def read(self) -> pd.DataFrame:
        with self._lock:
            return self._read()

    def _read(self) -> pd.DataFrame:
        if self.df is None or self.df.empty:
            self.df = read_telemetry(self.path, self.names, self.prefix)
            self.damaged = dict(self.df.attrs.get("damaged") or [])
        else:
            import pandas as pd

            cut = float(self.df["ts"].max()) - self.REREAD_S
            new = read_telemetry(self.path, self.names, self.prefix, start=cut)
            old = self.df[self.df["ts"] < cut]
            cols = ["ts", "node", "process", "engine", "name", "labels", "value"]
            both = pd.concat([old[cols].astype({c: object for c in cols[1:6]}),
                              new[cols].astype({c: object for c in cols[1:6]})],
                             ignore_index=True)
            self.damaged.update(dict(new.attrs.get("damaged") or []))
            self.df = compact(both) if len(both) else new
        self.reads += 1
        return self.df


def compact(df: pd.DataFrame) -> pd.DataFrame:
    """Categorical keys, a `series` id per (process, engine, name, labels), sorted by
    (series, ts). Vectorised (factorize + lexsort): this runs on millions of rows."""
    import numpy as np
    import pandas as pd

    keys = ("process", "engine", "name", "labels")
    cols: dict[str, tuple[np.ndarray, Any]] = {}
    combined = np.zeros(len(df), dtype=np.int64)
    for c in ("node", *keys):
        col = df[c] if c in df.columns else pd.Series([""] * len(df))
        if isinstance(col.dtype, pd.CategoricalDtype):
            code = col.cat.codes.to_numpy().astype(np.int64)
            uniq = np.asarray(col.cat.categories, dtype=object)
            if (code < 0).any():  # missing key: its own category ""
                uniq = np.append(uniq, "")
                code = np.where(code < 0, len(uniq) - 1, code)
        else:
            code, uniq = pd.factorize(col.to_numpy(dtype=object), use_na_sentinel=False)
        cols[c] = (code, uniq)
        if c != "node":
            combined = combined * max(len(uniq), 1) + code
    series, _ = pd.factorize(combined, sort=True)
    ts = pd.to_numeric(df["ts"], errors="coerce").to_numpy(dtype="float64")
    value = pd.to_numeric(df["value"], errors="coerce").to_numpy(dtype="float64")
    # The store returns rows sorted by ts, so a stable sort on the series id is enough.
    if len(ts) > 1 and not (np.diff(ts) >= 0).all():
        order = np.lexsort((ts, series))
    else:
        order = np.argsort(series, kind="stable")
    res = {"ts": ts[order]}
    for c, (code, uniq) in cols.items():
        res[c] = pd.Categorical.from_codes(code[order], categories=pd.Index(uniq, dtype=object))
    res["value"] = value[order]
    res["series"] = series[order].astype(np.int64)
    return pd.DataFrame(res)


def read_gaps(path: Path) -> Any:
    if not telemetry_available():
        return None
    from launcher.telemetry import store

    fn = getattr(store, "read_gaps", None)
    try:
        return fn(Path(path)) if fn else None
    except (OSError, ValueError):
        return None


def read_agent_info(path: Path) -> Any:
    if not telemetry_available():
        return None
    from launcher.telemetry import store

    fn = getattr(store, "read_agent_info", None)
    try:
        return fn(Path(path)) if fn else None
    except (OSError, ValueError):
        return None
