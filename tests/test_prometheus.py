"""A real Prometheus (Debian's 2.42, installed by tests/prometheus/setup.sh) finds and scrapes
every job through the file-SD targets the launcher writes, using the very scrape config
`python -m launcher prometheus-config RUNS_DIR` prints.

Each test starts its own Prometheus on 127.0.0.1 (a free port, a temporary config and storage
directory) and stops it. A missing Prometheus fails the tests with the command to run; it
never skips them. The runs use a copy of the shipped cluster profile on a free port block, so
they never clash with another run on this host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import helpers
import psutil
import pytest
from helpers import leftovers, nvml_gpu_count

from launcher.run import rundir
from launcher.telemetry import promsd

REPO = Path(__file__).resolve().parents[1]
SETUP = "sudo bash tests/prometheus/setup.sh"
INSTALL_HINT = f"Prometheus is not installed: run `{SETUP}` (make test does)"
DOC = REPO / "docs" / "prometheus.md"
# the Grafana examples of docs/prometheus.md, run against the local run's data
PROMQL_KV = 'max by (run_id, endpoint, engine) (vllm:kv_cache_usage_perc{role="decode"})'
PROMQL_TTFT = ("histogram_quantile(0.9, sum by (run_id, endpoint, le) "
               "(rate(vllm:time_to_first_token_seconds_bucket[$__rate_interval])))")


def _binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists()
                                  else None)
    if path is None:
        pytest.fail(f"{name}: {INSTALL_HINT}", pytrace=False)
    return path


# --- a Prometheus of our own -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """One Prometheus on 127.0.0.1 with `config`; `stop()` ends it (the fixture makes sure)."""

    def __init__(self, workdir: Path, config: str) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(self.dir / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [_binary("prometheus"), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.dir,
            env={**os.environ, "GOMAXPROCS": "1"},  # the CPUs here are shared
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.logs()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"prometheus not ready in 30 s: {self.logs()}")

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.dir / "prometheus.log").read_text()[-3000:]

    def api(self, path: str, **params) -> dict | list:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def targets(self, run_id: str) -> list[dict]:
        return [t for t in self.api("targets", state="active")["activeTargets"]
                if t["labels"].get("run_id") == run_id]

    def query(self, q: str, at: float | None = None) -> list[dict]:
        params = {"query": q}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


@pytest.fixture
def prometheus(tmp_path):
    started: list[Prometheus] = []

    def start(config: str) -> Prometheus:
        p = Prometheus(tmp_path / f"prometheus{len(started)}", config)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


# --- runs on a port block of their own -------------------------------------------------------


def free_port_base(span: int = 1000) -> int:
    """Not the shipped profiles' 21000-24999, below Linux's ephemeral ports."""
    return helpers.free_port_base(range(25000, 32000, span), span)


def profile(tmp_path: Path, shipped: str, **changes) -> Path:
    """A copy of a shipped cluster profile with `changes` (port_base, prometheus_sd_dir)."""
    return Path(helpers.profile_copy(tmp_path / f"{shipped}-prom.yaml", shipped, **changes))


def submit(tmp_path: Path, recipe: str, *sets: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "launcher", "submit", recipe,
            "--runs-dir", str(tmp_path / "runs")]
    for s in sets:
        args += ["--set", s]
    return subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def the_run(tmp_path: Path, timeout: float = 30) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError("no run directory appeared")


def expected_targets(run: Path) -> dict[str, dict]:
    """instance -> the labels its target must carry, for every process that serves metrics."""
    plan = json.loads((run / "plan.json").read_text())
    out = {}
    for p in plan["processes"]:
        if p["kind"] in ("engine", "router", "agent") and p.get("metrics_url"):
            inst = urllib.parse.urlsplit(p["metrics_url"]).netloc
            labels = {"run_id": plan["run_id"], "recipe": plan["recipe"],
                      "cluster": plan["cluster"], "engine_kind": plan["engine"],
                      "kind": p["kind"], "node": p["node"], "job": promsd.JOB_NAME,
                      "instance": inst}
            if p["kind"] == "engine":
                labels.update(role=p["role"], endpoint=p["endpoint"])
            out[inst] = labels
    return out


def run_listeners(run: Path) -> list[tuple[str, str, int]]:
    """(process, address, port) of every TCP listener of the run's processes (PD_RUN_DIR in
    their environment, and their descendants: vllm-router renames itself)."""
    pids: dict[int, str] = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("PD_RUN_DIR") == str(run):
            name = env.get("PD_PROCESS", "?")
            pids[proc.pid] = name
            try:
                for c in proc.children(recursive=True):
                    pids.setdefault(c.pid, name)
            except psutil.NoSuchProcess:
                pass
    return sorted({(pids[c.pid], c.laddr.ip, c.laddr.port)
                   for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.pid in pids and c.laddr})


def stop_run(proc: subprocess.Popen, run: Path | None) -> None:
    """Whatever happened, nothing of the run stays up: a Slurm job is cancelled, a local
    orchestrator gets Ctrl-C (it tears everything down), killed if it hangs."""
    if run is not None and (run / "plan.json").exists() and \
            not rundir.RunDir(run).status().final and rundir.RunDir(run).status().slurm_job_id:
        subprocess.run([sys.executable, "-m", "launcher", "cancel", str(run)],
                       capture_output=True, timeout=60, check=False)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the orchestrator tears down on Ctrl-C
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for left in leftovers(run) if run is not None else []:  # "pid name"
                try:
                    os.kill(int(left.split()[0]), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


def wait_targets_up(prom: Prometheus, run: Path, done, timeout: float) -> list[dict]:
    """Until every expected target is active and up; fails if the run ends first."""
    run_id = run.name
    deadline = time.monotonic() + timeout
    seen: list[dict] = []
    while time.monotonic() < deadline:
        want = expected_targets(run)  # a Slurm job plans again on its real nodes
        seen = prom.targets(run_id)
        up = {t["labels"]["instance"] for t in seen if t["health"] == "up"}
        if up >= set(want) and len(seen) == len(want):
            return seen
        if done():
            break
        time.sleep(0.5)
    have = {t["labels"]["instance"]: (t["health"], t.get("lastError")) for t in seen}
    st = rundir.RunDir(run).status()
    raise AssertionError(f"targets not all up (run {st.state}: {st.error}): want {sorted(want)},"
                         f" Prometheus has {have}; SD files: {sd_files(run)}")


def sd_files(run: Path) -> list[str]:
    return sorted(str(p) for p in run.parent.rglob("prometheus/*.json"))


def check_target_labels(prom_targets: list[dict], run: Path) -> None:
    want = expected_targets(run)
    got = {t["labels"]["instance"]: t["labels"] for t in prom_targets}
    assert set(got) == set(want)
    for inst, labels in want.items():
        assert {k: got[inst].get(k) for k in labels} == labels, inst
        assert got[inst]["instance"] == inst


def watch_until(prom: Prometheus, run_id: str, done, timeout: float) -> float | None:
    """Wait for `done()`; returns when Prometheus first listed no target of the run."""
    gone_at = None
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        if gone_at is None and not prom.targets(run_id):
            gone_at = time.time()
        time.sleep(0.25)
    assert done(), f"the run did not end within {timeout} s"
    return gone_at


def wait_targets_gone(prom: Prometheus, run_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not prom.targets(run_id) and not prom.query(f'up{{run_id="{run_id}"}}'):
            return
        time.sleep(0.5)
    raise AssertionError(f"targets of {run_id} still there after the run: "
                         f"{[t['labels']['instance'] for t in prom.targets(run_id)]}")


def assert_binds_profile_host(listeners: list[tuple[str, str, int]], host: str) -> None:
    wrong = [x for x in listeners if x[1] != host]
    assert not wrong, (
        f"the profile's bind_host is {host}, yet these listen elsewhere: {wrong} (the agent's "
        "exporter takes --exporter-addr; the renderer must pass the profile's bind_host)")


# --- the snippet and the names, no run needed ---------------------------------------------


def test_scrape_config_snippet_passes_promtool(tmp_path):
    promtool = _binary("promtool")
    runs = tmp_path / "runs"
    runs.mkdir()  # a runs directory that does not exist is refused
    out = subprocess.run([sys.executable, "-m", "launcher.telemetry.promsd", str(runs)],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out == promsd.scrape_config(runs)
    assert f'"{runs}/prometheus/*.json"' in out and "job_name" in out
    shared = tmp_path / "shared-sd"
    shared.mkdir()
    (shared / "x.json").write_text("[]")
    run = rundir.create(runs, "r")
    (run.path / "plan.json").write_text("{}")
    for text, pattern in ((out, f"{runs}/prometheus/*.json"),
                          (promsd.scrape_config(shared), f"{shared}/*.json"),
                          (promsd.scrape_config(run.path), f"{run.path}/prometheus/*.json"),
                          (promsd.scrape_config(tmp_path / "elsewhere", job_name="vllm jobs",
                                                scrape_interval="15s"), None)):
        if pattern:
            assert json.dumps(pattern) in text, text
        cfg = tmp_path / "check.yml"
        cfg.write_text(text)
        p = subprocess.run([promtool, "check", "config", str(cfg)], capture_output=True,
                           text=True)
        assert p.returncode == 0 and "SUCCESS" in p.stdout + p.stderr, p.stdout + p.stderr


def test_sd_files_appear_and_go_with_the_right_labels(tmp_path):
    from launcher.planning import plan, render
    from launcher.schema import cluster, recipe

    r, c = recipe.load("local-sim"), cluster.load("local")
    run = rundir.create(tmp_path / "runs", "r")
    p = plan.make_plan(r, c, cluster.profile_nodes(c, plan.nodes_needed(r, c)))
    doc = render.plan_doc(p.at(str(run.path)), run.run_id, placeholder_nodes=False)
    assert any(x.headless for x in doc.processes), "local-sim: decode spans two nodes"
    heads = [p.name for p in doc.processes if p.kind == "engine" and p.url]
    healthy = heads + ["router"] + [p.name for p in doc.processes if p.kind == "agent"] + \
        [p.name for p in doc.processes if p.kind == "engine" and not p.url]  # headless: no URL
    path = promsd.publish(run, doc, healthy, None)
    assert path == tmp_path / "runs" / "prometheus" / f"{run.run_id}.json"
    own = run.path / "prometheus" / f"{run.run_id}.json"
    groups = json.loads(path.read_text())
    assert json.loads(own.read_text()) == groups
    kinds = [g["labels"]["kind"] for g in groups]
    assert kinds.count("engine") == len(heads) and kinds.count("router") == 1
    assert kinds.count("agent") == len(doc.nodes)
    for g in groups:
        lab = g["labels"]
        assert len(g["targets"]) == 1 and ":" in g["targets"][0]
        assert lab["run_id"] == doc.run_id and lab["engine_kind"] == "sim"
        assert lab["recipe"] == doc.recipe and lab["cluster"] == doc.cluster and lab["node"]
        assert ("role" in lab and "endpoint" in lab) == (lab["kind"] == "engine")
        assert lab[promsd.RUN_DIR_LABEL] == str(run.path.resolve())
        assert not {"job", "instance", "process"} & set(lab)
    # a profile's shared directory: another user's run of the same id must not clash
    shared = tmp_path / "shared"
    p2 = promsd.publish(run, doc, heads, str(shared))
    assert p2.parent == shared and p2.name.startswith(run.run_id + ".")
    promsd.withdraw(run, str(shared))
    assert not p2.exists() and not own.exists() and path.exists()
    # prune: an orchestrator killed before its teardown leaves its targets behind
    sd = tmp_path / "runs" / "prometheus"
    run.write_record(rundir.RunRecord(state=rundir.State.RUNNING))
    assert promsd.prune(sd) == [] and path.exists()
    run.write_record(rundir.RunRecord(state=rundir.State.FAILED))
    assert promsd.prune(sd) == [path] and not path.exists()


def _gpu_doc_names() -> list[str]:
    from launcher.telemetry import gpu

    text = gpu.__doc__.split("Sample names", 1)[1]
    words = set()
    for tok in text.replace(",", " ").replace(";", " ").replace("/", " ").split():
        if tok.replace("_", "").isalnum() and "_" in tok and tok.islower():
            words.add(tok)
    return sorted({*words, *gpu.GPM_METRICS.values(), *(f for f, _, _ in gpu.FAST_FIELDS),
                   *(f for f, _, _ in gpu.SLOW_FIELDS)})


def test_every_telemetry_name_has_a_conventional_prometheus_name(tmp_path):
    """Each host, process and GPU sample name maps to a named, typed, unit-suffixed series, and
    promtool's metric linter finds nothing to say about what the exporter serves."""
    from launcher.telemetry import exporter as ex_mod
    from launcher.telemetry.host import HostCollector

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"],
                             env={**os.environ, "PD_PROCESS": "decode-0@n1"})
    try:
        h = HostCollector("n1", rescan_s=0.0)
        h.sample()
        time.sleep(0.2)
        rows = h.sample()
    finally:
        child.kill()
        child.wait()
    names = {r[4] for r in rows}
    assert "proc:rss_bytes" in names and "host:mem_used_bytes" in names
    gpu_names = [f"gpu:{n}" for n in _gpu_doc_names() if n not in ("labels", "index")]
    unmapped = sorted(n for n in [*names, *gpu_names] if n not in ex_mod.SERIES)
    assert not unmapped, f"no Prometheus name for {unmapped}: add them to exporter.SERIES"
    # the unit a sample name ends in -> the base unit its Prometheus name must end in
    units = [("_kib_s", "_bytes_per_second"), ("_mib_s", "_bytes_per_second"),
             ("_pct", "_ratio"), ("_bytes", "_bytes"), ("_mhz", "_hertz"), ("_mj", "_joules"),
             ("_ns", "_seconds"), ("_w", "_watts"), ("_c", "_celsius"), ("_s", "_seconds")]
    for name, s in ex_mod.SERIES.items():
        f = s.family
        assert f.name.startswith("pd_") and f.help.endswith("."), name
        assert (f.type == ex_mod.COUNTER) == f.name.endswith("_total"), name
        base = f.name.removesuffix("_total")
        for suffix, unit in units:
            if name.endswith(suffix):
                assert base.endswith(unit), f"{name} -> {f.name}: should end in {unit}"
                break
    doc = DOC.read_text()
    undocumented = sorted({f"`{s.family.name}`" for s in ex_mod.SERIES.values()}
                          - {w for w in doc.split() if w.startswith("`pd_")})
    assert not undocumented, f"docs/prometheus.md does not list {undocumented}"
    # what the exporter serves passes `promtool check metrics` (its naming linter)
    exp = ex_mod.Exporter("n1", 0, addr="127.0.0.1")
    try:
        fake = [(time.time(), "n1", "decode-0@n1", "", n, '{"index":"0","uuid":"GPU-x"}', 1.0)
                for n in gpu_names]
        exp.update(rows + fake)
        body = urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=5).read()
    finally:
        exp.close()
    p = subprocess.run([_binary("promtool"), "check", "metrics"], input=body,
                       capture_output=True)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        (p.stdout + p.stderr).decode()
    (tmp_path / "exporter.prom").write_bytes(body)


# --- end to end ----------------------------------------------------------------------------


def _samples(prom: Prometheus, selector: str, at: float, window_s: int) -> dict:
    """Raw samples (scrape time, value) of every series matching `selector`, by labels."""
    out = {}
    for r in prom.query(f"{selector}[{window_s}s]", at=at):
        out[tuple(sorted(r["metric"].items()))] = [(float(t), float(v)) for t, v in r["values"]]
    return out


def _step_values(rows, lo: float, hi: float) -> list[float]:
    """The values a step series (telemetry change points) held at some time in [lo, hi]."""
    before = [v for t, v in rows if t < lo]
    inside = [v for t, v in rows if lo <= t <= hi]
    return (before[-1:] if before else []) + inside


def _teardown_ts(run: Path) -> float:
    return next(e["ts"] for e in rundir.RunDir(run).events()
                if e.get("event") == "stage" and e.get("stage") == "teardown")


SCRAPE_TIMEOUT_S = 1.0  # both tests' Prometheus configuration (scrape_timeout: 1s)


def compare_kv_usage(prom: Prometheus, run: Path, start: float, end: float) -> dict:
    """`vllm:kv_cache_usage_perc` per engine, Prometheus against the run's telemetry.

    Prometheus scraped each API server at its time T, the agent at its own beat. Under the
    steady load (long requests that only grow) each engine's usage only rises between beats,
    so the value Prometheus got at T lies between what the agent recorded at its beat before T
    and at its beat after the engine answered (by T + the scrape timeout; Prometheus stamps
    the scrape's start): exact bounds, no tolerance. Samples in [start, end] are checked.
    """
    from launcher.telemetry import store

    run_id = run.name
    interval = json.loads((run / "plan.json").read_text())["telemetry"]["interval_s"]
    kv = _samples(prom, f'vllm:kv_cache_usage_perc{{run_id="{run_id}"}}', time.time(),
                  int(time.time() - start + 60))
    df = store.read_samples(run, names=["vllm:kv_cache_usage_perc"])
    tel_keys = set(zip(df["process"], df["engine"], strict=True))
    by_engine = {}
    for key, samples in kv.items():
        lab = dict(key)
        assert lab["kind"] == "engine" and lab["engine_kind"] == "sim", lab
        by_engine[(f"{lab['endpoint']}@{lab['node']}", lab["engine"])] = (lab["role"], samples)
    assert set(by_engine) == tel_keys, (sorted(by_engine), sorted(tel_keys))
    stats = {"checked": 0, "decode_max": {}}
    bad = []
    for (proc, engine), (role, samples) in sorted(by_engine.items()):
        s = df[(df["process"] == proc) & (df["engine"] == engine)]
        rows = list(zip(s["ts"], s["value"], strict=True))
        for t, v in samples:
            if not start <= t <= end:
                continue
            vals = _step_values(rows, t - 0.05, t + SCRAPE_TIMEOUT_S + interval + 0.3)
            stats["checked"] += 1
            if not vals or not min(vals) <= v <= max(vals):
                bad.append((proc, engine, round(t, 3), v, vals))
            if role == "decode":
                stats["decode_max"][f"{proc}/{engine}"] = max(
                    v, stats["decode_max"].get(f"{proc}/{engine}", 0.0))
    assert stats["checked"] >= 5 * len(by_engine), stats
    assert not bad, f"{len(bad)} of {stats['checked']} samples outside the agent's: {bad[:8]}"
    return stats


def compare_host_series(prom: Prometheus, run: Path, start: float) -> int:
    """The exporter's host series per node against the run's telemetry: Prometheus stamps a
    sample T, the scrape's start; the exporter answers with the agent's latest sample by
    T + the scrape timeout (a loaded host answers late: a newer beat may be in by then), taken
    within one beat (plus the beat's own work) before T at the earliest, so the value equals
    one the agent recorded in that span."""
    from launcher.telemetry import store

    run_id = run.name
    interval = json.loads((run / "plan.json").read_text())["telemetry"]["interval_s"]
    df = store.read_samples(run, names=["host:mem_used_bytes", "host:cpu_user_s"])
    checked = 0
    for sel, tel_name in ((f'pd_host_memory_used_bytes{{run_id="{run_id}"}}',
                           "host:mem_used_bytes"),
                          (f'pd_host_cpu_seconds_total{{run_id="{run_id}",mode="user"}}',
                           "host:cpu_user_s")):
        series = _samples(prom, sel, time.time(), int(time.time() - start + 60))
        tel = df[df["name"] == tel_name]
        assert {dict(k)["node"] for k in series} == set(tel["node"]), (sel, list(series))
        misses = []
        for key, samples in series.items():
            lab = dict(key)
            assert lab["kind"] == "agent" and "process" not in lab, lab
            s = tel[tel["node"] == lab["node"]]
            rows = list(zip(s["ts"], s["value"], strict=True))
            for t, v in samples:
                vals = _step_values(rows, t - 2 * interval - 0.5, t + SCRAPE_TIMEOUT_S)
                checked += 1
                if not any(abs(v - x) <= 1e-12 * max(1.0, abs(v)) for x in vals):
                    misses.append((lab["node"], round(t, 3), v, vals[-3:]))
        assert not misses, (tel_name, len(misses), misses[:5])
    assert checked >= 10, checked
    return checked


class SteadyLoad:
    """Long completions through the router that outlast the hold: every decode engine's KV
    usage then only rises until teardown. `stop()` closes their connections (the test calls
    it once teardown is under way), so the router's graceful shutdown need not wait out its
    grace (10 s, then SIGKILL) for them."""

    def __init__(self, router_url: str, model: str, n: int = 8, max_tokens: int = 4000):
        import http.client
        import threading

        self.errors: list[str] = []
        self.conns: list[http.client.HTTPConnection] = []
        body = json.dumps({"model": model, "prompt": "Count slowly. " * 40,
                           "max_tokens": max_tokens, "ignore_eos": True}).encode()
        where = urllib.parse.urlsplit(router_url)

        def one() -> None:
            conn = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
            self.conns.append(conn)
            try:
                conn.request("POST", "/v1/completions", body=body,
                             headers={"Content-Type": "application/json"})
                conn.getresponse().read()
            except (OSError, http.client.HTTPException) as e:  # stop() or the teardown
                self.errors.append(str(e))

        self.threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()
        self.started = time.time()

    def stop(self) -> None:
        for conn in self.conns:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for t in self.threads:
            t.join(10)


def no_exported_labels(prom: Prometheus, run_id: str, start: float) -> None:
    """Target labels never collide with a scraped label (that would rename it exported_*)."""
    series = prom.api("series", **{"match[]": f'{{run_id="{run_id}"}}',
                                   "start": f"{start:.0f}", "end": f"{time.time():.0f}"})
    assert series, "no series of the run in Prometheus"
    clash = sorted({k for s in series for k in s if k.startswith("exported_")})
    assert not clash, clash
    kinds = {s.get("kind") for s in series}
    assert kinds == {"engine", "router", "agent"}, kinds


def check_doc_queries(prom: Prometheus, run_id: str, at: float) -> None:
    """The PromQL examples of docs/prometheus.md give what they promise on a real run."""
    text = DOC.read_text()
    assert PROMQL_KV in text and PROMQL_TTFT in text
    kv = prom.query(PROMQL_KV.replace('role="decode"', f'role="decode",run_id="{run_id}"'),
                    at=at)
    assert sorted((r["metric"]["endpoint"], r["metric"]["engine"]) for r in kv) == [
        ("decode-0", str(i)) for i in range(4)], kv
    assert all(0 < float(r["value"][1]) <= 1 for r in kv), kv
    ttft = prom.query(PROMQL_TTFT.replace("[$__rate_interval]", "[30s]").replace(
        "_bucket[", f'_bucket{{run_id="{run_id}"}}['), at=at)
    p90 = {r["metric"]["endpoint"]: float(r["value"][1]) for r in ttft}
    assert set(p90) == {"decode-0", "prefill-0", "prefill-1"}, ttft
    assert p90["decode-0"] > 0, p90  # an endpoint that got no request in the window is NaN
    assert all(v > 0 or v != v for v in p90.values()), p90


def test_local_run_is_found_scraped_and_forgotten(tmp_path, prometheus):
    """A local run: Prometheus, pointed at the runs directory with the printed snippet, finds
    every engine head, the router and every agent while the run serves, scrapes them, and
    forgets them at teardown; what it scraped agrees with the run's own telemetry."""
    runs = tmp_path / "runs"
    prom = prometheus(promsd.scrape_config(runs, scrape_interval="1s", refresh_interval="2s"))
    prof = profile(tmp_path, "local", port_base=free_port_base())
    t0 = time.time()
    # sim.speed 0.5: decode steps of ~25 ms, so 8 requests of 4000 tokens outlast the hold
    proc = submit(tmp_path, "local-sim", f"cluster={prof}", "accuracy.enabled=false",
                  "benchmark.enabled=false", "sim.speed=0.5", "hold_s=20")
    run = None
    try:
        run = the_run(tmp_path)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            rec = rundir.RunDir(run).read_record()
            if rec and rec.serving:
                break
            time.sleep(0.2)
        rec = rundir.RunDir(run).read_record()
        assert rec and rec.serving, rundir.RunDir(run).status()
        up = wait_targets_up(prom, run, lambda: proc.poll() is not None, timeout=45)
        found_s = time.time() - t0
        # the load starts once Prometheus scrapes: its histograms see the requests arrive
        plan = json.loads((run / "plan.json").read_text())
        load = SteadyLoad(rec.router_url, plan["model"]["served_name"])
        check_target_labels(up, run)
        assert sd_files(run) == sorted([str(runs / "prometheus" / f"{run.name}.json"),
                                        str(run / "prometheus" / f"{run.name}.json")])
        listeners = run_listeners(run)

        def ended() -> bool:
            """2 s into the teardown the load lets go: the KV comparison reads the agent's
            beats up to 0.8 s after the teardown began, and those must still see it rise."""
            ts = [e["ts"] for e in rundir.RunDir(run).events() if e.get("stage") == "teardown"]
            if ts and time.time() > ts[0] + 2.0:
                load.stop()
            return proc.poll() is not None

        gone_at = watch_until(prom, run.name, ended, timeout=120)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out[-3000:]
        wait_targets_gone(prom, run.name)
        gone_s = (gone_at or time.time()) - _teardown_ts(run)
        assert sd_files(run) == [] and leftovers(run) == []
        # requests reach the decode engines ~1 s after they are sent (prefill, KV transfer)
        teardown = _teardown_ts(run)
        assert teardown - load.started > 8, "the hold ended before the load could be measured"
        kv = compare_kv_usage(prom, run, load.started + 2.0, teardown)
        assert all(v > 0 for v in kv["decode_max"].values()) and len(kv["decode_max"]) == 4, kv
        host = compare_host_series(prom, run, t0)
        no_exported_labels(prom, run.name, t0)
        check_doc_queries(prom, run.name, min(load.started + 10, teardown - 1))
        print(f"targets up {found_s:.1f} s after submit, gone {gone_s:.1f} s after teardown began; "
              f"KV samples checked {kv['checked']}, host samples {host}")
    finally:
        stop_run(proc, run)
    assert_binds_profile_host(listeners, "127.0.0.1")


@pytest.mark.slurm
def test_devcluster_run_is_found_and_forgotten(tmp_path, prometheus):
    """The same through Slurm (slurm/devcluster/), with the profile naming a shared target
    directory: the snippet printed for that profile's directory finds the job."""
    if shutil.which("sinfo") is None or subprocess.run(
            ["sinfo", "-h"], capture_output=True).returncode != 0:
        pytest.fail("the dev cluster is not up: run `sudo bash slurm/devcluster/up.sh` (make "
                    "test does)", pytrace=False)
    sd = tmp_path / "site-sd"
    prof = profile(tmp_path, "devcluster", port_base=free_port_base(),
                   prometheus_sd_dir=str(sd))
    out = subprocess.run([sys.executable, "-m", "launcher.telemetry.promsd", "--cluster",
                          str(prof)], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert json.dumps(f"{sd}/*.json") in out
    prom = prometheus(out.replace("scrape_interval: 5s", "scrape_interval: 1s")
                      .replace("scrape_timeout: 5s", "scrape_timeout: 1s")
                      .replace("refresh_interval: 10s", "refresh_interval: 2s"))
    t0 = time.time()
    # the targets are up about 4-8 s into the hold (Prometheus passes file-SD changes on
    # every 5 s, later on a loaded host: this test runs beside others); 25 s leaves the
    # margin, and the host samples with it
    proc = submit(tmp_path, "devcluster-sim", f"cluster={prof}", "benchmark.enabled=false",
                  "accuracy.enabled=false", "hold_s=25")
    run = None
    try:
        sub_out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, sub_out[-3000:]
        run = the_run(tmp_path)

        def ended() -> bool:
            return rundir.RunDir(run).status().final

        up = wait_targets_up(prom, run, ended, timeout=90)
        found_s = time.time() - t0
        check_target_labels(up, run)
        files = sorted(str(p) for p in sd.glob("*.json"))
        assert len(files) == 1 and Path(files[0]).name.startswith(run.name + "."), files
        assert (run / "prometheus" / f"{run.name}.json").is_file()
        listeners = run_listeners(run)
        gone_at = watch_until(prom, run.name, ended, timeout=120)
        st = rundir.RunDir(run).status()
        assert st.state == "succeeded", st.error
        wait_targets_gone(prom, run.name)
        gone_s = (gone_at or time.time()) - _teardown_ts(run)
        assert not list(sd.glob("*.json")) and not (run / "prometheus" / f"{run.name}.json"
                                                     ).exists()
        host = compare_host_series(prom, run, t0)
        no_exported_labels(prom, run.name, t0)
        print(f"devcluster: {len(up)} targets up {found_s:.1f} s after submit, gone "
              f"{gone_s:.1f} s after teardown began; host samples checked {host}")
        deadline = time.monotonic() + 60
        while leftovers(run) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert leftovers(run) == []
    finally:
        stop_run(proc, run)
    assert_binds_profile_host(listeners, "127.0.0.1")


GPU_BURN = """
import time, torch
x = torch.randn(8192, 8192, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
    time.sleep(0.3)   # on and off: utilisation and power move
"""


@pytest.mark.gpu
@pytest.mark.skipif(nvml_gpu_count() == 0, reason="needs an NVIDIA GPU with NVML")
def test_gpu_series_agree_with_telemetry(tmp_path, prometheus):
    """On a real GPU: Prometheus scrapes an agent's exporter (a target file written as promsd
    writes them) while the GPU works on and off; every pd_gpu_* series it stored equals, in
    base units, a value the agent recorded within one beat before the scrape."""
    from launcher.telemetry import exporter as ex_mod
    from launcher.telemetry import store

    run = tmp_path / "run"
    run.mkdir()
    port = free_port()
    sd = tmp_path / "sd"
    sd.mkdir()
    (sd / "gpu.json").write_text(json.dumps([{
        "targets": [f"127.0.0.1:{port}"],
        "labels": {"run_id": "gpu-test", "kind": "agent", "node": "n1", "engine_kind": "vllm"},
    }]))  # fmt: skip
    prom = prometheus(promsd.scrape_config(sd, scrape_interval="1s", refresh_interval="2s",
                                           is_sd_dir=True))
    interval = 0.5
    env = {**os.environ, "PYTHONPATH": str(REPO), "PD_PROCESS": "agent@n1",
           "PD_RUN_DIR": str(run)}
    agent = subprocess.Popen(
        [sys.executable, "-m", "launcher.telemetry.agent", "--run-dir", str(run), "--node", "n1",
         "--interval", str(interval), "--exporter-port", str(port), "--exporter-addr",
         "127.0.0.1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)  # fmt: skip
    burn = None
    try:
        try:
            import torch  # noqa: F401

            burn = subprocess.Popen([sys.executable, "-c", GPU_BURN, "12"])
        except ImportError:
            pass
        t0 = time.time()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if prom.query('pd_gpu_power_watts{run_id="gpu-test"}'):
                break
            time.sleep(0.5)
        time.sleep(12)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        if burn is not None:
            burn.kill()
            burn.wait()
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    assert agent.returncode == 0, out
    # every GPU name the collector produced here has its Prometheus name
    unmapped = [ln for ln in body.decode().splitlines() if "unit as recorded" in ln]
    assert not unmapped, unmapped
    lint = subprocess.run([_binary("promtool"), "check", "metrics"], input=body,
                          capture_output=True)
    assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint
    df = store.read_samples(run, name_prefix="gpu:")
    assert len(df), "the agent recorded no GPU samples"
    inv = {s.family.name: (n, s) for n, s in ex_mod.SERIES.items() if not s.labels}
    checked, misses = {}, []
    for fam in ("pd_gpu_memory_used_bytes", "pd_gpu_power_watts", "pd_gpu_utilization_ratio",
                "pd_gpu_sm_clock_hertz", "pd_gpu_temperature_celsius",
                "pd_gpu_energy_joules_total"):
        tel_name, series = inv[fam]
        tel = df[df["name"] == tel_name]
        if not len(tel):
            continue  # not supported on this GPU (recorded in agent.json)
        got = _samples(prom, f'{fam}{{run_id="gpu-test"}}', time.time(),
                       int(time.time() - t0 + 60))
        assert got, f"Prometheus has no {fam}"
        for key, samples in got.items():
            lab = dict(key)
            s = tel[tel["labels"].str.contains(f'"uuid":"{lab["uuid"]}"', regex=False)]
            rows = list(zip(s["ts"], s["value"], strict=True))
            for t, v in samples:
                vals = _step_values(rows, t - 2 * interval - 1.0, t + 0.05)
                checked[fam] = checked.get(fam, 0) + 1
                if not any(abs(v - x * series.scale) <= 1e-9 * max(1.0, abs(v)) for x in vals):
                    misses.append((fam, lab["gpu"], round(t, 3), v, vals[-3:]))
    assert checked.get("pd_gpu_power_watts", 0) >= 5, checked
    assert not misses, misses[:8]
    print(f"GPU series checked: {checked}")
