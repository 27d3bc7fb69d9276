"""`launcher run` inside an allocation one holds (`salloc`), on the dev cluster under real
pyxis and enroot (issue 39): a run and a study written by `submit --dry-run` run to their end
there, as they do as a submitted job; an allocation too small for them is said in one
sentence before anything starts, and the directory stays for a proper one.

Needs the dev cluster (`bash slurm/devcluster/up.sh`, `slurm/devcluster/containers.sh`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import helpers
import pytest
from helpers import launcher, leftovers

from launcher.run import rundir

# This module's port bases (others take theirs; the first block free now is used).
PORT_BASES = (29500, 30500, 31500)
SMALL = ["accuracy.enabled=false", "benchmark.concurrency=[4]"]
# Inside the allocation: wait until the job's ports (the profile's base shifted by the job
# id, where another suite's run may sit for a moment) are free, then `launcher run`.
RUN_WHEN_FREE = """
import os, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import helpers
from launcher.planning.plan import job_port_shift
from launcher.schema import cluster
base = {base}
prof = cluster.load("devcluster").model_copy(update={{"port_base": base}})
start = base + job_port_shift(os.environ["SLURM_JOB_ID"], prof, 400)
helpers.wait_for(lambda: all(helpers._binds(p) for p in range(start, start + 400)), 180,
                 f"ports {{start}}.. free")
os.execv(sys.executable, [sys.executable, "-m", "launcher", "run", *sys.argv[1:]])
"""


@pytest.fixture(scope="module")
def cluster_up():
    p = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.fail(f"the dev cluster does not answer ({p.stderr.strip()}): run up.sh")


def _prepare(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    """A dry-run's directory on a port block free now: (port base, the directory)."""
    base = helpers.free_port_base(PORT_BASES, 400)
    prof = helpers.profile_copy(tmp_path / "devcluster-salloc.yaml", "devcluster",
                                port_base=base)
    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run",
                         *[w for s in [f"cluster={prof}", *SMALL] for w in ("--set", s)],
                         *extra)
    assert code == 0, out
    found = list((tmp_path / "runs").glob("*/study.json")) or list(
        (tmp_path / "runs").glob("*/plan.json"))
    return base, found[0].parent


def _salloc(tmp_path: Path, nodes: int, base: int, target: Path,
            timeout: float = 420) -> subprocess.CompletedProcess:
    script = tmp_path / "run_when_free.py"
    script.write_text(RUN_WHEN_FREE.format(tests=str(Path(__file__).parent),
                                           repo=str(Path(__file__).parents[1]), base=base))
    return subprocess.run(
        ["salloc", "-N", str(nodes), "--gpus-per-node=4", "--time=15", "--job-name=pd-salloc",
         sys.executable, str(script), str(target)],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.slurm
def test_launcher_run_of_a_run_inside_salloc_succeeds_under_pyxis(tmp_path, cluster_up):
    base, run = _prepare(tmp_path)
    p = _salloc(tmp_path, 4, base, run)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    st = rundir.RunDir(run).status()
    assert st.state == "succeeded", st.error
    # on every node the container check ran in the image, not on the host (pyxis)
    nodes = [n["name"] for n in json.loads((run / "plan.json").read_text())["nodes"]]
    for node in nodes:
        box, host = (json.loads((run / "preflight" / f"{node}.{w}.json").read_text())
                     for w in ("container", "host"))
        assert box["root"] != host["root"], node
    assert "--container-image=" in (run / "commands.sh").read_text()
    assert (run / "bench" / "c00004.json").is_file()
    assert leftovers(run) == []


@pytest.mark.slurm
def test_launcher_run_of_a_study_inside_salloc_succeeds_under_pyxis(tmp_path, cluster_up):
    base, study = _prepare(tmp_path, "--sweep", "prefill.endpoints=1,2", "--allocation", "one")
    p = _salloc(tmp_path, 3, base, study)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    alloc = json.loads((study / "allocation.json").read_text())
    assert alloc["state"] == "succeeded" and alloc["summary"]["succeeded"] == 2, alloc
    for c in alloc["configurations"]:
        assert rundir.RunDir(study / c["run"]).status().state == "succeeded"
        assert leftovers(study / c["run"]) == []


@pytest.mark.slurm
def test_an_allocation_too_small_is_one_sentence_before_anything_starts(tmp_path, cluster_up):
    base, run = _prepare(tmp_path)
    p = _salloc(tmp_path, 2, base, run, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    (said,) = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert said.startswith("error: this allocation (job ") and (
        "has 2 node(s)" in said and "this run needs 4 of 4 GPUs" in said
        and "salloc -N 4 --gpus-per-node=4" in said), said
    assert "Traceback" not in p.stderr
    assert not (run / "run.json").exists()  # the directory is still for a proper one


def test_a_job_environment_not_built_yet_is_one_sentence(tmp_path, monkeypatch):
    """Without the dev cluster: inside an allocation (its variables), a shared compute
    environment whose interpreter is not there yet is said before anything is written."""
    from launcher.control import allocation
    from launcher.errors import UserError

    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    monkeypatch.setattr(allocation, "allocation_nodes",
                        lambda: ["gb200-01", "gb200-02", "gb200-03", "gb200-04"])
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    rt = json.loads((run / "plan.json").read_text())["runtime"]
    allocation.check_allocation(run / "recipe.yaml", 4, {**rt, "python": sys.executable},
                                "this run")  # all there
    env = tmp_path / "env"
    with pytest.raises(UserError) as e:
        allocation.check_allocation(run / "recipe.yaml", 4, {
            **rt, "python": str(env / "venv/bin/python"), "env": str(env)}, "this run")
    assert str(e.value) == (
        f"this allocation (job 41) has no job environment yet: {env}/venv/bin/python is built "
        f"by {env}/bootstrap.sh (`python -m launcher env prepare --cluster devcluster` "
        f"writes it), which a submitted job runs first; run `srun -N1 -n1 bash "
        f"{env}/bootstrap.sh` in it, then this again; nothing was started or written")


def test_an_agentic_runs_aiperf_environment_not_built_yet_is_one_sentence(tmp_path,
                                                                         monkeypatch):
    """`launcher run` inside a salloc has no batch script to build the staged AIPerf's venv
    either: said before anything is written, with the step that builds it."""
    from launcher.control import allocation
    from launcher.errors import UserError

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"session_id": "a", "input_length": 10, "output_length": 2}\n')
    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run", "--set",
                         f"benchmark.agentic={{trace: {trace}, tokenizer: {tmp_path}}}")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    monkeypatch.setattr(allocation, "allocation_nodes",
                        lambda: ["gb200-01", "gb200-02", "gb200-03", "gb200-04"])
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    env = tmp_path / "env"
    rt = {**json.loads((run / "plan.json").read_text())["runtime"],
          "python": sys.executable, "env": str(env / "x86_64-py3.11-0123456789")}
    staged = env / "aiperf-0.13.0-x86_64-py3.11"
    rt["arch"] = "x86_64"
    with pytest.raises(UserError) as e:
        allocation.check_allocation(run / "recipe.yaml", 4, rt, "this run")
    assert str(e.value) == (
        f"this allocation (job 41) has no AIPerf environment yet: {staged}/venv is built by "
        f"{staged}/bootstrap.sh (`python -m launcher env prepare --cluster devcluster "
        "--aiperf` writes it), which a submitted agentic job runs first; run `srun -N1 -n1 "
        f"bash {staged}/bootstrap.sh` in it, then this again; nothing was started or written")
    (staged / "venv" / "bin").mkdir(parents=True)
    (staged / "venv" / "bin" / "aiperf").touch()
    allocation.check_allocation(run / "recipe.yaml", 4, rt, "this run")  # built: nothing said


def test_a_dry_runs_directory_gets_this_launchers_source_copy_inside_the_allocation(tmp_path):
    """submit copies the launcher's source for the nodes; a dry-run does not, so `launcher
    run` of its directory copies its own, as submit does, and its steps use that copy."""
    from launcher.control import compute_env

    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    doc = json.loads((run / "plan.json").read_text())
    doc["runtime"]["src"] = str(tmp_path / "env" / "src-0123456789ab")  # never copied
    (run / "plan.json").write_text(json.dumps(doc))
    rt = compute_env.current(run / "plan.json")
    assert rt.src == str(tmp_path / "env" / f"src-{compute_env.source_hash()}"), rt.src
    assert (Path(rt.src) / "launcher" / "control" / "orchestrator.py").is_file()
    assert rt.python == doc["runtime"]["python"]
