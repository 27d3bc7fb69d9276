"""Simulation knobs: the one place where every SIM_* setting is defined.

Each knob is read from the environment variable ``SIM_<NAME>`` and can be overridden by
the matching ``--sim-<name>`` flag (dashes instead of underscores), so the launcher only has
to add env vars (or flags) for ``engine: sim``; the vLLM argv stays untouched.

Speed-model defaults are GB200-ish for Qwen3.5-397B-A17B-NVFP4 per DP rank (DEP): they
reproduce the orders of magnitude of vLLM 0.33's generated sample logs (docs/vllm-logs.md;
invented, not measured): ~25k prompt tok/s per prefill engine, ~30 ms decode steps at ~80
running, ~160 MB and ~30 ms per KV transfer.

Durations of the speed model are divided by ``SIM_SPEED``; fault timings
(``SIM_CRASH_AFTER_S``, ``SIM_START_DELAY_S``) are wall-clock seconds and are not scaled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class Knobs:
    """All simulation settings; see each field's ``doc`` metadata (printed by ``--sim-help``)."""

    speed: float = field(default=1.0, metadata=_doc(
        "Time scale of the speed model: >1 runs faster than real time (10 = ten times "
        "faster). Scales step, prefill and KV-transfer durations, not fault timers."))
    prefill_tokens_per_s: float = field(default=28000.0, metadata=_doc(
        "Prompt tokens one DP rank computes per second of GPU time (chunked prefill)."))
    step_base_ms: float = field(default=12.0, metadata=_doc(
        "Fixed cost of one engine step in ms (kernel launches, MoE all2all, sampling)."))
    decode_per_seq_ms: float = field(default=0.04, metadata=_doc(
        "Extra step time in ms per running sequence in the batch."))
    decode_per_ktoken_ms: float = field(default=0.008, metadata=_doc(
        "Extra step time in ms per 1000 context tokens summed over the decode batch "
        "(attention reads grow with context)."))
    kv_capacity_tokens: int = field(default=2_883_936, metadata=_doc(
        "KV-cache capacity per DP rank in tokens, used when --num-gpu-blocks-override is "
        "not given (num_gpu_blocks = capacity // block size)."))
    default_block_size: int = field(default=16, metadata=_doc(
        "The block size when --block-size is not given. vLLM picks its own for hybrid "
        "models (the page it unifies with the GDN state); the launcher sets this and "
        "kv_capacity_tokens from its KV estimate, so the simulator fills up where it says."))
    state_blocks_per_request: int = field(default=0, metadata=_doc(
        "Blocks a running request holds for its recurrent (GDN/Mamba) state besides the "
        "blocks of its tokens, as vLLM's hybrid allocator charges them: one per GDN group "
        "(plus one per speculative token), with prefix caching on or off (vLLM 0.33's align "
        "mode keeps one more for the single step after a block boundary, not modelled); the "
        "launcher sets this from its KV estimate."))
    kv_bytes_per_token: int = field(default=15360, metadata=_doc(
        "KV bytes per prompt token moved by a NIXL transfer (full-attention layers; "
        "Qwen3.5: 2 x 2 KV heads x 256 dim x 15 layers x 1 byte fp8)."))
    kv_state_bytes: int = field(default=47_185_920, metadata=_doc(
        "Constant per-request state bytes moved by a NIXL transfer (GDN/Mamba SSM state)."))
    kv_bandwidth_gbps: float = field(default=5.0, metadata=_doc(
        "Effective NIXL read bandwidth per transfer in GB/s (1e9 bytes/s)."))
    kv_post_ms: float = field(default=2.4, metadata=_doc(
        "Time to post a NIXL transfer to the backend, in ms (vllm:nixl_post_time_seconds)."))
    kv_lease_s: float = field(default=30.0, metadata=_doc(
        "Seconds a prefill holds un-pulled KV blocks before they expire (NIXL "
        "kv_lease_duration; a value in --kv-transfer-config extra config wins)."))
    chars_per_token: float = field(default=4.0, metadata=_doc(
        "Characters per token for text prompts when no tokenizer is given."))
    tokenizer: str = field(default="", metadata=_doc(
        "A tokenizer.json (or the model folder holding one): text prompts are counted as "
        "vLLM counts a completion prompt, special tokens included, instead of by "
        "chars_per_token; needs the tokenizers package where the simulator runs."))
    crash_after_s: float = field(default=0.0, metadata=_doc(
        "Fault: the process exits non-zero this many wall-clock seconds after start "
        "(0 = never)."))
    crash_cause: str = field(default="", metadata=_doc(
        "Fault: what the crash of crash_after_s logs before the engine dies, as vLLM 0.33 "
        "would: 'oom' (CUDA out of memory), 'nccl' (an NCCL error), 'exception' (a Python "
        "error), or '' (the process only vanishes)."))
    hang_before_healthy: bool = field(default=False, metadata=_doc(
        "Fault: the engine never finishes loading, so the HTTP port never opens and "
        "/health never answers."))
    start_delay_s: float = field(default=0.0, metadata=_doc(
        "Fault: extra wall-clock seconds of 'model loading' before the server opens; vLLM's "
        "checkpoint progress lines are spread over it (see launcher.sim.loading)."))
    checkpoint_shards: int = field(default=8, metadata=_doc(
        "Number of safetensors shards of the simulated checkpoint: the 'Loading safetensors "
        "checkpoint shards: ... i/N' progress lines count to it."))
    model_weights_gib: float = field(default=27.46, metadata=_doc(
        "GiB of weights per GPU reported by 'Model loading took X GiB memory ...'."))
    ucx_transport: str = field(default="cuda_ipc", metadata=_doc(
        "UCX transport the decode's KV reads use, printed in UCX's protocol table when the "
        "engine runs with UCX_PROTO_INFO=y (first KV transfer). 'tcp' imitates a silent TCP "
        "fall-back; 'tl/device' (e.g. 'rc_mlx5/mlx5_0:1') sets the device too."))
    zero_tokens: bool = field(default=False, metadata=_doc(
        "Fault: every request finishes with zero generated tokens (finish_reason stop)."))
    wrong_answers: bool = field(default=False, metadata=_doc(
        "Fault: accuracy collapse, every GSM8K answer is wrong."))
    kv_fail_fraction: float = field(default=0.0, metadata=_doc(
        "Fault: fraction (0..1) of KV transfers that fail (deterministic per request id): "
        "on a decode its pulls fail, on a prefill its blocks cannot be read; the decode "
        "counts them in vllm:nixl_num_failed_transfers."))
    answer_key: str = field(default="", metadata=_doc(
        "Path to a GSM8K-format jsonl ({'question','answer'} ending in '#### N'); the sim "
        "answers the last 'Question:' of the prompt with '... #### N' (GSM8K's format)."))
    accuracy: float = field(default=0.9, metadata=_doc(
        "Fraction of answer-key questions answered correctly (chosen by a hash of the "
        "question, so it is deterministic)."))
    handshake_delay_s: float = field(default=0.0, metadata=_doc(
        "Fault: a decode's first NIXL handshake with each prefill engine takes this many "
        "more wall-clock seconds (a slow first handshake); the requests waiting on it wait, "
        "and a prefill whose lease runs out meanwhile has freed their blocks, as in vLLM."))
    connect_timeout_s: float = field(default=5.0, metadata=_doc(
        "Timeout for side-channel (KV pull) connects and replies, wall-clock seconds."))
    store_python: str = field(default="", metadata=_doc(
        "The Python that has Mooncake's store client (mooncake.store, from the "
        "mooncake-transfer-engine wheel), used when --kv-transfer-config names "
        "MooncakeStoreConnector: the engine runs its store client with it. Empty: the python "
        "beside mooncake_master on PATH, else the simulator's own."))
    offload_bandwidth_gbps: float = field(default=100.0, metadata=_doc(
        "Copy bandwidth between GPU and host memory of a CPU offload tier "
        "(OffloadingConnector, SimpleCPUOffloadConnector), in GB/s each way (invented, not "
        "measured)."))
    spec_accept: float = field(default=0.8, metadata=_doc(
        "With --speculative-config: the chance that each draft position is accepted given the "
        "one before it was (a step's tokens are 1 + the accepted run); the acceptance rate "
        "vLLM reports follows from it."))
    headless_wait_s: float = field(default=600.0, metadata=_doc(
        "How long a headless part (or a hybrid-LB front on another node) keeps retrying to "
        "reach the head's DP RPC address."))

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def doc(cls, name: str) -> str:
        for f in fields(cls):
            if f.name == name:
                return str(f.metadata.get("doc", ""))
        raise KeyError(name)


def env_name(name: str) -> str:
    return "SIM_" + name.upper()


def flag_name(name: str) -> str:
    return "--sim-" + name.replace("_", "-")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(name: str, kind: Any, raw: str) -> Any:
    try:
        if kind in (bool, "bool"):
            low = raw.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(raw)
        if kind in (int, "int"):
            return int(float(raw))
        if kind in (float, "float"):
            return float(raw)
        return raw
    except ValueError:
        raise ValueError(
            f"{env_name(name)} / {flag_name(name)} has an invalid value {raw!r}") from None


def load(env: dict[str, str] | None = None, flags: dict[str, str] | None = None) -> Knobs:
    """Knobs from ``env`` (default os.environ) overridden by ``flags`` (name -> raw value)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in fields(Knobs):
        raw = env.get(env_name(f.name))
        if flags and f.name in flags:
            raw = flags[f.name]
        if raw is not None:
            values[f.name] = _convert(f.name, f.type, raw)
    for name, value in values.items():
        if why := out_of_range(name, value):
            raise ValueError(f"{env_name(name)} {why}")
    return Knobs(**values)


POSITIVE = frozenset({"speed", "prefill_tokens_per_s", "kv_bandwidth_gbps", "chars_per_token",
                      "offload_bandwidth_gbps",
                      "default_block_size", "kv_capacity_tokens", "checkpoint_shards"})
FRACTIONS = frozenset({"kv_fail_fraction", "accuracy"})
CHOICES = {"crash_cause": ("", "oom", "nccl", "exception")}


def out_of_range(name: str, value: Any) -> str | None:
    """Why a knob's value cannot be simulated ('must be > 0', ...), or None. One rule for the
    simulator's environment and the recipe's `sim:` section, so the dry-run refuses what the
    engine would."""
    if name in CHOICES and value not in CHOICES[name]:
        return "must be one of " + ", ".join(repr(c) for c in CHOICES[name])
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if name in POSITIVE and not value > 0:
        return "must be > 0"
    if name in FRACTIONS and not 0 <= value <= 1:
        return "must be between 0 and 1"
    if value < 0:
        return "must be >= 0"
    return None


def unknown_env(env: dict[str, str] | None = None) -> list[str]:
    """SIM_* variables that are not knobs (typos in a recipe's sim: section)."""
    env = os.environ if env is None else env
    known = {env_name(n) for n in Knobs.names()}
    return sorted(k for k in env if k.startswith("SIM_") and k not in known)


def describe() -> str:
    """Human-readable list of all knobs (for --sim-help)."""
    lines = []
    for f in fields(Knobs):
        lines.append(f"{env_name(f.name)} / {flag_name(f.name)} (default {f.default!r})")
        lines.append(f"    {f.metadata.get('doc', '')}")
    return "\n".join(lines)
