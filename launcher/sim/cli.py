"""Parse the exact argv of ``vllm serve`` (only the executable swapped) into a SimConfig.

``python -m launcher.sim serve MODEL [vllm flags] [--sim-* flags]``. Flags the simulator
cannot model are accepted (with or without a value) and listed once at start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from launcher.sim import knobs as knobs_mod

# Flags we parse but whose effect the simulator does not model (listed at start-up when given).
_UNMODELLED = (
    "enable_expert_parallel", "all2all_backend", "async_scheduling", "language_model_only",
    "gdn_prefill_backend", "trust_remote_code", "enforce_eager", "disable_log_requests",
    "data_parallel_backend", "data_parallel_hybrid_lb", "data_parallel_external_lb",
    "attention_backend", "moe_backend", "enable_eplb", "enable_prefix_caching",
)


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
    ignored_flags: list[str] = field(default_factory=list)

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
    def stats_logging(self) -> bool:
        """vLLM prints the periodic stats lines only with one API server, never headless."""
        return not self.headless and self.api_server_count == 1 and not self.disable_log_stats


class UsageError(Exception):
    """A user-fixable problem with the argv; the message names what to fix."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launcher.sim serve", add_help=True,
                                allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    p.add_argument("--data-parallel-address", "-dpa", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=29550)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=0)
    p.add_argument("--data-parallel-backend", "-dpb", default=None)
    p.add_argument("--data-parallel-hybrid-lb", "-dph", action="store_true", default=None)
    p.add_argument("--data-parallel-external-lb", "-dpe", action="store_true", default=None)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true", default=None)
    p.add_argument("--enable-eplb", action="store_true", default=None)
    p.add_argument("--all2all-backend", default=None)
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-model-len", type=int, default=262144)
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--api-server-count", "-asc", type=int, default=None)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None)
    p.add_argument("--mamba-ssm-cache-dtype", default="auto")
    p.add_argument("--language-model-only", action="store_true", default=None)
    p.add_argument("--gdn-prefill-backend", default=None)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--moe-backend", default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--trust-remote-code", action="store_true", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true", default=None)
    p.add_argument("--disable-log-requests", action="store_true", default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--aggregate-engine-logging", action="store_true")
    p.add_argument("--enable-request-id-headers", action="store_true")
    p.add_argument("--sim-help", action="store_true", help="list the SIM_* knobs and exit")
    for name in knobs_mod.Knobs.names():
        p.add_argument(knobs_mod.flag_name(name), dest="sim_" + name, default=None)
    return p


def _unknown_flags(rest: list[str]) -> list[str]:
    """Names of unknown flags (values that follow them are not flags)."""
    return [tok.split("=", 1)[0] for tok in rest if tok.startswith("-") and tok != "-"]


def parse(argv: list[str], env: dict[str, str] | None = None) -> SimConfig:
    env = dict(os.environ) if env is None else env
    if not argv or argv[0] != "serve":
        raise UsageError("usage: python -m launcher.sim serve MODEL [vllm serve flags]; "
                         "the first argument must be 'serve'")
    parser = _parser()
    ns, rest = parser.parse_known_args(argv[1:])
    if ns.sim_help:
        print(knobs_mod.describe())
        raise SystemExit(0)
    model = ns.model_tag or ns.model
    if not model:
        raise UsageError("no model given: pass it as 'serve MODEL' like vllm serve")
    sim_flags = {n: getattr(ns, "sim_" + n) for n in knobs_mod.Knobs.names()
                 if getattr(ns, "sim_" + n) is not None}
    try:
        knobs = knobs_mod.load(env, sim_flags)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    kv: dict[str, Any] = {}
    if ns.kv_transfer_config:
        try:
            kv = json.loads(ns.kv_transfer_config)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--kv-transfer-config is not valid JSON: {exc}") from None
        if not isinstance(kv, dict):
            raise UsageError("--kv-transfer-config must be a JSON object")
        if kv.get("kv_connector") and not kv.get("kv_role"):
            raise UsageError("--kv-transfer-config sets kv_connector but no kv_role; "
                             "add \"kv_role\": \"kv_producer\" or \"kv_consumer\"")
    extra = kv.get("kv_connector_extra_config") or {}
    lease = float(extra.get("kv_lease_duration", knobs.kv_lease_s))

    dp = ns.data_parallel_size
    dpl = ns.data_parallel_size_local if ns.data_parallel_size_local is not None else dp
    if ns.headless and ns.api_server_count not in (None, 0):
        raise UsageError("--headless cannot be combined with --api-server-count > 0")
    if dp < 1 or dpl < 1 or ns.data_parallel_start_rank + dpl > dp:
        raise UsageError(
            f"data parallel ranks {ns.data_parallel_start_rank}.."
            f"{ns.data_parallel_start_rank + dpl - 1} do not fit --data-parallel-size {dp}")
    if ns.headless:
        api_count = 0
    elif ns.api_server_count is not None:
        api_count = ns.api_server_count
    elif ns.data_parallel_start_rank and not ns.headless:
        api_count = dpl  # hybrid LB: one API server per local rank
    else:
        api_count = dp
    block_size = ns.block_size or 16
    num_blocks = ns.num_gpu_blocks_override or max(1, knobs.kv_capacity_tokens // block_size)

    served = ns.served_model_name[0] if ns.served_model_name else model
    ignored = [
        "--" + name.replace("_", "-") for name in _UNMODELLED
        if getattr(ns, name, None) not in (None, False)
    ] + _unknown_flags(rest)
    base_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    return SimConfig(
        model=model,
        served_model_name=served,
        served_model_names=list(ns.served_model_name or [model]),
        host=ns.host,
        port=ns.port,
        dp_size=dp,
        dp_size_local=dpl,
        dp_start_rank=ns.data_parallel_start_rank,
        dp_address=ns.data_parallel_address or "127.0.0.1",
        dp_rpc_port=ns.data_parallel_rpc_port,
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
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        max_model_len=ns.max_model_len,
        stream_interval=max(1, ns.stream_interval),
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_dtype=ns.kv_cache_dtype,
        mamba_ssm_cache_dtype=ns.mamba_ssm_cache_dtype,
        disable_log_stats=ns.disable_log_stats,
        aggregate_engine_logging=ns.aggregate_engine_logging,
        request_id_headers=ns.enable_request_id_headers,
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"),
        side_channel_port=base_port,
        log_stats_interval=float(env.get("VLLM_LOG_STATS_INTERVAL", "10")),
        knobs=knobs,
        ignored_flags=ignored,
    )
