"""The local dev cluster (slurm/devcluster/up.sh) behaves like the GB200 cluster where it matters
to the launcher: multi-node exclusive allocations with 4 GPUs per node, concurrent
`srun --overlap` steps, teardown by scancel, the batch-only signal, and submitit on top.

These tests need the cluster up; they fail (not skip) when it is not.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import DEVCLUSTER_DIR
from helpers import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
PARTITION = "dev"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    conf = DEVCLUSTER_DIR / "etc" / "slurm.conf"
    # up.sh links /etc/slurm/slurm.conf; SLURM_CONF also covers DEVCLUSTER_NO_ETC=1.
    if "SLURM_CONF" not in env and conf.exists():
        env["SLURM_CONF"] = str(conf)
    return env


def sh(*argv: str, timeout: float = 60, check: bool = True) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env())
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


@pytest.fixture(scope="module", autouse=True)
def cluster() -> list[str]:
    """The idle-or-busy nodes of partition `dev`; fails with the fix when Slurm is not there."""
    hint = "the dev cluster is not up: run `sudo bash slurm/devcluster/up.sh` first"
    try:
        p = subprocess.run(
            ["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t"],
            capture_output=True, text=True, timeout=20, env=_env(),
        )  # fmt: skip
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"{hint} (sinfo: {e})", pytrace=False)
    if p.returncode != 0 or not p.stdout.strip():
        pytest.fail(f"{hint} (sinfo: {p.stderr.strip() or 'no nodes'})", pytrace=False)
    usable = [
        ln.split()[0] for ln in p.stdout.splitlines() if ln.split()[1] in ("idle", "mix", "alloc")
    ]
    if len(usable) < 2:
        pytest.fail(f"{hint} (fewer than 2 usable nodes: {p.stdout.strip()})", pytrace=False)
    os.environ.update({k: v for k, v in _env().items() if k == "SLURM_CONF"})
    return usable


def sbatch(script: str, tmp_path: Path, *args: str) -> str:
    path = tmp_path / f"job-{uuid.uuid4().hex[:8]}.sbatch"
    path.write_text(script)
    out = sh(
        "sbatch", "--parsable", f"--partition={PARTITION}", f"--chdir={tmp_path}", *args, str(path)
    )
    return out.strip().split(";")[0]


def job_state(job_id: str) -> str:
    out = sh("scontrol", "-o", "show", "job", job_id, check=False)
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "GONE"


def wait_done(job_id: str, timeout: float = 60) -> str:
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE")
    return wait_for(lambda: (s := job_state(job_id)) in done and s, timeout, f"job {job_id} to end")


def live_pids(marker: str) -> list[int]:
    """Processes whose command line contains marker, zombies excluded (PID 1 here may not reap)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def test_two_node_exclusive_job_sees_four_gpus_per_node(tmp_path):
    script = """#!/bin/bash
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  srun --overlap --nodes=1 --ntasks=1 --nodelist=$n \\
    bash -c 'echo "step target=$1 node=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES"' _ $n
done
echo "batch node=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES nodelist=$SLURM_JOB_NODELIST"
"""
    job = sbatch(script, tmp_path, "--nodes=2", "--gpus-per-node=4", "--exclusive",
                 "--output=out.txt")  # fmt: skip
    assert wait_done(job) == "COMPLETED"
    out = (tmp_path / "out.txt").read_text()
    steps = re.findall(r"step target=(\S+) node=(\S+) cvd=(\S*)", out)
    assert len(steps) == 2, out
    assert len({node for _, node, _ in steps}) == 2, out
    for target, node, cvd in steps:
        assert node == target, out
        assert len(cvd.split(",")) == 4, out
    batch = re.search(r"batch node=(\S+) cvd=(\S*) nodelist=(\S+)", out)
    assert batch and batch.group(1) == steps[0][0] and batch.group(2) == "0,1,2,3", out


def test_overlap_steps_run_concurrently_on_one_node(tmp_path):
    script = """#!/bin/bash
node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -1)
for k in a b; do
  srun --overlap --nodes=1 --ntasks=1 --nodelist=$node \\
    bash -c 'echo "$1 $SLURMD_NODENAME start $(date +%s.%N)"; sleep 3; echo "$1 end $(date +%s.%N)"' _ $k &
done
wait
"""
    job = sbatch(script, tmp_path, "--nodes=2", "--gpus-per-node=4", "--exclusive",
                 "--output=out.txt")  # fmt: skip
    assert wait_done(job) == "COMPLETED"
    out = (tmp_path / "out.txt").read_text()
    start = {k: float(t) for k, _, t in re.findall(r"(\w) (\S+) start (\S+)", out)}
    end = {k: float(t) for k, t in re.findall(r"(\w) end (\S+)", out)}
    nodes = set(re.findall(r"\w (\S+) start", out))
    assert set(start) == set(end) == {"a", "b"}, out
    assert len(nodes) == 1, out
    assert start["a"] < end["b"] and start["b"] < end["a"], f"steps ran one after the other:\n{out}"


def test_scancel_kills_overlap_steps(tmp_path):
    marker = f"pdtest-{uuid.uuid4().hex[:10]}"
    script = f"""#!/bin/bash
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  for k in 1 2; do
    srun --overlap --nodes=1 --ntasks=1 --nodelist=$n bash -c 'exec -a {marker} sleep 600' &
  done
done
wait
"""
    job = sbatch(script, tmp_path, "--nodes=2", "--gpus-per-node=4", "--exclusive",
                 "--output=out.txt")  # fmt: skip
    # 4 tasks, plus the srun clients whose argv carries the marker too.
    wait_for(lambda: sum(1 for p in live_pids(marker) if _argv0(p) == marker) == 4, 30,
             "4 overlap steps to start")  # fmt: skip
    t0 = time.monotonic()
    sh("scancel", job)
    wait_for(lambda: not live_pids(marker), 20, f"every process of job {job} to go")
    gone_after = time.monotonic() - t0
    assert wait_done(job, 20) == "CANCELLED"
    assert not sh("squeue", "-h", "-s", "-j", job, check=False).strip()
    assert gone_after < 10, f"processes took {gone_after:.1f}s to go"


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def step_srun(job: str, marker: str) -> subprocess.Popen:
    """An srun of one task in `job` (its own process group), step and task named `marker`,
    returned once the task runs."""
    p = subprocess.Popen(
        ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1",
         f"--job-name={marker}", "bash", "-c", f"exec -a {marker} sleep 300"],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    wait_for(lambda: any(_argv0(x) == marker for x in live_pids(marker)), 20, "the step task")
    return p


# Alone on its partition: Slurm's messages for the killed srun's step (its task's exit, the
# step's end) go to that srun's ports, and an srun that starts meanwhile may have taken one:
# it then aborts its own step (docs/contracts.md). The other partition's sruns have ports of
# their own (slurm/devcluster/up.sh).
@pytest.mark.whole_partition
def test_srun_client_kill_and_step_cancel(tmp_path):
    """SIGTERM to srun ends its step; SIGKILL to the whole srun process group leaves the step
    running until `scancel JOB.STEP` (what an orchestrator must do for lost clients)."""
    job = sbatch("#!/bin/bash\nsleep 300\n", tmp_path, "--nodes=1", "--output=out.txt")
    wait_for(lambda: job_state(job) == "RUNNING", 30, f"job {job} to run")
    try:
        procs = {}
        for sig_name in ("TERM", "KILL"):
            marker = f"pdtest-{sig_name}-{uuid.uuid4().hex[:8]}"
            procs[sig_name] = (step_srun(job, marker), marker)
        p, marker = procs["TERM"]
        os.killpg(p.pid, signal.SIGTERM)
        wait_for(lambda: not any(_argv0(x) == marker for x in live_pids(marker)), 10,
                 "the task to end after SIGTERM to srun")  # fmt: skip
        p.wait(10)

        p, marker = procs["KILL"]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        time.sleep(2)
        assert any(_argv0(x) == marker for x in live_pids(marker)), "task died with srun"
        steps = sh("squeue", "-h", "-s", "-j", job, "-o", "%i %j")
        step_id = next(ln.split()[0] for ln in steps.splitlines() if ln.split()[1] == marker)
        sh("scancel", step_id)
        wait_for(lambda: not live_pids(marker), 10, f"step {step_id} to go after scancel")
    finally:
        sh("scancel", job, check=False)
        wait_done(job)  # its steps' last messages are sent before the job has ended


@pytest.mark.whole_partition  # it kills an srun and cancels its step: see the test above
def test_a_killed_sruns_step_has_ended_when_the_launcher_has_cancelled_it(tmp_path,
                                                                          monkeypatch):
    """The launcher's stop SIGKILLs an srun that outlived its grace, then cancels the step it
    left; it returns once that step has ended, so the step's last messages (sent to the dead
    srun's ports) are gone before the next sruns start."""
    from launcher.control import scheduling

    job = sbatch("#!/bin/bash\nsleep 300\n", tmp_path, "--nodes=1", "--output=out.txt")
    wait_for(lambda: job_state(job) == "RUNNING", 30, f"job {job} to run")
    try:
        marker = f"pdtest-left-{uuid.uuid4().hex[:8]}"
        p = step_srun(job, marker)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        monkeypatch.setenv("SLURM_JOB_ID", job)
        scheduling.SLURM.cancel_steps({marker})
        steps = sh("squeue", "-h", "-s", "-j", job, "-o", "%i %j", check=False)
        assert marker not in steps, steps
        assert not live_pids(marker)
    finally:
        sh("scancel", job, check=False)
        wait_done(job)


def _srun_ports(conf: Path) -> range:
    m = re.search(r"^SrunPortRange=(\d+)-(\d+)$", conf.read_text(), re.M)
    assert m, f"{conf} names no SrunPortRange"
    return range(int(m.group(1)), int(m.group(2)) + 1)


def test_each_partitions_sruns_listen_on_ports_no_other_partition_takes(tmp_path):
    """Each partition's slurmds read a config whose srun ports are the partition's own, outside
    the kernel's ephemeral ports, and a job's srun listens only there: Slurm's messages for a
    killed srun's step then reach no other partition's srun (docs/contracts.md)."""
    import psutil

    nodes_of = {}
    for ln in sh("sinfo", "-h", "-o", "%R %N").splitlines():
        part, expr = ln.split()
        nodes_of[part] = sh("scontrol", "show", "hostnames", expr).split()
    assert len(nodes_of) >= 2, nodes_of
    conf_of = {}  # node -> the config its slurmd reads
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv[:2] == ["slurmd", "-N"]:
            try:
                conf_of[argv[2]] = Path(proc.environ()["SLURM_CONF"])
            except (psutil.Error, KeyError):
                pass
    ranges = {}
    for part, nodes in nodes_of.items():
        confs = {conf_of.get(n) for n in nodes}
        assert len(confs) == 1 and None not in confs, f"{part}: slurmds read {confs}"
        ranges[part] = _srun_ports(confs.pop())
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    names = sorted(ranges)
    for i, a in enumerate(names):
        assert ranges[a].start > hi or ranges[a].stop <= lo, f"{a}: {ranges[a]} is ephemeral"
        for b in names[i + 1:]:
            assert not set(ranges[a]) & set(ranges[b]), f"{a} and {b} share srun ports"

    script = """#!/bin/bash
srun --nodes=1 --ntasks=1 sleep 5 &
sleep 2
echo "conf=$SLURM_CONF"
ss -Hltnp | grep "pid=$!," | awk '{print $4}'
wait
"""
    job = sbatch(script, tmp_path, "--nodes=1", "--output=out.txt")
    assert wait_done(job) == "COMPLETED"
    out = (tmp_path / "out.txt").read_text()
    ports = [int(x.rsplit(":", 1)[1]) for x in re.findall(r"^\S+:\d+$", out, re.M)]
    assert ports, out
    assert all(port in ranges[PARTITION] for port in ports), (ranges[PARTITION], out)


def test_batch_only_signal_reaches_batch_shell_not_steps(tmp_path):
    # USR2 115 s before a 2 min limit: arrives a few seconds in (slurmctld checks periodically).
    script = """#!/bin/bash
node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -1)
srun --overlap --nodes=1 --ntasks=1 --nodelist=$node \\
  bash -c 'trap "echo step-got-usr2; exit 3" USR2; sleep 200 & wait' &
trap 'echo batch-got-usr2; kill $(jobs -p); exit 0' USR2
sleep 200 & wait $!
"""
    job = sbatch(script, tmp_path, "--nodes=2", "--gpus-per-node=4", "--exclusive",
                 "--time=2", "--signal=B:USR2@115", "--output=out.txt")  # fmt: skip
    assert wait_done(job, 90) == "COMPLETED"
    out = (tmp_path / "out.txt").read_text()
    assert "batch-got-usr2" in out and "step-got-usr2" not in out, out


def _submitit_payload(delay: float) -> dict:
    """Runs in the batch step: launches one srun step per node with this same python."""
    import os
    import subprocess
    import sys
    import time

    time.sleep(delay)
    nodes = subprocess.check_output(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], text=True
    ).split()
    code = "import os, sys; print(os.environ['SLURMD_NODENAME'], os.environ['CUDA_VISIBLE_DEVICES'], sys.prefix)"
    procs = [
        subprocess.Popen(
            [
                "srun",
                "--overlap",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={n}",
                sys.executable,
                "-c",
                code,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for n in nodes
    ]
    return {
        "batch_node": os.environ["SLURMD_NODENAME"],
        "nodes": nodes,
        "steps": [p.communicate(timeout=60)[0].strip() for p in procs],
        "codes": [p.returncode for p in procs],
    }


def test_submitit_two_node_job_launches_steps(tmp_path):
    submitit = pytest.importorskip("submitit")
    import cloudpickle

    # The job imports nothing from tests/: ship this module's functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ex = submitit.AutoExecutor(tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(
        gpus_per_node=4, timeout_min=10, slurm_partition=PARTITION, slurm_exclusive=True,
        slurm_use_srun=False, slurm_additional_parameters={"nodes": 2, "signal": "B:USR2@90"},
    )  # fmt: skip
    t0 = time.monotonic()
    job = ex.submit(_submitit_payload, 2.0)
    print(f"submitted job {job.job_id}")
    # No accounting: state comes from squeue/scontrol, not sacct.
    wait_for(lambda: sh("squeue", "-h", "-j", job.job_id, "-o", "%T", check=False).strip() == "RUNNING",
             30, "squeue to show RUNNING")  # fmt: skip
    print(f"running after {time.monotonic() - t0:.1f}s")
    res = job.result()
    print(f"result after {time.monotonic() - t0:.1f}s")
    assert wait_done(job.job_id) == "COMPLETED"
    assert res["codes"] == [0, 0], res
    assert len(res["nodes"]) == 2 and res["batch_node"] == res["nodes"][0], res
    seen = [line.split() for line in res["steps"]]
    assert [s[0] for s in seen] == res["nodes"], res
    assert all(s[1] == "0,1,2,3" and s[2] == sys.prefix for s in seen), res
    text = Path(job.paths.submission_file).read_text()
    assert "#SBATCH --signal=B:USR2@90" in text and "#SBATCH --nodes=2" in text
