"""Cluster profiles: the facts about a site that a recipe should not have to repeat."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from launcher.errors import UserError
from launcher.schema.secrets import env_refusal, secret_env
from launcher.schema.sections import (
    ENV_NAME,
    Strict,
    _no_control_chars,
    check_mounts,
    check_no_secret,
    check_srun_options,
)
from launcher.schema.wording import format_error, show
from launcher.schema.yaml_io import read_yaml

CLUSTERS_DIR = Path(__file__).parents[1] / "clusters"


class ComputeEnv(Strict):
    """Where the launcher's own programs (orchestrator, agents, router, clients) come from on
    the compute nodes."""

    mode: Literal["submitter", "shared"] = Field(
        default="submitter",
        description="submitter: this interpreter (same machine or same arch and paths); "
        "shared: a per-arch virtualenv on the shared filesystem, built once inside the job "
        "from a wheelhouse fetched here (python -m launcher env prepare)",
    )
    python: str = Field(default="python3", description="compute nodes' interpreter to build from")
    python_version: str | None = Field(
        default=None, pattern=r"^3\.\d+$", description="its X.Y (default: this interpreter's)"
    )
    dir: str | None = Field(
        default=None, description="shared folder for environments (default <runs-dir>/.pd-env)"
    )

    @field_validator("dir")
    @classmethod
    def _one_path(cls, v: str | None) -> str | None:
        if v and ":" in v:
            raise ValueError("the launcher's source under it goes on PYTHONPATH: remove the ':'")
        return v


class ContainerSettings(Strict):
    """How container steps run and what they see (pyxis: only the image and the mounts)."""

    runtime: Literal["pyxis", "none"] = "none"
    mounts: list[str] = Field(
        default_factory=lambda: ["{run_dir}:{run_dir}"],
        description="SRC:DST[:ro] for every container step; {run_dir} is the run directory",
    )
    writable: bool = Field(default=True, description="--container-writable (vLLM writes caches)")
    remap_root: bool = False
    image_cache: str | None = Field(
        default=None,
        description="pyxis: shared folder where each image is imported once as a .sqsh",
    )

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        return check_mounts(v)


class Network(Strict):
    interface: str | None = Field(
        default=None,
        description="the NIC between nodes (e.g. enP6p3s0f0np0): its address is each node's "
        "address and it is exported as NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, VLLM_HOST_IP "
        "and UCX_NET_DEVICES (NIXL's KV transfer): an interface name there leaves UCX only "
        "TCP between nodes, so give RDMA devices in env.UCX_NET_DEVICES (e.g. mlx5_0:1), "
        "which this then leaves alone",
    )
    loopback_ok: bool = Field(
        default=False, description="every node really is this host (single-host dev cluster)"
    )
    kv_over_tcp: Literal["allow", "refuse"] | None = Field(
        default=None,
        description="a P->D KV transfer that UCX runs over TCP: refuse fails the P->D check "
        "naming the transport (default on profiles whose nodes are other hosts: TCP there "
        "means NVLink/RDMA is not in use; not where the recipe's own env pins a UCX_TLS "
        "without an RDMA lane, as DeepSeek-V4's published recipes do: the dry-run says so), "
        "allow lets it run",
    )


class Models(Strict):
    hf_home: str | None = Field(
        default=None, description="shared Hugging Face cache every node and container sees"
    )
    internet: bool = Field(default=True, description="compute nodes can reach the model hub")

    @field_validator("hf_home")
    @classmethod
    def _mountable(cls, v: str | None) -> str | None:
        if v and (":" in v or "," in v):
            raise ValueError("it is mounted into containers as SRC:DST: remove the ':' or ','")
        return v


class Imex(Strict):
    """The IMEX channel a job's engines use for NVLink across trays."""

    channel: int | Literal["auto"] = Field(
        default="auto",
        description="the channel number; auto: any channel the engines see (Slurm's "
        "switch/nvidia_imex gives each job one, channelN with N >= 1, and sets no variable)",
    )
    dir: str = Field(
        default="/dev/nvidia-caps-imex-channels",
        description="where the channel devices are, on the host and in the container",
    )


class Cluster(Strict):
    name: str
    scheduler: Literal["slurm", "local"]
    arch: Literal["any", "x86_64", "aarch64"] = "any"
    gpus_per_node: int = Field(ge=1, le=64)
    gpu_memory_gib: float = Field(gt=0, le=100_000)
    host_memory_gib: float | None = Field(
        default=None, gt=0, le=1_000_000,
        description="host memory a node can give KV tiers (a Mooncake store's segments, CPU "
        "offload), GiB; the dry-run holds their sum per node to it (null: not checked)",
    )
    gpu_kind: Literal["gb200", "b200", "h200", "h100", "cpu"] = Field(
        default="gb200", description="what the KV-capacity estimate assumes for start-up memory"
    )
    nodes_per_rack: int = Field(default=18, ge=1, le=100_000)
    gpu_directive: Literal["gpus-per-node", "gres", "none"] = Field(
        default="gpus-per-node",
        description="how the job and its GPU steps ask for GPUs; none: no GPU request (sites "
        "that reject both and give whole nodes)",
    )
    gres_type: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+$", description="e.g. gb200 for --gres=gpu:gb200:4"
    )
    exclusive: bool = True
    mem_zero: bool = False
    segment: bool = False
    imex: Imex | None = Field(
        default=None,
        description="multi-node NVLink: the IMEX channel engines need, checked where they "
        "run (inside the container) before they start (true: the defaults)",
    )
    srun_options: list[str] = Field(
        default_factory=list, description="extra srun options for every step (--name=value)"
    )
    step_preamble: str | None = Field(
        default=None,
        description="shell run before every step's command, inside its container if it has "
        "one (e.g. 'module load ...'); it must not set a secret",
    )
    bind_host: str = "0.0.0.0"
    port_base: int = Field(ge=1024, le=60000)
    port_blocks: int | None = Field(
        default=None, ge=1, le=16,
        description="1,000-port blocks from port_base that runs sharing a host take turns on "
        "(a site's open port range); default: as many as fit below 32768, at most 16",
    )  # fmt: skip
    dry_run_nodes: str = Field(description="Slurm-style node list used by --dry-run")
    env: dict[str, str] = Field(default_factory=dict, description="env for every engine process")
    compute_env: ComputeEnv = Field(default_factory=ComputeEnv)
    containers: ContainerSettings = Field(default_factory=ContainerSettings)
    network: Network = Field(default_factory=Network)
    models: Models = Field(default_factory=Models)
    nofile: int = Field(
        default=65536, ge=1024, le=1 << 30,
        description="open files the router and clients need (ulimit -n)",
    )  # fmt: skip
    kill_wait_s: float = Field(
        default=30, gt=0, le=86400, description="Slurm's KillWait: teardown must fit inside it"
    )
    load_time_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="how long one engine start takes here, start to healthy (the site's "
        "measured figure): the cost, the time-limit check and the study's choice count each "
        "load round at it, health.timeout_s bounding it, and the dry-run's useful GPU time is "
        "also given at it; unset: taken as health.timeout_s",
    )
    prometheus_sd_dir: str | None = Field(
        default=None,
        description="where running jobs list their scrape targets for Prometheus file-SD "
        "(shared by all jobs; default: each run directory's prometheus/)",
    )

    @field_validator("imex", mode="before")
    @classmethod
    def _imex_flag(cls, v):
        if v is True:
            return {}
        return None if v is False else v

    @field_validator("srun_options")
    @classmethod
    def _srun(cls, v: list[str]) -> list[str]:
        return check_srun_options(v)

    @field_validator("step_preamble")
    @classmethod
    def _preamble(cls, v: str | None) -> str | None:
        if v is not None:
            check_no_secret(v, "step_preamble")
        return v or None

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        for key in self.env:
            if not ENV_NAME.match(key):
                raise ValueError(f"env: {show(key)} is not a valid environment variable name")
            if what := secret_env(key):
                raise ValueError(env_refusal(f"env.{key}", what, "a recipe's env_from_host"))
        _no_control_chars(self.model_dump(mode="json"), "")
        return self


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(CLUSTERS_DIR.glob("*.yaml"))}


def load(ref: str) -> Cluster:
    path = file_of(ref)
    data = read_yaml(path, "a cluster profile")
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise format_error(e, str(path), model=Cluster) from None


def file_of(ref: str) -> Path:
    """The profile file a recipe's `cluster` names (a shipped name or a path)."""
    path = Path(ref)
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        st = None
    found = available()
    if ref in found and (st is None or stat.S_ISDIR(st.st_mode)):
        path = found[ref]  # a shipped profile's name (a folder of that name does not count)
    elif st is None:
        if "/" in ref or path.suffix in (".yaml", ".yml"):
            raise UserError(f"cluster profile file {show(ref)} does not exist")
        from launcher.schema.wording import did_you_mean

        hint = did_you_mean(ref, found)
        raise UserError(
            f"no cluster profile {show(ref)}{f' ({hint})' if hint else ''}: give a YAML path "
            f"or one of: {', '.join(found)}"
        )
    return path


def profile_nodes(cluster: Cluster, count: int) -> list[str]:
    """Node names for a plan made outside an allocation: the profile's list, extended."""
    names = expand_nodelist(cluster.dry_run_nodes, f"cluster profile {cluster.name}: dry_run_nodes")
    return names + [f"node-{i:03d}" for i in range(len(names) + 1, count + 1)]


_GROUP = re.compile(r"^(?P<prefix>[^\[\],]*)\[(?P<ranges>[^\]]+)\](?P<suffix>[^\[\],]*)$")


MAX_NODELIST = 4096
_NUMBER = re.compile("[0-9]{1,9}")  # ASCII digits: str.isdigit() takes '²', int() does not
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


def expand_nodelist(text: str, where: str = "node list") -> list[str]:
    """`gb200-[01-03,07],login1` -> names, keeping zero padding (one bracket group per name).
    `where` names the input in errors (--nodelist, a profile's dry_run_nodes)."""
    shown = show(text)
    if text.count("[") != text.count("]"):
        raise UserError(f"{where}: cannot read {shown}: unbalanced brackets")
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)?", text.strip()):
        item = item.strip()
        if not item:
            continue
        m = _GROUP.match(item)
        if not m:
            if "[" in item or "]" in item:
                raise UserError(f"{where}: cannot read {shown} near {show(item, 40)}")
            names.append(item)
        else:
            for part in m["ranges"].split(","):
                lo, _, hi = part.partition("-")
                if not _NUMBER.fullmatch(lo) or hi and not _NUMBER.fullmatch(hi):
                    raise UserError(f"{where}: cannot read {shown} near {show(part, 40)}")
                first, last = int(lo), int(hi or lo)
                if last - first + len(names) >= MAX_NODELIST:
                    raise UserError(f"{where}: {shown} names more than {MAX_NODELIST} nodes")
                width = len(lo)
                for i in range(first, last + 1):
                    names.append(f"{m['prefix']}{i:0{width}d}{m['suffix']}")
        if len(names) > MAX_NODELIST:
            raise UserError(f"{where}: {shown} names more than {MAX_NODELIST} nodes")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise UserError(f"{where}: {shown} names {n} twice")
        seen.add(n)
        if not NODE_NAME.match(n):
            raise UserError(
                f"{where}: node name {show(n, 70)} is not a host name (letters, digits, '.', "
                "'_', '-'; at most 63)"
            )
    return names
