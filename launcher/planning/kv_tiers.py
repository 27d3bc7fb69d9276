"""KV beyond the GPU (pure): each role's connector chain as the recipe writes it, the Mooncake
store the engines share (its master's command line and ports, the store config it is given),
and what vLLM 0.33 would refuse only once the engines load: a connector it does not know, a
child without its kv_role, a store config missing a field, differing PYTHONHASHSEEDs, pools
larger than a node's host memory. Facts and their sources: docs/kv-store.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.errors import UserError
from launcher.run.vocab import Role
from launcher.schema.sections import flag_key
from launcher.schema.wording import did_you_mean, show

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.planning.plan import Endpoint, Plan
    from launcher.schema.recipe import Recipe

# vLLM 0.33.0 distributed/kv_transfer/kv_connector/factory.py: every registered name.
KNOWN_CONNECTORS = (
    "ExampleConnector", "ExampleHiddenStatesConnector", "LMCacheConnectorV1",
    "LMCacheMPConnector", "NixlConnector", "NixlPullConnector", "NixlPushConnector",
    "MultiConnector", "HiSparseConnector", "MoRIIOConnector", "OffloadingConnector",
    "DecodeBenchConnector", "MooncakeConnector", "MooncakeStoreConnector",
    "FlexKVConnectorV1", "SimpleCPUOffloadConnector", "HF3FSKVConnector",
)
STORE_CONNECTOR = "MooncakeStoreConnector"
# vLLM 0.33.0 distributed/mooncake_store.py MooncakeStoreConfig.from_file: the keys it reads
# (any other is ignored without a word). The first four have no default in the dataclass;
# from_file gives them "" / "rdma" / "", which fail at store set-up or pick hardware
# silently: the recipe names them (master_server_address is the launcher's).
STORE_KEYS = ("metadata_server", "master_server_address", "protocol", "device_name", "mode",
              "global_segment_size", "local_buffer_size", "enable_offload", "tenant_id")
STORE_REQUIRED = ("metadata_server", "protocol", "device_name")
STORE_MODES = ("embedded", "standalone-store")
DEFAULT_SEGMENT = 4 * 1024**3  # DEFAULT_GLOBAL_SEGMENT_SIZE and DEFAULT_LOCAL_BUFFER_SIZE
# The value every engine sharing a store gets when the recipe sets none (the published
# recipes' "0"): block hashes must agree across processes and nodes.
HASH_SEED = "0"
CONFIG_FILE = "mooncake_store_config.json"
MASTER = "mooncake-master"
STORE_SLOT = 2  # port_base + 2, +3, +4: the master's RPC, HTTP metadata and admin ports
GIB = 1024**3


@dataclass(frozen=True)
class MasterPorts:
    rpc: int
    metadata: int
    admin: int  # /health and /metrics


def master_ports(plan: Plan) -> MasterPorts:
    base = plan.router_port + STORE_SLOT  # router_port is the job's port base
    return MasterPorts(base, base + 1, base + 2)


# Mooncake's store client takes a port of its own in each process that opens the store, at
# random in [MC_STORE_CLIENT_MIN_PORT, MC_STORE_CLIENT_MAX_PORT] (12300-14300 unless set),
# and its transfer engine listens on two more (RPC, TCP data) at random in
# [MC_MIN_RPC_PORT, MC_MAX_RPC_PORT] (15000-17000 unless set), retrying on busy ones: left
# alone they land on ports the launcher planned for the router or an engine that starts
# later. Each plan keeps two ranges of its own after its endpoints' ports, one for each: 4
# per GPU of the engines sharing the store (a client per rank, room for the retries), at
# least 16. docs/kv-store.md.
CLIENT_PORTS_PER_GPU = 4
MOONCAKE_CLIENT_PORTS = ((1024, 32767), (61000, 65535))  # what Mooncake takes; else its own


def client_ports_needed(recipe: Recipe, endpoints: Sequence[Endpoint]) -> int:
    roles = store_roles(recipe) if recipe.kv_store is not None else []
    gpus = sum(len(p.gpus) for ep in endpoints if ep.role in roles for p in ep.parts)
    return max(16, CLIENT_PORTS_PER_GPU * gpus) if roles else 0


def client_ports(first: int, count: int) -> tuple[int, int] | None:
    """A range for the store clients' ports, or a sentence naming the fix where Mooncake
    would not take it (it would fall back to its own range, among other jobs' ports)."""
    if not count:
        return None
    lo, hi = first, first + count - 1
    if not any(a <= lo and hi <= b for a, b in MOONCAKE_CLIENT_PORTS):
        raise UserError(f"the KV store's clients would take ports {lo}-{hi}, which Mooncake "
                        "refuses (it takes 1024-32767 or 61000-65535, else falls back to "
                        "its own ranges, among other jobs' ports): lower the cluster "
                        "profile's port_base")
    return lo, hi


def master_node(plan: Plan) -> str:
    """The head node: where srt-slurm runs the master (its infra node)."""
    return plan.nodes[0]


def master_address(plan: Plan) -> str:
    return f"{plan.address(master_node(plan))}:{master_ports(plan).rpc}"


# --- each role's connector ------------------------------------------------------------------


def role_config(recipe: Recipe, role: Role) -> dict[str, Any]:
    """The --kv-transfer-config of `role`: its pool's kv_connector as written, else the
    recipe's kv_connector with each side's kv_role (the recipe's kv_both on every side when
    it names one, else kv_producer on prefill and kv_consumer on decode)."""
    own = getattr(recipe, role).kv_connector
    if own is not None:
        return dict(own)
    cfg = dict(recipe.kv_connector)
    if cfg.get("kv_role") != "kv_both":
        cfg["kv_role"] = "kv_producer" if role == Role.PREFILL else "kv_consumer"
    return cfg


def chain(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The connectors a config runs: a MultiConnector's children, else the one."""
    if cfg.get("kv_connector") == "MultiConnector":
        kids = extra_of(cfg).get("connectors")
        return [c for c in kids if isinstance(c, dict)] if isinstance(kids, list) else []
    return [cfg]


def extra_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """A connector's kv_connector_extra_config ({} when absent or not a mapping: said)."""
    extra = cfg.get("kv_connector_extra_config")
    return extra if isinstance(extra, dict) else {}


def names(cfg: dict[str, Any]) -> list[str]:
    return [str(c.get("kv_connector")) for c in chain(cfg)]


def connector_roles(recipe: Recipe) -> list[Role]:
    """The roles whose engines run a KV connector: prefill and decode of a P/D recipe, an
    aggregated pool that names its own (a store or CPU offload without P/D)."""
    if recipe.mode == "disagg":
        return [r for r in (Role.PREFILL, Role.DECODE) if getattr(recipe, r).endpoints]
    return [Role.AGG] if recipe.agg.endpoints and recipe.agg.kv_connector is not None else []


def store_roles(recipe: Recipe) -> list[Role]:
    """The roles whose engines share the Mooncake store."""
    return [r for r in connector_roles(recipe)
            if STORE_CONNECTOR in names(role_config(recipe, r))]


def connector_problems(recipe: Recipe) -> list[str]:
    """What vLLM 0.33 would refuse in each role's connector chain once the engine starts."""
    from launcher.sim import vllm_flags

    fields = vllm_flags.CONFIG_CLASSES["KVTransferConfig"]["fields"]
    out: list[str] = []
    for role in connector_roles(recipe):
        own = getattr(recipe, role).kv_connector
        cfg = own if own is not None else role_config(recipe, role)
        where = f"{role}.kv_connector" if own is not None else "kv_connector"
        if own is not None:  # the recipe's own keys are checked with the engine flags
            out += _keys(cfg, where, fields)
        if cfg.get("kv_connector") == "MultiConnector":
            kids = extra_of(cfg).get("connectors")
            if not isinstance(kids, list) or not kids or not all(
                    isinstance(k, dict) for k in kids):
                out.append(f"{where}: a MultiConnector lists its children in "
                           "kv_connector_extra_config.connectors (a list of connector "
                           "mappings); vLLM would start with none")
                continue
            for i, kid in enumerate(kids):
                at = f"{where}.kv_connector_extra_config.connectors[{i}]"
                out += _keys(kid, at, fields)
                out += _one(kid, at)
        else:
            out += _one(cfg, where)
    out += _offloading_flag(recipe)
    return list(dict.fromkeys(out))  # the recipe's kv_connector is both sides': said once


def offloading_size(recipe: Recipe, role: Role) -> tuple[str, float] | None:
    """(where, GiB) of --kv-offloading-size on `role`'s engines, native backend: vLLM makes
    the engine's connector OffloadingConnector (or SimpleCPUOffloadConnector) itself."""
    from launcher.planning.plan import engine_args

    pool = getattr(recipe, role)
    args = engine_args(recipe, pool)
    if args.get("kv-offloading-size") is None or args.get("kv-offloading-backend",
                                                           "native") != "native":
        return None
    where = f"{role}.args" if "kv-offloading-size" in {
        flag_key(k) for k in pool.args_at(recipe.first_point())} else "vllm_args"
    try:
        return f"{where}.kv-offloading-size", float(args["kv-offloading-size"])
    except (TypeError, ValueError):
        return None  # vLLM's parser names it


def _offloading_flag(recipe: Recipe) -> list[str]:
    """vLLM 0.33 (config/vllm.py _post_init_kv_transfer_config) sets the engine's
    kv_connector to the offload connector when --kv-offloading-size is given: on a P/D
    engine that replaces its NixlConnector, and the handoff silently stops."""
    out = []
    for role in connector_roles(recipe):
        found = offloading_size(recipe, role)
        if found and role != Role.AGG:
            out.append(f"{found[0]} on a {role} engine makes vLLM replace its "
                       f"{' + '.join(names(role_config(recipe, role)))} with the CPU offload "
                       "connector, so the P/D handoff stops: give the role a MultiConnector of "
                       "NixlConnector and OffloadingConnector (kv_connector_extra_config."
                       "cpu_bytes_to_use) instead")
    return out


def _keys(cfg: dict, where: str, fields: list[str]) -> list[str]:
    out = []
    for key in cfg:
        if key not in fields:
            hint = did_you_mean(key, fields)
            out.append(f"{where}.{key} is not a key of vLLM's KV-transfer config"
                       + (f": {hint}" if hint else ""))
    return out


def _one(cfg: dict, where: str) -> list[str]:
    name = cfg.get("kv_connector")
    out = []
    if cfg.get("kv_connector_extra_config") is not None and not isinstance(
            cfg["kv_connector_extra_config"], dict):
        out.append(f"{where}.kv_connector_extra_config must be a mapping of the connector's "
                   f"own settings (got {show(cfg['kv_connector_extra_config'])})")
    if cfg.get("kv_connector_module_path") is None and name not in KNOWN_CONNECTORS:
        hint = did_you_mean(str(name), KNOWN_CONNECTORS)
        out.append(f"{where}: connector {show(name)} is not one vLLM 0.33 knows"
                   + (f" ({hint})" if hint else f" (it knows {', '.join(KNOWN_CONNECTORS)})")
                   + "; name one, or give kv_connector_module_path for your own")
    if name == "MultiConnector":
        out.append(f"{where}: a MultiConnector inside a MultiConnector is not supported here; "
                   "list its children in the outer one")
    if cfg.get("kv_role") is None:
        out.append(f"{where} ({show(name)}) has no kv_role: vLLM refuses a connector without "
                   "one; write kv_producer, kv_consumer or kv_both")
    extra = extra_of(cfg)
    if name == "OffloadingConnector" and "spec_name" not in extra \
            and not extra.get("cpu_bytes_to_use"):
        out.append(f"{where}: OffloadingConnector's CPU tier needs "
                   "kv_connector_extra_config.cpu_bytes_to_use (its size in bytes): vLLM "
                   "refuses to start without it")
    return out


# --- the store ------------------------------------------------------------------------------


def parse_size(value: Any) -> int:
    """A size as vLLM's Mooncake config reads it: bytes, or a number with gb/mb/kb/b (powers
    of 1024, any case); the simulator's engines read it the same way."""
    from launcher.sim.connectors import parse_size as read

    if isinstance(value, bool):
        raise ValueError("a size, not true/false")
    try:
        return read(value)
    except ValueError:
        raise ValueError(f"{show(value)} is not a size (bytes, or a number with GB, MB, "
                         "KB)") from None


def store_problems(recipe: Recipe) -> list[str]:
    """The kv_store section against the roles that use it and vLLM's MooncakeStoreConfig."""
    store = recipe.kv_store
    using = store_roles(recipe)
    if store is None:
        return [f"{r}'s connector names {STORE_CONNECTOR} but the recipe has no kv_store: add "
                "kv_store.store_config (the launcher then runs its mooncake_master)"
                for r in using]
    cfg = store.store_config
    out = []
    for key in cfg:
        if key not in STORE_KEYS:
            hint = did_you_mean(key, STORE_KEYS)
            out.append(f"kv_store.store_config.{key} is not read by vLLM's Mooncake store "
                       + (f"({hint})" if hint else f"(it reads {', '.join(STORE_KEYS)})"))
    missing = [k for k in STORE_REQUIRED if k not in cfg]
    if missing:
        out.append(f"kv_store.store_config has no {', '.join(missing)}: vLLM's Mooncake store "
                   "needs them and the launcher fills in only master_server_address (e.g. "
                   "metadata_server: P2PHANDSHAKE, protocol: rdma or tcp, device_name: the "
                   "RDMA devices, or \"\" to let Mooncake pick)")
    mode = cfg.get("mode", "embedded")
    if mode not in STORE_MODES:
        out.append(f"kv_store.store_config.mode must be embedded or standalone-store (got "
                   f"{show(mode)})")
    sizes = {}
    for key in ("global_segment_size", "local_buffer_size"):
        try:
            sizes[key] = parse_size(cfg.get(key, DEFAULT_SEGMENT))
        except ValueError as e:
            out.append(f"kv_store.store_config.{key}: {e}")
    if sizes.get("local_buffer_size", 1) <= 0:
        out.append("kv_store.store_config.local_buffer_size must be more than 0")
    seg = sizes.get("global_segment_size")
    if mode == "embedded" and seg == 0:
        out.append("kv_store.store_config.global_segment_size is 0 in embedded mode: each "
                   "rank must give the pool some memory (or use mode standalone-store)")
    if mode == "standalone-store" and seg not in (None, 0):
        out.append("kv_store.store_config.global_segment_size must be 0 in standalone-store "
                   "mode (an external mooncake_client owns the pool)")
    tenant = cfg.get("tenant_id")
    if tenant is not None and not isinstance(tenant, str):
        out.append("kv_store.store_config.tenant_id must be text")
    return out


def hash_seed(recipe: Recipe) -> tuple[str, list[str]]:
    """(the PYTHONHASHSEED every engine sharing the store gets, problems): the recipe's own
    when all its settings agree (recipe env, each store role's env, kv_store.env)."""
    if recipe.kv_store is None:
        return "", []
    seen: dict[str, str] = {}
    for where, env in [("env", recipe.env), ("kv_store.env", recipe.kv_store.env)] + [
            (f"{r}.env", getattr(recipe, r).env) for r in store_roles(recipe)]:
        if "PYTHONHASHSEED" in env:
            seen[where] = env["PYTHONHASHSEED"]
    if len(set(seen.values())) > 1:
        said = ", ".join(f"{w} {show(v)}" for w, v in seen.items())
        return "", [f"PYTHONHASHSEED differs between the engines that share the KV store "
                    f"({said}): their block hashes would never match, so the store would "
                    "never hit; set one value (in env) or none (the launcher then sets "
                    f"{HASH_SEED} everywhere)"]
    return next(iter(seen.values()), HASH_SEED), []


def problems(recipe: Recipe) -> list[str]:
    """Every refusal of this module, one sentence each, before anything is written."""
    out = connector_problems(recipe) + store_problems(recipe)
    return out + hash_seed(recipe)[1]


def store_config(plan: Plan) -> dict[str, Any]:
    """The JSON the engines read at MOONCAKE_CONFIG_PATH: the recipe's, with the master's
    address filled in (nothing else is added)."""
    cfg = dict(plan.recipe.kv_store.store_config)
    cfg["master_server_address"] = master_address(plan)
    return cfg


def store_config_text(plan: Plan) -> str:
    return json.dumps(store_config(plan), indent=2) + "\n"


def config_path(plan: Plan) -> str:
    return f"{plan.run_dir}/{CONFIG_FILE}"


def master_argv(plan: Plan) -> list[str]:
    """srt-slurm's mooncake_master flags, on this plan's ports, then the recipe's own."""
    s, p = plan.recipe.kv_store, master_ports(plan)
    return [s.master_command, f"--port={p.rpc}", "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={p.metadata}", "--eviction_high_watermark_ratio=0.9",
            f"--default_kv_lease_ttl={s.lease_ttl_ms}", "--rpc_thread_num=16",
            "--enable_metric_reporting=true", f"--metrics_port={p.admin}", *s.master_args]


def store_client_python(recipe: Recipe) -> str | None:
    """For simulated engines sharing the store: the Python beside kv_store.master_command
    when that is a path (the mooncake-transfer-engine wheel installs mooncake_master and the
    store client in one environment); else the simulator looks beside mooncake_master on
    PATH itself."""
    command = recipe.kv_store.master_command if recipe.kv_store is not None else ""
    if "/" not in command:
        return None
    return f"{command.rsplit('/', 1)[0]}/python"


def engine_env(plan: Plan, role: Role, node: str) -> dict[str, str]:
    """What an engine sharing the store needs (srt-slurm sets the same), the recipe's MC_*
    knobs first: the launcher's own values win."""
    r = plan.recipe
    if r.kv_store is None or role not in store_roles(r):
        return {}
    host, p = plan.address(master_node(plan)), master_ports(plan)
    return {**r.kv_store.env, "PYTHONHASHSEED": hash_seed(r)[0],
            "MOONCAKE_CONFIG_PATH": config_path(plan),
            "MOONCAKE_MASTER": master_address(plan),
            "MOONCAKE_TE_META_DATA_SERVER": f"http://{host}:{p.metadata}/metadata",
            "MOONCAKE_LOCAL_HOSTNAME": plan.address(node),
            **({"MC_STORE_CLIENT_MIN_PORT": str(plan.store_client_ports[0]),
                "MC_STORE_CLIENT_MAX_PORT": str(plan.store_client_ports[1])}
               if plan.store_client_ports else {}),
            **({"MC_MIN_RPC_PORT": str(plan.store_rpc_ports[0]),
                "MC_MAX_RPC_PORT": str(plan.store_rpc_ports[1])}
               if plan.store_rpc_ports else {})}


# --- host memory ----------------------------------------------------------------------------


def rank_bytes(recipe: Recipe, role: Role) -> list[tuple[str, int]]:
    """[(what, bytes)] of host memory one GPU rank of `role` takes for its KV tiers: its
    share of the Mooncake pool (embedded: global_segment_size + local_buffer_size; standalone:
    local_buffer_size) and of a CPU offload tier (cpu_bytes_to_use over the engine's world
    size, tensor x pipeline parallel ranks, or cpu_bytes_to_use_per_rank)."""
    out = []
    cfg = role_config(recipe, role)
    tp = getattr(recipe, role).model_parallel
    for kid in chain(cfg):
        name = kid.get("kv_connector")
        extra = extra_of(kid)
        try:
            if name == STORE_CONNECTOR and recipe.kv_store is not None:
                sc = recipe.kv_store.store_config
                buf = parse_size(sc.get("local_buffer_size", DEFAULT_SEGMENT))
                seg = parse_size(sc.get("global_segment_size", DEFAULT_SEGMENT)) \
                    if sc.get("mode", "embedded") == "embedded" else 0
                out.append(("Mooncake segment + buffer", seg + buf))
            elif name == "SimpleCPUOffloadConnector":
                per = extra.get("cpu_bytes_to_use_per_rank")
                total = int(extra.get("cpu_bytes_to_use", 0) or 0)
                out.append(("CPU offload", int(per) if per is not None else total // tp))
            elif name == "OffloadingConnector" and extra.get("cpu_bytes_to_use"):
                out.append(("CPU offload", int(extra["cpu_bytes_to_use"]) // tp))
        except (TypeError, ValueError):
            continue  # a value the checks above name
    if (found := offloading_size(recipe, role)) is not None:  # GiB over the world size
        out.append(("CPU offload (--kv-offloading-size)", int(found[1] * GIB) // tp))
    return out


def host_memory(plan: Plan) -> list[tuple[str, int, str]]:
    """[(node, bytes, how)] the KV tiers take on each node that runs engines using them."""
    per: dict[str, list[str]] = {}
    need: dict[str, int] = {}
    for ep in plan.endpoints:
        tiers = rank_bytes(plan.recipe, ep.role)
        if not tiers:
            continue
        for part in ep.parts:
            ranks = len(part.gpus)
            for what, b in tiers:
                need[part.node] = need.get(part.node, 0) + ranks * b
                per.setdefault(part.node, []).append(
                    f"{ep.name} {ranks} rank(s) x {b / GIB:g} GiB {what}")
    return [(n, need[n], "; ".join(per[n])) for n in plan.nodes if n in need]


def memory_blockers(plan: Plan) -> list[str]:
    """A node whose KV-tier pools add up past its host memory: the engines would fail to
    register them (or the node would swap) after the model loaded."""
    have = plan.cluster.host_memory_gib
    if have is None:
        return []
    out = []
    for node, b, how in host_memory(plan):
        if b > have * GIB:
            out.append(f"the KV tiers need {b / GIB:,.1f} GiB of host memory on {node} ({how}) "
                       f"but a {plan.cluster.name} node has {have:,g} GiB (the profile's "
                       "host_memory_gib): lower kv_store.store_config.global_segment_size or "
                       "the offload size")
    return out


def summary(plan: Plan) -> list[str]:
    """The dry-run's lines: the master, the store config, each node's host-memory budget."""
    r = plan.recipe
    roles = connector_roles(r) or [role for role, _ in r.pools()]
    if r.kv_store is None and not any(getattr(r, x).kv_connector is not None
                                      or offloading_size(r, x) for x in roles):
        return []  # NIXL alone: the engine lines show its --kv-transfer-config
    lines = []
    if r.kv_store is not None and not store_roles(r):
        lines.append("warning: kv_store is set but no role's kv_connector names "
                     f"{STORE_CONNECTOR}: its master runs (as srt-slurm runs it) and serves no "
                     "engine; add the connector or remove kv_store")
    for role in connector_roles(r):
        lines.append(f"KV connector ({role}): " + " + ".join(
            f"{c.get('kv_connector')} ({c.get('kv_role')})" for c in chain(role_config(r, role))))
    if r.kv_store is not None:
        p = master_ports(plan)
        users = (f"engines of {', '.join(store_roles(r))} share it with PYTHONHASHSEED="
                 f"{hash_seed(r)[0]}") if store_roles(r) else "no engine uses it"
        lines.append(f"KV store: mooncake_master on {master_node(plan)} (rpc {p.rpc}, metadata "
                     f"{p.metadata}, admin/metrics {p.admin}); {users}")
        lines.append(f"KV store config ({CONFIG_FILE}): "
                     + json.dumps(store_config(plan), separators=(",", ":"), sort_keys=True))
    have = plan.cluster.host_memory_gib
    of = f" of the node's {have:,g} GiB" if have is not None else ""
    for node, b, how in host_memory(plan):
        lines.append(f"Host memory for KV tiers on {node}: {b / GIB:,.1f} GiB{of} ({how})")
    if have is None and lines:
        lines.append("Host memory is not checked: the cluster profile sets no host_memory_gib")
    return lines
