"""What would break in the first seconds of a real GB200 job, on the dev cluster that
imitates it: the job builds its own compute environment (the submitter's virtualenv is not
there), engines and clients run under pyxis in an image that sees only the declared
mounts (tests/test_pyxis.py has the runtime itself), a node whose name resolves to loopback is refused, and a time limit mid-sweep ends
with teardown done. The dev cluster must be up (`bash slurm/devcluster/up.sh`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import leftovers

from launcher.run import rundir

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
RECIPE = "devcluster-sim"
SERVE_ONLY = ["--set", "benchmark.enabled=false", "--set", "accuracy.enabled=false"]


def submit(tmp_path: Path, *args: str, python: str = sys.executable, env: dict | None = None,
           wait: bool = True) -> tuple[int, str, Path]:
    p = subprocess.run(
        [python, "-m", "launcher", "submit", RECIPE, *args, "--runs-dir", str(tmp_path / "runs"),
         *(["--wait"] if wait else [])],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env or dict(os.environ),
    )  # fmt: skip
    runs = [r.parent for r in (tmp_path / "runs").glob("*/plan.json")]
    return p.returncode, p.stdout + p.stderr, runs[0] if runs else None


SITE_PROFILE = REPO / "slurm" / "devcluster" / "site-profile.yaml"


def profile(tmp_path: Path, base: Path = REPO / "launcher" / "clusters" / "devcluster.yaml",
            **changes) -> str:
    """A copy of a devcluster profile with some settings changed (YAML text edits)."""
    text = base.read_text()
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    return str(path)


def wait_end(run: Path, timeout: float = 240) -> rundir.RunStatus:
    from launcher.control import runs

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = runs.reconcile(rundir.RunDir(run))
        if st.final:
            return st
        time.sleep(1)
    raise AssertionError(f"{run} did not end in {timeout} s")


@pytest.fixture(scope="module")
def site_run(tmp_path_factory) -> tuple[Path, Path]:
    """One whole run (sweep and gate) as a site would submit it, read by the tests below:
    from a login-node virtualenv that is gone before the job starts (one the aarch64 trays
    could not run), on the site profile (slurm/devcluster/site-profile.yaml: extra srun
    options, a step preamble, no GPU request, an IMEX channel) changed to name the nodes'
    interface and not accept loopback as a node's address, with an API server on each
    decode node (decode.fronts: per_node) and one more srun option on the decode's steps.
    The run and the submitter's (vanished) venv path."""
    tmp_path = tmp_path_factory.mktemp("site-run")
    venv = tmp_path / "login-venv"
    venv.symlink_to(REPO / ".venv")
    env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv}/bin:{os.environ['PATH']}")
    # the dev cluster's nodes are one host: UCX moves its KV over TCP on lo, which this
    # profile allows (a site naming an ib0-like interface is refused at dry-run instead)
    prof = profile(tmp_path, SITE_PROFILE, **{
        "loopback_ok: true": "loopback_ok: false\n  interface: lo\n  kv_over_tcp: allow"})
    code, out, run = submit(
        tmp_path, "--set", f"cluster={prof}", "--set", "slurm.directives.hold=true",
        "--set", "decode.fronts=per_node", "--set", "decode.srun_options=[--comment=decode-steps]",
        python=str(venv / "bin" / "python"), env=env, wait=False,
    )  # fmt: skip
    assert code == 0, out
    job = rundir.RunDir(run).read_submission().slurm_job_id
    venv.unlink()  # the submitter's environment is unreachable from here on
    subprocess.run(["scontrol", "release", job], check=True, capture_output=True)
    st = wait_end(run)
    assert st.state == "succeeded", st.error
    return run, venv


def test_the_job_runs_without_the_submitters_virtualenv(site_run):
    """The job builds and uses its own environment."""
    run, venv = site_run
    for f in ("job.sbatch", "commands.sh", "plan.json"):
        assert str(venv) not in (run / f).read_text(), f
    assert "bash /var/tmp/pd-devcluster/env/" in (run / "job.sbatch").read_text()
    assert leftovers(run) == []


def test_clients_write_their_results_through_the_container_mount(site_run):
    run, _ = site_run
    plan = json.loads((run / "plan.json").read_text())
    boxed = {p["name"] for p in plan["processes"] if p["container"]}
    assert {"bench-c8", "bench-c32", "accuracy"} <= boxed
    assert any(p["name"].startswith("decode-0@") for p in plan["processes"] if p["container"])
    assert all(f"--container-mounts={run}:{run}," in line
               for line in (run / "commands.sh").read_text().splitlines()
               if line.startswith("srun") and ("bench-c" in line or "--job-name=accuracy" in line))
    assert (run / "bench" / "c00008.json").is_file() and (run / "bench" / "c00032.json").is_file()
    acc = json.loads((run / "accuracy" / "gsm8k.json").read_text())
    assert acc["requests"]["answered"] == acc["num_questions"] == 30
    assert leftovers(run) == []


def test_the_router_sends_to_each_decode_front_and_each_front_serves_its_own_ranks(site_run):
    """decode.fronts: per_node: each decode node runs an API server for its own DP ranks,
    both are decode workers of the router, and the sweep went through both."""
    run, _ = site_run
    plan = json.loads((run / "plan.json").read_text())
    (dec,) = [e for e in plan["endpoints"] if e["role"] == "decode"]
    assert len(dec["fronts"]) == 2
    (router,) = [p for p in plan["processes"] if p["name"] == "router"]
    assert [router["argv"][i + 1] for i, a in enumerate(router["argv"]) if a == "--decode"] \
        == dec["fronts"]
    prefill_nodes = {p["node"] for p in plan["processes"] if p.get("role") == "prefill"}
    assert router["node"] in prefill_nodes  # router.placement: prefill
    served = {}
    for p in plan["processes"]:
        if p.get("endpoint") == dec["name"]:
            assert not p["headless"] and "--data-parallel-hybrid-lb" in p["argv"]
            log = (run / p["log"]).read_text()
            served[p["name"]] = log.count("POST /v1/completions")
    assert len(served) == 2 and all(n > 0 for n in served.values()), served
    assert leftovers(run) == []


def test_site_srun_options_preamble_and_no_gpu_request_run_on_every_step(site_run):
    """The profile's srun options, its step preamble and gpu_directive: none reach every
    step as commands.sh shows them, and every step ran its preamble before its command."""
    run, _ = site_run
    cmds = (run / "commands.sh").read_text()
    sbatch = (run / "job.sbatch").read_text()
    assert "--gpus-per-node" not in sbatch + cmds and "--gres" not in sbatch + cmds
    steps = [ln for ln in cmds.splitlines() if ln.startswith("srun ")]
    assert steps and all("--mpi=none" in ln and "site preamble on" in ln for ln in steps)
    decode = [ln for ln in steps if "--job-name=decode-0@" in ln]
    assert decode and all("--comment=decode-steps" in ln for ln in decode)
    assert all("--comment=decode-steps" not in ln for ln in steps if ln not in decode)
    plan = json.loads((run / "plan.json").read_text())
    for p in plan["processes"]:
        # the step's first line of its own, after srun's and pyxis's notes
        first = next(ln for ln in (run / p["log"]).read_text().splitlines()
                     if not ln.startswith(("srun: ", "pyxis: ")))
        assert first.startswith("site preamble on ") and first.endswith(f"for {p['name']}"), \
            (p["name"], first)
    facts = json.loads(next((run / "preflight").glob("*.container.json")).read_text())
    assert facts["imex_channels"] == ["/var/tmp/pd-devcluster/imex/channel0"]


def test_an_imex_channel_path_that_does_not_exist_fails_preflight_in_the_container(tmp_path):
    """The profile names a channel folder the engines' containers do not have: the check
    inside the container names it, in seconds, before any engine starts."""
    prof = profile(tmp_path, SITE_PROFILE, **{
        ', "/var/tmp/pd-devcluster/imex:/var/tmp/pd-devcluster/imex:ro"]': "]",
        "dir: /var/tmp/pd-devcluster/imex": "dir: /var/tmp/pd-devcluster/no-imex"})
    t = time.monotonic()
    code, out, run = submit(tmp_path, "--set", f"cluster={prof}", *SERVE_ONLY)
    assert code != 0
    st = rundir.RunDir(run).status()
    assert st.state == "failed" and st.stage == "preflight", st
    assert ("the engine's container has no IMEX channel "
            "/var/tmp/pd-devcluster/no-imex/channel0: engines across trays need") in st.error, \
        st.error
    assert time.monotonic() - t < 120
    assert leftovers(run) == []


def test_without_the_run_directory_mount_preflight_names_it(tmp_path):
    prof = profile(tmp_path, **{'mounts: ["{run_dir}:{run_dir}"]': "mounts: []"})
    t = time.monotonic()
    code, out, run = submit(tmp_path, "--set", f"cluster={prof}")
    assert code != 0
    st = rundir.RunDir(run).status()
    assert st.state == "failed" and st.stage == "preflight", st
    assert "container steps do not see the run directory; add {run_dir}:{run_dir}" in st.error
    assert not (run / "bench").exists()
    assert time.monotonic() - t < 120
    assert leftovers(run) == []


def test_a_node_resolving_to_loopback_is_refused_on_a_multi_host_profile(tmp_path):
    # The dev cluster's nodes really are this host; a profile that says they are not must
    # refuse 127.0.0.1 as a node's address before anything starts.
    prof = profile(tmp_path, **{"loopback_ok: true": "loopback_ok: false"})
    code, out, run = submit(tmp_path, *SERVE_ONLY, "--set", f"cluster={prof}")
    assert code != 0
    st = rundir.RunDir(run).status()
    assert st.stage == "plan" and "resolves its own name to 127.0.0.1 (loopback)" in st.error
    assert "network.interface" in st.error
    assert not list((run / "logs").glob("*@*.log"))


def test_a_named_interface_gives_the_addresses(site_run):
    run, _ = site_run
    plan = json.loads((run / "plan.json").read_text())
    assert {n["address"] for n in plan["nodes"]} == {"127.0.0.1"}
    decode = next(p for p in plan["processes"] if p["name"].startswith("decode-0@"))
    assert decode["env"]["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_time_limit_mid_sweep_ends_with_teardown_and_an_honest_summary(tmp_path):
    # Submitted with 30 minutes, told 110 s before the end; once the sweep runs the limit is
    # cut to 2 minutes (`scontrol update`, as an admin or a reservation would), so Slurm's own
    # timer sends USR2 at its next check, mid-sweep, without a fixed wait for it.
    code, out, run = submit(
        tmp_path, "--set", "slurm.time_limit=30", "--set", "slurm.signal_lead_s=110",
        "--set", "benchmark.concurrency=[4,8,16,32]", "--set", "benchmark.prompts_per_point=4000",
        "--set", "sim.speed=1", "--set", "accuracy.enabled=false", wait=False,
    )  # fmt: skip
    assert code == 0 and run is not None, out
    deadline = time.monotonic() + 180
    while (st := rundir.RunDir(run).status()).stage != "sweep" and not st.final:
        assert time.monotonic() < deadline, st
        time.sleep(0.3)
    assert not st.final, st
    subprocess.run(["scontrol", "update", f"JobId={st.slurm_job_id}", "TimeLimit=2"], check=True)
    st = wait_end(run, timeout=240)
    assert st.state == "cancelled", (st, out[-2000:])
    assert st.error == "stopped: the Slurm time limit is near"
    assert st.stage == "sweep"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "cancelled" and summary["state"] == "cancelled"
    assert any("no result for concurrency" in r for r in summary["verdict_reasons"])
    events = [e["event"] for e in rundir.RunDir(run).events()]
    assert "process_stopped" in events and events[-1] == "cancelled"
    assert leftovers(run) == []
    # the job itself ends too (its batch shell exits after the orchestrator's last record)
    deadline = time.monotonic() + 60
    while (job := subprocess.run(["squeue", "-h", "-j", st.slurm_job_id], capture_output=True,
                                 text=True).stdout.strip()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not job, job
