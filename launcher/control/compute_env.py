"""The compute-node environment: where the launcher's own programs (orchestrator, agents,
router, clients) come from inside the allocation.

GB200 trays are aarch64 while login nodes are often x86_64, and compute nodes often cannot
reach a package index: a virtualenv made on the login node cannot run there. With the
profile's `compute_env.mode: shared`:

- `python -m launcher env prepare` (on a machine that reaches PyPI: the login node) fetches
  a wheelhouse for the compute nodes' arch and Python into `<dir>/<arch>-py<X.Y>-<lock>/`,
  pinned to the versions installed here, and writes `bootstrap.sh` beside it; `submit`
  does the same when it is missing, and copies this launcher's source to
  `<dir>/src-<hash>/launcher` (pure Python: any arch).
- The batch script runs `bootstrap.sh` first: on the first node, under `flock`, it builds
  `venv/` from the wheelhouse with `--no-index` (once per lock; later jobs reuse it), then
  the orchestrator starts from that venv with the copied source on PYTHONPATH.

`mode: submitter` runs this very interpreter (the local profile, or a site whose login and
compute nodes share arch and paths). `describe()` is what the dry-run prints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import launcher
from launcher.errors import UserError
from launcher.planning.plan import Runtime
from launcher.schema.cluster import Cluster
from launcher.schema.sections import AIPERF_PYTHONS, AIPERF_VERSION

# What runs on compute nodes, pinned to the versions installed here (the dashboard's
# Streamlit stays on the machine that shows it).
COMPUTE_PACKAGES = (
    "submitit", "pydantic", "pyyaml", "prometheus-client", "psutil", "nvidia-ml-py",
    "aiohttp", "rich", "vllm-router", "pyarrow",
)  # fmt: skip
# manylinux tags pip may take for each arch (newest first); then linux_<arch>, the tag of a
# wheel built by hand on such a host (the package index takes none of those)
PLATFORMS = {
    "x86_64": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
               "linux_x86_64"],
    "aarch64": ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64",
                "linux_aarch64"],
}


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def installed_versions() -> dict[str, str]:
    """{normalized name: version} of the distributions on sys.path, first one wins (as
    importlib.metadata resolves them), read from the `name-version.dist-info` folder names
    the wheel format prescribes: a directory listing, not the 40 ms importlib.metadata and
    its email parser cost on every dry-run."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n.endswith(".dist-info") and "-" in n:
                name, _, version = n[: -len(".dist-info")].partition("-")
                found.setdefault(_normalized(name), version)
    return found


def requirements() -> list[str]:
    """`name==version` of every compute package, as installed here."""
    versions = installed_versions()
    out = []
    for name in COMPUTE_PACKAGES:
        version = versions.get(_normalized(name))
        if version is None:
            raise UserError(
                f"{name} is not installed here, so the compute environment cannot be pinned: "
                f"reinstall the launcher (pip install -e .)"
            )
        out.append(f"{name}=={version}")
    return out


def source_dir() -> Path:
    return Path(launcher.__file__).resolve().parent


def source_hash() -> str:
    """Hash of the launcher's own files: a changed launcher gets its own copy."""
    h = hashlib.sha256()
    root = source_dir()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def _version(cluster: Cluster) -> str:
    return cluster.compute_env.python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"


def _arch(cluster: Cluster) -> str:
    return os.uname().machine if cluster.arch == "any" else cluster.arch


def env_root(cluster: Cluster, runs_root: Path) -> Path:
    d = cluster.compute_env.dir
    return Path(d).expanduser() if d else runs_root.expanduser().resolve() / ".pd-env"


def runtime(cluster: Cluster, runs_root: Path) -> Runtime:
    """The paths a job of this profile uses; nothing is created (the source is hashed)."""
    if cluster.compute_env.mode == "submitter":  # this interpreter, whatever its arch
        return Runtime("submitter", sys.executable, str(source_dir().parent), None, "", "")
    arch, ver = _arch(cluster), _version(cluster)
    lock = hashlib.sha256("\n".join(requirements()).encode()).hexdigest()[:10]
    root = env_root(cluster, runs_root)
    env = root / f"{arch}-py{ver}-{lock}"
    src = root / f"src-{source_hash()}"
    return Runtime("shared", f"{env}/venv/bin/python", str(src), str(env), arch, ver)


def current(run_plan: Path) -> Runtime:
    """Inside the allocation: the runtime the job was submitted with (plan.json), so the
    commands rendered here are the ones the dry-run showed. A directory only a dry-run
    wrote, run with `launcher run` inside an allocation one holds, has no source copy (submit
    makes it): this launcher's own is copied, as submit copies it, and its steps use that."""
    from launcher.run.plandoc import PlanError, read_plan

    try:
        rt = Runtime(**read_plan(run_plan).runtime)
    except (PlanError, TypeError):
        return Runtime("submitter", sys.executable, str(source_dir().parent), None, "", "")
    if rt.mode == "shared" and rt.src and not (Path(rt.src) / "launcher").is_dir():
        own = Path(rt.src).with_name(f"src-{source_hash()}")
        _copy_source(own)
        rt = dataclasses.replace(rt, src=str(own))
    return rt


def describe(rt: Runtime) -> str:
    if rt.mode == "submitter":
        return f"{rt.python} (this interpreter; the profile's compute_env.mode is submitter)"
    return (
        f"{rt.python} ({rt.arch}, Python {rt.python_version}; built once inside the job "
        f"from {rt.env}/wheels), launcher source {rt.src}"
    )


# --- effects --------------------------------------------------------------------------------


def _run(argv: list[str], what: str, log: Path) -> None:
    with open(log, "ab") as f:
        f.write(f"\n$ {shlex.join(argv)}\n".encode())
        f.flush()
        p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode:
        last = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise UserError(f"{what} failed (exit {p.returncode}): {' | '.join(last)} (log: {log})")


def prepare(cluster: Cluster, runs_root: Path, quiet: bool = False) -> Runtime:
    """`launcher env prepare`: the shared environment's inputs for this profile."""
    return ensure(cluster, runtime(cluster, runs_root), quiet)


def _env_folder(rt: Runtime, what: str) -> Path:
    """The folder a wheelhouse goes to, made; one sentence where no wheels are known for the
    nodes' arch or the folder cannot be made."""
    if rt.arch not in PLATFORMS:
        raise UserError(f"compute_env: no wheels are known for arch {rt.arch!r}")
    env = Path(rt.env)
    try:
        env.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {what} {env}: {e}") from None
    return env


def ensure(cluster: Cluster, rt: Runtime, quiet: bool = False) -> Runtime:
    """Make the shared environment's inputs exist: the wheelhouse for the compute nodes'
    arch and Python (downloaded here once per lock) and this launcher's source copy.
    The venv itself is built inside the job, on a compute node, by bootstrap.sh."""
    if rt.mode == "submitter" or rt.env is None:
        return rt
    env = _env_folder(rt, "the compute environment folder")
    _fetch_wheels(env, rt, requirements(), "the compute environment's", quiet)
    (env / "bootstrap.sh").write_text(bootstrap_script(cluster, rt))
    _copy_source(Path(rt.src))
    return rt


def _fetch_wheels(env: Path, rt: Runtime, reqs: list[str], whose: str, quiet: bool) -> None:
    """A wheelhouse of `reqs` and their dependencies for the nodes' arch and Python in
    env/wheels, fetched here once (wheels.ready marks it whole)."""
    if (env / "wheels.ready").exists():
        return
    if not quiet:
        print(f"fetching {whose} wheels ({rt.arch}, Python {rt.python_version}) into "
              f"{env}/wheels (once per version set)", flush=True)
    (env / "requirements.txt").write_text("\n".join(reqs) + "\n")
    # --find-links: a wheel the index lacks for this arch, built by the site and put in
    # wheels/, is taken (AIPerf's crick has no linux aarch64 wheel: docs/agentic.md)
    (env / "wheels").mkdir(exist_ok=True)
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--dest", str(env / "wheels"), "--find-links", str(env / "wheels"),
        "--only-binary=:all:", "--implementation", "cp",
        "--python-version", rt.python_version, "-r", str(env / "requirements.txt"),
    ]  # fmt: skip
    for tag in PLATFORMS[rt.arch]:
        argv += ["--platform", tag]
    t = time.monotonic()
    log = env / "prepare.log"
    before = log.stat().st_size if log.exists() else 0
    try:
        _run(argv, f"fetching wheels for {rt.arch}", log)
    except UserError:
        with open(log, "rb") as f:
            f.seek(before)
            missing = re.search(r"No matching distribution found for ([^\s(]+)",
                                f.read().decode(errors="replace"))
        if not missing:
            raise
        raise UserError(
            f"{missing.group(1)} has no wheel for {rt.arch} Python {rt.python_version} on "
            f"the package index ({whose} wheels need it): build one on an {rt.arch} host with "
            f"Python {rt.python_version} (pip wheel '{missing.group(1)}' --no-deps -w "
            f"{env}/wheels), then run this again (log: {log})") from None
    (env / "wheels.ready").write_text(f"{time.monotonic() - t:.1f} s\n")


def aiperf_runtime(rt: Runtime) -> Runtime | None:
    """The staged AIPerf environment of a shared runtime, in the launcher's own shape (its
    folder, arch and Python), so one bootstrap builds either."""
    if rt.aiperf_env is None:
        return None
    return Runtime("shared", f"{rt.aiperf_env}/venv/bin/python", "", rt.aiperf_env, rt.arch,
                   rt.python_version)


def prepare_aiperf(cluster: Cluster, runs_root: Path, quiet: bool = False) -> Path:
    """`launcher env prepare --aiperf`: AIPerf's wheelhouse for the compute nodes beside the
    launcher's, and its bootstrap.sh (an agentic run's job builds the venv once)."""
    ai = aiperf_runtime(runtime(cluster, runs_root))
    if ai is None:
        raise UserError(
            f"cluster profile {cluster.name} runs the launcher's programs with this "
            "interpreter (compute_env.mode: submitter), so AIPerf is the aiperf on PATH or "
            f"benchmark.agentic.aiperf: install AIPerf {AIPERF_VERSION} in an environment of "
            "its own (bash tests/aiperf/setup.sh makes one)")
    if ai.python_version not in AIPERF_PYTHONS:
        raise UserError(
            f"AIPerf {AIPERF_VERSION} needs Python {', '.join(AIPERF_PYTHONS)} but "
            f"{cluster.name}'s compute environment is Python {ai.python_version}: set the "
            "profile's compute_env.python and python_version to one of those")
    env = _env_folder(ai, "AIPerf's environment folder")
    _fetch_wheels(env, ai, [f"aiperf=={AIPERF_VERSION}"], f"AIPerf {AIPERF_VERSION}'s", quiet)
    (env / "bootstrap.sh").write_text(bootstrap_script(cluster, ai, f"AIPerf {AIPERF_VERSION}"))
    return env


def aiperf_staged(rt: Runtime) -> bool:
    """Whether AIPerf's wheelhouse and bootstrap are on the shared filesystem."""
    ai = aiperf_runtime(rt)
    return ai is not None and all((Path(ai.env) / f).exists()
                                  for f in ("wheels.ready", "bootstrap.sh"))


def _copy_source(dest: Path) -> None:
    """This launcher's package, copied once per content hash (write-then-rename)."""
    if (dest / "launcher" / "__init__.py").exists():
        return
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(
        source_dir(), tmp / "launcher", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    # byte-compiled once here, as an install does: every process of a job imports from this
    # copy, and one that may not write beside it (PYTHONDONTWRITEBYTECODE, a read-only
    # mount) would compile what it imports each time (a Python of another version ignores
    # these files); tracebacks name the final path
    import compileall

    compileall.compile_dir(tmp / "launcher", ddir=str(dest / "launcher"), quiet=2)
    try:
        tmp.rename(dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another submit copied the same source


def bootstrap_script(cluster: Cluster, rt: Runtime, what: str = "compute environment") -> str:
    """Runs first in the batch script, on a compute node: build the venv once, under a lock."""
    python = cluster.compute_env.python
    return f"""#!/bin/bash
# Written by `python -m launcher env prepare`: builds this {what}'s venv from
# its wheelhouse (no package index needed), once, under a lock; later jobs reuse it.
set -euo pipefail
env={shlex.quote(rt.env or "")}
if [ "$(uname -m)" != {shlex.quote(rt.arch)} ]; then
  echo "{what}: built for {rt.arch} but $(hostname) is $(uname -m): set the cluster profile's arch" >&2
  exit 1
fi
exec 9>"$env/.lock"
flock 9
if [ ! -f "$env/venv/.ready" ]; then
  echo "{what}: building $env/venv on $(hostname) (once)" >&2
  rm -rf "$env/venv"
  if ! have=$({shlex.quote(python)} -c 'import sys; print("%d.%d" % sys.version_info[:2])'); then
    echo "{what}: {python} does not run on $(hostname): set the profile's compute_env.python" >&2
    exit 1
  fi
  if [ "$have" != {shlex.quote(rt.python_version)} ]; then
    echo "{what}: {python} on $(hostname) is Python $have, the wheels are for {rt.python_version}: set the profile's compute_env.python_version" >&2
    exit 1
  fi
  {shlex.quote(python)} -m venv "$env/venv"
  "$env/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \\
      --find-links "$env/wheels" -r "$env/requirements.txt"
  touch "$env/venv/.ready"
fi
"""


def check_ready(rt: Runtime) -> str | None:
    """Why a shared environment cannot be used by a job yet (None: it can)."""
    if rt.mode != "shared" or rt.env is None:
        return None
    env = Path(rt.env)
    if not (env / "wheels.ready").exists():
        return f"its wheelhouse is not fetched ({env}/wheels): run python -m launcher env prepare"
    if not (Path(rt.src) / "launcher").is_dir():
        return f"the launcher source copy {rt.src} is missing: run python -m launcher env prepare"
    return None
