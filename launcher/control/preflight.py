"""Preflight: what would fail after a 40-minute model load, found in seconds before it.

Two kinds of checks, both through `launcher.control.nodecheck` (one entry point for
`engine: vllm` and `engine: sim`, so CI runs the same path as GB200):

- on every node's host, before planning: the node's own address (resolved on the node; a
  loopback address is refused unless the profile says every node is this host), GPUs
  visible, the IMEX channel for multi-node NVLink, the open-files limit; with pyxis,
  enroot, every container mount's source and the image cache;
- in the engine's container on every node, before any engine starts (with pyxis this step
  also creates the job's named container once per node): the run directory is visible,
  the step really runs in a container, the engine's version, every engine argv through the
  engine's own parser, the model and the input files.

A step that fails before it can check anything (pyxis could not import the image, a mount
source is missing, the cache is full) is judged by its log: `step_failures` turns what
pyxis and enroot print into one sentence each (docs/containers.md).

`judge_*` are pure: facts in, one sentence per problem out (naming node, process and fix).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import Problem
from launcher.planning import containers, schedulers
from launcher.planning.plan import Plan
from launcher.run.plandoc import PlanDoc
from launcher.run.rundir import read_json
from launcher.run.vocab import Kind, Role

PREFLIGHT_DIR = "preflight"


class PreflightFailed(Exception):
    """One or more problems, each one sentence; str() joins them."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(problems))
        self.problems = problems


def facts_file(run_dir: Path, node: str, where: str) -> Path:
    return Path(run_dir) / PREFLIGHT_DIR / f"{node}.{where}.json"


def read_facts(run_dir: Path, nodes: list[str], where: str) -> dict[str, dict | None]:
    return {n: read_json(facts_file(run_dir, n, where)) for n in nodes}


# --- host ---------------------------------------------------------------------------------


def addresses(plan: Plan, facts: dict[str, dict | None]) -> dict[str, str]:
    """Each node's address as found on the node itself; raises with one sentence per node
    whose address is unknown or loopback (headless DP ranks and NIXL peers could not reach
    it)."""
    c = plan.cluster
    out, problems = {}, []
    for node in plan.nodes:
        f = facts.get(node)
        if f is None:
            problems.append(Problem(
                f"{node}: the host check wrote nothing (see logs/preflight-host.log)", node=node))
            continue
        if c.network.interface:
            addr = f.get("interface_address")
            if not addr:
                problems.append(Problem(
                    f"{node} has no IPv4 address on interface {c.network.interface}: set the "
                    f"profile's network.interface to the NIC that connects the nodes",
                    node=node))
                continue
        else:
            addr = f.get("resolved")
            if not addr:
                problems.append(Problem(
                    f"{node} cannot resolve its own name: fix its DNS or /etc/hosts, or set "
                    f"the profile's network.interface",
                    node=node))
                continue
            if addr.startswith("127.") and not c.network.loopback_ok:
                problems.append(Problem(
                    f"{node} resolves its own name to {addr} (loopback), which other nodes "
                    f"cannot reach: set the profile's network.interface (e.g. ib0) or fix "
                    f"/etc/hosts on the nodes",
                    node=node))
                continue
        out[node] = addr
    if problems:
        raise PreflightFailed(problems)
    return out


IMEX_FIX = ("engines across trays need the IMEX service's channel for multi-node NVLink; "
            "ask the site how a job gets one (Slurm's switch/nvidia_imex, a prolog), set the "
            "profile's imex.channel and imex.dir to it, or set imex: false")


def imex_wanted(plan: Plan) -> str:
    imex = plan.cluster.imex
    return (f"IMEX channel {imex.dir}/channel{imex.channel}"
            if imex and imex.channel != "auto" else f"IMEX channel in {imex.dir if imex else ''}")


def judge_host(plan: Plan, facts: dict[str, dict | None], needed_fds: int) -> list[Problem]:
    c = plan.cluster
    problems = []
    want_arch = c.arch
    for node in plan.nodes:
        f = facts.get(node) or {}
        if not f:
            continue  # addresses() already said so
        if why := schedulers.of(c).gpu_count_problem(c, f.get("gpus") or {}):
            problems.append(Problem(f"{node} {why}", node=node))
        if want_arch != "any" and f.get("arch") and f["arch"] != want_arch:
            problems.append(Problem(
                f"{node} is {f['arch']} but the profile's arch is {want_arch}", node=node))
        hard = (f.get("nofile") or {}).get("hard")
        if isinstance(hard, int) and 0 < hard < needed_fds:
            problems.append(Problem(
                f"{node} allows {hard} open files but the router and clients need "
                f"{needed_fds}: raise the hard limit (limits.conf) or lower the profile's nofile",
                node=node))
        if "pyxis" in f:
            problems += judge_runtime(plan, node, f["pyxis"])
    return problems


def judge_runtime(plan: Plan, node: str, f: dict) -> list[Problem]:
    """enroot, the container mounts' sources and the image cache on one node."""
    out = []
    if not f.get("enroot"):
        out.append(Problem(
            f"{node}: enroot is not installed (not on PATH nor in /usr/local/bin, /usr/bin): "
            f"the profile {plan.cluster.name} runs containers through pyxis and enroot; ask "
            f"the site to install it on every node, or exclude the node (--exclude); pyxis's "
            f"job epilog fails there too and Slurm drains the node ('Epilog error')",
            node=node))
    for src, there in (f.get("mount_sources") or {}).items():
        if not there:
            out.append(Problem(
                f"{node}: the container mount source {src} does not exist on the node (pyxis "
                f"fails every step with it): create it on the shared filesystem, or fix "
                f"container.mounts / container.environment / the profile's containers.mounts",
                node=node))
    cache = f.get("image_cache")
    if cache and not cache.get("exists"):
        out.append(Problem(
            f"{node}: the image cache {cache['path']} (the profile's containers.image_cache) "
            f"does not exist on the node: create it on the shared filesystem", node=node))
    return out


# What pyxis and enroot print when a step cannot start, as (pattern, sentence); the groups
# fill the sentence. Seen with pyxis 0.24.0 and enroot 4.1.2 (docs/containers.md).
_STEP_ERRORS: list[tuple[str, str]] = [
    (r"URL https?://(?P<registry>[^/\s]+)/v2/(?P<repo>\S+)/manifests/(?P<ref>sha256:[0-9a-f]+) "
     r"returned error code: 404",
     "the image's digest {ref} does not exist in {repo} on the registry {registry}: copy the "
     "digest again (skopeo inspect docker://{registry}/{repo}:TAG), or push the image"),
    (r"URL https?://(?P<registry>[^/\s]+)/v2/(?P<repo>\S+)/manifests/(?P<ref>\S+) "
     r"returned error code: 404",
     "the image {repo}:{ref} is not in the registry {registry}: push it, or fix "
     "container.image (the repository or the tag)"),
    (r"URL https?://(?P<registry>[^/\s]+)/v2/(?P<repo>\S+)/manifests/\S+ "
     r"returned error code: 401",
     "the registry {registry} refuses access to {repo} (401): put the site's credentials "
     "for it in enroot's credentials file on the nodes"),
    (r"Invalid image reference: (?P<uri>\S+)",
     "enroot cannot read the image reference {uri}: fix container.image"),
    (r"curl: \((?:6|7|28|35|60)\) (?P<why>[^\n]+)",
     "the image's registry cannot be reached from the node (curl: {why}): check the "
     "registry's address in container.image, the node's proxy or network, or import the "
     "image into the profile's containers.image_cache from a node that reaches it"),
    (r"--container-mounts: source path does not exist: (?P<src>\S+)",
     "the container mount source {src} does not exist on the node: create it on the "
     "shared filesystem, or fix the mount"),
    (r"(?P<what>[^\n]*)No space left on device",
     "no room left for the image ({what}No space left on device): free space in the image "
     "cache {cache} and in enroot's data and cache folders on the node (ENROOT_DATA_PATH, "
     "ENROOT_CACHE_PATH), or point containers.image_cache at a larger filesystem"),
    (r"enroot: command not found|couldn't get list of containers|couldn't execute enroot",
     "enroot is not installed or does not run on the node (pyxis could not start it): ask "
     "the site to install it on every node, or exclude the node"),
    (r"nodecheck: (?P<node>\S+): the run directory (?P<dir>\S+) is not visible here",
     "container steps do not see the run directory; add {{run_dir}}:{{run_dir}} to the "
     "profile's containers.mounts"),
    (r"launch failed: Plugin initialization failed",
     "a SPANK plugin (pyxis) failed to set the step up there; slurmd's log on the node says "
     "why. pyxis makes its runtime folder (/run/pyxis) when slurmd starts, so a slurmd "
     "started before pyxis was loaded, or since a reboot emptied /run, fails this way: ask "
     "the site to restart slurmd on the node, or exclude the node"),
    (r"unrecognized option '--container-",
     "srun does not know pyxis's options (--container-image ...): pyxis is not loaded on "
     "this cluster (plugstack.conf); use a profile with containers.runtime: none, or ask the "
     "site"),
]


def step_failures(name: str, log: str, plan: Plan) -> list[Problem]:
    """One sentence per node for a preflight step that failed the way a site fails, read
    off its log; [] when nothing in it is recognised (the facts then speak)."""
    import re

    default = plan.nodes[0] if name.startswith("stage-") else None
    found: dict[str, Problem] = {}
    for line in log.splitlines():
        m = re.match(r"slurmstepd-(\S+?): ", line) or re.match(r"nodecheck: (\S+?): ", line)
        node = m.group(1) if m else default
        # srun's own lines name a task; a check step runs task i on the plan's i-th node
        t = re.match(r"srun: error: task (\d+) launch failed", line)
        if t and not name.startswith("stage-") and int(t.group(1)) < len(plan.nodes):
            node = plan.nodes[int(t.group(1))]
        for pattern, sentence in _STEP_ERRORS:
            hit = re.search(pattern, line)
            if hit:
                text = sentence.format(cache=plan.cluster.containers.image_cache or "(none)",
                                       **{k: v.strip(": ") for k, v in hit.groupdict().items()})
                key = f"{node}|{pattern}"
                if key not in found:
                    where = f"{node}: " if node else ""
                    found[key] = Problem(f"{where}{name}: {text} (see logs/{name}.log)",
                                         node=node)
                break
    # one sentence per cause: the same cause on every node is said once, naming the nodes
    by_cause: dict[str, list[Problem]] = {}
    for key, p in found.items():
        by_cause.setdefault(key.split("|", 1)[1], []).append(p)
    order = {n: i for i, n in enumerate(plan.nodes)}
    out = []
    for probs in by_cause.values():
        probs.sort(key=lambda p: order.get(p.node, len(order)))
        if len(probs) == 1:
            out.append(probs[0])
        else:
            nodes = ", ".join(p.node for p in probs if p.node)
            out.append(Problem(f"{nodes}: {probs[0].split(': ', 1)[1]}", node=probs[0].node))
    return out


# --- container ----------------------------------------------------------------------------


def judge_container(
    plan: Plan, doc: PlanDoc, facts: dict[str, dict | None], expect_version: str | None,
    hosts: dict[str, dict | None] | None = None, step_error: str | None = None,
) -> list[Problem]:
    """The container check's facts of every node (`hosts`: the host check's, whose root a
    container's must differ from; `step_error`: the last lines of the check step's log when
    it exited non-zero for a cause nothing recognised)."""
    problems = []
    kind = doc.engine_kind
    expect_version = kind.expected_version(expect_version)  # none for a stand-in's
    engine_nodes = {p.node for p in doc.processes_of_kind(Kind.ENGINE)}
    mounts = "{run_dir}"
    rejected: dict[str, list[str]] = {}  # vLLM's message -> the engines it names (once)
    hosts = hosts or {}
    isolated = containers.of(plan.cluster).isolated and plan.recipe.container is not None
    for node in plan.nodes:
        f = facts.get(node)
        if f is None and step_error:
            problems.append(Problem(
                f"{node}: the container check step failed before it wrote its result: "
                f"{step_error} (see logs/preflight-container.log"
                + (f"; the recipe's setup_script {plan.recipe.setup_script} runs first in that "
                   "step, as before each engine" if plan.recipe.setup_script else "") + ")",
                node=node))
            continue
        if f is None:
            problems.append(Problem(
                f"{node}: the container check left no result in {plan.run_dir}/{PREFLIGHT_DIR}: "
                f"container steps do not see the run directory; add {mounts}:{mounts} to the "
                f"profile's containers.mounts (see logs/preflight-container.log)",
                node=node))
            continue
        host_root = (hosts.get(node) or {}).get("root")
        if isolated and host_root and f.get("root") == host_root:
            problems.append(Problem(
                f"{node}: the container check ran on the node's own root filesystem, not in "
                f"the image: pyxis did not start a container there (is it in that node's "
                f"plugstack.conf?); ask the site, or exclude the node", node=node))
        if node in engine_nodes and not f.get("engine_version"):
            what = kind.parser_name
            problems.append(Problem(
                f"{node}: {what} cannot be imported in the engine's environment", node=node))
        elif (
            expect_version
            and f.get("engine_version")
            and not f["engine_version"].startswith(expect_version)
        ):
            problems.append(Problem(
                f"{node}: the engine is vLLM {f['engine_version']} but the recipe expects "
                f"{expect_version}: use the matching image or set engine_version",
                node=node))
        found = f.get("engine_platform")
        if node in engine_nodes and kind.checks_version and found and doc.engine_platform \
                and found != doc.engine_platform:
            build = "a CPU build of vLLM" if found == "cpu" else "a GPU build of vLLM"
            problems.append(Problem(
                f"{node}: the engine's environment is {build} ({f.get('engine_version')}) but "
                f"the recipe says engine_platform: {doc.engine_platform}: set engine_platform: "
                f"{found} (CPU runs are labelled vLLM (CPU), never a GPU measurement) or use "
                f"the other image",
                node=node))
        if node in engine_nodes and plan.cluster.imex is not None \
                and f.get("imex_channels") == []:
            where = "the engine's container" if isolated else "the engine's environment"
            problems.append(Problem(f"{node}: {where} has no {imex_wanted(plan)}: " + IMEX_FIX,
                                    node=node))
        for chk in f.get("argv_checks") or []:
            if not chk.get("ok"):
                msg = " ".join((chk.get("message") or "rejected").split())
                rejected.setdefault(msg, []).append(chk["process"])
        model = f.get("model") or {}
        if node in engine_nodes and model.get("ok") is False and model.get("pinned"):
            pin = model["pinned"]
            problems.append(Problem(
                f"{node}: the model {model.get('path')} at revision {pin} (model.revision) is "
                f"not in the engine's HF cache, and offline vLLM finds nothing else "
                f"({model.get('how')}): run python -m launcher stage-model {model.get('path')} "
                f"--revision {pin} --cluster <profile>", node=node))
        elif node in engine_nodes and model.get("ok") is False:
            problems.append(Problem(
                f"{node}: the model {model.get('path')} is not readable in the engine's "
                f"container ({model.get('how')}): stage it, or mount its folder",
                node=node))
        numa = f.get("numa_bind") or {}
        if numa and not numa.get("ok"):
            script = plan.recipe.setup_script
            how = (f"the recipe's setup_script {script} ran first and did not install it" if script
                   else "no setup_script installs it")
            problems.append(Problem(
                f"{node}: {', '.join(numa['processes'])} set numa-bind, which runs vLLM's workers "
                f"under numactl, but numactl {'does not work' if numa.get('numactl') else 'is not'}"
                f" in the engine's container ({numa.get('message')}; {how}): give setup_script a "
                "script that installs it (DeepSeek-V4-Pro's srt-slurm recipes run "
                "vllm-container-deps.sh), use an image that has it, or drop numa-bind",
                node=node, processes=tuple(numa["processes"])))
        store = f.get("store") or {}
        if store and not store.get("ok"):
            where = "the engines' container" if plan.recipe.container else "the node"
            problems.append(Problem(
                f"{node}: the KV store's master {store.get('command')} does not run in {where} "
                f"({store.get('message')}): use an image with Mooncake (the "
                "mooncake-transfer-engine package ships mooncake_master) or set "
                "kv_store.master_command to its path there",
                node=node, processes=(store["process"],)))
        for t in f.get("tokenizers") or []:
            if not t.get("ok"):
                problems.append(Problem(
                    f"{node}: {t['process']} would fail after the load: {t.get('message')}",
                    node=node, processes=(t["process"],)))
        unreadable: dict[str, list[str]] = {}
        for fr in f.get("files") or []:
            if not fr.get("ok"):
                unreadable.setdefault(fr["path"], []).append(f"{fr['process']} ({fr['what']})")
        for path, who in unreadable.items():
            problems.append(Problem(
                f"{path} is not readable on {node} for {', '.join(who)}: put it on the "
                f"shared filesystem and, with containers, mount its folder (container.mounts)",
                node=node))
        if any(p.node == node and p.container and p.kind.client for p in doc.processes) and (
            f.get("aiohttp") is False
        ):
            problems.append(Problem(
                f"{node}: the engine's image has no aiohttp for the launcher's clients",
                node=node))
    # A flag every engine carries is one problem, not one per engine.
    problems += [Problem(f"{', '.join(who)}: the engine rejects its command line: {msg}",
                         processes=tuple(who)) for msg, who in rejected.items()]
    return problems + judge_pairing(plan, doc, facts)


def judge_pairing(plan: Plan, doc: PlanDoc, facts: dict[str, dict | None]) -> list[Problem]:
    """What prefill and decode must agree on, from their rendered command lines and what the
    engines' containers saw: the model's config.json there (hybrid or not) and the real
    vLLM version (launcher.planning.pairing)."""
    from launcher.planning import pairing
    from launcher.planning.plan import is_hybrid

    heads = {}
    for p in doc.processes_of_kind(Kind.ENGINE):
        if p.role in (Role.PREFILL, Role.DECODE) and not p.headless:
            heads.setdefault(p.role, p)
    if len(heads) < 2:
        return []
    seen = [f for f in (facts.get(p.node) or {} for p in heads.values())]
    hybrid = (any((f.get("model") or {}).get("hybrid") for f in seen)
              or is_hybrid(plan.recipe, plan.model))
    version = doc.engine_kind.expected_version(
        next((f["engine_version"] for f in seen if f.get("engine_version")), None))
    sides = [pairing.side_of_argv(r, heads[r].argv, heads[r].env)
             for r in (Role.PREFILL, Role.DECODE)]
    who = (heads[Role.PREFILL].name, heads[Role.DECODE].name)
    return [Problem(text, processes=who)
            for text in pairing.disagreements(*sides, hybrid=bool(hybrid), engine_version=version)]


# --- serving ------------------------------------------------------------------------------


def _post(url: str, body: dict, timeout: float) -> tuple[int, dict | str]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode("utf-8", "replace")
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")[:300]
    except (urllib.error.URLError, OSError) as e:
        return 0, str(getattr(e, "reason", e))


def _metric(url: str, name: str) -> float:
    """The sum of one /metrics family over its label sets (0 when absent)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return float("nan")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return total


def unregistered(doc: PlanDoc, router_url: str) -> list[str]:
    """Endpoints the router does not list as healthy workers of their role (vllm-router's
    GET /workers names one worker per DP rank: "http://host:port@rank")."""
    try:
        with urllib.request.urlopen(router_url + "/workers", timeout=5) as r:
            workers = json.loads(r.read()).get("workers") or []
    except (urllib.error.URLError, OSError, ValueError, AttributeError) as e:
        return [f"all (GET /workers: {getattr(e, 'reason', e)})"]
    missing = []
    for ep in doc.endpoints:
        want = "regular" if ep.role == Role.AGG else str(ep.role)
        fronts = ep.front_urls
        for url in fronts:
            ok = any(
                str(w.get("url", "")).split("@")[0] == url
                and w.get("is_healthy")
                and (ep.role == Role.AGG or w.get("worker_type") == want)
                for w in workers
            )
            if not ok:
                missing.append(ep.name if len(fronts) == 1 else f"{ep.name} ({url})")
    return missing


@dataclass(frozen=True)
class _Front:
    """One API server of an endpoint (an endpoint with per_node fronts has several)."""

    name: str  # the endpoint's
    url: str


@dataclass
class PathCheck:
    """One prefill->decode hand-over. `step` is where it stopped: `prefill` (its answer),
    `decode` (the decode's answer, handshake not seen), `handshake` (seen, no answer),
    `transfer` (answered, but no successful KV read counted), `done`."""

    prefill: str
    decode: str
    ok: bool
    detail: str
    step: str = "done"
    waited_s: float = 0.0


# vLLM counts every completed NIXL transfer in this histogram; failures in their own counter.
TRANSFERS_OK = "vllm:nixl_xfer_time_seconds_count"
TRANSFERS_FAILED = "vllm:nixl_num_failed_transfers_total"
# vLLM's INFO line once the decode holds the prefill's NIXL metadata (nixl/base_worker.py).
HANDSHAKE_LINE = "NIXL compatibility check passed"
# How long vLLM keeps a prefill's blocks for a decode that has not read them (its
# kv_lease_duration default; docs/vllm-logs.md). Past it the read would fail in vLLM too.
DEFAULT_KV_LEASE_S = 30.0
# Beyond the lease: the decode's metadata fetch (vLLM gives it 5 s per remote rank), its
# first step and its answer on a busy node.
PD_SLACK_S = 60.0
PROGRESS_S = 15.0


def pd_wait_s(kv_connector: dict, override: float | None = None) -> float:
    """As long as vLLM itself waits for a decode to read a prefill's KV: the lease, plus slack
    (or the recipe's health.pd_wait_s)."""
    if override:
        return float(override)
    extra = kv_connector.get("kv_connector_extra_config") or {}
    try:
        lease = float(extra.get("kv_lease_duration", DEFAULT_KV_LEASE_S))
    except (TypeError, ValueError):
        lease = DEFAULT_KV_LEASE_S
    return max(lease, 1.0) + PD_SLACK_S


def _post_watched(url: str, body: dict, wait_s: float, watch, say, waiting) -> tuple:
    """POST in a thread; every second `watch()` (raises when a process died), every
    PROGRESS_S `say(waiting(seconds))`. (code, answer, seconds); code None: no answer."""
    import threading

    got: list = []
    t = threading.Thread(target=lambda: got.append(_post(url, body, wait_s + 5)), daemon=True)
    t0 = time.monotonic()
    t.start()
    next_say = t0 + PROGRESS_S
    while t.is_alive() and time.monotonic() - t0 < wait_s:
        t.join(1.0)
        watch()
        if say and time.monotonic() >= next_say and t.is_alive():
            say(waiting(time.monotonic() - t0))
            next_say += PROGRESS_S
    took = time.monotonic() - t0
    if not got:
        return None, None, took
    return got[0][0], got[0][1], took


def pd_path(doc: PlanDoc, wait_s: float, handshake_seen=lambda name: False,
            watch=lambda: None, say=None) -> list[PathCheck]:
    """One request through every prefill endpoint, handed to a decode as the router does it
    (prefill with do_remote_decode, then the decode with the prefill's kv_transfer_params):
    the path works when the decode's successful-transfer counter moves. The NIXL handshake
    is lazy, so this is the first time a broken P->D path can show. Each leg waits up to
    `wait_s` (pd_wait_s); `handshake_seen(decode)` tells whether the decode's log shows the
    handshake, so a give-up names the step it stopped in."""
    prefills = [_Front(e.name, u) for e in doc.endpoints if e.role == Role.PREFILL
                for u in e.front_urls]
    decodes = [_Front(e.name, u) for e in doc.endpoints if e.role == Role.DECODE
               for u in e.front_urls]
    out = []
    # every prefill front hands to a decode front, and every decode front is handed to
    for i in range(max(len(prefills), len(decodes)) if prefills and decodes else 0):
        pre, dec = prefills[i % len(prefills)], decodes[i % len(decodes)]
        before_ok = _metric(dec.url + "/metrics", TRANSFERS_OK)
        before_bad = _metric(dec.url + "/metrics", TRANSFERS_FAILED)
        body = {
            "model": doc.served_name, "prompt": "The launcher checks the P/D path.",
            "max_tokens": 1, "min_tokens": 1, "stream": False, "temperature": 0,
            "kv_transfer_params": {
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None,
            },
        }  # fmt: skip
        code, answer, took_p = _post_watched(
            pre.url + "/v1/completions", body, wait_s, watch, say,
            lambda s, p=pre: f"P/D path: waiting for {p.name}'s answer ({s:.0f} s of {wait_s:g} s)")
        if code is None:
            out.append(PathCheck(pre.name, dec.name, False, f"{pre.name} gave no answer within "
                                 f"{took_p:.0f} s", "prefill", round(took_p, 1)))
            continue
        if code != 200 or not isinstance(answer, dict):
            out.append(PathCheck(pre.name, dec.name, False, f"{pre.name} answered {code}: {answer}",
                                 "prefill", round(took_p, 1)))
            continue
        params = answer.get("kv_transfer_params")
        if not params:
            out.append(PathCheck(pre.name, dec.name, False,
                                 f"{pre.name} returned no kv_transfer_params", "prefill",
                                 round(took_p, 1)))
            continue
        body = {
            "model": doc.served_name, "prompt": "The launcher checks the P/D path.",
            "max_tokens": 2, "temperature": 0, "kv_transfer_params": params,
        }  # fmt: skip

        lead = f"{pre.name} answered in {took_p:.1f} s, then "

        def waiting(s: float, d=dec, lead=lead) -> str:
            seen = ("the NIXL handshake is in its log" if handshake_seen(d.name)
                    else "no NIXL handshake in its log yet")
            return (f"P/D path: {lead.removesuffix(', then ')}; waiting for {d.name} to read "
                    f"its KV ({s:.0f} s of {wait_s:g} s; {seen})")

        code, answer, took_d = _post_watched(dec.url + "/v1/completions", body, wait_s, watch,
                                             say, waiting)
        if code is None:
            seen = handshake_seen(dec.name)
            out.append(PathCheck(
                pre.name, dec.name, False,
                lead + f"{dec.name} gave no answer within {took_d:.0f} s ("
                + ("its log shows the NIXL handshake, but the KV read did not finish"
                   if seen else f"its log shows no NIXL handshake: no '{HANDSHAKE_LINE}'")
                + "; health.pd_wait_s sets the wait, by default the prefill's KV lease + "
                f"{PD_SLACK_S:g} s)",
                "handshake" if seen else "decode", round(took_d, 1)))  # fmt: skip
            continue
        deadline = time.monotonic() + 15  # the stats reach /metrics per engine step
        moved = failed = 0.0
        while time.monotonic() < deadline:
            moved = _metric(dec.url + "/metrics", TRANSFERS_OK) - before_ok
            failed = _metric(dec.url + "/metrics", TRANSFERS_FAILED) - before_bad
            if moved > 0 or failed > 0:
                break
            time.sleep(0.25)
        if code != 200:
            out.append(PathCheck(pre.name, dec.name, False,
                                 lead + f"{dec.name} answered {code} after {took_d:.1f} s: {answer}",
                                 "decode", round(took_d, 1)))
        elif failed > 0 or not moved > 0:
            out.append(PathCheck(
                pre.name, dec.name, False,
                lead + f"{dec.name}'s KV read failed ({TRANSFERS_FAILED} +{failed:g}, "
                f"successful +{moved:g})", "transfer", round(took_d, 1),
            ))  # fmt: skip
        else:
            out.append(PathCheck(pre.name, dec.name, True,
                                 f"{moved:g} KV transfer(s) in {took_p + took_d:.1f} s", "done",
                                 round(took_p + took_d, 1)))
    return out
