"""Render (pure): a Plan -> every process's node, argv and env, the sbatch text, commands.sh.

`engine: sim` renders the same argv as `engine: vllm` with the simulator as the executable,
so everything downstream sees the same flags. Programs of this package run as `python -m ...`;
the process backend puts the launcher's own interpreter first on PATH.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from launcher.planning.plan import Endpoint, Plan, engine_args
from launcher.run import rundir
from launcher.run.plandoc import EndpointDoc, NodeDoc, PlanDoc, Process
from launcher.run.vocab import Kind, Role

ENGINE_EXE = {"vllm": ["vllm"], "sim": ["python", "-m", "launcher.sim"]}
BENCH_EXE = {
    "vllm": ["vllm", "bench", "serve"],
    "builtin": ["python", "-m", "launcher.clients.bench"],
}
KV_CONNECTOR_FLAG = {"nixl": "nixl", "mooncake": "mooncake", "moriio": "moriio"}
# The stats-log parser needs plain text (a forced colour would break it), and CUDA must
# number GPUs as NVML does, so CUDA_VISIBLE_DEVICES and the telemetry mean the same GPU.
ENGINE_BASE_ENV = {"VLLM_LOGGING_COLOR": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def flags(args: dict) -> list[str]:
    """{"async-scheduling": True, "max-num-seqs": 256} -> ["--async-scheduling", ...]."""
    out: list[str] = []
    for key, value in args.items():
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out.append(f"--no-{key}")
        else:
            out += [f"--{key}", str(value)]
    return out


def kv_transfer_config(plan: Plan, role: Role) -> str:
    cfg = dict(plan.recipe.kv_connector)
    cfg["kv_role"] = "kv_producer" if role == Role.PREFILL else "kv_consumer"
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True)


def _kv_connector_flag(plan: Plan) -> str:
    name = str(plan.recipe.kv_connector.get("kv_connector", "")).lower()
    for key, flag in KV_CONNECTOR_FLAG.items():
        if key in name:
            return flag
    return "nixl"


def _base_env(name: str, run_dir: str) -> dict[str, str]:
    return {"PD_PROCESS": name, "PD_RUN_DIR": run_dir}


def sim_env(plan: Plan) -> dict[str, str]:
    env = {f"SIM_{k.upper()}": _env_str(v) for k, v in plan.recipe.sim.items()}
    acc = plan.recipe.accuracy
    if acc.enabled and acc.data:
        # The simulator has no model: it answers GSM8K from the task's own answer key.
        env.setdefault("SIM_ANSWER_KEY", acc.data)
    return env


def _env_str(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def engine_processes(plan: Plan, ep: Endpoint, run_dir: str) -> list[Process]:
    r = plan.recipe
    pool = ep.pool
    exe = ENGINE_EXE[r.engine]
    procs = []
    for part in ep.parts:
        name = f"{ep.name}@{part.node}"
        argv = [*exe, "serve", r.model.path, "--served-model-name", r.model.name]
        if part.head:
            argv += ["--host", plan.cluster.bind_host, "--port", str(ep.http_port)]
        argv += ["--tensor-parallel-size", str(pool.tensor_parallel)]
        if pool.data_parallel > 1:
            argv += ["--data-parallel-size", str(pool.data_parallel)]
            argv += ["--data-parallel-size-local", str(len(part.dp_ranks))]
        if ep.multi_node:
            argv += ["--data-parallel-address", plan.address(ep.head.node)]
            argv += ["--data-parallel-rpc-port", str(ep.dp_rpc_port)]
        if pool.expert_parallel:
            argv.append("--enable-expert-parallel")
        if part.head:
            argv += ["--api-server-count", str(pool.api_servers)]
        else:
            argv += ["--headless", "--data-parallel-start-rank", str(part.dp_ranks[0])]
        if ep.role.disaggregated:
            argv += ["--kv-transfer-config", kv_transfer_config(plan, ep.role)]
        argv += flags(engine_args(r, pool))

        env = dict(ENGINE_BASE_ENV)
        env.update(plan.cluster.env)
        env.update(r.env)
        env.update(pool.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in part.gpus)
        if ep.role.disaggregated:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = plan.address(part.node)
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ep.nixl_port_base)
        if r.engine == "sim":
            env.update(sim_env(plan))
        env.update(_base_env(name, run_dir))
        url = plan.endpoint_url(ep) if part.head else None
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
                headless=not part.head,
                url=url,
                metrics_url=f"{url}/metrics" if url else None,
                env_from_host=list(r.env_from_host),
                container=r.container is not None and r.engine == "vllm",
            )
        )
    return procs


def router_process(plan: Plan, run_dir: str) -> Process:
    r = plan.recipe
    bind = plan.cluster.bind_host
    argv = ["vllm-router", "--host", bind, "--port", str(plan.router_port)]
    if r.mode == "disagg":
        argv.append("--vllm-pd-disaggregation")
        for ep in plan.endpoints:
            if ep.role == Role.PREFILL:
                argv += ["--prefill", plan.endpoint_url(ep)]
        for ep in plan.endpoints:
            if ep.role == Role.DECODE:
                argv += ["--decode", plan.endpoint_url(ep)]
        argv += ["--kv-connector", _kv_connector_flag(plan)]
    else:
        argv += ["--worker-urls", *[plan.endpoint_url(ep) for ep in plan.endpoints]]
    argv += ["--prometheus-host", bind, "--prometheus-port", str(plan.router_metrics_port)]
    for key in ("policy", "prefill_policy", "decode_policy"):
        value = getattr(r.router, key)
        if value:
            argv += [f"--{key.replace('_', '-')}", value]
    argv += flags({k.lstrip("-"): v for k, v in r.router.args.items() if v is not None})
    node = plan.nodes[0]
    return Process(
        name="router",
        kind=Kind.ROUTER,
        node=node,
        argv=argv,
        env=_base_env("router", run_dir),
        log="logs/router.log",
        url=plan.router_url,
        metrics_url=plan.url(node, plan.router_metrics_port) + "/metrics",
    )


def agent_processes(plan: Plan, run_dir: str) -> list[Process]:
    procs = []
    for node in plan.nodes:
        name = f"agent@{node}"
        argv = [
            "python", "-m", "launcher.telemetry.agent",
            "--run-dir", run_dir,
            "--node", node,
            "--interval", f"{plan.recipe.telemetry.interval_s:g}",
            "--exporter-port", str(plan.exporter_ports[node]),
        ]  # fmt: skip
        procs.append(
            Process(
                name=name,
                kind=Kind.AGENT,
                node=node,
                argv=argv,
                env=_base_env(name, run_dir),
                log=f"logs/{name}.log",
                url=plan.url(node, plan.exporter_ports[node]),
                metrics_url=plan.url(node, plan.exporter_ports[node]) + "/metrics",
            )
        )
    return procs


def bench_processes(plan: Plan, run_dir: str) -> list[Process]:
    """One client run per concurrency point, against the router, from the first node."""
    r = plan.recipe
    b = r.benchmark
    run = rundir.RunDir(Path(run_dir))
    procs = []
    for c in b.concurrency:
        name = f"bench-c{c}"
        result = run.bench_result(c)
        argv = [
            *BENCH_EXE[b.driver],
            "--backend", "openai",
            "--base-url", plan.router_url,
            "--endpoint", "/v1/completions",
            "--model", r.model.name,
            "--tokenizer", r.model.path,
            "--dataset-name", "random",
            "--random-input-len", str(b.input_len),
            "--random-output-len", str(b.output_len),
            "--random-range-ratio", f"{b.range_ratio:g}",
            "--num-prompts", str(b.prompts(c)),
            "--max-concurrency", str(c),
            "--num-warmups", str(b.warmup),
            "--ignore-eos",
            "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99",
            "--seed", "0",
            "--save-result",
            "--result-dir", str(result.parent),
            "--result-filename", result.name,
        ]  # fmt: skip
        procs.append(
            Process(
                name=name,
                kind=Kind.BENCH,
                node=plan.nodes[0],
                argv=argv,
                env=_base_env(name, run_dir),
                log=f"logs/{name}.log",
                env_from_host=list(r.env_from_host),
                container=b.driver == "vllm" and r.container is not None,
                result=str(result.relative_to(run.path)),
            )
        )
    return procs


def accuracy_process(plan: Plan, run_dir: str) -> Process | None:
    a = plan.recipe.accuracy
    if not a.enabled:
        return None
    result = rundir.RunDir(Path(run_dir)).accuracy_result(a.task)
    argv = [
        "python", "-m", "launcher.accuracy",
        "--base-url", plan.router_url,
        "--model", plan.recipe.model.name,
        "--data", a.data or "",
        "--num-questions", str(a.num_questions),
        "--num-shots", str(a.num_shots),
        "--max-tokens", str(a.max_tokens),
        "--concurrency", str(a.concurrency),
        "--threshold", f"{a.threshold:g}",
        "--output", str(result),
    ]  # fmt: skip
    return Process(
        name="accuracy",
        kind=Kind.ACCURACY,
        node=plan.nodes[0],
        argv=argv,
        env=_base_env("accuracy", run_dir),
        log="logs/accuracy.log",
        result=str(result.relative_to(run_dir)),
    )


def processes(plan: Plan, run_dir: str) -> list[Process]:
    """Every process of the run, in start order: agents, engines, router, bench, accuracy."""
    out: list[Process] = []
    if plan.recipe.telemetry.enabled:
        out += agent_processes(plan, run_dir)
    for ep in plan.endpoints:
        out += engine_processes(plan, ep, run_dir)
    out.append(router_process(plan, run_dir))
    if plan.recipe.benchmark.enabled:
        out += bench_processes(plan, run_dir)
    acc = accuracy_process(plan, run_dir)
    if acc:
        out.append(acc)
    return out


def plan_doc(plan: Plan, run_id: str, run_dir: str, placeholder_nodes: bool) -> PlanDoc:
    r = plan.recipe
    return PlanDoc(
        run_id=run_id,
        recipe=r.name,
        cluster=plan.cluster.name,
        engine=r.engine,
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
            )
            for ep in plan.endpoints
        ],
        processes=processes(plan, run_dir),
        router_url=plan.router_url,
        router_metrics_url=plan.url(plan.nodes[0], plan.router_metrics_port) + "/metrics",
        gpu_count=plan.gpu_count(),
        placeholder_nodes=placeholder_nodes,
    )


# --- Slurm ----------------------------------------------------------------------------------


def slurm_parameters(plan: Plan, nodes: int) -> dict:
    """submitit SlurmExecutor parameters: the one place the allocation request is decided."""
    r, c = plan.recipe, plan.cluster
    params: dict = {
        "job_name": f"pd-{r.name}",
        "time": r.slurm.minutes,
        "partition": r.slurm.partition,
        "account": r.slurm.account,
        "qos": r.slurm.qos,
        "exclusive": c.exclusive or None,
        "stderr_to_stdout": True,
        "wckey": None,
        "use_srun": False,  # one orchestrator in the batch step starts every srun step itself
    }
    if c.gpu_directive == "gres":
        params["gres"] = f"gpu:{c.gres_type + ':' if c.gres_type else ''}{c.gpus_per_node}"
    else:
        params["gpus_per_node"] = c.gpus_per_node
    # submitit counts tasks from `nodes`; the orchestrator is one task, so the node count
    # goes in as an additional parameter, which overrides submitit's --nodes=1 line.
    extra: dict = {"nodes": nodes, "ntasks_per_node": 1, "signal": "B:USR2@120"}
    if c.mem_zero:
        extra["mem"] = "0"
    if c.segment:
        extra["segment"] = nodes
    extra.update({k.lstrip("-").replace("-", "_"): v for k, v in r.slurm.directives.items()})
    params["additional_parameters"] = extra
    # wckey=None is how submitit drops its default "#SBATCH --wckey=submitit" line.
    return {k: v for k, v in params.items() if v is not None or k == "wckey"}


def submitit_command(python: str, folder: str) -> str:
    return f"{shlex.quote(python)} -u -m submitit.core._submit {shlex.quote(folder)}"


def sbatch_text(plan: Plan, nodes: int, folder: str, python: str) -> str:
    """Exactly the text submitit submits (its own renderer, same parameters)."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(plan, nodes)
    return _make_sbatch_string(command=submitit_command(python, folder), folder=folder, **params)


# --- commands.sh ----------------------------------------------------------------------------


def srun_prefix(plan: Plan, proc: Process) -> list[str]:
    """The srun step a process runs in (Slurm profiles); the orchestrator adds --jobid."""
    argv = [
        "srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={proc.node}",
        f"--job-name={proc.name}", "--kill-on-bad-exit=1",
    ]  # fmt: skip
    if proc.gpus or proc.kind == "agent":  # with device cgroups a step sees only what it asks for
        argv.append(f"--gpus-per-node={plan.cluster.gpus_per_node}")
    c = plan.recipe.container
    if proc.container and c and plan.cluster.container == "pyxis":
        argv += [f"--container-image={c.image}", "--no-container-entrypoint"]
        argv.append("--no-container-mount-home")
        mounts = list(c.mounts)
        if mounts:
            argv.append(f"--container-mounts={','.join(mounts)}")
        if c.workdir:
            argv.append(f"--container-workdir={c.workdir}")
    return argv


def command_line(plan: Plan, proc: Process) -> list[str]:
    """The full command that starts `proc`: [srun ...] env K=V ... argv."""
    env = ["env", *[f"{k}={v}" for k, v in proc.env.items()]]
    prefix = srun_prefix(plan, proc) if plan.cluster.scheduler == "slurm" else []
    return [*prefix, *env, *proc.argv]


def commands_sh(plan: Plan, run_dir: str) -> str:
    """A readable script of every process, in start order (what the orchestrator runs)."""
    lines = [
        "#!/bin/bash",
        f"# Every process of run {run_dir}, in the order the orchestrator starts them.",
        "# The orchestrator also waits for health between stages and tears everything down;",
        "# this file is for reading and for starting one process by hand.",
        "# Secrets are passed by name only: export them before running a line.",
        "",
    ]
    for proc in processes(plan, run_dir):
        where = f"{proc.node}" + (f" gpus {','.join(map(str, proc.gpus))}" if proc.gpus else "")
        lines.append(f"# {proc.name} ({proc.kind}) on {where} -> {run_dir}/{proc.log}")
        if proc.env_from_host:
            lines.append(
                f"#   passes through from your environment: {' '.join(proc.env_from_host)}"
            )
        lines.append(
            shlex.join(command_line(plan, proc))
            + f" > {shlex.quote(run_dir + '/' + proc.log)} 2>&1 &"
        )
        lines.append("")
    return "\n".join(lines)
