"""Plan (pure): endpoints -> nodes, GPU indices, DP ranks and ports.

The same function runs for the dry-run (on the cluster profile's fake node list) and inside
the allocation (on the real one), so what the dry-run shows is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError
from launcher.planning import kv, pairing
from launcher.run import lengths
from launcher.run.vocab import Role
from launcher.schema.cluster import Cluster
from launcher.schema.recipe import Recipe
from launcher.schema.sections import AIPERF_VERSION, Pool, flag_key

if TYPE_CHECKING:
    from launcher.planning.kv import ModelFacts

# Flags and env the launcher derives itself; a user setting them would break the rendezvous.
OWNED_FLAGS = {
    "host": "the launcher binds every server (cluster profile bind_host)",
    "port": "the launcher owns every port",
    "served-model-name": "set model.served_name",
    "tensor-parallel-size": "set <pool>.tensor_parallel",
    "tp": "set <pool>.tensor_parallel",
    "data-parallel-size": "set <pool>.data_parallel",
    "dp": "set <pool>.data_parallel",
    "data-parallel-size-local": "the planner derives it from <pool>.gpus_per_node",
    "dpl": "the planner derives it from <pool>.gpus_per_node",
    "data-parallel-address": "the planner sets the head node's address",
    "dpa": "the planner sets the head node's address",
    "data-parallel-rpc-port": "the launcher owns every port",
    "dpp": "the launcher owns every port",
    "data-parallel-start-rank": "the planner assigns DP ranks",
    "dpr": "the planner assigns DP ranks",
    "data-parallel-rank": "the planner assigns DP ranks",
    "headless": "the planner decides which parts are headless",
    "enable-expert-parallel": "set <pool>.expert_parallel",
    "ep": "set <pool>.expert_parallel",
    "api-server-count": "set <pool>.api_servers",
    "asc": "set <pool>.api_servers",
    "kv-transfer-config": "set kv_connector (the launcher adds kv_role per side)",
    "device-ids": "the planner pins GPUs with CUDA_VISIBLE_DEVICES",
    "nnodes": "the planner spans an engine over nodes (<pool>.tensor_parallel x "
              "pipeline_parallel)",
    "node-rank": "the planner spans an engine over nodes (<pool>.tensor_parallel x "
                 "pipeline_parallel)",
    "master-addr": "the planner sets the head node's address",
    "master-port": "the launcher owns every port",
}
# Owned too (<pool>.pipeline_parallel), but 1, vLLM's default, may stay in args as published
# recipes write it: it changes nothing.
PIPELINE_FLAGS = ("pipeline-parallel-size", "pp")
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the planner pins GPUs per endpoint",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "the launcher sets each node's own address",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "the launcher owns every port",
    "PD_PROCESS": "the launcher names every process",
    "PD_RUN_DIR": "the launcher sets the run directory",
}

EXPORTER_SLOT = 10  # port_base + 10 + node index: one telemetry exporter per node
ENDPOINT_SLOT = 100  # endpoints' port blocks start here
MAX_NODES = ENDPOINT_SLOT - EXPORTER_SLOT
# vLLM picks its internal ports (ZMQ, DP coordinator, ...) upward from VLLM_PORT; two engines
# on one node without their own ranges can pick the same one (EADDRINUSE at start-up).
VLLM_PORT_SPAN = 32


@dataclass(frozen=True)
class Runtime:
    """Where the launcher's own programs come from on the compute nodes
    (launcher.control.compute_env decides; the renderer writes it down)."""

    mode: str  # "submitter" | "shared"
    python: str  # the launcher's interpreter on the compute nodes
    src: str  # the folder that holds the `launcher` package there (PYTHONPATH)
    env: str | None  # shared mode: the environment's folder (the {compute_env} image)
    arch: str
    python_version: str

    @property
    def bindir(self) -> str:
        return str(Path(self.python).parent)

    @property
    def bootstrap(self) -> str | None:
        return f"{self.env}/bootstrap.sh" if self.env else None

    @property
    def aiperf_env(self) -> str | None:
        """Shared mode: the AIPerf environment `env prepare --aiperf` stages beside the
        launcher's (its wheels; the job builds its venv once, as the launcher's)."""
        if not self.env:
            return None
        return f"{Path(self.env).parent}/aiperf-{AIPERF_VERSION}-{self.arch}-py{self.python_version}"


LOCAL_RUNTIME = Runtime("submitter", "python", "", None, "any", "")


@dataclass(frozen=True)
class Part:
    """One endpoint's share of one node."""

    node: str
    gpus: tuple[int, ...]
    dp_ranks: tuple[int, ...]
    head: bool  # rank 0's part: the DP coordinator's address (and the one front by default)
    vllm_port: int  # VLLM_PORT: the base of vLLM's internal ports, one range per process
    http_port: int | None = None  # a front (an API server); None: --headless


@dataclass(frozen=True)
class Endpoint:
    name: str
    role: Role
    pool: Pool
    parts: tuple[Part, ...]
    http_port: int
    dp_rpc_port: int
    nixl_port_base: int

    @property
    def head(self) -> Part:
        return self.parts[0]

    @property
    def dp_local(self) -> int:
        return len(self.head.dp_ranks)

    @property
    def multi_node(self) -> bool:
        return len(self.parts) > 1

    @property
    def fronts(self) -> tuple[Part, ...]:
        """The parts that run an API server: each is a worker of the router."""
        return tuple(p for p in self.parts if p.http_port is not None)

    @property
    def spans_nodes(self) -> bool:
        """One engine whose workers (tensor x pipeline parallel) span the nodes (--nnodes):
        the head serves, the other nodes' workers are --headless."""
        return self.multi_node and self.pool.model_parallel > len(self.head.gpus)

    @property
    def hybrid_lb(self) -> bool:
        """One front per node (--data-parallel-hybrid-lb) rather than one head and
        headless parts."""
        return self.multi_node and self.pool.fronts == "per_node" and not self.spans_nodes


@dataclass(frozen=True)
class Plan:
    recipe: Recipe
    cluster: Cluster
    nodes: tuple[str, ...]  # the nodes the job uses, in order; nodes[0] runs the orchestrator
    addresses: dict[str, str]
    endpoints: tuple[Endpoint, ...]
    router_port: int
    router_metrics_port: int
    exporter_ports: dict[str, int] = field(default_factory=dict)
    runtime: Runtime = LOCAL_RUNTIME
    job_id: str | None = None  # the Slurm job, once inside the allocation
    run_dir: str = "<RUN_DIR>"  # set once the run directory exists
    # What container steps mount for {run_dir}: a study's folder when its configurations
    # share one allocation (pyxis keeps the mounts a job's named container started with).
    mount_dir: str | None = None
    port_span: int = 0  # ports from router_port up that the plan uses
    model: ModelFacts | None = None  # config.json and model.facts, read when it was made
    # the KV store's clients (Mooncake picks each one's port in this range, both ends in),
    # and their transfer engines' listening ports (RPC and TCP data), a range of their own
    store_client_ports: tuple[int, int] | None = None
    store_rpc_ports: tuple[int, int] | None = None

    def at(self, run_dir: str, mount_dir: str | None = None) -> Plan:
        """This plan for the run directory `run_dir` (`mount_dir`: a study's folder)."""
        return replace(self, run_dir=run_dir, mount_dir=mount_dir)

    def address(self, node: str) -> str:
        return self.addresses.get(node, node)

    def url(self, node: str, port: int) -> str:
        return f"http://{self.address(node)}:{port}"

    def endpoint_url(self, ep: Endpoint) -> str:
        return self.url(ep.head.node, ep.http_port)

    def front_urls(self, ep: Endpoint) -> list[str]:
        """Every API server of `ep`, the head's first."""
        return [self.url(p.node, p.http_port) for p in ep.fronts]

    @property
    def router_node(self) -> str:
        """Where the router and the clients run: the first node of the role the recipe's
        router.placement names (the orchestrator stays on nodes[0])."""
        want = self.recipe.router.placement
        for ep in self.endpoints:
            if ep.role == want:
                return ep.head.node
        return self.nodes[0]

    @property
    def router_url(self) -> str:
        return self.url(self.router_node, self.router_port)

    @property
    def staged_aiperf(self) -> str | None:
        """The staged AIPerf environment an agentic run uses (it names no aiperf of its
        own and its profile's compute environment is shared), else None."""
        ag = self.recipe.benchmark.agentic
        return self.runtime.aiperf_env if ag is not None and ag.aiperf is None else None

    @property
    def aiperf(self) -> str:
        """The aiperf command of an agentic run: the recipe's, the staged one, or PATH's."""
        ag = self.recipe.benchmark.agentic
        if ag is not None and ag.aiperf:
            return ag.aiperf
        return f"{self.staged_aiperf}/venv/bin/aiperf" if self.staged_aiperf else "aiperf"

    def gpu_count(self) -> dict[str, int]:
        counts = {str(r): 0 for r in Role}
        for ep in self.endpoints:
            counts[ep.role] += ep.pool.gpus
        counts["total"] = sum(counts.values())
        return counts




def check_owned(recipe: Recipe) -> None:
    """Reject user args/env that the launcher derives, naming the field to use instead."""
    staged = any(pool.pipeline_parallel > 1 for _, pool in recipe.pools())
    for where, args in recipe.engine_arg_sources():
        for key in args:
            k = flag_key(key)
            base = k.removeprefix("no-")
            if base in PIPELINE_FLAGS:
                if args[key] is None or args[key] == 1 and not staged:
                    continue  # removed, or vLLM's default as published recipes write it
                pools = [f"{r}.pipeline_parallel" for r, p in recipe.pools()
                         if p.pipeline_parallel > 1]
                who = where.split(".")[0]
                own = "<pool>" if who == "vllm_args" else who
                raise UserError(f"{where}: remove {key!r}: "
                                + (f"{', '.join(pools)} renders --pipeline-parallel-size"
                                   if pools else f"set {own}.pipeline_parallel instead"))
            if base in OWNED_FLAGS:
                why = OWNED_FLAGS[base].replace("<pool>", where.split(".")[0])
                raise UserError(f"{where}: remove {key!r}: {why}")
    envs = [("env", recipe.env)] + [
        (f"{role}.env", getattr(recipe, role).env) for role in Role
    ]
    for where, env in envs:
        for key in env:
            if key in OWNED_ENV:
                raise UserError(f"{where}: remove {key}: {OWNED_ENV[key]}")


def engine_args(recipe: Recipe, pool: Pool, concurrency: int | None = None) -> dict:
    """vllm_args merged with the pool's args (the pool wins) at this sweep concurrency
    (None: what the engines start with, at the first point); None removes a flag."""
    at = recipe.first_point() if concurrency is None else concurrency
    merged = {flag_key(k): v for k, v in recipe.vllm_args.items()}
    merged.update({flag_key(k): v for k, v in pool.args_at(at).items()})
    return {k: v for k, v in merged.items() if v is not None}


def _check_fit(recipe: Recipe, cluster: Cluster, model: ModelFacts | None) -> None:
    gpn = cluster.gpus_per_node
    for role, pool in recipe.pools():
        use = pool.gpus_per_node or gpn
        if use > gpn:
            raise UserError(
                f"{role}.gpus_per_node is {use} but a {cluster.name} node has {gpn} GPUs"
            )
        if pool.pipeline_parallel > 1 and role.disaggregated:
            raise UserError(
                f"{role}.pipeline_parallel {pool.pipeline_parallel}: vLLM's NixlConnector does "
                "not move KV to or from pipeline stages (docs/pipeline-parallel.md); use "
                f"pipeline stages in an aggregated pool only, or tensor_parallel here"
            )
        if pool.pipeline_parallel > 1 and pool.data_parallel > 1:
            raise UserError(
                f"{role}: pipeline_parallel {pool.pipeline_parallel} with data_parallel "
                f"{pool.data_parallel} is not laid out by this launcher; use data_parallel 1 "
                "(more endpoints for more replicas)"
            )
        mp, what = pool.model_parallel, (
            f"tensor_parallel {pool.tensor_parallel}" if pool.pipeline_parallel == 1 else
            f"tensor_parallel x pipeline_parallel {pool.tensor_parallel} x "
            f"{pool.pipeline_parallel}")
        if mp > use and (mp % use or pool.data_parallel > 1):
            raise UserError(
                f"{role}.{what} is larger than the {use} GPUs per node it may use: an engine "
                f"over nodes takes whole nodes (a multiple of {use}) and data_parallel 1"
            )
        if pool.gpus > use and mp <= use:
            if use % mp:
                raise UserError(
                    f"{role}: {use} GPUs per node is not a multiple of {what}"
                )
            if pool.gpus % use:
                raise UserError(
                    f"{role}: data_parallel x tensor_parallel = {pool.gpus} GPUs does not fill "
                    f"whole nodes of {use} GPUs; make it a multiple of {use} or at most {use}"
                )
    if recipe.mode == "disagg":
        # as the engines start, and from each point where some restart (args_from_concurrency)
        for c in [None, *recipe.restart_points()]:
            problems = pairing.disagreements(
                *(_side(recipe, role, c) for role in (Role.PREFILL, Role.DECODE)),
                hybrid=is_hybrid(recipe, model))
            if problems:
                at = f"from sweep concurrency {c} on (args_from_concurrency): " if c else ""
                raise UserError(at + "; ".join(problems))


def _check_lengths(recipe: Recipe, model: ModelFacts | None) -> None:
    """The sweep's longest request against each serving pool's max-model-len (or the
    model's context): vLLM refuses a prompt plus max_tokens past it, so every such point
    would fail. A P/D prefill is asked for one token."""
    b = recipe.benchmark
    if not b.sweeps:
        return
    context = model.max_position_embeddings if model else 0
    if b.agentic is not None:
        _check_context(recipe, context)
        return
    n = b.lengths()
    for role, pool in recipe.pools():
        if pool.endpoints < 1:
            continue
        longest = n.input_high + 1 if role == Role.PREFILL else n.max_total
        for c in [None, *recipe.restart_points()]:
            raw = engine_args(recipe, pool, c).get("max-model-len")
            limit, where = None, ""
            if raw is not None:
                try:
                    limit = kv.EngineArgs.from_flags({"max-model-len": raw}).max_model_len
                except ValueError:  # not a length: vLLM's parser names the flag
                    limit = None
                if limit is not None:
                    where = f"{role}'s max-model-len {limit:,}"
            if limit is None and context:
                limit, where = context, f"the model's context ({context:,} tokens)"
            if limit is not None and longest > limit:
                what = (f"input up to {n.input_high:,}" if role == Role.PREFILL else
                        f"input up to {n.input_high:,} + output up to {n.output_high:,}")
                raise UserError(
                    f"benchmark: the longest request is {longest:,} tokens ({what}, "
                    f"{lengths.RULE_TEXT[b.length_rule]} at range_ratio {b.range_ratio:g}) "
                    f"but {where} is shorter: vLLM refuses such requests; raise "
                    f"{role}.args.max-model-len or lower benchmark.input_len/output_len")


def max_model_len(recipe: Recipe, context: int = 0) -> tuple[int, str] | None:
    """The shortest max-model-len of the serving pools (else the model's context), and
    where it comes from in words; None when neither is known."""
    best: tuple[int, str] | None = None
    for role, pool in recipe.pools():
        if pool.endpoints < 1:
            continue
        raw = engine_args(recipe, pool).get("max-model-len")
        try:
            limit = (kv.EngineArgs.from_flags({"max-model-len": raw}).max_model_len
                     if raw is not None else None)
        except ValueError:  # not a length: vLLM's parser names the flag
            limit = None
        if limit is not None and (best is None or limit < best[0]):
            best = (limit, f"{role}.args.max-model-len {limit:,}")
    if best is None and context:
        best = (context, f"the model's context ({context:,} tokens)")
    return best


def _check_context(recipe: Recipe, context: int) -> None:
    """An agentic run's max_context past what the engines take: every longer session would
    fail its later turns."""
    ag = recipe.benchmark.agentic
    limit = max_model_len(recipe, context)
    if ag.max_context and limit and ag.max_context > limit[0]:
        raise UserError(
            f"benchmark.agentic.max_context {ag.max_context:,} is longer than {limit[1]}: "
            "vLLM refuses a turn past it; lower max_context or raise max-model-len")


def _side(recipe: Recipe, role: Role, concurrency: int | None = None) -> pairing.Side:
    pool = getattr(recipe, role)
    return pairing.side_of_pool(role, recipe.model.path, recipe.model.served_name,
                                pool.tensor_parallel, engine_args(recipe, pool, concurrency),
                                {**recipe.env, **pool.env})


def is_hybrid(recipe: Recipe, model: ModelFacts | None) -> bool:
    """Mamba/GDN layers: declared in model.facts, or seen in the checkpoint's config.json
    when its folder is on this machine (preflight asks again where the engines run)."""
    facts = recipe.model.facts
    return bool(facts is not None and facts.gdn_layers > 0 or model and model.hybrid)


class _Read:
    """The default model facts: read from the model folder when the plan is made."""


READ = _Read()


def _model(recipe: Recipe, model: ModelFacts | None | _Read) -> ModelFacts | None:
    if isinstance(model, _Read):
        from launcher.planning import capacity

        return capacity.resolve_model(recipe)
    return model


def place(recipe: Recipe, cluster: Cluster) -> list[tuple[Role, Pool, list[tuple[int, list[int]]]]]:
    """Endpoints onto node slots: [(role, pool, [(node_index, gpu indices), ...]), ...].

    Multi-node endpoints take whole nodes; smaller ones are packed first-fit onto nodes of
    their own role, so prefill and decode never share a node (their telemetry stays apart).
    """
    gpn = cluster.gpus_per_node
    free: list[list[int]] = []  # free GPU indices per node slot
    role_of: list[Role] = []
    placed = []
    for role, pool in recipe.pools():
        use = pool.gpus_per_node or gpn
        for _ in range(pool.endpoints):
            if len(free) > MAX_NODES:  # stop early: counts up to 512 x 1024 x 64 are valid
                raise UserError(_too_many(f"more than {MAX_NODES}"))
            if pool.gpus > use:
                parts = []
                for _ in range(pool.gpus // use):
                    free.append(list(range(use, gpn)))
                    role_of.append(role)
                    parts.append((len(free) - 1, list(range(use))))
            else:
                slot = next(
                    (i for i, f in enumerate(free) if role_of[i] == role and len(f) >= pool.gpus),
                    None,
                )
                if slot is None:
                    free.append(list(range(gpn)))
                    role_of.append(role)
                    slot = len(free) - 1
                gpus, free[slot] = free[slot][: pool.gpus], free[slot][pool.gpus :]
                parts = [(slot, gpus)]
            placed.append((role, pool, parts))
    return placed


def check_container(recipe: Recipe, cluster: Cluster) -> None:
    """The recipe's image must be something the profile's container runtime can run."""
    from launcher.planning import containers

    containers.of(cluster).check_image(recipe, cluster)


def nodes_needed(recipe: Recipe, cluster: Cluster,
                 model: ModelFacts | None | _Read = READ) -> int:
    check_owned(recipe)
    check_container(recipe, cluster)
    model = _model(recipe, model)
    _check_fit(recipe, cluster, model)
    _check_lengths(recipe, model)
    slots = {slot for _, _, parts in place(recipe, cluster) for slot, _ in parts}
    n = len(slots)
    if cluster.segment and n > cluster.nodes_per_rack:
        raise UserError(
            f"the plan needs {n} nodes but one rack of {cluster.name} has "
            f"{cluster.nodes_per_rack} and the profile keeps a job in one rack (segment): "
            f"use fewer endpoints"
        )
    if n > MAX_NODES:
        raise UserError(_too_many(str(n)))
    return n


def _too_many(n: str) -> str:
    return (
        f"the plan needs {n} nodes and this launcher plans at most {MAX_NODES}: use fewer "
        "endpoints or a smaller data_parallel"
    )


def _endpoints(recipe: Recipe, cluster: Cluster, nodes: list[str],
               base: int) -> tuple[list[Endpoint], int]:
    """Every endpoint with its ports from ``base`` up, and the span of ports they take."""
    next_port = base + ENDPOINT_SLOT
    counters = dict.fromkeys(Role, 0)
    endpoints = []
    for role, pool, parts in place(recipe, cluster):
        name = f"{role}-{counters[role]}"
        counters[role] += 1
        spans = pool.model_parallel > len(parts[0][1])
        dp_local = max(1, len(parts[0][1]) // pool.model_parallel)
        vllm_ports = next_port + 2 + pool.data_parallel
        # per_node fronts: the other nodes' API servers take ports after the block
        front_ports = vllm_ports + VLLM_PORT_SPAN * len(parts)
        every_node = pool.fronts == "per_node" and not spans
        built = []
        for i, (slot, gpus) in enumerate(parts):
            # an engine over nodes: one DP rank, its engine core (and KV side channel) on the
            # head
            ranks = ((0,) if i == 0 else ()) if spans else tuple(
                range(i * dp_local, (i + 1) * dp_local))
            port = vllm_ports + i * VLLM_PORT_SPAN
            http = next_port if i == 0 else front_ports + i - 1 if every_node else None
            built.append(Part(nodes[slot], tuple(gpus), ranks, head=(i == 0), vllm_port=port,
                              http_port=http))
        endpoints.append(
            Endpoint(
                name=name,
                role=role,
                pool=pool,
                parts=tuple(built),
                http_port=next_port,
                dp_rpc_port=next_port + 1,
                nixl_port_base=next_port + 2,
            )
        )
        next_port += 2 + pool.data_parallel + VLLM_PORT_SPAN * len(parts)
        if every_node:
            next_port += len(parts) - 1
    if next_port > 65535:
        raise UserError(f"ports run past 65535: lower the cluster profile's port_base ({base})")
    return endpoints, next_port - base


JOB_PORT_SLOTS = 16
EPHEMERAL_FLOOR = 32768  # Linux's default ip_local_port_range starts here


def port_block(span: int) -> int:
    """A job's block of ports: 1,000 (its span rounded up to thousands if more), the same for
    jobs of every shape so their blocks never overlap."""
    return max(1, -(-span // 1000)) * 1000


def job_port_slots(cluster: Cluster, span: int) -> tuple[int, int]:
    """(slots, block): how many blocks of ports runs of this profile take turns on from its
    port_base (its port_blocks, or as many as fit below the ephemeral range, at most 16),
    and the block's size."""
    base, block = cluster.port_base, port_block(span)
    ceiling = EPHEMERAL_FLOOR if base + span <= EPHEMERAL_FLOOR else 65536
    fit = min(JOB_PORT_SLOTS, max(1, (ceiling - base) // block))
    return min(fit, cluster.port_blocks or fit), block


def job_port_shift(job_id: str | None, cluster: Cluster, span: int) -> int:
    """How far a Slurm job's ports sit above port_base: (job id mod slots) x block, so jobs
    that share a host (a dev cluster, a partition that is not exclusive) do not plan the same
    ports. 0 outside a job."""
    head = (job_id or "").split("_")[0]
    if not head.isdigit():
        return 0
    slots, block = job_port_slots(cluster, span)
    return int(head) % slots * block


def make_plan(
    recipe: Recipe,
    cluster: Cluster,
    nodes: list[str],
    addresses: dict[str, str] | None = None,
    runtime: Runtime | None = None,
    job_id: str | None = None,
    model: ModelFacts | None | _Read = READ,
    study_span: int | None = None,
    port_slot: int | None = None,
) -> Plan:
    """`study_span`: the port span of a study's largest configuration, so every
    configuration of a study in one allocation plans its endpoints on the same ports.
    `port_slot`: the block of ports a run outside a scheduler's job holds (instead of the
    one a job id picks)."""
    model = _model(recipe, model)
    need = nodes_needed(recipe, cluster, model)
    if len(nodes) < need:
        raise UserError(
            f"the plan needs {need} nodes of {cluster.gpus_per_node} GPUs but only "
            f"{len(nodes)} are available ({', '.join(nodes) or 'none'})"
        )
    nodes = list(nodes[:need])
    if len(set(nodes)) != len(nodes):
        raise UserError(f"the node list names a node twice: {', '.join(nodes)}")
    if runtime is None:
        runtime = LOCAL_RUNTIME
    if addresses is None:
        from launcher.planning import schedulers

        addresses = schedulers.of(cluster).addresses(nodes)
    base = cluster.port_base
    endpoints, span = _endpoints(recipe, cluster, nodes, base)
    from launcher.planning import kv_tiers

    store_ports = kv_tiers.client_ports_needed(recipe, endpoints)
    endpoint_span, span = span, span + 2 * store_ports  # the clients', then their engines'
    if port_slot is None:
        shift = job_port_shift(job_id, cluster, max(span, study_span or 0))
    else:
        shift = port_slot * port_block(max(span, study_span or 0))
    if shift:
        base += shift
        endpoints, _ = _endpoints(recipe, cluster, nodes, base)
    return Plan(
        recipe=recipe,
        cluster=cluster,
        nodes=tuple(nodes),
        addresses=dict(addresses),
        endpoints=tuple(endpoints),
        router_port=base,
        router_metrics_port=base + 1,
        exporter_ports={n: base + EXPORTER_SLOT + i for i, n in enumerate(nodes)},
        runtime=runtime,
        job_id=job_id,
        port_span=span,
        model=model,
        store_client_ports=kv_tiers.client_ports(base + endpoint_span, store_ports),
        store_rpc_ports=kv_tiers.client_ports(base + endpoint_span + store_ports, store_ports),
    )
