"""The engine side of the estimate: the vLLM flags that move the KV capacity, the
parallelism, the device and the sweep's workload."""

from __future__ import annotations

import json
from dataclasses import dataclass

from launcher.run import lengths as run_lengths
from launcher.run.lengths import Lengths


@dataclass(frozen=True)
class EngineArgs:
    """The vLLM flags that move the KV capacity (None = vLLM's default)."""

    block_size: int | None = None
    kv_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"  # conv state
    gpu_memory_utilization: float = 0.92  # CacheConfig default in 0.33 (config/cache.py:215)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None  # None: vLLM's default (on for generative models)
    prefix_caching_flag: str = ""  # the flag that decided it, as the command line has it
    gdn_prefill_backend: str = "auto"
    language_model_only: bool = False
    num_speculative_tokens: int = 0
    speculative_method: str = ""  # --speculative-config's method (mtp adds the MTP layers)
    attention_backend: str = ""  # --attention-backend (an MLA model's block size follows it)
    enforce_eager: bool = False
    # --attention-config's indexer dtype: a DeepSeek-V4 indexer keeps MXFP4 keys when it is
    # mxfp4 (or the older images' use_fp4_indexer_cache), FP8 otherwise (indexer.py:60-68)
    indexer_fp4: bool = False
    # on unless --no-async-scheduling: two batches in flight (config/vllm.py:588-609, 1685-1719)
    async_scheduling: bool = True
    hybrid_kv_cache_manager: bool = True  # off with --disable-hybrid-kv-cache-manager

    @classmethod
    def from_flags(cls, args: dict) -> EngineArgs:
        """From `{"kv-cache-dtype": "fp8", ...}` as a recipe writes vLLM flags. A value of the
        wrong kind (a list, `--help`, a bool for a JSON option) is a ValueError: vLLM's own
        parser names the flag at dry-run or preflight, the estimate just has none."""
        import argparse

        try:
            return cls._from_flags(args)
        except (TypeError, AttributeError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"a flag's value is not one vLLM reads ({e})") from None

    @property
    def mtp(self) -> bool:
        """Speculative decoding by the model's own MTP layers."""
        return bool(self.num_speculative_tokens) and \
            self.speculative_method in ("mtp", "deepseek_mtp")

    @classmethod
    def _from_flags(cls, args: dict) -> EngineArgs:

        def get(name, conv=None, default=None):
            v = args.get(name, args.get(name.replace("-", "_"), default))
            return conv(v) if conv and v is not None else v

        spec = _json_flag(args, "speculative-config")
        prefix, prefix_flag = prefix_caching_from_flags(args)
        attn = _json_flag(args, "attention-config")
        if not isinstance(attn, dict):  # vLLM's parser refuses it, in its own sentence
            attn = {}
        fp4 = str(attn.get("indexer_kv_dtype", "")).lower() == "mxfp4" or \
            attn.get("use_fp4_indexer_cache") is True
        async_flag = args.get("async-scheduling")
        if args.get("no-async-scheduling") is True:
            async_flag = False
        return cls(
            block_size=get("block-size", int),
            kv_cache_dtype=str(get("kv-cache-dtype", default="auto")),
            mamba_ssm_cache_dtype=str(get("mamba-ssm-cache-dtype", default="auto")),
            mamba_cache_dtype=str(get("mamba-cache-dtype", default="auto")),
            gpu_memory_utilization=get("gpu-memory-utilization", float, 0.92),
            max_num_seqs=get("max-num-seqs", int),
            max_num_batched_tokens=get("max-num-batched-tokens", _size),
            num_gpu_blocks_override=get("num-gpu-blocks-override", int),
            kv_cache_memory_bytes=get("kv-cache-memory-bytes", _size),
            max_model_len=get("max-model-len", _size),
            enable_prefix_caching=prefix,
            prefix_caching_flag=prefix_flag,
            gdn_prefill_backend=str(get("gdn-prefill-backend", default="auto")),
            language_model_only=bool(get("language-model-only", default=False)),
            num_speculative_tokens=int(spec.get("num_speculative_tokens", 0)),
            speculative_method=str(spec.get("method") or ""),
            attention_backend=str(get("attention-backend", default="") or ""),
            enforce_eager=bool(get("enforce-eager", default=False)),
            indexer_fp4=fp4,
            async_scheduling=async_flag is not False,
            hybrid_kv_cache_manager=args.get("disable-hybrid-kv-cache-manager") is not True,
        )


def _size(v) -> int | None:
    """vLLM's human_readable_int ("64M", "1.5g", "32k"; "auto"/-1 for the model's own
    length), as its parser reads these flags."""
    if isinstance(v, str) and not v.strip().lstrip("-").isdigit():
        if v.strip().lower() == "auto":
            return None
        from launcher.sim.argv import human_readable_int  # only for such values

        return human_readable_int(v)
    return None if int(v) == -1 else int(v)


def _json_flag(args: dict, name: str):
    """A JSON option's value as parsed ({} when not given)."""
    value = args.get(name) or {}
    return json.loads(value) if isinstance(value, str) else value


# vLLM 0.33's prefix-caching switches: --enable-prefix-caching is a BooleanOptionalAction
# (--no-enable-prefix-caching) that also answers to --disable-prefix-caching
# (engine/arg_utils.py:1401-1407, utils/argparse_utils.py:120-145); the last one given wins.
# A recipe writes them as keys: True gives --KEY, False gives --no-KEY (render.flags).
PREFIX_CACHING_KEYS = {
    "enable-prefix-caching": True,
    "no-enable-prefix-caching": False,
    "disable-prefix-caching": False,
}


def prefix_caching_from_flags(args: dict) -> tuple[bool | None, str]:
    """(enable_prefix_caching, the deciding flag) from a recipe's vLLM flags, in their order
    on the command line; (None, "") when none is given (vLLM's default then applies)."""
    on, flag = None, ""
    for key, value in args.items():
        name = str(key).replace("_", "-")
        if name not in PREFIX_CACHING_KEYS or value is None:
            continue
        positive = PREFIX_CACHING_KEYS[name]
        if value is False and not positive:
            raise ValueError(f"--no-{name} is not a vLLM 0.33 flag")
        on = positive if value is not False else not positive
        flag = f"--{name}" if value is not False else f"--no-{name}"
    return on, flag


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    dp: int = 1
    expert_parallel: bool = False
    pp: int = 1  # pipeline stages, each tp GPUs holding its share of the layers

    def stages(self, layers: int) -> list[tuple[int, int]]:
        """[start, end) of each pipeline stage's layers as vLLM splits them
        (distributed/utils.py get_pp_indices, VLLM_PP_LAYER_PARTITION unset): layers // pp
        each, the remainder one more each on the stages before the last."""
        sizes = [layers // self.pp] * self.pp
        for i in range(2, layers % self.pp + 2):
            sizes[-i] += 1
        starts = [sum(sizes[:i]) for i in range(self.pp)]
        return [(a, a + n) for a, n in zip(starts, sizes, strict=True)]

    @property
    def ep(self) -> int:
        """Ranks the routed experts are split over (EP spans TP x DP)."""
        return self.tp * self.dp if self.expert_parallel else self.tp


@dataclass(frozen=True)
class Device:
    """One accelerator. `memory_gib` is what CUDA reports as total (vLLM multiplies that
    by gpu-memory-utilization); `kind` picks the overhead defaults and, for "cpu", vLLM's
    CPU block-size rules."""

    memory_gib: float
    kind: str = "gb200"

    @property
    def platform(self) -> str:
        return "cpu" if self.kind == "cpu" else "cuda"


@dataclass(frozen=True)
class Workload:
    """The sweep's random lengths: ISL/OSL, range ratio and the rule that reads it
    (launcher.run.lengths: vLLM's by default, sa-bench's for the published workload)."""

    input_len: int
    output_len: int
    range_ratio: float | dict = 0.0  # a float, or {"input": r, "output": r} (vLLM's rule)
    num_special_tokens: int = 0  # the tokenizer's num_special_tokens_to_add() (Qwen: 0)
    prefix_len: int = 0
    rule: str = "vllm"
    template_len: int = 0  # the chat template's tokens, inside input_len (sa-bench's)




def default_batch_limits(device: Device) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's API server picks by device memory
    (engine/arg_utils.py:2973-3006)."""
    if device.memory_gib >= 160:
        return 16384, 1024
    if device.memory_gib >= 70:
        return 8192, 1024
    return 2048, 256


def in_flight_tokens(engine: EngineArgs, device: Device) -> int:
    """Tokens scheduled but not yet settled: one batch per concurrent step, two with async
    scheduling (config/vllm.py:587-608), which vLLM for CPU turns off (cpu-0.32
    platforms/cpu.py:331)."""
    batched = engine.max_num_batched_tokens or default_batch_limits(device)[0]
    both = engine.async_scheduling and device.platform != "cpu"
    return (2 if both else 1) * batched


def prefix_caching(engine: EngineArgs) -> tuple[bool, str]:
    """(on, why). Without a flag vLLM turns it on for every generative model, hybrid ones
    included (engine/arg_utils.py:3075-3076 from config/model.py:2276-2291)."""
    if engine.enable_prefix_caching is None:
        return True, "vLLM's default for a generative model"
    return engine.enable_prefix_caching, engine.prefix_caching_flag or (
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching"
    )


def random_dataset_lengths(w: Workload) -> Lengths:
    """The workload's bounds by its rule (launcher.run.lengths); vLLM's takes the special
    tokens off the input first, sa-bench's counts the chat template inside it."""
    return run_lengths.lengths(w.rule, w.input_len, w.output_len, w.range_ratio,
                               template_len=w.template_len, special_tokens=w.num_special_tokens,
                               prefix_len=w.prefix_len)
