"""The per-node telemetry agent.

    python -m launcher.telemetry.agent --run-dir DIR --node NODE --interval S [--exporter-port P]

Reads `plan.json` for the processes on its node, then every interval: scrapes every local
/metrics endpoint (engines with a metrics_url, the router if it runs here) concurrently with a
hard timeout, samples host and per-process state, tails the local vLLM logs for stats lines,
and writes it all to `telemetry/<node>/` through the store. NVML runs in its own thread.
A dead or slow endpoint becomes a gap record with its reason; the loop keeps its beat.
SIGTERM/SIGINT: one last sample, flush what it has (pending change points included), compact,
exit 0.

A node directory that cannot be written (disk full, read-only, I/O errors) never stops it: rows
wait in memory and every beat retries (launcher.telemetry.store.SampleWriter); what it had to
give up on is counted in agent.json's `writes`, in the exporter's `pd_telemetry_*` series and
in its last log line, and the exit status stays 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from launcher.run.plandoc import PlanDoc, PlanError, read_plan
from launcher.run.vocab import Kind
from launcher.telemetry.scrape import Scraper, Target
from launcher.telemetry.statslog import LogTail, StatsLogParser
from launcher.telemetry.store import ChangeFilter, SampleWriter, write_agent_info

INFO_EVERY_S = 10.0
# A segment this small reads as fast as text; compacting it would cost every agent 0.3 s of
# CPU at its stop (the columnar writer's import), mostly on runs of a few minutes.
COMPACT_MIN_BYTES = 4 * 1024 * 1024


def say(node: str, msg: str) -> None:
    """A line on the agent's log; a log that cannot be written (disk full) is no reason to
    stop collecting."""
    try:
        print(f"agent@{node}: {msg}", flush=True)
    except (OSError, ValueError):
        pass


def _key_rows(node: str, out: list[tuple]) -> list[tuple]:
    return [(t, node, k[0], k[1], k[2], k[3], v) for t, k, v in out]


class FilteredSink:
    """Change-point filter in front of the writer for one source (GPU or host); thread-safe."""

    def __init__(self, writer: SampleWriter, node: str, keyframe_s: float,
                 exporter: Any = None) -> None:
        self.writer = writer
        self.node = node
        self.filter = ChangeFilter(keyframe_s)
        self.exporter = exporter
        self.lock = threading.Lock()
        self.rows_in = 0
        self.rows_out = 0

    def __call__(self, rows: list[tuple]) -> None:
        if not rows:
            return
        if self.exporter is not None:
            self.exporter.update(rows)
        ts = rows[0][0]
        with self.lock:
            out = self.filter.step(ts, (((r[2], r[3], r[4], r[5]), r[6]) for r in rows))
            self.rows_in += len(rows)
            self.rows_out += len(out)
            self.writer.write(_key_rows(self.node, out))

    def close(self) -> None:
        with self.lock:
            self.writer.write(_key_rows(self.node, self.filter.pending()))


def load_plan(run_dir: Path) -> tuple[PlanDoc | None, str | None]:
    """The plan, or None and why (the agent then collects host and GPU only)."""
    try:
        return read_plan(run_dir), None
    except PlanError as e:
        return None, str(e)


def local_setup(plan: PlanDoc | None, node: str, run_dir: Path) -> dict[str, Any]:
    """What this node's agent watches: scrape targets, log files, GPU -> process."""
    targets: list[Target] = []
    logs: dict[str, Path] = {}
    gpus: dict[int, str] = {}
    names: set[str] = set()
    ports: dict[int, str] = {}
    if plan is None:
        return {"targets": targets, "logs": logs, "gpus": gpus, "names": None, "ports": ports}
    for p in plan.processes_on(node):
        names.add(p.name)
        if p.kind in (Kind.ENGINE, Kind.ROUTER) and p.url:
            port = urlsplit(p.url).port
            if port:
                ports[port] = p.name
        if p.kind == Kind.ENGINE:
            if p.metrics_url:
                targets.append(Target(p.name, p.metrics_url))
            logs[p.name] = run_dir / p.log
            for g in p.gpus:
                gpus[int(g)] = p.name
        elif p.kind in (Kind.ROUTER, Kind.STORE) and p.metrics_url:
            targets.append(Target(p.name, p.metrics_url))
    return {"targets": targets, "logs": logs, "gpus": gpus, "names": names, "ports": ports}


def kept_log_offsets(run_dir: Path) -> dict[str, int]:
    """process -> its log's size when this run took it over from an earlier one."""
    from launcher.run.rundir import RunDir

    try:
        rec = RunDir(run_dir).read_record()
    except Exception:  # noqa: BLE001 - a damaged record costs this, not the agent
        return {}
    return {n: p.log_bytes_at_start for n, p in (rec.processes if rec else {}).items()
            if p.log_bytes_at_start}


class Agent:
    def __init__(self, run_dir: Path, node: str, interval: float | None = None, *,
                 exporter_port: int | None = None, exporter_addr: str = "0.0.0.0",  # noqa: S104
                 scrape_timeout: float | None = None, raw_every_s: float = 60.0,
                 keyframe_s: float = 60.0, bucket_every_s: float | None = None,
                 gpu: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.node = node
        self.plan, plan_error = load_plan(self.run_dir)
        plan_interval = self.plan.telemetry_interval_s if self.plan else None
        self.interval = float(interval or plan_interval or 1.0)
        # a scrape may use most of an interval, never more: the beat is kept
        self.scrape_timeout = scrape_timeout or max(0.2, min(2.0, 0.8 * self.interval))
        self.node_dir = self.run_dir / "telemetry" / node
        self.writer = SampleWriter(self.node_dir, keyframe_s=keyframe_s,
                                   compact_min_bytes=COMPACT_MIN_BYTES)
        self.setup = local_setup(self.plan, node, self.run_dir)
        self.notices: list[str] = []
        if self.plan is None:
            self.notices.append(f"{plan_error}: collecting host and GPU only")
        elif not self.setup["names"]:
            self.notices.append(f"node {node!r} has no processes in plan.json")
        self.bucket_every_s = (bucket_every_s if bucket_every_s is not None
                               else max(self.interval, 5.0))
        self.scraper = Scraper(node, self.setup["targets"], timeout=self.scrape_timeout,
                               raw_every_s=raw_every_s, keyframe_s=keyframe_s,
                               bucket_every_s=self.bucket_every_s)
        # An engine a study kept loaded from an earlier configuration: what it logged
        # before this run began is that configuration's (run.json says where it stood).
        skip = kept_log_offsets(self.run_dir)
        self.tails = {name: (LogTail(path, skip=skip.get(name, 0)), StatsLogParser())
                      for name, path in self.setup["logs"].items()}
        self.exporter = None
        self.exporter_error = None
        if exporter_port:
            try:
                from launcher.telemetry.exporter import Exporter

                self.exporter = Exporter(node, exporter_port, addr=exporter_addr,
                                         on_sample=self.sample_now)
            except Exception as e:  # noqa: BLE001 - no exporter never stops collection
                self.exporter_error = f"exporter on port {exporter_port} failed: {e}"
                self.notices.append(self.exporter_error)
        from launcher.telemetry.host import HostCollector

        self.host = HostCollector(node, run_dir=str(self.run_dir),
                                  port_owners=self.setup["ports"])
        self.host_sink = FilteredSink(self.writer, node, keyframe_s, self.exporter)
        self.gpu_sink = FilteredSink(self.writer, node, keyframe_s, self.exporter)
        self.gpu_info: dict[str, Any] = {"available": False, "notices": ["GPU collection off"]}
        self.gpu_sampler = None
        if gpu:
            from launcher.telemetry.gpu import GpuCollector, GpuSampler

            collector = GpuCollector(node, self.setup["gpus"])
            self.gpu_info = collector.open()
            if collector.available:
                self.gpu_sampler = GpuSampler(collector, self.gpu_sink, self.interval)
        self.stop_event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_lock = asyncio.Lock()  # a requested sample never overlaps the beat's
        self.started = time.time()
        self.ticks = 0
        self.late_ticks = 0
        self.last_status: dict[str, str | None] = {}
        self.log_rows = 0
        self._last_info = 0.0
        self.info_error: str | None = None
        self._said_failing = False

    # --- one beat ------------------------------------------------------------------------
    def _host_rows(self, ts: float) -> None:
        self.host.up = {p for p, err in self.last_status.items() if err is None}
        rows = self.host.sample(ts)
        allowed = self.setup["names"]
        if allowed:
            rows = [r for r in rows if r[2] == "" or r[2] in allowed]
        self.host_sink(rows)

    def _log_rows(self) -> None:
        now = time.time()
        for name, (tail, parser) in self.tails.items():
            rows = []
            for line in tail.poll():
                for s in parser.feed(line, fallback_ts=now):
                    rows.append((s.ts, self.node, name, s.engine, s.name, s.labels, s.value))
            if rows:
                self.writer.write(rows)
                self.log_rows += len(rows)

    async def tick(self) -> float:
        async with self._tick_lock:
            ts = time.time()
            self.last_status = await self.scraper.scrape_once(self.writer, ts)
            self._host_rows(ts)
            self._log_rows()
            self.writer.flush()
            self.ticks += 1
            self.watch_writes()
            if ts - self._last_info >= INFO_EVERY_S or (self.info_error and self.ticks % 5 == 0):
                self.write_info()
            return ts

    def sample_now(self, timeout: float) -> float | None:
        """From another thread (the exporter's `POST /sample`): one beat begun after this
        call, its time once written; None when the loop is not running or it took longer
        than `timeout`. The teardown asks before it stops the servers: the periodic beat may
        come only after they are gone, and their last requests' counts with them."""
        loop = self._loop
        if loop is None or loop.is_closed() or self.stop_event.is_set():
            return None
        done = asyncio.run_coroutine_threadsafe(self.tick(), loop)
        try:
            return done.result(timeout)
        except Exception:  # noqa: BLE001 - late, cancelled or failed: no sample to name
            done.cancel()
            return None

    def watch_writes(self) -> None:
        """Say when the node directory stops and starts taking writes; serve the counts."""
        w = self.writer.status()
        if self.exporter is not None:
            self.exporter.set_writes(w)
        if w["failing"] and not self._said_failing:
            self._said_failing = True
            say(self.node, f"cannot write {self.node_dir} ({w['last_error']}): keeping rows in "
                           f"memory and retrying every {self.interval:g} s")
        elif not w["failing"] and self._said_failing:
            self._said_failing = False
            say(self.node, f"writing {self.node_dir} again; {w['dropped_rows']} row(s) lost "
                           "so far")
    def write_info(self, *, final: bool = False) -> None:
        self._last_info = time.time()
        log_notices = [n for _, p in self.tails.values() for n in p.notices]
        info = {
            "node": self.node, "pid": os.getpid(), "started": self.started,
            "updated": self._last_info, "final": final, "interval_s": self.interval,
            "scrape_timeout_s": self.scrape_timeout, "bucket_every_s": self.bucket_every_s,
            "notices": self.notices + list(self.gpu_info.get("notices", [])) + log_notices,
            "gpu": self.gpu_info,
            "gpu_sample_errors": (self.gpu_sampler.collector.sample_errors
                                  if self.gpu_sampler else {}),
            "host": self.host.info,
            "processes": self.host.processes(),
            "scrape_targets": [
                {"process": s.target.process, "url": s.target.url, "ok_scrapes": s.scrapes,
                 "failing": s.failing, "last_error": s.last_error, "last_ok": s.last_ok}
                for s in self.scraper.states],
            "logs": {n: str(t.path) for n, (t, _) in self.tails.items()},
            "log_stats_lines": {n: p.matched for n, (_, p) in self.tails.items()},
            "exporter": (None if self.exporter is None else
                         {"addr": self.exporter.addr, "port": self.exporter.port}),
            "ticks": self.ticks, "late_ticks": self.late_ticks,
            "cpu_s": time.process_time(),
            "rows": {"host_in": self.host_sink.rows_in, "host_out": self.host_sink.rows_out,
                     "gpu_in": self.gpu_sink.rows_in, "gpu_out": self.gpu_sink.rows_out,
                     "log": self.log_rows, "text_bytes": self.writer.bytes_written},
            "writes": {**self.writer.status(), "agent_json_error": self.info_error},
        }
        try:
            write_agent_info(self.node_dir, info)
            self.info_error = None
        except OSError as e:  # said in `writes` once it can be written again
            self.info_error = f"{e.strerror or e} ({e.filename or 'agent.json'})"

    # --- main loop -----------------------------------------------------------------------
    async def run(self, duration: float | None = None) -> None:
        loop = self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop_event.set)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread (tests): stop() is called instead
        self.write_info()
        if self.gpu_sampler is not None:
            self.gpu_sampler.start()
        end = None if duration is None else time.time() + duration
        next_t = time.time()
        try:
            while not self.stop_event.is_set():
                await self.tick()
                next_t += self.interval
                now = time.time()
                if now > next_t:  # overran: skip the missed beats, never burst
                    self.late_ticks += 1
                    next_t = now
                if end is not None and now >= end:
                    break
                try:
                    await asyncio.wait_for(self.stop_event.wait(), max(0.0, next_t - now))
                except TimeoutError:
                    pass
            if self.stop_event.is_set():
                await self.last_tick()
        finally:
            self._loop = None
            await self.shutdown()

    async def last_tick(self) -> None:
        """One sample when told to stop: the teardown stops the agents after the servers, so
        the end is on record too. Bounded, so the flush in shutdown comes before the SIGKILL
        that follows a stop's grace."""
        try:
            await asyncio.wait_for(self.tick(), self.scrape_timeout + 1.0)
        except TimeoutError:
            pass

    def stop(self) -> None:
        self.stop_event.set()

    async def shutdown(self) -> None:
        if self.gpu_sampler is not None:
            self.gpu_sampler.stop()
            self.gpu_sampler.collector.close()
        self._log_rows()
        self.scraper.flush_pending(self.writer)
        self.host_sink.close()
        self.gpu_sink.close()
        await self.scraper.close()
        for tail, _ in self.tails.values():
            tail.close()
        self.writer.close()
        self.write_info(final=True)
        if self.exporter is not None:
            self.exporter.close()

    def final_words(self) -> str:
        """The last log line: how many beats, and what could not be written."""
        w = self.writer.status()
        msg = f"stopped after {self.ticks} ticks"
        if w["write_errors"]:
            msg += (f"; {w['write_errors']} failed write(s) to {self.node_dir}, the last: "
                    f"{w['last_error']}; {w['dropped_rows']} row(s), {w['dropped_gaps']} gap "
                    f"record(s) and {w['dropped_raw']} raw payload(s) could not be written: "
                    "the telemetry of this node is partial")
            if self.info_error:
                msg += f"; agent.json could not be written either ({self.info_error})"
        return msg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.telemetry.agent",
                                 description="per-node telemetry agent")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--node", required=True)
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between samples (default: plan telemetry.interval_s, else 1)")
    ap.add_argument("--exporter-port", type=int, default=None)
    ap.add_argument("--exporter-addr", default=os.environ.get("PD_EXPORTER_ADDR", "0.0.0.0"))  # noqa: S104
    ap.add_argument("--scrape-timeout", type=float, default=None)
    ap.add_argument("--raw-every", type=float, default=60.0,
                    help="keep a raw /metrics copy every this many seconds (0: never)")
    ap.add_argument("--keyframe", type=float, default=60.0)
    ap.add_argument("--bucket-every", type=float, default=None,
                    help="seconds between histogram bucket samples (default max(interval, 5))")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    a = ap.parse_args(argv)
    if not a.run_dir.is_dir():
        print(f"error: run directory {a.run_dir} does not exist; pass --run-dir of a run",
              file=sys.stderr)
        return 2
    agent = Agent(a.run_dir, a.node, a.interval, exporter_port=a.exporter_port,
                  exporter_addr=a.exporter_addr, scrape_timeout=a.scrape_timeout,
                  raw_every_s=a.raw_every, keyframe_s=a.keyframe,
                  bucket_every_s=a.bucket_every, gpu=not a.no_gpu)
    for n in agent.notices + list(agent.gpu_info.get("notices", [])):
        say(a.node, n)
    say(a.node, f"{len(agent.setup['targets'])} scrape target(s), {len(agent.tails)} log(s), "
                f"writing {agent.node_dir}")
    asyncio.run(agent.run(a.duration))
    say(a.node, agent.final_words())
    return 0


if __name__ == "__main__":
    sys.exit(main())
