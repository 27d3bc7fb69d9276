"""A fault on every part of a run, as a hostile or unlucky user would cause it: one test per
fault. Each checks what a user is owed afterwards:

- the culprit named in `python -m launcher status RUN` (the node for a node loss, the
  process, the orchestrator, the canceller or the run directory otherwise),
- no process of the run left (PD_RUN_DIR), no Slurm step left, no planned port still bound,
- the logs, telemetry and results written before the fault kept,
- an honest verdict in summary.json (never "passed" for a run that did not pass).

The dev-cluster tests (marker `slurm`) need `bash slurm/devcluster/up.sh` and root (a node
loss kills a slurmd; the read-only directory is an ext4 loop filesystem whose errors remount
it read-only). The disk-full test runs on the local profile with its runs directory on a
small tmpfs. Run with `-s` to see the table of figures (time to detect, leftovers, data kept).

Ports: copies of the profiles on a port range that is free when the test starts, so a run
of another suite on the same machine does not clash with these.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import helpers
import psutil
import pytest
from helpers import launcher, leftovers

from launcher.run import rundir

REPO = Path(__file__).resolve().parents[1]
# Port bases tried in order; the first whose 400 ports are all free is used (other suites
# and workers on the machine use the profiles' own bases, 23000 and 24000, and others).
PORT_BASES = (25000, 28400, 29400, 30400, 31400)
DETECT_S = 30.0  # a fault must be named within this (the run's recorded end)
# Events that mark the orchestrator noticing a fault (time to detect).
NOTICED = ("process_exited", "node_lost", "agent_died", "telemetry_partial", "cancelled",
           "failed")


# --- the table ------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    culprit: str = "-"
    state: str = "-"
    detect_s: float | None = None
    end_s: float | None = None
    procs: int = 0
    steps: int = 0
    ports: int = 0
    logs: int = 0
    telemetry_rows: int = 0
    results: int = 0
    verdict: str = "-"
    notes: list[str] = field(default_factory=list)


ROWS: list[Row] = []


def table(rows: list[Row]) -> str:
    head = ("fault", "culprit named", "state", "detect s", "end s", "left: procs/steps/ports",
            "kept: logs/telemetry rows/results", "verdict")
    body = [
        (r.fault, r.culprit, r.state, f"{r.detect_s:.1f}" if r.detect_s is not None else "-",
         f"{r.end_s:.1f}" if r.end_s is not None else "-", f"{r.procs}/{r.steps}/{r.ports}",
         f"{r.logs}/{r.telemetry_rows}/{r.results}", r.verdict)
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(x).ljust(w) for x, w in zip(b, widths, strict=True)) + " |"
              for b in body]
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def figures_table():
    yield
    if ROWS:
        text = table(ROWS)
        said = "\n".join(f"{r.fault}:\n" + "\n".join(f"    {n[:300]}" for n in r.notes)
                         for r in ROWS)
        print("\n\nFault suite: time to detect (fault -> first event naming it), to the run's "
              "recorded end, what was left and what was kept\n" + text +
              "\n\nWhat `status` said (first line of each error and note):\n" + said)
        out = os.environ.get("PD_FAULTS_TABLE")
        if out:
            Path(out).write_text(text + "\n")


# --- helpers --------------------------------------------------------------------------------


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the fault suite kills daemons and mounts filesystems: run it as root")


def need_cluster() -> None:
    need_root()
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    out = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"the dev cluster does not answer ({out.stderr.strip()}): run up.sh")


def profile(tmp_path: Path, name: str) -> str:
    """A copy of a shipped cluster profile on a port range nobody else uses right now."""
    return helpers.profile_copy(tmp_path / f"{name}-faults.yaml", name,
                                port_base=helpers.free_port_base(PORT_BASES, 400))


def sets(*pairs: str) -> list[str]:
    out = []
    for p in pairs:
        out += ["--set", p]
    return out


def slurm_run(tmp_path: Path, *extra: str, hold_s: int = 120) -> list[str]:
    """Serve, one short sweep point, then hold: a fault in the hold has a result to keep."""
    prof = profile(tmp_path, "devcluster")
    return ["submit", "devcluster-sim", *sets(
        f"cluster={prof}", "accuracy.enabled=false", "benchmark.concurrency=[4]",
        f"hold_s={hold_s}"), *extra]


def submit(tmp_path: Path, *args: str) -> Path:
    code, out = launcher(tmp_path, *args)
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    return run


def status(run: Path) -> rundir.RunStatus:
    return rundir.RunDir(run).status()


def wait_stage(run: Path, stage: str, timeout: float = 180) -> rundir.RunStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(run)
        if st.stage == stage and st.state == "running":
            return st
        if st.final:
            raise AssertionError(f"the run ended before stage {stage}: {st.state} {st.error}")
        time.sleep(0.3)
    raise AssertionError(f"stage {stage} not reached in {timeout} s: {status(run)}")


def wait_end(run: Path, timeout: float = 120, reconcile: bool = False) -> rundir.RunStatus:
    from launcher.control import runs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = runs.reconcile(rundir.RunDir(run)) if reconcile else status(run)
        if st.final:
            return st
        time.sleep(0.3)
    raise AssertionError(f"{run} did not end in {timeout} s: {status(run)}")


def job_gone(job: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                             text=True).stdout.strip()
        if not out:
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} still in squeue after {timeout} s: {out}")


def steps_left(job: str | None) -> list[str]:
    if not job:
        return []
    out = subprocess.run(["squeue", "--steps", "-h", "-j", job, "-o", "%i %j"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def planned_ports(run: Path) -> set[int]:
    plan = json.loads((run / "plan.json").read_text())
    ports: set[int] = set()
    for ep in plan["endpoints"]:
        ports.add(ep["http_port"])
        if ep.get("dp_rpc_port"):
            ports.add(ep["dp_rpc_port"])
        if ep.get("nixl_port_base"):
            ports |= {ep["nixl_port_base"] + r for r in range(ep["dp_size"])}
    for p in plan["processes"]:
        for key in ("url", "metrics_url"):
            m = re.match(r"https?://[^/:]+:(\d+)", p.get(key) or "")
            if m:
                ports.add(int(m.group(1)))
    return ports


def bound(ports: set[int], run: Path, ended: float) -> list[int]:
    """Planned ports something still listens on, but for another run's processes that the
    freed ports drew there: by their PD_RUN_DIR (fresh71: a dev2 run's agents took the block
    4 s after Slurm killed this run's), or started after this run `ended` (fresh66: a local
    run's agents). A listener whose environment cannot be read counts as this run's."""
    def someone_elses(pid: int | None) -> bool:
        try:
            proc = psutil.Process(pid or -1)
            other = proc.environ().get("PD_RUN_DIR")
            return (other is not None and Path(other) != run) or proc.create_time() > ended
        except psutil.Error:
            return False

    return sorted({c.laddr.port for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports
                   and not someone_elses(c.pid)})


def left_behind(run: Path) -> list[str]:
    """The run's processes still alive: by PD_RUN_DIR (tests/helpers.py), and by the pid
    run.json recorded (the router overwrites its environment with its title)."""
    left = set(leftovers(run))
    rec = rundir.RunDir(run).read_record()
    for name, p in (rec.processes.items() if rec else []):
        try:
            proc = psutil.Process(p.pid or -1)
            if p.started and abs(proc.create_time() - p.started) < 5 and \
                    proc.status() != psutil.STATUS_ZOMBIE:
                left.add(f"{p.pid} {name}")
        except (psutil.Error, ValueError):
            continue
    return sorted(left)


def cli_status(tmp_path: Path, run: Path) -> str:
    code, out = launcher(tmp_path, "status", str(run))
    assert code == 0, out
    return out


def telemetry_rows(run: Path, before: float | None = None) -> int:
    from launcher.telemetry import store

    df = store.read_samples(run)
    return int((df["ts"] < before).sum()) if before is not None else len(df)


def detect_time(run: Path, fault_ts: float) -> float | None:
    for e in rundir.RunDir(run).events():
        if (e.get("ts") or 0) >= fault_ts and (e.get("event") in NOTICED
                                               or e.get("stage") == "teardown"):
            return e["ts"] - fault_ts
    rec = rundir.RunDir(run).read_reconciled()
    return rec.ts - fault_ts if rec else None


def end_time(st: rundir.RunStatus, fault_ts: float) -> float | None:
    if st.record and st.record.ended:
        return st.record.ended - fault_ts
    return st.reconciled.ts - fault_ts if st.reconciled else None


def verdict(run: Path) -> str:
    doc = rundir.read_json(run / "summary.json")
    return doc.get("verdict", "-") if isinstance(doc, dict) else "(no summary)"


def pids_of(run: Path, process: str) -> list[psutil.Process]:
    """The run's processes carrying PD_PROCESS=process (innermost last)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("PD_RUN_DIR") == str(run) and env.get("PD_PROCESS") == process:
            out.append(p)
    return sorted(out, key=lambda p: p.pid)


def server_pid(run: Path, process: str, marker: str) -> int:
    """The pid of the real server of `process` (not env/srun around it)."""
    for p in pids_of(run, process):
        try:
            if marker in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no {marker!r} process of {process} in {run}")


def finish(tmp_path: Path, run: Path, row: Row, fault_ts: float, *, culprit: str,
           state: str, verdicts: tuple[str, ...], results: int = 1,
           reconcile: bool = False, end_within: float = DETECT_S) -> str:
    """The checks every fault ends with; fills and records the table row."""
    st = wait_end(run, reconcile=reconcile)
    ended = time.time()
    row.state, row.culprit = st.state, culprit
    row.detect_s, row.end_s = detect_time(run, fault_ts), end_time(st, fault_ts)
    if st.slurm_job_id:
        job_gone(st.slurm_job_id)
    deadline = time.monotonic() + 20
    while left_behind(run) and time.monotonic() < deadline:
        time.sleep(0.5)  # processes Slurm is still ending (KillWait)
    procs = left_behind(run)
    steps = steps_left(st.slurm_job_id)
    ports = bound(planned_ports(run), run, ended)
    row.procs, row.steps, row.ports = len(procs), len(steps), len(ports)
    out = cli_status(tmp_path, run)
    logs = [f for f in (run / "logs").glob("*.log") if f.stat().st_size > 0]
    row.logs = len(logs)
    row.telemetry_rows = telemetry_rows(run, before=fault_ts)
    row.results = len([f for f in (run / "bench").glob("c*.json")
                       if not f.name.endswith(".window.json")]) if (run / "bench").is_dir() else 0
    row.verdict = verdict(run)
    row.notes = [line for line in out.splitlines() if line.startswith(("error:", "note:"))]
    ROWS.append(row)
    assert st.state == state, (st.state, st.error, out)
    assert culprit in out, f"{culprit!r} is not named in `status`:\n{out}"
    assert row.detect_s is not None and row.detect_s < end_within, row
    assert row.end_s is not None and row.end_s < end_within + 30, row
    assert procs == [], procs
    assert steps == [], steps
    assert ports == [], f"planned ports still bound: {ports}"
    plan = json.loads((run / "plan.json").read_text())
    started = {p for p in (st.record.processes if st.record else {})}
    for p in plan["processes"]:
        if p["name"] in started and p["kind"] in ("engine", "router", "agent"):
            assert (run / p["log"]).stat().st_size > 0, f"{p['log']} is empty or gone"
    assert row.telemetry_rows > 0, "no telemetry from before the fault"
    assert row.results >= results, f"results before the fault: {row.results} < {results}"
    assert row.verdict in verdicts, (row.verdict, verdicts)
    return out


# --- node loss ------------------------------------------------------------------------------


def node_pids(node: str) -> set[int]:
    """Everything of `node`: its slurmd, the slurmstepds logging to its log, every process
    whose environment says SLURMD_NODENAME=node, and all their descendants."""
    found: set[int] = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if cmd[:3] == ["slurmd", "-N", node]:
                found.add(p.pid)
            elif cmd and cmd[0].startswith("slurmstepd"):
                if os.readlink(f"/proc/{p.pid}/fd/3").endswith(f"slurmd.{node}.log"):
                    found.add(p.pid)
            elif p.environ().get("SLURMD_NODENAME") == node:
                found.add(p.pid)
        except (psutil.Error, OSError, IndexError):
            continue
    for pid in list(found):
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    return found


def cmdline(pid: int) -> str:
    """A process's command line, '' once it is gone (pyxis's enroot helpers come and go)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def lose_node(node: str) -> int:
    """Everything of `node` stops at once, then dies, as when a node loses power: killed one
    by one, a slurmstepd that outlived its batch script reported the script's SIGKILL to
    slurmctld first, and the job ended FAILED instead of by the node's loss (fresh68)."""
    victims = node_pids(node)
    assert any("slurmd" in cmdline(p) for p in victims), f"no slurmd of {node} among {victims}"
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return len(victims)


def bring_back(node: str) -> None:
    subprocess.run(["bash", str(REPO / "slurm/devcluster/up.sh")], capture_output=True,
                   timeout=120)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                   capture_output=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        s = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True,
                           text=True).stdout.strip()
        if s in ("idle", "alloc", "mix", "comp"):
            return
        time.sleep(1)
    raise AssertionError(f"{node} did not come back: {s}")


@pytest.mark.whole_partition
@pytest.mark.slurm
@pytest.mark.parametrize("part", ["prefill", "decode", "batch"])
def test_node_loss_is_named_as_node_loss(tmp_path, part):
    """A node dies (its slurmd and everything of the job on it): the run fails naming the
    node, within seconds, whether the first process to exit is elsewhere (the decode head
    whose remote ranks vanished) or nothing exits at all (a prefill node: its sruns wait).
    The batch node takes the orchestrator with it: Slurm's NODE_FAIL (after SlurmdTimeout,
    20 s here) is then what `status` finds, with the node."""
    need_cluster()
    run = submit(tmp_path, *slurm_run(tmp_path))
    wait_stage(run, "hold")
    plan = json.loads((run / "plan.json").read_text())
    batch_node = plan["nodes"][0]["name"]
    if part == "decode":  # the decode's headless part, not the batch node
        node = next(p["node"] for p in plan["processes"]
                    if p["role"] == "decode" and p["headless"])
    elif part == "prefill":
        node = next(p["node"] for p in plan["processes"] if p["name"].startswith("prefill-3@"))
    else:
        node = batch_node
    assert (node == batch_node) == (part == "batch")
    fault_ts = time.time()
    try:
        lose_node(node)
        if part == "batch":
            st = wait_end(run, timeout=150, reconcile=True)
            assert f"node lost: {node} (" in st.error, st.error
        else:
            st = wait_end(run, timeout=DETECT_S + 60)
            assert st.error.startswith(f"node lost: {node} ("), st.error
            assert st.record.culprit == node
            lost = {n for n, p in st.record.processes.items() if p.status == "lost"}
            assert lost and all(n.endswith(f"@{node}") for n in lost), st.record.processes
            assert f"@{node}" in st.error  # what went with it
    finally:
        bring_back(node)
    out = finish(tmp_path, run, Row(f"node loss ({part} node)"), fault_ts, culprit=node,
                 state="failed", verdicts=("failed",), reconcile=part == "batch",
                 end_within=150 if part == "batch" else DETECT_S)
    assert f"node lost: {node}" in out
    assert rundir.RunDir(run).read_record().slurm_job_id == status(run).slurm_job_id


# --- a process killed -----------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("victim", ["engine", "router"])
def test_killed_server_is_named(tmp_path, victim):
    need_cluster()
    run = submit(tmp_path, *slurm_run(tmp_path))
    wait_stage(run, "hold")
    plan = json.loads((run / "plan.json").read_text())
    if victim == "engine":
        name = next(p["name"] for p in plan["processes"] if p["name"].startswith("prefill-1@"))
        pid = server_pid(run, name, "launcher.sim serve")
    else:  # the router renames itself (vllm::router): find it by the port it serves
        name = "router"
        port = int(plan["router"]["url"].rsplit(":", 1)[1])
        pid = next(c.pid for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid)
    fault_ts = time.time()
    os.kill(pid, signal.SIGKILL)
    st = wait_end(run)
    assert st.error.startswith(f"{name} on "), st.error
    assert "exited with status" in st.error and "node lost" not in st.error
    assert st.record.culprit == name
    finish(tmp_path, run, Row(f"{victim} killed ({name})"), fault_ts, culprit=name,
           state="failed", verdicts=("failed",))


@pytest.mark.slurm
def test_killed_agent_is_a_named_gap_not_a_failed_benchmark(tmp_path):
    need_cluster()
    # the agent dies within a second of the hold's start and the run notes it at once; the
    # 5 s hold leaves the margin (the test does not read what follows)
    run = submit(tmp_path, *slurm_run(tmp_path, hold_s=5))
    wait_stage(run, "hold")
    plan = json.loads((run / "plan.json").read_text())
    node = plan["nodes"][-1]["name"]
    name = f"agent@{node}"
    fault_ts = time.time()
    os.kill(server_pid(run, name, "launcher.telemetry.agent"), signal.SIGKILL)
    out = finish(tmp_path, run, Row(f"agent killed ({name})"), fault_ts, culprit=name,
                 state="succeeded", verdicts=("passed",))
    rec = rundir.RunDir(run).read_record()
    assert rec.processes[name].status.startswith("exit "), rec.processes[name]
    assert any(n.startswith(f"{name} exited with status") for n in rec.notes), rec.notes
    assert re.search(rf"{re.escape(name)} +{node} +exit \d+", out), out
    summary = json.loads((run / "summary.json").read_text())
    assert any(name in n for n in summary["notes"]), summary["notes"]
    assert any(e["event"] == "agent_died" for e in rundir.RunDir(run).events())


# --- the orchestrator killed ----------------------------------------------------------------


@pytest.mark.slurm
def test_killed_orchestrator_is_reconciled_by_status_runs_and_cancel(tmp_path):
    need_cluster()
    run = submit(tmp_path, *slurm_run(tmp_path))
    st = wait_stage(run, "hold")
    job = st.slurm_job_id
    batch = [p for p in psutil.process_iter(["pid", "cmdline"])
             if "-m launcher run" in " ".join(p.info["cmdline"] or [])
             and str(run) in " ".join(p.info["cmdline"] or [])]
    assert len(batch) == 1, batch
    fault_ts = time.time()
    batch[0].kill()
    # `status` says the truth within seconds (Slurm ends the job and its steps)
    deadline = time.monotonic() + DETECT_S
    out = ""
    while time.monotonic() < deadline:
        out = cli_status(tmp_path, run)
        if "state failed" in out:
            break
        time.sleep(1)
    assert "state failed" in out and "the orchestrator" in out, out
    t = time.monotonic()
    code, said = launcher(tmp_path, "cancel", str(run))
    assert code == 0 and "already ended" in said, said
    assert time.monotonic() - t < 10, "cancel waited for a dead orchestrator"
    code, listed = launcher(tmp_path, "runs")
    assert re.search(rf"{re.escape(run.name)} +failed", listed), listed
    out = finish(tmp_path, run, Row("orchestrator killed (kill -9)"), fault_ts,
                 culprit="the orchestrator", state="failed", verdicts=("failed",),
                 reconcile=True)
    assert "killed by signal 9" in out and f"Slurm job {job}" in out, out


# --- cancelled ------------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.parametrize("how", ["scancel", "launcher cancel"])
def test_cancel_tears_down_and_keeps_what_was_written(tmp_path, how):
    need_cluster()
    run = submit(tmp_path, *slurm_run(tmp_path))
    st = wait_stage(run, "hold")
    fault_ts = time.time()
    if how == "scancel":
        subprocess.run(["scancel", st.slurm_job_id], check=True)
        culprit = "scancel"
    else:
        code, out = launcher(tmp_path, "cancel", str(run))
        assert code == 0, out
        culprit = "launcher cancel"
    finish(tmp_path, run, Row(f"{how}"), fault_ts, culprit=culprit, state="cancelled",
           verdicts=("cancelled",))


# --- a read-only telemetry directory --------------------------------------------------------


class Ext4:
    """A small ext4 loop filesystem mounted at `where`, with errors=remount-ro: `fail()`
    makes the kernel remount it read-only, as it does on a real I/O error (writes to files
    already open fail with EROFS, not only new files)."""

    def __init__(self, image: Path, where: Path, size_mb: int = 64) -> None:
        self.image, self.where, self.loop = image, where, None
        subprocess.run(["truncate", "-s", f"{size_mb}M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, capture_output=True)
        self.loop = subprocess.run(["losetup", "-f", "--show", str(image)], check=True,
                                   capture_output=True, text=True).stdout.strip()
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-o", "errors=remount-ro", self.loop, str(where)], check=True)

    def fail(self) -> None:
        dev = os.path.basename(self.loop)
        Path(f"/sys/fs/ext4/{dev}/trigger_fs_error").write_text("pd-launcher fault test\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            opts = subprocess.run(["findmnt", "-n", "-o", "OPTIONS", str(self.where)],
                                  capture_output=True, text=True).stdout
            if opts.startswith("ro") or {"ro", "emergency_ro"} & set(opts.strip().split(",")):
                return
            time.sleep(0.2)
        raise AssertionError(f"{self.where} did not turn read-only")

    def mounted_in(self) -> list[str]:
        """'pid (command)' of one process per mount namespace that has this filesystem mounted."""
        rdev = os.stat(self.loop).st_rdev
        dev, seen, found = f"{os.major(rdev)}:{os.minor(rdev)}", set(), []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                ns = os.readlink(proc / "ns" / "mnt")
                if ns in seen:
                    continue
                seen.add(ns)
                if any(line.split()[2] == dev for line in (proc / "mountinfo").read_text().splitlines()):
                    found.append(f"{proc.name} ({(proc / 'comm').read_text().strip()})")
            except OSError:  # gone meanwhile
                continue
        return found

    def recover(self) -> None:
        """What an admin does next: unmount, fsck, mount (read-only) to get the data back."""
        subprocess.run(["umount", str(self.where)], check=True, capture_output=True)
        # fsck needs it unmounted everywhere: a container's mount namespace of the run's job
        # may still hold it for a moment after the job left the queue (fresh60: "in use")
        try:
            helpers.wait_for(lambda: not self.mounted_in(), 60,
                             f"{self.loop} to be unmounted in every mount namespace")
        except AssertionError as e:
            raise AssertionError(f"{e}; still mounted in the namespace of {self.mounted_in()}") from None
        r = subprocess.run(["e2fsck", "-fy", self.loop], capture_output=True, text=True)
        assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: errors corrected
        subprocess.run(["mount", "-o", "ro", self.loop, str(self.where)], check=True)

    def remove(self) -> None:
        if subprocess.run(["umount", str(self.where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(self.where)], capture_output=True)
        if self.loop:
            # detached now, or (autoclear) once the last mount of it goes: a container's mount
            # namespace of the run's job may still hold its bind of the run directory for a
            # moment after the job left the queue
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            helpers.wait_for(lambda: not subprocess.run(
                ["losetup", "-j", str(self.image)], capture_output=True, text=True
            ).stdout.strip(), 30, f"no loop device left on {self.image}", poll=0.5)
        self.image.unlink(missing_ok=True)


@pytest.mark.slurm
def test_read_only_telemetry_directory_keeps_the_run_and_says_telemetry_is_partial(tmp_path):
    need_cluster()
    # the fault comes about 1.5 s into the hold and the agents report it 1-2 s later: an 8 s
    # hold leaves them the margin
    run = submit(tmp_path, *slurm_run(tmp_path, "--set", "slurm.directives.hold=true",
                                      hold_s=8))
    job = rundir.RunDir(run).read_submission().slurm_job_id
    fs = None
    try:
        fs = Ext4(tmp_path / "telemetry.img", run / "telemetry")
        subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
        wait_stage(run, "hold")
        time.sleep(0.5)  # the agents have written telemetry since before the sweep
        # on the disk, not only in the page cache: what a filesystem that fails loses of its
        # unwritten cache is the kernel's business; what is on disk must stay readable
        os.sync()
        fault_ts = time.time()
        fs.fail()
        wait_end(run)
        job_gone(job)
        fs.recover()  # the telemetry written before the fault, as an admin gets it back
        out = finish(tmp_path, run, Row("read-only telemetry dir"), fault_ts,
                     culprit="telemetry of gb200-", state="succeeded", verdicts=("passed",))
        rec = rundir.RunDir(run).read_record()
        nodes = [n["name"] for n in json.loads((run / "plan.json").read_text())["nodes"]]
        for node in nodes:
            assert any(n.startswith(f"telemetry of {node} is partial: agent@{node} could not "
                                    f"write telemetry/{node} (Read-only file system")
                       for n in rec.notes), rec.notes
            agent = rec.processes[f"agent@{node}"]
            assert agent.exit_code == 0 and agent.status == "stopped", agent
            log = (run / "logs" / f"agent@{node}.log").read_text()
            assert "the telemetry of this node is partial" in log, log[-2000:]
        summary = json.loads((run / "summary.json").read_text())
        assert any("telemetry of" in n and "partial" in n for n in summary["notes"])
        assert "telemetry of" in out
    finally:
        subprocess.run(["scancel", job], capture_output=True)  # a failed test: nothing holds it
        job_gone(job)
        if fs is not None:
            fs.remove()


# --- disk full on the local profile ---------------------------------------------------------


def fill(path: Path) -> int:
    """Write zeros into `path` until the filesystem is full; the bytes written."""
    n = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(chunk)
            except OSError:
                break
        while True:  # the last partial MiB
            try:
                k = f.write(b"\0" * 4096)
                if not k:
                    break
                n += k
            except OSError:
                break
    return n


def test_disk_full_on_the_local_profile(tmp_path):
    need_root()
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(runs)], check=True)
    proc = None
    try:
        prof = profile(tmp_path, "local")
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", "submit", "local-sim", "--runs-dir", str(runs),
             *sets(f"cluster={prof}", "accuracy.enabled=false", "benchmark.concurrency=[4]",
                   "hold_s=120")],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        run = None
        while run is None and time.monotonic() < deadline:
            found = list(runs.glob("*/run.json"))
            run = found[0].parent if found else None
            time.sleep(0.3)
        assert run is not None, "no run started"
        wait_stage(run, "hold")
        time.sleep(2)
        fault_ts = time.time()
        filled = fill(runs / "filler")
        assert filled > 0
        out, _ = proc.communicate(timeout=DETECT_S + 90)
        assert proc.returncode == 1, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        st_out = finish(tmp_path, run, Row("disk full (local)"), fault_ts,
                        culprit="No space left on device", state="failed",
                        verdicts=("failed",))
        assert "the run directory takes no writes" in st_out and str(run) in st_out
        rec = rundir.RunDir(run).read_record()
        assert rec.culprit == str(run)
        for name, p in rec.processes.items():
            if p.kind == "agent":
                assert p.exit_code == 0, (name, p)
        assert not (run / rundir.RESERVE).exists()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-l", str(runs)], capture_output=True)


# --- the orchestrator killed on the local profile -------------------------------------------


def test_killed_local_orchestrator_is_reconciled_and_its_processes_stopped(tmp_path):
    """No Slurm to end the steps: the first `status` after the orchestrator died records the
    end and stops what it left running (every process of the run carries PD_RUN_DIR)."""
    prof = profile(tmp_path, "local")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "submit", "local-sim", "--runs-dir",
         str(tmp_path / "runs"), *sets(f"cluster={prof}", "accuracy.enabled=false",
                                       "benchmark.concurrency=[4]", "hold_s=120")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        run = None
        while run is None and time.monotonic() < deadline:
            found = list((tmp_path / "runs").glob("*/run.json"))
            run = found[0].parent if found else None
            time.sleep(0.3)
        assert run is not None, "no run started"
        wait_stage(run, "hold")
        assert leftovers(run), "nothing runs to be orphaned"
        fault_ts = time.time()
        proc.kill()
        proc.wait()
        out = cli_status(tmp_path, run)
        assert "state failed" in out and "stopped what it left running" in out, out
        assert leftovers(run) == []
        t = time.monotonic()
        code, said = launcher(tmp_path, "cancel", str(run))
        assert code == 0 and "already ended" in said and time.monotonic() - t < 10, said
        finish(tmp_path, run, Row("orchestrator killed (local)"), fault_ts,
               culprit="the orchestrator", state="failed", verdicts=("failed",),
               reconcile=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for r in (tmp_path / "runs").glob("*/run.json"):  # a failed test leaves nothing
            from launcher.control.runs import stop_orphans

            stop_orphans(rundir.RunDir(r.parent))
