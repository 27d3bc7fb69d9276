"""Helpers shared by the end-to-end tests."""

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil


def leftovers(run: Path) -> list[str]:
    """Processes still alive that the launcher started for this run (PD_RUN_DIR)."""
    left = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("PD_RUN_DIR") == str(run):
                left.append(f"{proc.pid} {proc.environ().get('PD_PROCESS')}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left


def fixtures_dir() -> Path:
    """vLLM 0.33 /metrics and log samples, each with a .source.txt saying how it was made."""
    return Path(__file__).resolve().parent / "data" / "vllm_samples"


FIXTURES = fixtures_dir()
# Families a real vLLM API server registers that the generated 0.33 fixtures cannot hold: the
# instrumentator's http_* (their source.txt says so) and the MFU counters vllm:estimated_*
# (their generator stubbed those loggers). Real vLLM 0.32 on CPU has both, and so has the
# simulator (tests/test_vllm_cpu.py compares it with the real engine).
FIXTURE_GAPS = ("http_", "vllm:estimated_")


def in_fixture_scope(name: str) -> bool:
    """A /metrics family or sample name the generated fixtures can be compared on."""
    return not name.startswith(FIXTURE_GAPS)


def devcluster_partition() -> str:
    """The dev-cluster partition this test's jobs go to: its lane's (tests/conftest.py sets
    SBATCH_PARTITION), else the default one, `dev`."""
    import os

    return os.environ.get("SBATCH_PARTITION") or "dev"


def launcher(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    """`python -m launcher ARGS --runs-dir TMP/runs` as a user runs it: (exit code, output)."""
    p = subprocess.run(
        [sys.executable, "-m", "launcher", *args, "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip
    return p.returncode, p.stdout + p.stderr


def plan_doc(prefill: int = 4, *, decode_dp: int = 8, prefill_dp: int = 2, agg: int = 0,
             agg_dp: int = 8, engine: str = "vllm", nodes: list[str] | None = None,
             run_id: str = "r1"):
    """A PlanDoc made by the real planner and renderer on the GB200 profile: `prefill`
    endpoints of DEP`prefill_dp` and one DEP`decode_dp` decode, or `agg` endpoints."""
    from launcher.planning import plan, render
    from launcher.schema import cluster, recipe

    mode = "agg" if agg else "disagg"
    data = {
        "name": "qwen35", "cluster": "gb200-nvl72", "engine": engine, "mode": mode,
        "model": {"path": "/models/q", "served_name": "qwen3.5"},
        "container": {"image": "vllm/vllm-openai@sha256:" + "0" * 64},
    }  # fmt: skip
    if agg:
        data["agg"] = {"endpoints": agg, "data_parallel": agg_dp, "expert_parallel": True}
    else:
        data["prefill"] = {"endpoints": prefill, "data_parallel": prefill_dp,
                           "expert_parallel": True}
        data["decode"] = {"endpoints": 1, "data_parallel": decode_dp, "expert_parallel": True}
    r = recipe.validate(data, "test")
    c = cluster.load("gb200-nvl72")
    names = nodes or cluster.profile_nodes(c, plan.nodes_needed(r, c))
    p = plan.make_plan(r, c, names)
    return render.plan_doc(p.at(f"/runs/{run_id}"), run_id, placeholder_nodes=False)


@contextmanager
def aiohttp_in_thread(make_app: Callable, backlog: int = 128) -> Iterator[str]:
    """The aiohttp app `make_app()` builds, on 127.0.0.1:<free port> with its own event loop
    in a thread; yields its URL and cleans up after."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict = {}

    async def start() -> None:
        runner = web.AppRunner(make_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=backlog).start()
        box["runner"] = runner
        box["port"] = runner.addresses[0][1]

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(10), "test server did not start"
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()


def nvml_gpu_count() -> int:
    """GPUs NVML sees here; 0 where there is no NVML or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any NVML failure means "no GPU here"
        return 0


EPHEMERAL_FLOOR = 32768  # Linux's ip_local_port_range starts here


def free_port_base(bases: Iterable[int], span: int) -> int:
    """The first of `bases` whose `span` ports all bind on 127.0.0.1 now (SO_REUSEADDR, as the
    servers bind). Each suite passes its own bases, so suites sharing a host stay apart;
    under pytest-xdist a worker's own ports stand in for them (worker_ports).
    Blocks reaching into the ephemeral range are skipped: a client's outgoing connection can
    take any port there after the check (a demo's prefill once lost its port that way)."""
    tried = []
    from simprocs import worker_ports

    if (own := worker_ports()) is not None:
        import random

        bases = list(range(own.start, own.stop - span + 1, 100))
        random.Random().shuffle(bases)
    for base in bases:
        if base + span > EPHEMERAL_FLOOR:
            continue
        tried.append(base)
        if all(_binds(port) for port in range(base, base + span)):
            return base
    raise AssertionError(f"no free block of {span} ports at any of {tried[:8]}...: "
                         "other runs on this host hold them")


@contextmanager
def listening(ports: Iterable[int]) -> Iterator[None]:
    """Another program listening on each of `ports`, as a user's would be, each under the
    launcher's lock for it: a run holds that lock from its port check to its end, so this
    never takes a port a run has already planned on. Where a run holds the lock, its port is
    taken all the same."""
    import os

    from launcher.control.probes import block_lock, lock_ports

    held: list = []
    try:
        for port in ports:
            block_lock(port).parent.mkdir(mode=0o1777, exist_ok=True)
            fds = lock_ports(port, 1)
            if fds is None:
                continue
            held += fds
            s = socket.socket()
            held.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
            s.bind(("127.0.0.1", port))
            s.listen()
        yield
    finally:
        for h in held:
            h.close() if isinstance(h, socket.socket) else os.close(h)


def _binds(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def profile_copy(dest: Path, shipped: str, **changes) -> str:
    """A shipped cluster profile with top-level `changes` (port_base, prometheus_sd_dir, ...)
    written to `dest` (as JSON, which is YAML); returns its path."""
    import yaml

    repo = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((repo / "launcher" / "clusters" / f"{shipped}.yaml").read_text())
    data.update(changes)
    Path(dest).write_text(json.dumps(data))
    return str(dest)


def recipe_per_prefill_count(tmp_path: Path, shipped: str,
                             changes: dict[int, dict[str, dict | float]]) -> list[str]:
    """A shipped recipe with `n` prefill endpoints for each `n` of `changes`, each a recipe
    file of its own (a --sweep gives every configuration the same settings) with that
    configuration's top-level `changes[n]` (a section's dict is merged into it). Its paths
    to the GSM8K data stay those of the shipped file. Returns the paths in `changes`' order."""
    import yaml

    src = Path(__file__).resolve().parents[1] / "launcher" / "recipes" / f"{shipped}.yaml"
    r = yaml.safe_load(src.read_text())
    for k in ("data", "train"):  # relative to the shipped file
        r["accuracy"][k] = str((src.parent / r["accuracy"][k]).resolve())
    out = []
    for n, more in changes.items():
        doc = {**r, "name": f"{shipped}-p{n}", "prefill": {**r["prefill"], "endpoints": n}}
        for key, value in more.items():
            doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
        path = tmp_path / f"{shipped}-p{n}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(str(path))
    return out


def wait_for(pred, timeout: float, what: str, poll: float = 0.1):
    """pred()'s first truthy value within `timeout` seconds (an event awaited, not a fixed
    sleep); AssertionError naming `what` otherwise."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= end:
            break
        time.sleep(poll)
    if not v:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")
    return v


@contextmanager
def completions_server(handle) -> Iterator[str]:
    """An OpenAI-style server whose /v1/completions and /v1/chat/completions are `handle`
    (an aiohttp handler), in a thread; yields its URL."""
    from aiohttp import web

    def make_app() -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", handle)
        app.router.add_post("/v1/chat/completions", handle)
        return app

    with aiohttp_in_thread(make_app) as url:
        yield url


def streamlit_healthy(base: str, proc, log: Path, timeout: float = 60) -> None:
    """Streamlit at `base` answers its health check; fails with its log if it died or hung."""
    import urllib.request

    import pytest

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"streamlit did not start: {Path(log).read_text()}")
        time.sleep(0.3)


def stop(proc, grace_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: a stuck server must not hang the suite."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def server_of(process: str, marker: str, under: Path, timeout: float = 120) -> int:
    """The pid of a run's `process` (PD_PROCESS, a glob: "decode-0@*" on whichever node
    Slurm gave it) whose command line holds `marker`, once it runs, for a run directory
    anywhere under `under`."""
    from fnmatch import fnmatchcase

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if fnmatchcase(env.get("PD_PROCESS", ""), process) and env.get(
                    "PD_RUN_DIR", "").startswith(
                    str(under)) and marker in " ".join(p.info["cmdline"] or []):
                return p.pid
        time.sleep(0.5)
    raise AssertionError(f"no {marker!r} process of {process} under {under} in {timeout} s")


def in_image(pid: int, marker: str = "pd-devcluster-engine") -> bool:
    """Whether the process's root is the dev cluster's engine image (containers.sh writes
    /etc/pd-image into it), not this host's."""
    mark = Path(f"/proc/{pid}/root/etc/pd-image")
    return mark.is_file() and mark.read_text().strip() == marker \
        and not Path(f"/proc/{pid}/root{Path(__file__).resolve().parents[1]}").exists()


DASHBOARD_APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")


def open_app(runs_root: Path, monkeypatch, **query: str):
    """The dashboard under Streamlit's AppTest on `runs_root`, opened with `query` as its URL's
    parameters, its first page run without an exception."""
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    monkeypatch.setenv(ui.RUNS_ENV, str(runs_root))
    at = AppTest.from_file(DASHBOARD_APP, default_timeout=180)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
