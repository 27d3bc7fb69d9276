"""A cancel at any stage is recorded as a cancel, never as the failure of the step it
interrupted (issue 39): `scancel` and `launcher cancel`, as a user runs them, during
preflight (the host check, then the container check), model loading, the sweep and the
accuracy gate of a small devcluster-sim run on the dev cluster. Each run must read cancelled
in run.json, `status` and summary.json, with the canceller named, and leave no process, step
or job behind.

scancel is the racy one: Slurm kills the job's steps on every node while the orchestrator's
own SIGTERM comes from its node's slurmd, so a step's failure can be seen first (a cancel
during the container check was once recorded as "failed preflight"; docs/contracts.md).

Needs the dev cluster (`bash slurm/devcluster/up.sh`). Run by hand in a loop to count:
`for i in $(seq 10); do pytest -q tests/test_cancel_stages.py; done`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import helpers
import pytest
import yaml
from helpers import launcher, leftovers

from launcher.run import rundir

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
# Port bases of this module (test_faults and test_prometheus take others; checked free).
PORT_BASES = (26000, 26500, 27000, 27500)
# Two nodes: one prefill endpoint DP2, one decode DP4.
SMALL = ["prefill.endpoints=1", "decode.data_parallel=4"]
# Each stage made long enough to be hit: engines load for a minute; a decode step of 50 ms
# (1 s at speed 20) makes a sweep point and the gate last seconds.
STAGES = {
    "host check": ("plan", []),
    "preflight": ("preflight", []),
    "loading": ("health", ["sim.start_delay_s=60", "accuracy.enabled=false"]),
    "sweep": ("sweep", ["sim.step_base_ms=1000", "benchmark.concurrency=[4]",
                        "accuracy.enabled=false"]),
    "gate": ("accuracy", ["sim.step_base_ms=1000", "benchmark.concurrency=[4]",
                          "benchmark.prompts_multiplier=1", "benchmark.warmup=0",
                          "accuracy.concurrency=1"]),
}
SAID = {"scancel": "cancelled (SIGTERM: scancel or shutdown)",
        "launcher cancel": "cancelled by `launcher cancel` ("}


@pytest.fixture(scope="module", autouse=True)
def cluster_up():
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    out = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"the dev cluster does not answer ({out.stderr.strip()}): run up.sh")


@pytest.fixture
def jobs():
    """Job ids submitted here: whatever the test's outcome, none outlives it."""
    ids: list[str] = []
    yield ids
    for job in ids:
        subprocess.run(["scancel", job], capture_output=True)


def profile(tmp_path: Path, fresh_image_cache: bool) -> str:
    """The dev cluster's profile on ports free now; with an empty image cache of its own, the
    preflight's image import lasts seconds (long enough for a CLI to land in it)."""
    containers = yaml.safe_load((REPO / "launcher/clusters/devcluster.yaml").read_text())[
        "containers"]
    if fresh_image_cache:
        cache = tmp_path / "images"
        cache.mkdir()
        containers["image_cache"] = str(cache)
    return helpers.profile_copy(tmp_path / "devcluster-cancel.yaml", "devcluster",
                                containers=containers,
                                port_base=helpers.free_port_base(PORT_BASES, 400))


def reached(run: Path, stage: str, how: str) -> bool:
    """The moment to cancel: inside the stage, with its work under way."""
    st = rundir.RunDir(run).status()
    if st.final:
        raise AssertionError(f"the run ended before stage {stage}: {st.state} {st.error}")
    rec = st.record
    if st.state != "running" or rec is None or rec.stage != stage:
        return False
    if stage == "plan":
        return (run / "logs" / "preflight-host.log").exists()
    if stage == "preflight":  # scancel: as pyxis starts the container; else in the import
        return (run / "logs" / ("preflight-container.log" if how == "scancel"
                                else "stage-image.log")).exists()
    if stage == "health":
        return bool(rec.progress.get("loading"))
    if stage == "sweep":
        return "bench-c4" in rec.processes
    return "accuracy" in rec.processes


def job_gone(job: str, timeout: float = 90) -> None:
    helpers.wait_for(lambda: not subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip(),
        timeout, f"job {job} to leave squeue", poll=0.5)


# The host check lasts a second: `launcher cancel`, a Python start-up, could land after it.
CASES = [(name, how) for name in STAGES for how in ("scancel", "launcher cancel")
         if (name, how) != ("host check", "launcher cancel")]


@pytest.mark.parametrize(("name", "how"), CASES)
def test_a_cancel_during_each_stage_is_recorded_as_the_cancel(tmp_path, jobs, name, how):
    stage, sets = STAGES[name]
    fresh = name == "preflight" and how == "launcher cancel"
    args = [f"cluster={profile(tmp_path, fresh)}", *SMALL, *sets]
    for attempt in range(3):
        before = set((tmp_path / "runs").glob("*/plan.json"))
        code, out = launcher(tmp_path, "submit", "devcluster-sim",
                             *[w for s in args for w in ("--set", s)])
        assert code == 0, out
        jobs.insert(0, re.search(r"submitted job (\d+)", out).group(1))
        (run,) = [p.parent for p in set((tmp_path / "runs").glob("*/plan.json")) - before]
        try:
            helpers.wait_for(lambda run=run: reached(run, stage, how), 240,
                             f"stage {stage} under way", poll=0.05)
            break
        except AssertionError as e:
            # the job's port block (port_base + its id mod 9 x 1,000) taken by a run of
            # someone else's on this shared host: not what is tested; another job id
            if "ports in use on this host" not in str(e) or attempt == 2:
                raise
            print(f"\nattempt {attempt + 1}: {str(e)[:200]}")
            job_gone(jobs[0])
    t0 = time.monotonic()
    if how == "scancel":
        subprocess.run(["scancel", jobs[0]], check=True)
    else:
        code, said = launcher(tmp_path, "cancel", str(run))
        assert code == 0 and "tore down and recorded why" in said, said
    st = helpers.wait_for(lambda: (s := rundir.RunDir(run).status()).final and s, 60,
                          "the run's end")
    took = time.monotonic() - t0
    print(f"\n{name} ({stage}), {how}: {st.state} in {took:.1f} s: {st.error}")
    assert (st.state, st.error[:len(SAID[how])]) == ("cancelled", SAID[how]), st.error
    assert st.record.failed_stage == stage, st.record.failed_stage  # it interrupted that stage
    events = rundir.RunDir(run).events()
    said = [e for e in events if e.get("event") in ("failed", "process_exited")
            or e.get("event") == "sweep_point" and e.get("status") == "failed"]
    assert said == [] and events[-1]["event"] == "cancelled", said or events[-1]
    if stage != "plan":  # before the plan for its nodes there is no summary (nor for a failure)
        summary = rundir.read_json(run / "summary.json")
        assert summary["verdict"] == "cancelled", summary["verdict"]
    code, out = launcher(tmp_path, "status", str(run))
    assert code == 0 and "\nstate cancelled " in out and f"\nerror: {st.error}\n" in out, out
    job_gone(jobs[0])
    assert subprocess.run(["squeue", "--steps", "-h", "-j", jobs[0]], capture_output=True,
                          text=True).stdout.strip() == ""
    helpers.wait_for(lambda: leftovers(run) == [], 20, f"no process of {run.name} left")
    assert took < 30, f"the cancel took {took:.1f} s to be recorded"
