"""Render (pure): a Plan -> every process's node, argv and env, commands.sh (and, through its
scheduler, the batch script).

`engine: sim` renders the same argv as `engine: vllm` with the simulator as the executable,
so everything downstream sees the same flags. Programs of this package run as `python -m ...`;
the process backend puts the launcher's own interpreter first on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

from launcher.planning import containers, kv_tiers, schedulers
from launcher.planning.plan import Endpoint, Plan, engine_args
from launcher.run import lengths, rundir
from launcher.run import slo as run_slo
from launcher.run.plandoc import EndpointDoc, NodeDoc, PlanDoc, Process
from launcher.run.vocab import Kind, Role
from launcher.schema.sections import AGENTIC_CORPORA, flag_key

# The launcher's own modules behind each program (the simulator stands in for `vllm`).
BENCH_MODULE = "launcher.clients.bench"
AGENTIC_MODULE = "launcher.clients.agentic"
ACCURACY_MODULE = "launcher.clients.accuracy"
AGENT_MODULE = "launcher.telemetry.agent"
KV_CONNECTOR_FLAG = {"nixl": "nixl", "mooncake": "mooncake", "moriio": "moriio"}
# The stats-log parser needs plain text (a forced colour would break it), and CUDA must
# number GPUs as NVML does, so CUDA_VISIBLE_DEVICES and the telemetry mean the same GPU.
ENGINE_BASE_ENV = {"VLLM_LOGGING_COLOR": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def option(flag: str, value) -> list[str]:
    """["--flag", "value"], or ["--flag=value"] for a value starting with '-': argparse
    (vLLM, vllm-router, the launcher's clients) would read that one as an option of its own
    (--help would print the help and exit); after '=' it is always the flag's value."""
    text = str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def flags(args: dict) -> list[str]:
    """{"async-scheduling": True, "max-num-seqs": 256, "numa-bind-nodes": [0, 1]} ->
    ["--async-scheduling", "--max-num-seqs", "256", "--numa-bind-nodes", "0", "1"]."""
    out: list[str] = []
    for key, value in args.items():
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out.append(f"--no-{key}")
        elif isinstance(value, list):  # nargs="+": the flag, then each value
            out += [f"--{key}", *map(str, value)]
        else:
            out += option(f"--{key}", value)
    return out


def kv_transfer_config(plan: Plan, role: Role) -> str:
    """The role's --kv-transfer-config (launcher.planning.kv_tiers.role_config)."""
    return json.dumps(kv_tiers.role_config(plan.recipe, role), separators=(",", ":"),
                      sort_keys=True)


def _kv_connector_flag(plan: Plan) -> str:
    name = str(plan.recipe.kv_connector.get("kv_connector", "")).lower()
    for key, flag in KV_CONNECTOR_FLAG.items():
        if key in name:
            return flag
    return "nixl"


def _base_env(name: str, run_dir: str) -> dict[str, str]:
    return {"PD_PROCESS": name, "PD_RUN_DIR": run_dir}


def sim_env(plan: Plan, ep: Endpoint) -> dict[str, str]:
    knobs = plan.recipe.sim.model_dump(exclude_none=True)
    env = {f"SIM_{k.upper()}": _env_str(v) for k, v in knobs.items()}
    args = engine_args(plan.recipe, ep.pool)
    if "num-gpu-blocks-override" not in args and "kv_capacity_tokens" not in knobs:
        # The simulator's KV capacity is the estimate's, so a simulated run of a real
        # topology meets its KV limit where the dry-run said it would.
        from launcher.planning import capacity

        cap = capacity.estimate(plan, ep, plan.model) if plan.model else None
        if cap is not None:
            from launcher.planning.kv import simulator_kv_blocks

            block, blocks, state = simulator_kv_blocks(cap)
            env["SIM_KV_CAPACITY_TOKENS"] = str(block * blocks)
            if state and "state_blocks_per_request" not in knobs:
                env["SIM_STATE_BLOCKS_PER_REQUEST"] = str(state)
            if "block-size" not in args:
                env["SIM_DEFAULT_BLOCK_SIZE"] = str(block)
    python = kv_tiers.store_client_python(plan.recipe)
    if python and "store_python" not in knobs and ep.role in kv_tiers.store_roles(plan.recipe):
        env["SIM_STORE_PYTHON"] = python  # the store client runs with Mooncake's Python
    acc = plan.recipe.accuracy
    if acc.enabled and acc.data:
        # The simulator has no model: it answers GSM8K from the task's own answer key.
        env.setdefault("SIM_ANSWER_KEY", acc.data)
    return env


def _env_str(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def launcher_cmd(plan: Plan, module: str, in_container: bool) -> list[str]:
    """`python -m MODULE` with the interpreter of the place it runs: the container's python3
    (the launcher mounted read-only), else the compute environment's."""
    return ["python3" if in_container else plan.runtime.python, "-m", module]


def host_env(plan: Plan) -> dict[str, str]:
    """A shared compute environment's launcher source, for lines run by hand too."""
    return {"PYTHONPATH": plan.runtime.src} if plan.runtime.mode == "shared" else {}


def serve_argv(plan: Plan, ep: Endpoint, part, concurrency: int | None = None) -> list[str]:
    """`vllm serve ...` of one part of an endpoint at a sweep concurrency (None: as it
    starts); the simulator takes the same argv."""
    r = plan.recipe
    pool = ep.pool
    module = r.engine_kind.serve_module
    exe = ["vllm"] if module is None else launcher_cmd(plan, module, r.container is not None)
    argv = [*exe, "serve", r.model.path, "--served-model-name", r.model.name,
            *revision_flags(r, engine_args(r, pool, concurrency))]
    if part.http_port is not None:
        argv += ["--host", plan.cluster.bind_host, "--port", str(part.http_port)]
    argv += ["--tensor-parallel-size", str(pool.tensor_parallel)]
    if pool.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(pool.pipeline_parallel)]
    if pool.data_parallel > 1:
        argv += ["--data-parallel-size", str(pool.data_parallel)]
        argv += ["--data-parallel-size-local", str(len(part.dp_ranks))]
    if ep.spans_nodes:  # vLLM's multi-node launch: node 0 serves, the others join it
        argv += ["--nnodes", str(len(ep.parts)), "--node-rank", str(ep.parts.index(part)),
                 "--master-addr", plan.address(ep.head.node), "--master-port", str(ep.dp_rpc_port)]
    elif ep.multi_node:
        argv += ["--data-parallel-address", plan.address(ep.head.node)]
        argv += ["--data-parallel-rpc-port", str(ep.dp_rpc_port)]
    if pool.expert_parallel:
        argv.append("--enable-expert-parallel")
    if ep.hybrid_lb:
        argv += ["--data-parallel-start-rank", str(part.dp_ranks[0]), "--data-parallel-hybrid-lb"]
    if part.http_port is not None:
        argv += ["--api-server-count", str(pool.api_servers)]
    elif ep.spans_nodes:
        argv.append("--headless")
    else:
        argv += ["--headless", "--data-parallel-start-rank", str(part.dp_ranks[0])]
    if ep.role.disaggregated or pool.kv_connector is not None:
        argv += ["--kv-transfer-config", kv_transfer_config(plan, ep.role)]
    return argv + flags(engine_args(r, pool, concurrency))


def revision_flags(r, args: dict) -> list[str]:
    """A pinned hub revision for the weights and, unless the recipe names another tokenizer,
    the tokenizer: offline (HF_HUB_OFFLINE=1) vLLM resolves nothing but what it is given, and
    without them asks for `main`, which a cache staged at a commit does not have."""
    m = r.model
    if not (m.revision and m.hub_id):
        return []
    out = [] if "revision" in args else ["--revision", m.revision]
    if "tokenizer" not in args and "tokenizer-revision" not in args:
        out += ["--tokenizer-revision", m.revision]
    return out


def restarts(plan: Plan, ep: Endpoint, part, argv: list[str]) -> list[dict]:
    """The argv of each args_from_concurrency step that changes this part's command line."""
    out = []
    for c in plan.recipe.restart_points():
        later = serve_argv(plan, ep, part, c)
        if later != argv:
            out.append({"from_concurrency": c, "argv": later})
            argv = later
    return out


def engine_processes(plan: Plan, ep: Endpoint) -> list[Process]:
    r = plan.recipe
    pool = ep.pool
    procs = []
    for part in ep.parts:
        name = f"{ep.name}@{part.node}"
        argv = serve_argv(plan, ep, part)

        env = dict(ENGINE_BASE_ENV)
        if not ep.multi_node:
            # its own range of internal ports beside the node's other engines; an endpoint
            # over several nodes has the nodes to itself, and its parts' ranges must not be
            # pinned (srt-slurm unsets it there too)
            env["VLLM_PORT"] = str(part.vllm_port)
        env.update(plan.cluster.env)
        env.update(network_env(plan, part.node))
        env.update(model_env(plan))
        env.update(r.env)
        env.update(pool.env)
        env.update(kv_tiers.engine_env(plan, ep.role, part.node))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in part.gpus)
        for k, v in engine_wait_env(plan, ep).items():
            env.setdefault(k, v)  # a recipe's own value wins
        if ep.role.disaggregated:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = plan.address(part.node)
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ep.nixl_port_base)
        if ep.role == Role.DECODE:
            env.setdefault("UCX_PROTO_INFO", "y")  # UCX names the transport it picked
        if r.engine_kind.takes_sim_knobs:
            env.update(sim_env(plan, ep))
        env.update(containers.of(plan.cluster).env(plan))
        env.update(_base_env(name, plan.run_dir))
        url = plan.url(part.node, part.http_port) if part.http_port is not None else None
        procs.append(
            Process(
                name=name,
                kind=Kind.ENGINE,
                node=part.node,
                argv=argv,
                env=env,
                log=f"logs/{name}.log",
                endpoint=ep.name,
                role=ep.role,
                gpus=list(part.gpus),
                dp_ranks=list(part.dp_ranks),
                headless=part.http_port is None,
                url=url,
                metrics_url=f"{url}/metrics" if url else None,
                env_from_host=list(r.env_from_host),
                container=r.container is not None,
                restarts=restarts(plan, ep, part, argv),
            )
        )
    return procs


def engine_wait_env(plan: Plan, ep: Endpoint) -> dict[str, str]:
    """With more than one API server, vLLM's API servers wait for the engines only
    VLLM_ENGINE_READY_TIMEOUT_S (600 s by default, less than a large model's load): they
    wait as long as the health check does (docs/gb200-launch.md). One API server starts its
    engines itself and waits without a deadline."""
    if ep.pool.api_servers > 1:
        return {"VLLM_ENGINE_READY_TIMEOUT_S": f"{plan.recipe.health.timeout_s:g}"}
    return {}


def network_env(plan: Plan, node: str) -> dict[str, str]:
    """Pin NCCL, Gloo, UCX and vLLM to the profile's inter-node NIC (their own choice can be
    a management or loopback interface). UCX_NET_DEVICES set in the profile's env is kept:
    an interface name leaves UCX only TCP (launcher.planning.ucx), RDMA devices do not."""
    iface = plan.cluster.network.interface
    if not iface:
        return {}
    env = {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}
    if "UCX_NET_DEVICES" not in plan.cluster.env:
        env["UCX_NET_DEVICES"] = iface
    return {**env, "VLLM_HOST_IP": plan.address(node)}


def model_env(plan: Plan) -> dict[str, str]:
    """Engines read weights from the shared cache (offline when nodes have no internet)."""
    m = plan.cluster.models
    if not m.hf_home:
        return {}
    env = {"HF_HOME": m.hf_home}
    if not m.internet:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def router_process(plan: Plan) -> Process:
    r = plan.recipe
    bind = plan.cluster.bind_host
    router = "vllm-router" if plan.runtime.python == "python" else f"{plan.runtime.bindir}/vllm-router"
    argv = [router, "--host", bind, "--port", str(plan.router_port)]
    if r.mode == "disagg":
        argv.append("--vllm-pd-disaggregation")
        for role in (Role.PREFILL, Role.DECODE):
            for ep in plan.endpoints:
                if ep.role == role:
                    for url in plan.front_urls(ep):
                        argv += [f"--{role}", url]
        argv += ["--kv-connector", _kv_connector_flag(plan)]
    else:
        argv += ["--worker-urls", *[u for ep in plan.endpoints for u in plan.front_urls(ep)]]
    argv += ["--prometheus-host", bind, "--prometheus-port", str(plan.router_metrics_port)]
    for key, value in session_policies(r).items():
        argv += option(f"--{key.replace('_', '-')}", value)
    argv += flags({flag_key(k): v for k, v in r.router.args.items() if v is not None})
    node = plan.router_node
    return Process(
        name="router",
        kind=Kind.ROUTER,
        node=node,
        argv=argv,
        env={**host_env(plan), **_base_env("router", plan.run_dir)},
        log="logs/router.log",
        url=plan.router_url,
        metrics_url=plan.url(node, plan.router_metrics_port) + "/metrics",
    )


def store_process(plan: Plan) -> Process | None:
    """The KV store's mooncake_master on the head node (None: the recipe has no kv_store),
    in the engines' container where they have one (the image ships Mooncake)."""
    r = plan.recipe
    if r.kv_store is None:
        return None
    node, ports = kv_tiers.master_node(plan), kv_tiers.master_ports(plan)
    url = plan.url(node, ports.admin)
    boxed = r.container is not None
    env = containers.of(plan.cluster).env(plan) if boxed else {}
    return Process(
        name=kv_tiers.MASTER,
        kind=Kind.STORE,
        node=node,
        argv=kv_tiers.master_argv(plan),
        env={**env, **_base_env(kv_tiers.MASTER, plan.run_dir)},
        log=f"logs/{kv_tiers.MASTER}.log",
        url=url,
        metrics_url=f"{url}/metrics",
        container=boxed,
    )


def agent_processes(plan: Plan) -> list[Process]:
    procs = []
    for node in plan.nodes:
        name = f"agent@{node}"
        argv = [
            *launcher_cmd(plan, AGENT_MODULE, False),
            "--run-dir", plan.run_dir,
            "--node", node,
            "--interval", f"{plan.recipe.telemetry.interval_s:g}",
            "--exporter-addr", plan.cluster.bind_host,
            "--exporter-port", str(plan.exporter_ports[node]),
        ]  # fmt: skip
        procs.append(
            Process(
                name=name,
                kind=Kind.AGENT,
                node=node,
                argv=argv,
                env={**host_env(plan), **_base_env(name, plan.run_dir)},
                log=f"logs/{name}.log",
                url=plan.url(node, plan.exporter_ports[node]),
                metrics_url=plan.url(node, plan.exporter_ports[node]) + "/metrics",
            )
        )
    return procs


def workload_flags(plan: Plan) -> list[str]:
    """The lengths (and prompts) flags of one sweep point, the same for every point: the
    built-in client takes the rule itself; `vllm bench serve` (vLLM's rule only) gets the
    window of its rule that lies inside the recipe's (docs/workload.md)."""
    b = plan.recipe.benchmark
    if b.driver == "vllm":
        if b.length_rule == "vllm":
            ratio: object = b.range_ratio
            n_in, n_out = b.input_len, b.output_len
        else:
            n_in, n_out, ratio = lengths.vllm_window(b.lengths())
        text = (json.dumps(ratio, separators=(",", ":")) if isinstance(ratio, dict)
                else f"{ratio:g}")
        # per-request lengths in the file (the orchestrator trims the rest after the point)
        return ["--random-input-len", str(n_in), "--random-output-len", str(n_out),
                "--random-range-ratio", text, "--save-detailed"]
    flags = ["--random-input-len", str(b.input_len), "--random-output-len", str(b.output_len),
             "--random-range-ratio", f"{b.range_ratio:g}", "--length-rule", b.length_rule]
    if b.chat_template and chat_template_applies(plan):
        flags.append("--use-chat-template")
    if b.length_rule == "sa-bench":
        flags.append("--sa-bench-warmup")
    return flags


def chat_template_applies(plan: Plan) -> bool:
    """The chat template needs the served model's tokenizer: a simulated engine has none,
    so its prompts are ids of the same lengths (the template's tokens counted inside)."""
    return plan.recipe.engine_kind.tokenizes


def tokenizer_flags(plan: Plan) -> list[str]:
    """The client loads the tokenizer as the engines do: their --tokenizer-mode (vLLM's own
    renderer for DeepSeek-V4, what sa-bench's custom_tokenizer loads) and trust-remote-code
    (a tokenizer with its own code, Kimi-K2.5's), at the pinned revision (docs/workload.md)."""
    r = plan.recipe
    args = {k: v for _, pool in r.pools() for k, v in engine_args(r, pool).items()}
    path = str(args.get("tokenizer") or r.model.path)
    rev = args.get("tokenizer-revision") or (r.model.revision if "tokenizer" not in args else None)
    if rev and r.model.hub_id and r.benchmark.driver != "builtin" \
            and plan.cluster.models.hf_home and re.fullmatch(r"[0-9a-f]{40}", str(rev)):
        # vllm bench serve takes no revision: the commit's snapshot folder is one
        path = (f"{plan.cluster.models.hf_home}/hub/models--{path.replace('/', '--')}"
                f"/snapshots/{rev}")
    out = option("--tokenizer", path)
    if rev and r.model.hub_id and r.benchmark.driver == "builtin":
        out += option("--tokenizer-revision", rev)
    mode = args.get("tokenizer-mode")
    if mode and mode != "auto":
        out += option("--tokenizer-mode", mode)
    if args.get("trust-remote-code") is True:
        out.append("--trust-remote-code")
    return out


def agentic_process(plan: Plan, c: int) -> Process:
    """benchmark.agentic: one point (`c` live sessions), AIPerf through the router from the
    router's node, in AIPerf's own environment on the host (docs/agentic.md); its files in
    bench/aiperf-cNNNNN/, the point's result beside them."""
    r = plan.recipe
    ag = r.benchmark.agentic
    run = rundir.RunDir(Path(plan.run_dir))
    metrics = [f"{ep.role}=http://{plan.address(p.node)}:{p.http_port}/metrics"
               for ep in plan.endpoints for p in ep.fronts]
    trace = (["--public-dataset", AGENTIC_CORPORA[ag.corpus][0]] if ag.corpus else
             ["--input-file", ag.trace, "--trace-format", ag.trace_format,
              "--block-size", str(ag.block_size)])
    # a staged corpus is read from the shared cache by the datasets library, offline too
    offline = ({"HF_DATASETS_OFFLINE": "1"} if plan.cluster.models.hf_home
               and not plan.cluster.models.internet else {})
    name = f"bench-c{c}"
    result = run.bench_result(c)
    argv = [*launcher_cmd(plan, AGENTIC_MODULE, False), "--aiperf", plan.aiperf,
            "--url", plan.router_url, "--model", r.model.name,
            *option("--tokenizer", ag.tokenizer or r.model.path), *trace,
            "--sessions", str(c)]
    if ag.duration_s:
        argv += ["--duration", f"{ag.duration_s:g}"]
    elif ag.sessions_per_point:
        argv += ["--conversations", str(ag.sessions_per_point)]
    argv += ["--warmup", str(ag.warmup_requests), "--seed", str(ag.seed),
             "--failed-threshold", f"{ag.failed_request_threshold:g}",
             "--session-header", ag.session_header,
             "--drain-poll-s", f"{ag.drain_poll_s:g}"]
    if ag.think_time_cap_s is not None:
        argv += ["--think-cap", f"{ag.think_time_cap_s:g}"]
    if ag.max_context:
        argv += ["--max-context", str(ag.max_context)]
    if ag.scenario:
        argv += ["--scenario", ag.scenario]
    if ag.grace_period_s is not None:
        argv += ["--grace-period", f"{ag.grace_period_s:g}"]
    if ag.cache_warmup_s is not None:
        argv += ["--cache-warmup", f"{ag.cache_warmup_s:g}"]
    for item in ag.extra_inputs:
        argv += ["--extra-input", item]
    for m in metrics:
        argv += ["--metrics", m]
    argv += ["--artifact-dir", str(result.with_name(f"aiperf-{result.stem}")),
             "--output", str(result)]
    return Process(
        name=name, kind=Kind.BENCH, node=plan.router_node, argv=argv,
        env={**model_env(plan), **offline, **host_env(plan), **ag.env,
             **_base_env(name, plan.run_dir)},
        log=f"logs/{name}.log", env_from_host=list(r.env_from_host), container=False,
        result=str(result.relative_to(run.path)))


def session_policies(recipe) -> dict[str, str]:
    """The router's policies: the recipe's, or for an agentic run that names none,
    consistent_hash for prefill and decode, so every turn of a session (keyed by its
    session header) reaches the prefill and decode that hold its prefix."""
    r = recipe.router
    given = {k: getattr(r, k) for k in ("policy", "prefill_policy", "decode_policy")
             if getattr(r, k)}
    if given or recipe.benchmark.agentic is None:
        return given
    if recipe.mode == "disagg":
        return {"prefill_policy": "consistent_hash", "decode_policy": "consistent_hash"}
    return {"policy": "consistent_hash"}


def bench_processes(plan: Plan) -> list[Process]:
    """One client run per planned concurrency point, against the router, from the first
    node."""
    return [bench_process(plan, c) for c in plan.recipe.benchmark.points]


def bench_process(plan: Plan, c: int) -> Process:
    """The client run of one sweep point at concurrency `c` (a planned point, or one the SLO
    search picks as it runs)."""
    r = plan.recipe
    b = r.benchmark
    if b.agentic is not None:
        return agentic_process(plan, c)
    run = rundir.RunDir(Path(plan.run_dir))
    boxed = r.container is not None
    exe = ["vllm", "bench", "serve"] if b.driver == "vllm" else launcher_cmd(plan, BENCH_MODULE, boxed)
    env = containers.of(plan.cluster).env(plan) if boxed else host_env(plan)
    name = f"bench-c{c}"
    result = run.bench_result(c)
    argv = [
        *exe,
        "--backend", "openai",
        "--base-url", plan.router_url,
        "--endpoint", "/v1/completions",
        "--model", r.model.name,
        *tokenizer_flags(plan),
        "--dataset-name", "random",
        *workload_flags(plan),
        "--num-prompts", str(b.prompts(c)),
        "--max-concurrency", str(c),
        "--num-warmups", str(b.warmups(c)),
        "--ignore-eos",
        "--temperature", "0",
        "--percentile-metrics", ",".join(run_slo.METRICS),
        "--metric-percentiles", ",".join(map(str, run_slo.PERCENTILES)),
        "--seed", "0",
        "--save-result",
        "--result-dir", str(result.parent),
        "--result-filename", result.name,
    ]  # fmt: skip
    return Process(
        name=name,
        kind=Kind.BENCH,
        node=plan.router_node,
        argv=argv,
        env={**model_env(plan), **env, **_base_env(name, plan.run_dir)},
        log=f"logs/{name}.log",
        env_from_host=list(r.env_from_host),
        container=boxed,
        result=str(result.relative_to(run.path)),
    )


CUSTOM_BENCH = "bench"  # the one process of a custom benchmark (benchmark.custom)
FRONTEND_TYPE = "vllm-router"  # srt-slurm's name for the front end, SRTCTL_FRONTEND_TYPE
ROLE_PREFIX = {Role.PREFILL: "PREFILL", Role.DECODE: "DECODE", Role.AGG: "AGG"}


def custom_contract_env(plan: Plan) -> dict[str, str]:
    """srt-slurm 2.x's environment for a custom benchmark command (docs/custom-benchmark.md):
    the front end, every router-facing API server by role (topology order, addresses
    repeated where servers share a node, so the lists stay aligned), their /metrics, the
    engine nodes and the GPUs per node. The router is the front end; no service runs."""
    env = {
        "SRTCTL_FRONTEND_TYPE": FRONTEND_TYPE,
        "SRT_FRONTEND_HOST": plan.address(plan.router_node),
        "SRT_FRONTEND_PORT": str(plan.router_port),
    }
    metrics = []
    for role in (Role.PREFILL, Role.DECODE, Role.AGG):
        fronts = [(plan.address(p.node), p.http_port)
                  for ep in plan.endpoints if ep.role == role for p in ep.fronts]
        if not fronts:
            continue  # srt-slurm sets only the roles the recipe has
        env[f"SRT_{ROLE_PREFIX[role]}_IPS"] = ",".join(host for host, _ in fronts)
        env[f"SRT_{ROLE_PREFIX[role]}_ENDPOINTS"] = ",".join(f"{h}:{port}" for h, port in fronts)
        metrics += [f"http://{h}:{port}/metrics" for h, port in fronts]
    env["AIPERF_SERVER_METRICS_URLS"] = ",".join(metrics)
    env["SRT_GPUS_PER_NODE"] = str(plan.cluster.gpus_per_node)
    workers = dict.fromkeys(p.node for ep in plan.endpoints for p in ep.parts)
    env["SRT_WORKER_NODES"] = ",".join(workers)
    return env


def custom_bench_process(plan: Plan) -> Process:
    """benchmark.custom: its command under `bash -lc`, where the benchmark client runs (the
    router's node, in the container), with the contract's environment, then the recipe's
    env, then its own env (srt-slurm applies benchmark.env last)."""
    r = plan.recipe
    boxed = r.container is not None
    env = {**model_env(plan),
           **(containers.of(plan.cluster).env(plan) if boxed else host_env(plan)),
           **custom_contract_env(plan), **r.env, **r.benchmark.custom.env,
           **_base_env(CUSTOM_BENCH, plan.run_dir)}
    return Process(
        name=CUSTOM_BENCH,
        kind=Kind.BENCH,
        node=plan.router_node,
        argv=["bash", "-lc", r.benchmark.custom.command],
        env=env,
        log=f"logs/{CUSTOM_BENCH}.log",
        env_from_host=list(r.env_from_host),
        container=boxed,
        result=str(rundir.RunDir(Path(plan.run_dir)).custom_result.relative_to(plan.run_dir)),
    )


def accuracy_process(plan: Plan) -> Process | None:
    """The GSM8K gate through the router, scored by the recipe's harness: lm-eval's gsm8k
    task (the default: its command line is the one it always was) or vLLM's own GSM8K
    harness (docs/gsm8k.md)."""
    a = plan.recipe.accuracy
    if not a.enabled:
        return None
    boxed = plan.recipe.container is not None
    result = rundir.RunDir(Path(plan.run_dir)).accuracy_result(a.task)
    argv = [
        *launcher_cmd(plan, ACCURACY_MODULE, boxed),
        "--base-url", plan.router_url,
        "--model", plan.recipe.model.name,
        *option("--test", a.data or ""),
    ]  # fmt: skip
    if a.train:
        argv += option("--train", a.train)
    if a.num_questions:
        argv += ["--num-questions", str(a.num_questions)]
    if a.harness == "vllm":  # one figure and no chat: --metric and --chat are lm-eval's
        argv += ["--harness", a.harness]
        if a.repeat > 1:
            argv += ["--repeat", str(a.repeat)]
    argv += ["--num-shots", str(a.num_shots)]
    if a.harness == "lm-eval":
        argv += ["--metric", a.metric]
    argv += [
        "--max-tokens", str(a.max_tokens),
        "--concurrency", str(a.concurrency),
        "--retries", str(a.retries),
        "--threshold", f"{a.threshold:g}",
    ]  # fmt: skip
    if a.chat and a.harness == "lm-eval":
        argv += ["--chat", "multiturn"]
    argv += ["--output", str(result)]
    env = containers.of(plan.cluster).env(plan) if boxed else host_env(plan)
    return Process(
        name="accuracy",
        kind=Kind.ACCURACY,
        node=plan.router_node,
        argv=argv,
        env={**env, **_base_env("accuracy", plan.run_dir)},
        log="logs/accuracy.log",
        container=boxed,
        result=str(result.relative_to(plan.run_dir)),
    )


def processes(plan: Plan) -> list[Process]:
    """Every process of the run, in start order: agents, the KV store's master, engines,
    router, bench, accuracy."""
    out: list[Process] = []
    if plan.recipe.telemetry.enabled:
        out += agent_processes(plan)
    if (store := store_process(plan)) is not None:
        out.append(store)
    for ep in plan.endpoints:
        out += engine_processes(plan, ep)
    out.append(router_process(plan))
    b = plan.recipe.benchmark
    if b.sweeps:
        out += bench_processes(plan)
    elif b.enabled:
        out.append(custom_bench_process(plan))
    acc = accuracy_process(plan)
    if acc:
        out.append(acc)
    return out


def workload_doc(plan: Plan) -> dict:
    """plan.json's `workload`: what every sweep point sends (docs/workload.md)."""
    b = plan.recipe.benchmark
    if not b.enabled:
        return {}
    if b.custom is not None:
        return {"driver": "custom", "command": b.custom.command}
    if b.agentic is not None:
        ag = b.agentic
        return {"driver": "aiperf", "trace": ag.trace, "corpus": ag.corpus,
                "trace_format": None if ag.corpus else ag.trace_format,
                "sessions": list(b.concurrency), "duration_s": ag.duration_s,
                "routing": session_policies(plan.recipe),
                "session_header": ag.session_header}
    n = b.lengths()
    return {"driver": b.driver, "length_rule": b.length_rule, "range_ratio": b.range_ratio,
            "input_len": b.input_len, "output_len": b.output_len,
            "bounds": {"input": [n.input_low, n.input_high],
                       "output": [n.output_low, n.output_high]},
            "mean_total": n.mean_total, "max_total": n.max_total,
            "chat_template": b.chat_template,
            "chat_template_applied": b.chat_template and chat_template_applies(plan),
            "ignore_eos": True, "text": lengths.workload_text(
                b, b.chat_template and chat_template_applies(plan))}


def plan_doc(plan: Plan, run_id: str, placeholder_nodes: bool,
             procs: list[Process] | None = None, capacity: list[dict] | None = None) -> PlanDoc:
    r = plan.recipe
    return PlanDoc(
        workload=workload_doc(plan),
        run_id=run_id,
        recipe=r.name,
        cluster=plan.cluster.name,
        engine=r.engine,
        engine_platform=r.engine_kind.platform,
        mode=r.mode,
        model_path=r.model.path,
        served_name=r.model.name,
        telemetry_interval_s=r.telemetry.interval_s,
        nodes=[NodeDoc(n, plan.address(n), plan.cluster.gpus_per_node) for n in plan.nodes],
        endpoints=[
            EndpointDoc(
                name=ep.name,
                role=ep.role,
                dp_size=ep.pool.data_parallel,
                tp_size=ep.pool.tensor_parallel,
                expert_parallel=ep.pool.expert_parallel,
                gpus=ep.pool.gpus,
                nodes=[p.node for p in ep.parts],
                url=plan.endpoint_url(ep),
                http_port=ep.http_port,
                dp_rpc_port=ep.dp_rpc_port,
                nixl_port_base=ep.nixl_port_base,
                fronts=plan.front_urls(ep),
            )
            for ep in plan.endpoints
        ],
        processes=processes(plan) if procs is None else procs,
        router_url=plan.router_url,
        router_metrics_url=plan.url(plan.router_node, plan.router_metrics_port) + "/metrics",
        gpu_count=plan.gpu_count(),
        placeholder_nodes=placeholder_nodes,
        runtime=dataclasses.asdict(plan.runtime),
        capacity=list(capacity or []),
    )


@dataclasses.dataclass(frozen=True)
class Rendered:
    """A plan rendered once: the dry-run text, the run's files, the submitter and the
    orchestrator all read this."""

    plan: Plan
    doc: PlanDoc          # plan.json, every process in start order
    commands: str         # commands.sh
    sbatch: str | None    # job.sbatch (schedulers that allocate), else None

    @property
    def processes(self) -> list[Process]:
        return self.doc.processes


def render(plan: Plan, run_id: str, *, placeholder_nodes: bool,
           capacity: list[dict] | None = None, with_sbatch: bool = True) -> Rendered:
    """Every process once, then what is made of them."""
    procs = processes(plan)
    folder = str(rundir.RunDir(Path(plan.run_dir)).slurm)
    sbatch = (schedulers.of(plan.cluster).batch_script(plan, len(plan.nodes), folder)
              if with_sbatch else None)
    return Rendered(plan=plan, doc=plan_doc(plan, run_id, placeholder_nodes, procs, capacity),
                    commands=commands_sh(plan, procs), sbatch=sbatch)


# --- commands.sh ----------------------------------------------------------------------------


def step_prefix(plan: Plan, proc: Process) -> list[str]:
    """What `proc`'s command line starts with: its scheduler's step (srun on Slurm, with the
    container runtime's step options)."""
    rt = containers.of(plan.cluster)
    return schedulers.of(plan.cluster).step_prefix(
        plan, proc, rt.step_flags(plan) if proc.container else [])


def command_line(plan: Plan, proc: Process) -> list[str]:
    """The full command that starts `proc`: [srun ...] [preamble] env K=V ... argv."""
    return [*step_prefix(plan, proc), *preamble(plan, proc.name, proc.kind == Kind.ENGINE),
            "env", *[f"{k}={v}" for k, v in proc.env.items()], *proc.argv]


def preamble(plan: Plan, name: str, setup: bool = False) -> list[str]:
    """The profile's step_preamble before a step's command, where the command runs (in its
    container, for a container step), then with `setup` the recipe's setup_script, as
    srt-slurm runs it in each worker's container before the worker; a failing preamble or
    script fails the step."""
    parts = [plan.cluster.step_preamble] if plan.cluster.step_preamble else []
    if setup and (script := setup_script_path(plan)):
        q = shlex.quote(script)  # missing: a warning, as srt-slurm (the dry-run said so)
        parts.append(f'if [ -f {q} ]; then bash {q}; else echo "setup_script {q} is missing" '
                     '>&2; fi')
    if not parts:
        return []
    return ["bash", "-c", f'set -e; {"; ".join(parts)}; set +e; exec "$@"', name]


def setup_script_path(plan: Plan) -> str | None:
    """Where the recipe's setup_script is run from: its copy in the run directory, which
    every node and container sees."""
    script = plan.recipe.setup_script
    return f"{plan.run_dir}/{rundir.INPUTS}/{Path(script).name}" if script else None


NODECHECK_MODULE = "launcher.control.nodecheck"
IMAGE_MODULE = "launcher.control.image"


def env_prefix(env: dict[str, str]) -> list[str]:
    return ["env", *[f"{k}={v}" for k, v in env.items()]] if env else []


def check_steps(plan: Plan) -> list[tuple[str, list[list[str]]]]:
    """The preflight steps, as (name, commands): the host check of every node (before the
    plan's addresses are known), then the check inside the engine's container on every node
    (with pyxis the same step imports the image into the job's named container, once per
    node). On Slurm each is one multi-node step; locally one command per node."""
    rd, c = plan.run_dir, plan.cluster
    host = [*launcher_cmd(plan, NODECHECK_MODULE, False), "--run-dir", rd, "--where", "host"]
    if c.network.interface:
        host += ["--interface", c.network.interface]
    boxed = plan.recipe.container is not None
    if boxed and containers.of(c).isolated:
        host += ["--runtime", c.containers.runtime]
        for src, _, _ in containers.mounts(plan):
            host += ["--mount-source", src]
        if c.containers.image_cache:
            host += ["--image-cache", c.containers.image_cache]
    inside = [
        *launcher_cmd(plan, NODECHECK_MODULE, boxed), "--run-dir", rd, "--where", "container",
        "--engine", plan.recipe.engine,
    ]  # fmt: skip
    if c.imex is not None:
        imex = ["--imex-dir", c.imex.dir, "--imex-channel", str(c.imex.channel)]
        host += imex
        inside += imex
    env_host = env_prefix(host_env(plan))
    rt = containers.of(c)
    env_box = env_prefix({**model_env(plan), **(rt.env(plan) if boxed else host_env(plan))})
    box = rt.step_flags(plan) if boxed else []
    stages = []
    if cached := containers.cached_image(plan):
        stages.append(("stage-image", [*env_host, *launcher_cmd(plan, IMAGE_MODULE, False),
                                       containers.enroot_uri(plan.recipe.container.image),
                                       "--to", cached]))
    if stage := stage_command(plan):
        stages.append(("stage-model", [*box, *env_box, *stage]))
    return schedulers.of(c).preflight_steps(
        plan, [*preamble(plan, "preflight-host"), *env_host, *host],
        [*box, *preamble(plan, "preflight-container", True), *env_box, *inside],
        [(n, _after_box(plan, n, cmd, box)) for n, cmd in stages])


def _after_box(plan: Plan, name: str, cmd: list[str], box: list[str]) -> list[str]:
    """A stage's command with the preamble after its container flags."""
    if box and cmd[: len(box)] == box:
        return [*box, *preamble(plan, name), *cmd[len(box):]]
    return [*preamble(plan, name), *cmd]


def stage_command(plan: Plan) -> list[str] | None:
    """Fetch a hub model once into the shared cache before any engine starts (only where
    compute nodes reach the hub; otherwise submit refuses an unstaged model)."""
    r, m = plan.recipe, plan.cluster.models
    if not r.engine_kind.loads_weights or not r.model.hub_id or not m.hf_home or not m.internet:
        return None
    cmd = [*launcher_cmd(plan, "launcher.control.staging", r.container is not None),
           r.model.path, "--hf-home", m.hf_home]  # fmt: skip
    return cmd + (["--revision", r.model.revision] if r.model.revision else [])


JOBID_PLACEHOLDER = "'--jobid=$SLURM_JOB_ID'"
JOBID_BY_HAND = '"--jobid=${SLURM_JOB_ID:?export SLURM_JOB_ID=the job id}"'


def _quote(word: str) -> str:
    """One shell word on one line: bash's $'...' for a word with a line break (a custom
    benchmark's script), else shlex's quoting (a tab stays as it is, inside quotes)."""
    if not re.search(r"[\x00-\x08\x0a-\x1f\x7f]", word):
        return shlex.quote(word)
    return "$'" + "".join(
        {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch)
        or (f"\\x{ord(ch):02x}" if ord(ch) < 32 or ord(ch) == 127 else ch)
        for ch in word) + "'"


def shell_line(cmd: list[str]) -> str:
    """`cmd` quoted for bash, every word one argument; only srun's own --jobid placeholder
    expands (to the job the line is run for), never a value that happens to read the same."""
    words = [_quote(w) for w in cmd]
    if cmd[:1] == ["srun"] and len(cmd) > 1 and words[1] == JOBID_PLACEHOLDER:
        words[1] = JOBID_BY_HAND
    return " ".join(words)


def _comment(text: str) -> str:
    """A comment line that stays one comment line, whatever the text holds."""
    return "# " + re.sub(r"[\x00-\x1f\x7f]", "?", text)


COMMANDS_GUARD = 'echo "commands.sh is for reading and for copying one line at a time" >&2; exit 2'


def commands_sh(plan: Plan, procs: list[Process] | None = None) -> str:
    """A readable script of every process, in start order (what the orchestrator runs)."""
    run_dir = plan.run_dir
    rt = plan.runtime
    c = plan.recipe.container
    lines = [
        "#!/bin/bash",
        _comment(f"Every process of run {run_dir}, in the order the orchestrator starts them."),
        "# The orchestrator also waits for health between stages and tears everything down;",
        "# this file is for reading and for starting one process by hand.",
        "# Secrets are passed by name only: export them before running a line.",
        _comment(f"Launcher programs (orchestrator, agents, router, clients) run {rt.python}"),
        "# Run whole, it would start every process, the benchmarks included, at once:",
        COMMANDS_GUARD,
    ]
    if c is not None:
        lines.append(
            _comment(
                f"Container steps ({plan.cluster.containers.runtime}): image {c.image}; "
                f"they see only the image and: "
                + ", ".join(f"{d}{' (ro)' if ro else ''}" for _, d, ro in containers.mounts(plan))
            )
        )
    lines.append("")
    for name, commands in check_steps(plan):
        lines.append(_comment(f"{name}: the checks before anything starts -> {run_dir}/logs/{name}.log"))
        for cmd in commands:
            lines.append(shell_line(cmd))
        lines.append("")
    for proc in processes(plan) if procs is None else procs:
        where = f"{proc.node}" + (f" gpus {','.join(map(str, proc.gpus))}" if proc.gpus else "")
        boxed = " in the container" if proc.container else ""
        lines.append(_comment(f"{proc.name} ({proc.kind}) on {where}{boxed} -> {run_dir}/{proc.log}"))
        if proc.env_from_host:
            lines.append(
                _comment(f"  passes through from your environment: {' '.join(proc.env_from_host)}")
            )
        line = shell_line(command_line(plan, proc))
        lines.append(line + f" > {shlex.quote(run_dir + '/' + proc.log)} 2>&1 &")
        for r in proc.restarts:
            lines.append(_comment(
                f"  stopped before the first sweep point at concurrency >= "
                f"{r['from_concurrency']} and started again as ({proc.role}.args_from_concurrency):"))
            again = dataclasses.replace(proc, argv=list(r["argv"]), restarts=[])
            lines.append(shell_line(command_line(plan, again))
                         + f" >> {shlex.quote(run_dir + '/' + proc.log)} 2>&1 &")
        lines.append("")
    return "\n".join(lines)
