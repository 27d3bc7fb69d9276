"""The dev cluster's container steps through real pyxis 0.24.0 and enroot 4.1.2 (built from
their release sources by slurm/devcluster/containers.sh): the image comes from a registry
on this host by name, each node creates the job's named container once and every later step
reuses it, and each way a site's container setup fails is one sentence in preflight, in
seconds, before anything loads."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import DEVCLUSTER_DIR
from helpers import in_image, launcher, leftovers, server_of, wait_for
from test_gb200_path import REPO, SERVE_ONLY, profile, submit, wait_end

from launcher.run import rundir

pytestmark = pytest.mark.slurm
ENGINE_REF = DEVCLUSTER_DIR / "images" / "engine.ref"
TAG_IMAGE = "127.0.0.1:5000/pd/devcluster-engine:bookworm"


def image(kind: str) -> str:
    """The dev cluster's engine image by `tag` or by `digest`, as containers.sh pushed it."""
    if not ENGINE_REF.is_file():
        pytest.fail(f"{ENGINE_REF} is missing: run slurm/devcluster/containers.sh")
    refs = dict(line.split(" ", 1) for line in ENGINE_REF.read_text().splitlines())
    return refs[kind]


@pytest.fixture(scope="module")
def cache_profile(tmp_path_factory) -> str:
    """The devcluster profile with an image cache of its own (empty at first)."""
    d = tmp_path_factory.mktemp("pyxis")
    (d / "cache").mkdir()
    return profile(d, **{"image_cache: /var/tmp/pd-devcluster/images/cache":
                         f"image_cache: {d / 'cache'}"})


def job_of(run: Path) -> str:
    return rundir.RunDir(run).read_submission().slurm_job_id


def pyxis_lines(job: str) -> list[tuple[str, str]]:
    """(node, message) of every pyxis line slurmd logged for the job's steps."""
    out = []
    for log in sorted((DEVCLUSTER_DIR / "log").glob("slurmd.*.log")):
        node = log.name.split(".")[1]
        for line in log.read_text(errors="replace").splitlines():
            if f"] [{job}." in line and "pyxis:" in line:
                out.append((node, line.split("pyxis:", 1)[1].strip()))
    return out


def enroot_data(node: str) -> Path:
    """enroot's data folder on a dev-cluster node, as the site's drop-in configures it,
    expanded as enroot expands it (`eval echo`) with a step's variables on that node."""
    conf = Path("/usr/local/etc/enroot/enroot.conf.d/pd-devcluster.conf").read_text()
    (value,) = [x.split(None, 1)[1] for x in conf.splitlines() if x.startswith("ENROOT_DATA_PATH ")]
    out = subprocess.run(["bash", "-c", 'eval echo "$1"', "_", value], capture_output=True,
                         text=True, check=True,
                         env={"SLURM_TOPOLOGY_ADDR": node, "SLURMD_NODENAME": node})
    return Path(out.stdout.strip())


def image_events(run: Path) -> list[dict]:
    return [e for e in rundir.RunDir(run).events() if e["event"] == "image"]


def test_srun_lists_pyxis_options():
    out = subprocess.run(["srun", "--help"], capture_output=True, text=True).stdout
    for option in ("--container-image=", "--container-name=", "--container-mounts=",
                   "--container-writable", "--container-remap-root", "--container-workdir=",
                   "--no-container-mount-home", "--no-container-entrypoint"):
        assert option in out, option


def test_engines_run_in_the_image_under_pyxis_and_reuse_one_container_per_node(
        tmp_path, cache_profile):
    code, out, run = submit(tmp_path, "--set", f"cluster={cache_profile}", wait=False)
    assert code == 0, out
    job = job_of(run)
    pid = server_of("decode-0@*", "launcher.sim", run)  # its node: whichever Slurm gave
    node = psutil.Process(pid).environ()["PD_PROCESS"].split("@", 1)[1]
    # its root is the job's named container in enroot's data folder of that node
    (container,) = enroot_data(node).glob(
        f"pyxis_{job}_pd-devcluster-engine-*")
    root, there = os.stat(f"/proc/{pid}/root/"), os.stat(container)
    assert (root.st_dev, root.st_ino) == (there.st_dev, there.st_ino)
    assert in_image(pid)  # the image's files, not the host's
    assert Path(f"/proc/{pid}/root{run}/plan.json").is_file()  # the run directory is mounted
    st = wait_end(run)
    assert st.state == "succeeded", st.error
    assert (run / "bench" / "c00008.json").is_file() and (run / "accuracy" / "gsm8k.json").is_file()
    # the image came from the registry by name, once, into the profile's cache
    (ev,) = image_events(run)
    assert ev["imported"] is True and ev["path"].startswith(str(Path(cache_profile).parent))
    assert "importing docker://127.0.0.1:5000#pd/devcluster-engine:bookworm" in (
        run / "logs" / "stage-image.log").read_text()
    # with the digest the registry served for the tag, which the run keeps and --again pins
    digest = image("digest").rsplit("@", 1)[1]
    assert ev["digest"] == digest, ev
    ident = rundir.RunDir(run).read_record().identity
    assert ident["image"] == TAG_IMAGE and ident["image_digest"] == digest
    (tmp_path / "again").mkdir()
    code, out = launcher(tmp_path / "again", "submit", "--again", str(run), "--dry-run")
    assert code == 0, out
    assert f"the image is pinned to the digest that run used: {TAG_IMAGE}@{digest}" in out
    (new,) = [p.parent for p in (tmp_path / "again" / "runs").glob("*/plan.json")]
    assert f"image: {TAG_IMAGE}@{digest}" in (new / "recipe.yaml").read_text()
    # one container created per node (the preflight step); every later step reused it
    lines = pyxis_lines(job)
    created = [n for n, m in lines if m.startswith("creating container filesystem")]
    reused = [n for n, m in lines if m.startswith("reusing existing container")]
    plan = json.loads((run / "plan.json").read_text())
    boxed = [p for p in plan["processes"] if p["container"]]
    assert sorted(created) == sorted(n["name"] for n in plan["nodes"]), lines
    assert len(reused) == len(boxed), (len(boxed), lines)
    assert leftovers(run) == []


def test_a_digest_pinned_image_runs_and_a_cached_image_is_not_imported_again(
        tmp_path, cache_profile):
    pinned = image("digest")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, out, run = submit(tmp_path / "a", "--set", f"cluster={cache_profile}", "--set",
                            f"container.image={pinned}", *SERVE_ONLY)
    assert code == 0, out
    cmds = (run / "commands.sh").read_text()
    name = re.search(r"--container-name=(\S+)", cmds).group(1)
    (ev,) = image_events(run)
    assert ev["imported"] is True, ev  # its own name: the digest is part of the reference
    # Docker's repo@sha256: form, written the way pyxis documents it: REGISTRY#REPO@DIGEST
    registry, rest = pinned.split("/", 1)
    assert f"importing docker://{registry}#{rest}" in (run / "logs" / "stage-image.log").read_text()
    code, out, again = submit(tmp_path / "b", "--set", f"cluster={cache_profile}", "--set",
                              f"container.image={pinned}", *SERVE_ONLY)
    assert code == 0, out
    (ev,) = image_events(again)
    assert ev["imported"] is False, ev
    assert ev["digest"] == pinned.rsplit("@", 1)[1]  # kept beside the cached file
    assert f"--container-name={name}" in (again / "commands.sh").read_text()


def test_the_gb200_recipes_container_options_are_accepted_by_the_real_plugin(tmp_path):
    """The container options of every GB200 step, as rendered, run through real pyxis: only
    the image (the site's vLLM is not here) and the mount sources are the dev cluster's."""
    subprocess.run(
        ["python", "-m", "launcher", "submit", "qwen3.5-397b-gb200-disagg", "--dry-run",
         "--runs-dir", str(tmp_path / "runs")], check=True, capture_output=True, cwd=tmp_path,
        env=dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"))
    (run,) = (tmp_path / "runs").iterdir()
    line = next(x for x in (run / "commands.sh").read_text().splitlines()
                if x.startswith("srun") and "--job-name=decode-0@" in x)
    flags = [w for w in line.split() if w.startswith(("--container-", "--no-container-"))]
    assert {f.split("=", 1)[0] for f in flags} >= {
        "--container-image", "--container-name", "--container-mounts",
        "--no-container-mount-home", "--no-container-entrypoint", "--container-writable"}
    src = tmp_path / "src"
    src.mkdir()
    (src / "probe").write_text("seen\n")
    changed = []
    for f in flags:
        if f.startswith("--container-image="):
            f = "--container-image=" + image("digest").replace("/", "#", 1)
        elif f.startswith("--container-mounts="):
            # the same list shape: a read-write run directory and a read-only launcher mount
            f = f"--container-mounts={tmp_path}:{tmp_path},{src}:/opt/pd-launcher/launcher:ro"
        changed.append(f)
    p = subprocess.run(["srun", "-N1", "--time=2", *changed, "cat",
                        "/opt/pd-launcher/launcher/probe", "/etc/pd-image"],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["seen", "pd-devcluster-engine"]


# --- each way a site's container setup fails: one sentence in preflight, in seconds ---------


def failed_preflight(tmp_path: Path, *sets: str, prof: str | None = None) -> str:
    args = [a for s in sets for a in ("--set", s)]
    if prof:
        args += ["--set", f"cluster={prof}"]
    code, out, run = submit(tmp_path, *args, *SERVE_ONLY)
    assert code != 0, out
    st = rundir.RunDir(run).status()
    # from the job's start (it may wait for nodes another test's job holds) to the refusal
    record = json.loads((run / "run.json").read_text())
    took = record["ended"] - record["started"]
    assert st.state == "failed" and st.stage in ("plan", "preflight"), st
    assert not list((run / "logs").glob("decode-0@*.log"))  # nothing loaded
    assert took < 90, took
    assert leftovers(run) == []
    return st.error


def nodes_of(tmp_path: Path) -> list[str]:
    """The nodes Slurm gave the run's job, in order (the batch node first): which ones it
    picks depends on what earlier tests left on the shared dev cluster."""
    (run,) = [r.parent for r in (tmp_path / "runs").glob("*/run.json")]
    show = subprocess.run(["scontrol", "show", "job", job_of(run)], capture_output=True,
                          text=True, check=True).stdout  # finished jobs stay (MinJobAge)
    nodelist = re.search(r"\bNodeList=(\S+)", show).group(1)
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                          text=True, check=True).stdout.split()


def test_an_image_not_in_the_registry_is_one_sentence(tmp_path, cache_profile):
    err = failed_preflight(tmp_path, "container.image=127.0.0.1:5000/pd/devcluster-engine:nope",
                           prof=cache_profile)
    assert "the image pd/devcluster-engine:nope is not in the registry 127.0.0.1:5000" in err, err
    assert f"{nodes_of(tmp_path)[0]}: stage-image:" in err


def test_a_digest_that_does_not_exist_is_one_sentence(tmp_path):
    # no image cache: pyxis itself pulls on every node, and each node says the same
    prof = profile(tmp_path, **{"image_cache: /var/tmp/pd-devcluster/images/cache": "image_cache: null"})
    missing = "127.0.0.1:5000/pd/devcluster-engine@sha256:" + "0" * 64
    err = failed_preflight(tmp_path, f"container.image={missing}", prof=prof)
    assert ("the image's digest sha256:" + "0" * 64 + " does not exist in pd/devcluster-engine "
            "on the registry 127.0.0.1:5000") in err, err
    nodes = nodes_of(tmp_path)
    assert err.count("does not exist") == 1 and ", ".join(nodes) in err  # one sentence


def test_a_malformed_image_name_is_refused_before_submission(tmp_path):
    for bad, said in (("127.0.0.1:5000/PD/Engine:x", "is not an image reference"),
                      ("127.0.0.1:5000/pd/devcluster-engine@sha256:abc", "is not sha256:<64")):
        code, out, run = submit(tmp_path, "--set", f"container.image={bad}", "--dry-run")
        assert code == 2 and said in out, out


def test_a_missing_mount_source_is_named_with_its_node(tmp_path):
    err = failed_preflight(tmp_path, "container.mounts=['/nonexistent/models:/models:ro']")
    assert (f"{nodes_of(tmp_path)[0]}: the container mount source /nonexistent/models does "
            "not exist on the node") in err, err


def test_an_image_cache_without_room_is_one_sentence(tmp_path):
    small = tmp_path / "small-cache"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        prof = profile(tmp_path, **{"image_cache: /var/tmp/pd-devcluster/images/cache":
                                    f"image_cache: {small}"})
        err = failed_preflight(tmp_path, prof=prof)
    finally:
        subprocess.run(["umount", str(small)], check=False)
    assert f"{nodes_of(tmp_path)[0]}: stage-image: no room left for the image" in err, err
    assert "containers.image_cache" in err


@pytest.mark.whole_cluster
def test_enroot_missing_on_the_nodes_is_one_sentence(tmp_path):
    exe = shutil.which("enroot")
    assert exe, "enroot is not installed: run slurm/devcluster/containers.sh"
    aside = exe + ".away"
    queue_empty()
    os.rename(exe, aside)
    run = None
    try:
        err = failed_preflight(tmp_path)
        (run,) = [r.parent for r in (tmp_path / "runs").glob("*/run.json")]
        # the job must end while enroot is still away: pyxis's job epilog (container_scope
        # job) then fails and Slurm drains the nodes, as on a site
        job = job_of(run)
        deadline = time.monotonic() + 90
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                             text=True).stdout.strip():
            assert time.monotonic() < deadline, f"job {job} did not end"
            time.sleep(0.5)
    finally:
        os.rename(aside, exe)
        drained = resume_drained()
    nodes = nodes_of(tmp_path)
    assert len(nodes) == 4 and f"{nodes[0]}: enroot is not installed" in err, err
    assert f"{nodes[-1]}: enroot is not installed" in err
    # this job's epilog failed on each of its nodes, each drained; a node of the other lane's
    # may drain meanwhile too (back from a loss, it runs its lost job's epilog late)
    failed = epilog_failed_on(job)
    assert failed == set(nodes), (failed, nodes)
    assert set(nodes) <= drained, drained


def queue_empty(timeout: float = 90) -> None:
    """No job left in any partition: the other lane's last job may still be ending, and its
    epilog, too, would fail while enroot is away and drain its nodes."""
    wait_for(lambda: not subprocess.run(["squeue", "-h"], capture_output=True,
                                        text=True).stdout.strip(),
             timeout, "every job of every partition to leave the queue", poll=0.5)


def epilog_failed_on(job: str) -> set[str]:
    """The nodes slurmctld drained for a failed epilog of `job` (its log says which job)."""
    log = (DEVCLUSTER_DIR / "log" / "slurmctld.log").read_text(errors="replace")
    return set(re.findall(rf"job_epilog_complete: JobId={job} epilog error on (\S+), draining",
                          log))


def resume_drained() -> set[str]:
    """Nodes Slurm drained after a failed epilog, given back (the dev cluster is shared by
    every later test)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-R", "-o", "%N|%E"], capture_output=True,
                         text=True).stdout
    nodes = {line.split("|")[0] for line in out.splitlines() if "Epilog error" in line}
    for n in sorted(nodes):
        subprocess.run(["scontrol", "update", f"nodename={n}", "state=resume"],
                       capture_output=True)
    return nodes


def test_the_registry_tells_the_digest_of_a_tag_and_nothing_for_a_missing_one():
    """What the image step records (and, without an image cache, what the orchestrator asks
    before the nodes pull): the registry's own digest for the tag, as skopeo saw it."""
    from launcher.control.image import registry_digest

    digest = image("digest").rsplit("@", 1)[1]
    assert registry_digest("127.0.0.1:5000#pd/devcluster-engine:bookworm") == digest
    assert registry_digest("127.0.0.1:5000#pd/devcluster-engine:no-such-tag") is None
    assert registry_digest(f"127.0.0.1:5000#pd/devcluster-engine@{digest}") == digest
