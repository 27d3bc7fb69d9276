"""Parse the exact argv of ``vllm serve`` (only the executable swapped) into a SimConfig.

``python -m launcher.sim serve MODEL [vllm flags] [--sim-* flags]``. The argv goes through a
parser as strict as vLLM 0.33's own (``launcher.sim.argv``, table in
``launcher.sim.vllm_flags``): an unknown flag or a value outside a flag's choices is vLLM's
argparse error, exit status 2. Flags vLLM accepts but the simulator does not model are
accepted and listed once at start-up.

Differences between vLLM 0.32 and 0.33 (0.33 is the target) are listed in
``launcher.sim.vllm_flags``' header (both tables made from the real parsers).
"""

from __future__ import annotations

import argparse
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from launcher.sim import argv as argv_mod
from launcher.sim import connectors, vllm_flags
from launcher.sim import knobs as knobs_mod

# Destinations of vLLM flags the simulator models; any other flag given is listed at start-up.
_MODELLED = {
    "model_tag", "model", "host", "port", "served_model_name", "data_parallel_size",
    "data_parallel_size_local", "data_parallel_address", "data_parallel_rpc_port",
    "data_parallel_start_rank", "data_parallel_hybrid_lb", "headless", "tensor_parallel_size",
    "pipeline_parallel_size",
    "api_server_count", "speculative_config", "nnodes", "node_rank", "master_addr", "master_port",
    "kv_transfer_config", "block_size", "num_gpu_blocks_override", "max_num_seqs",
    "max_num_batched_tokens", "max_model_len", "stream_interval", "gpu_memory_utilization",
    "kv_cache_dtype", "mamba_ssm_cache_dtype", "disable_log_stats", "aggregate_engine_logging",
    "enable_request_id_headers", "enable_scale_out", "tokens_only", "config", "help",
    "disable_uvicorn_access_log", "fingerprint_mode", "fingerprint_value",
    "enable_prefix_caching", "enable_log_requests",
}
_FIRST_OPTION = {rec["dest"]: rec["options"][0] for rec in vllm_flags.FLAGS}


@dataclass
class SimConfig:
    model: str
    served_model_name: str
    served_model_names: list[str]
    host: str | None
    port: int
    dp_size: int
    dp_size_local: int
    dp_start_rank: int
    dp_address: str
    dp_rpc_port: int
    headless: bool
    tp_size: int
    api_server_count: int
    kv_connector: str | None
    kv_role: str | None
    engine_id: str
    kv_lease_s: float
    block_size: int
    user_block_size: bool
    num_gpu_blocks: int
    num_gpu_blocks_override: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    stream_interval: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    mamba_ssm_cache_dtype: str
    disable_log_stats: bool
    aggregate_engine_logging: bool
    request_id_headers: bool
    side_channel_host: str
    side_channel_port: int
    log_stats_interval: float
    knobs: knobs_mod.Knobs
    scale_out: bool = False
    access_log: bool = True  # uvicorn's access lines (--disable-uvicorn-access-log: off)
    system_fingerprint: str | None = None  # --fingerprint-mode (0.33): in every response
    log_requests: bool = False  # --enable-log-requests: one line per request
    # --enable-prefix-caching / --no-enable-prefix-caching / --disable-prefix-caching; vLLM
    # 0.33 turns it on for generative models when none is given. It only shows in
    # cache_config_info: the KV estimate already sized the blocks for it.
    enable_prefix_caching: bool = True
    # One front per node: this API server serves only its own ranks and every other rank
    # has a front of its own (vLLM's local_engines_only: hybrid LB, or the external LB it
    # switches to with one local rank, engine/arg_utils.py:2488-2505, config/parallel.py:657).
    hybrid_lb: bool = False
    num_spec_tokens: int = 0  # --speculative-config's num_speculative_tokens (MTP and the like)
    pp_size: int = 1  # --pipeline-parallel-size: stages of tp_size workers each
    # one engine's workers over several nodes (vLLM's --nnodes/--node-rank/--master-addr/-port)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    # the connectors of --kv-transfer-config (a MultiConnector's children, else the one)
    kv_chain: list[dict[str, Any]] = field(default_factory=list)
    kv_load_failure_policy: str = "fail"
    ignored_flags: list[str] = field(default_factory=list)
    argv_warnings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def local_ranks(self) -> list[int]:
        return list(range(self.dp_start_rank, self.dp_start_rank + self.dp_size_local))

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def nixl(self) -> bool:
        """A P->D connector in the chain (anything but the store and CPU offload tiers)."""
        return any(k.get("kv_connector") not in connectors.TIER_CONNECTORS for k in self.kv_chain)

    @property
    def world_size(self) -> int:
        """One engine's workers: tensor x pipeline parallel (vLLM's world_size)."""
        return self.tp_size * self.pp_size

    @property
    def stats_logging(self) -> bool:
        """vLLM prints the periodic stats lines only with one API server, never headless."""
        return not self.headless and self.api_server_count == 1 and not self.disable_log_stats


def fingerprint(ns: argparse.Namespace, model: str, dp: int, max_model_len: int) -> str | None:
    """vLLM 0.33's system_fingerprint (vllm/entrypoints/serve/utils/fingerprint.py):
    full = vllm-<version>[-tpN][-ppN][-dpN][-ep]-<hash8>, hash = without the parallelism,
    custom = --fingerprint-value, none = null. The hash stands for vLLM's config hash."""
    import hashlib

    mode = ns.fingerprint_mode or "full"
    if mode == "none":
        return None
    if mode == "custom":
        return ns.fingerprint_value
    hash8 = hashlib.sha256(f"{model}|{dp}|{ns.tensor_parallel_size}|{max_model_len}".encode()
                           ).hexdigest()[:8]
    parts = [f"vllm-{vllm_flags.VLLM_VERSION}"]
    if mode == "full":
        tp, pp = ns.tensor_parallel_size or 1, getattr(ns, "pipeline_parallel_size", 1) or 1
        parts += [f"tp{tp}"] if tp > 1 else []
        parts += [f"pp{pp}"] if pp > 1 else []
        parts += [f"dp{dp}"] if dp > 1 else []
        parts += ["ep"] if getattr(ns, "enable_expert_parallel", False) else []
    return "-".join([*parts, hash8])


# vLLM 0.33 engine/arg_utils.py:2495 (create_engine_config)
HYBRID_TO_EXTERNAL_WHERE = "arg_utils.py:2495"
HYBRID_TO_EXTERNAL = ("data_parallel_hybrid_lb is not eligible when "
                      "data_parallel_size_local = 1, autoswitch to data_parallel_external_lb.")


class UsageError(Exception):
    """A user-fixable problem with the argv; the message names what to fix."""


def _sim_flags(p: argparse.ArgumentParser) -> None:
    """The simulator's own flags, next to vLLM's on the serve parser."""
    p.add_argument("--sim-help", action="store_true", help="list the SIM_* knobs and exit")
    for name in knobs_mod.Knobs.names():
        p.add_argument(knobs_mod.flag_name(name), dest="sim_" + name, default=None,
                       help=knobs_mod.Knobs.doc(name))


def parse(argv: list[str], env: dict[str, str] | None = None) -> SimConfig:
    """SimConfig from ``serve MODEL [flags]``.

    Raises ``argv.VllmArgError`` (vLLM's argparse error, exit 2), ``argv.VllmStartupError``
    (an exception vLLM raises while reading the argv, exit 1) or UsageError (a problem the
    simulator reports itself).
    """
    env = dict(os.environ) if env is None else env
    warnings: list[tuple[str, str]] = []
    ns, given = argv_mod.parse(list(argv), lambda where, msg: warnings.append((where, msg)),
                               extra=_sim_flags)
    if ns.subparser != "serve":
        raise UsageError("usage: python -m launcher.sim serve MODEL [vllm serve flags]; "
                         "launcher.sim simulates only `vllm serve`")
    if ns.sim_help:
        print(knobs_mod.describe())
        raise SystemExit(0)
    model = ns.model_tag or ns.model
    sim_flags = {n: getattr(ns, "sim_" + n) for n in knobs_mod.Knobs.names()
                 if getattr(ns, "sim_" + n) is not None}
    try:
        knobs = knobs_mod.load(env, sim_flags)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    _validate_like_vllm(ns)
    kv: dict[str, Any] = dict(ns.kv_transfer_config or {})
    extra = kv.get("kv_connector_extra_config") or {}
    lease = float(extra.get("kv_lease_duration", knobs.kv_lease_s))

    dp = ns.data_parallel_size
    dpl = ns.data_parallel_size_local if ns.data_parallel_size_local is not None else dp
    start = ns.data_parallel_start_rank or 0
    if ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        raise UsageError(f"--node-rank {ns.node_rank} does not fit --nnodes {ns.nnodes}")
    world = ns.tensor_parallel_size * ns.pipeline_parallel_size
    if ns.nnodes > 1 and world % ns.nnodes:
        raise UsageError(f"--tensor-parallel-size {ns.tensor_parallel_size} x "
                         f"--pipeline-parallel-size {ns.pipeline_parallel_size} does not split "
                         f"over --nnodes {ns.nnodes}")
    if ns.headless and ns.api_server_count not in (None, 0):
        raise UsageError("--headless cannot be combined with --api-server-count > 0")
    if dp < 1 or dpl < 1 or start + dpl > dp:
        raise UsageError(
            f"data parallel ranks {start}..{start + dpl - 1} do not fit "
            f"--data-parallel-size {dp}")
    external_lb = ns.data_parallel_external_lb or ns.data_parallel_rank is not None
    if ns.headless:
        api_count = 0
    elif ns.api_server_count is not None:
        api_count = ns.api_server_count
    elif external_lb or ns.data_parallel_multi_port_external_lb:
        api_count = 1
    elif ns.data_parallel_hybrid_lb or ns.data_parallel_start_rank is not None:
        api_count = dpl  # hybrid LB: one API server per local rank (vLLM's default)
    else:
        api_count = dp
    hybrid_lb = False
    if not external_lb and ns.data_parallel_size_local is not None:
        hybrid_lb = bool(ns.data_parallel_hybrid_lb) or (
            ns.data_parallel_start_rank is not None and not ns.headless)
        if hybrid_lb and dpl == 1:
            warnings.append((HYBRID_TO_EXTERNAL_WHERE, HYBRID_TO_EXTERNAL))
        if dpl == dp:  # one node: vLLM turns hybrid LB off
            hybrid_lb = False
    block_size = ns.block_size or knobs.default_block_size
    num_blocks = ns.num_gpu_blocks_override or max(1, knobs.kv_capacity_tokens // block_size)

    served_names = [n for n in (ns.served_model_name or []) if n] or [model]
    ignored = [_FIRST_OPTION.get(dest, opt) for dest, opt in given.items()
               if dest not in _MODELLED and not dest.startswith("sim_")]
    base_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    max_model_len = ns.max_model_len if ns.max_model_len and ns.max_model_len > 0 else 262144
    return SimConfig(
        model=model,
        served_model_name=served_names[0],
        served_model_names=served_names,
        host=ns.host,
        port=ns.port,
        dp_size=dp,
        dp_size_local=dpl,
        dp_start_rank=start,
        dp_address=ns.data_parallel_address or "127.0.0.1",
        dp_rpc_port=ns.data_parallel_rpc_port or 29550,
        headless=ns.headless,
        tp_size=ns.tensor_parallel_size,
        api_server_count=api_count,
        kv_connector=kv.get("kv_connector"),
        kv_role=kv.get("kv_role") if kv.get("kv_connector") else None,
        engine_id=str(kv.get("engine_id") or uuid.uuid4()),
        kv_lease_s=lease,
        block_size=block_size,
        user_block_size=ns.block_size is not None,
        num_gpu_blocks=num_blocks,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        max_num_seqs=ns.max_num_seqs or 1024,
        max_num_batched_tokens=ns.max_num_batched_tokens or 16384,
        max_model_len=max_model_len,
        stream_interval=max(1, ns.stream_interval),
        gpu_memory_utilization=(ns.gpu_memory_utilization
                                if "gpu_memory_utilization" in given else 0.9),
        kv_cache_dtype=ns.kv_cache_dtype,
        mamba_ssm_cache_dtype=ns.mamba_ssm_cache_dtype,
        disable_log_stats=ns.disable_log_stats,
        aggregate_engine_logging=ns.aggregate_engine_logging,
        request_id_headers=bool(ns.enable_request_id_headers),
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_channel_port=base_port,
        log_stats_interval=float(env.get("VLLM_LOG_STATS_INTERVAL", "10")),
        knobs=knobs,
        scale_out=bool(ns.enable_scale_out or ns.tokens_only),
        access_log=not ns.disable_uvicorn_access_log,
        system_fingerprint=fingerprint(ns, model, dp, max_model_len),
        log_requests=bool(ns.enable_log_requests),
        enable_prefix_caching=ns.enable_prefix_caching is not False,
        hybrid_lb=hybrid_lb,
        num_spec_tokens=_spec_tokens(ns.speculative_config),
        pp_size=ns.pipeline_parallel_size,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        kv_chain=connectors.chain(kv),
        kv_load_failure_policy=str(kv.get("kv_load_failure_policy") or "fail"),
        ignored_flags=ignored,
        argv_warnings=warnings,
    )


def _spec_tokens(spec: Any) -> int:
    """Draft tokens per step from --speculative-config (0: no speculative decoding)."""
    if not spec:
        return 0
    if not isinstance(spec, dict):
        raise UsageError("--speculative-config: give a JSON object")
    n = spec.get("num_speculative_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise UsageError("--speculative-config: num_speculative_tokens must be a positive "
                         f"integer (got {n!r})")
    return n


def _validate_like_vllm(ns: argparse.Namespace) -> None:
    """The checks vLLM 0.33 runs on the parsed argv before loading anything
    (``validate_parsed_serve_args`` in vllm/entrypoints/common/cli_args.py, and the LB-mode
    check of ``vllm serve``); vLLM raises these, so they exit 1."""
    err = argv_mod.VllmStartupError
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise err("TypeError", "Error: --enable-auto-tool-choice requires --tool-call-parser")
    if ns.enable_log_outputs and not ns.enable_log_requests:
        raise err("TypeError", "Error: --enable-log-outputs requires --enable-log-requests")
    if ns.sse_keep_alive_interval < 0:
        raise err("ValueError", "Error: --sse-keep-alive-interval must be a non-negative "
                                "integer (0 disables keep-alive comments).")
    if ns.enable_per_request_metrics and ns.disable_log_stats:
        raise err("ValueError", "Error: --enable-per-request-metrics requires engine "
                                "statistics logging; remove --disable-log-stats to enable "
                                "per-request metrics.")
    external = ns.data_parallel_external_lb or ns.data_parallel_rank is not None
    if ns.data_parallel_hybrid_lb or ns.data_parallel_multi_port_external_lb:
        hybrid, multi = ns.data_parallel_hybrid_lb, ns.data_parallel_multi_port_external_lb
    else:
        hybrid, multi = ns.data_parallel_start_rank is not None, False
    if sum([bool(multi), bool(external), bool(hybrid)]) > 1:
        raise err("ValueError", "Cannot use more than one data parallel load balancing mode. "
                                "Choose one of: --data-parallel-multi-port-external-lb, "
                                "--data-parallel-external-lb (or --data-parallel-rank), "
                                "--data-parallel-hybrid-lb (or --data-parallel-start-rank).")
    if ns.headless and ns.data_parallel_hybrid_lb:  # serve.py:197 (run_headless)
        raise err("ValueError", "data_parallel_hybrid_lb is not applicable in headless mode")
    if ns.data_parallel_hybrid_lb and not external and ns.data_parallel_size_local is None:
        raise err("ValueError", "Invalid data-parallel launch options: "  # arg_utils.py:2520
                                "`--data-parallel-hybrid-lb` requires "
                                "`--data-parallel-size-local`. Set it to the number of "
                                "data-parallel ranks on this node.")
