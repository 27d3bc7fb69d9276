"""KV-cache capacity of one vLLM 0.33 engine, mirroring vLLM's own accounting.

Pure arithmetic on facts (`read_checkpoint` is the one function that reads files: the
checkpoint's config.json and quantization config). Every rule here restates a fact of vLLM 0.33.0 that
docs/kv-capacity.md cites by file and line; nothing is copied from vLLM. The shape:

1. memory for the cache per GPU = ceil(total x gpu-memory-utilization) - weights
   - (activation peak + other persistent memory + CUDA graphs)   [the last three: assumptions]
2. hybrid models (GDN/Mamba + attention): vLLM grows the attention block until one
   attention page (block_size tokens x bytes/token, one layer) covers one GDN state,
   then pads the GDN page to exactly that size, so every layer's page is equal;
3. layers are grouped (15 attention, 3 x 15 GDN for Qwen3.5-397B), each block id holds
   one page for every layer of a group, so blocks = memory // (layers_per_group x page);
4. a running request holds ceil(tokens / block_size) blocks per attention group plus one
   block per GDN group (its state), whatever its length, with prefix caching on or off:
   with it on (mamba_cache_mode "align") vLLM keeps the state of the last block boundary
   one step longer, so a request holds a second state block per GDN group only for the
   step after it crosses a boundary (v1/core/single_type_kv_cache_manager.py:1629-1657,
   1775-1795). What prefix caching changes is the block: in align mode FlashInfer's GDN
   prefill puts the block on its 64-token checkpoint grid (platforms/interface.py:1089-1094).

With data-parallel attention (DEP) each DP rank is its own engine with TP=1, so the
numbers below are per DP rank; the endpoint holds DP times as many requests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.planning import kv_compressed
from launcher.run import lengths as run_lengths
from launcher.run.lengths import Lengths

if TYPE_CHECKING:
    from launcher.schema.sections import DeclaredFacts

GIB = 1 << 30
MIB = 1 << 20

# Bytes per element of the dtypes a cache or a weight can have.
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2}
DTYPE_BYTES |= {"bfloat16": 2, "bf16": 2}
ONE_BYTE_KV = {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "int8"}
NVFP4_KV = {"nvfp4", "nvfp4_4over6"}
# ModelOpt kv_cache_quant_algo -> vLLM cache dtype (vllm/utils/torch_utils.py:78-81).
MODELOPT_KV = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
# Architectures whose --mamba-ssm-cache-dtype "auto" means config.json's mamba_ssm_dtype
# (vllm/model_executor/models/config.py:953-977, 1259-1262).
QWEN35_ARCHS = {
    f"Qwen3_5{moe}For{kind}"
    for moe in ("", "Moe")
    for kind in ("CausalLM", "ConditionalGeneration")
}
# config.json fields the estimate reads (text_config for multimodal checkpoints).
CONFIG_FIELDS = (
    "layer_types",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "mamba_ssm_dtype",
    "max_position_embeddings",
)
# where the facts of a known checkpoint come from (launcher/planning/capacity.known_facts)
KNOWN_FACTS_SOURCE = "launcher/data/model-facts.yaml"
# FlashInfer's GDN prefill emits states every 64 tokens (v1/attention/backends/gdn_attn.py:34).
FLASHINFER_GDN_ALIGNMENT = 64


# ----- inputs ------------------------------------------------------------------------------


class NoEstimate(ValueError):
    """The estimate does not model this model: said in one sentence, never a guess."""



def _size(n: int) -> str:
    """Bytes as a person reads them: 96 MiB, 1.5 GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB" if n >= MIB else \
        f"{n / 1024:.0f} KiB"

@dataclass(frozen=True)
class WeightFacts:
    """Parameter counts by storage format: what config.json alone cannot say."""

    dense_params: int  # stored in the model dtype; every EP rank holds a copy (split by TP)
    expert_params: int  # routed experts of all layers; split over the EP group
    expert_format: str = "nvfp4"  # nvfp4 | fp8 | bf16
    group_size: int = 16  # NVFP4 block size: one FP8 E4M3 scale per 16 weights
    mtp_params: int = 0  # loaded only with speculative decoding (MTP)
    vision_params: int = 0  # not loaded with --language-model-only
    source: str = "recipe"
    # as a recipe declares them: bits per stored weight (0: by expert_format / model dtype)
    expert_bits: float = 0.0
    dense_bits: float = 0.0
    # without a count of MTP weights, an MTP layer weighs one of the `layers` decoder layers
    layers: int = 0
    mtp_layers: int = 0

    @classmethod
    def from_billions(cls, dense_b: float, expert_b: float, **kw) -> WeightFacts:
        return cls(dense_params=round(dense_b * 1e9), expert_params=round(expert_b * 1e9), **kw)

    def expert_bytes_per_param(self) -> float:
        """NVFP4: 4 bits + one FP8 scale per group (the per-tensor FP32 scales are noise)."""
        if self.expert_bits:
            return self.expert_bits / 8
        if self.expert_format == "nvfp4":
            return 0.5 + 1 / self.group_size
        if self.expert_format == "fp8":
            return 1.0
        return float(DTYPE_BYTES[self.expert_format])


@dataclass(frozen=True)
class ModelFacts:
    """What config.json (text_config for multimodal checkpoints) says, plus the weights."""

    full_attention_layers: int
    num_kv_heads: int
    head_dim: int
    linear_attention_layers: int = 0  # GDN layers
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    mamba_ssm_dtype: str | None = None  # config's field; Qwen3.5 uses it for "auto"
    dtype: str = "bfloat16"  # model dtype (torch_dtype)
    architecture: str = ""
    max_position_embeddings: int = 0
    kv_cache_quant_algo: str | None = None  # vLLM cache dtype the checkpoint asks for, if any
    other_layers: int = 0  # layer types this estimate does not model (sliding window, ...)
    # why vLLM's accounting of this architecture is not the one modelled here ("": it is)
    unmodelled: str = ""
    # multi-head latent attention: kv_lora_rank + qk_rope_head_dim, one latent per token and
    # layer, not split by TP (model_executor/layers/attention/mla_attention.py:480, 1371-1399)
    mla_latent_dim: int = 0
    mtp_layers: int = 0  # num_nextn_predict_layers: MTP layers with the same cache (MLA, V4)
    # DeepSeek-V4's compressed sparse attention: each layer's compress ratio (1: sliding
    # window only, 4: CSA, 128: HCA), its window and the indexer's head (kv_compressed.py)
    compress_ratios: tuple[int, ...] = ()
    sliding_window: int = 0
    index_head_dim: int = 0
    weights: WeightFacts | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    @classmethod
    def from_config(
        cls,
        cfg: dict,
        quant: dict | None = None,
        source: str = "config.json",
        weights: WeightFacts | None = None,
    ) -> ModelFacts:
        """Facts from a parsed config.json; `quant` is its quantization_config or the
        checkpoint's hf_quant_config.json."""
        t = cfg.get("text_config") or cfg
        types = layer_types(t)
        heads = t.get("num_attention_heads") or 1
        kv_algo, kv_src = kv_dtype_from_quant_config(quant)
        where = f"{source}:text_config." if "text_config" in cfg else f"{source}:"
        src = {k: where + k for k in CONFIG_FIELDS if k in t}
        if kv_src:
            src["kv_cache_quant_algo"] = kv_src
        ratios = compress_ratios(t)
        mla = 0 if ratios else mla_latent(t)
        if ratios:
            src |= {k: where + k for k in DSV4_FIELDS if k in t}
        return cls(
            unmodelled=unmodelled_attention(t, types),
            mla_latent_dim=mla,
            mtp_layers=int(t.get("num_nextn_predict_layers") or 0) if mla or ratios else 0,
            compress_ratios=ratios,
            sliding_window=int(t.get("sliding_window") or 0) if ratios else 0,
            index_head_dim=int(t.get("index_head_dim") or 0) if ratios else 0,
            full_attention_layers=len(ratios) or sum(x == "full_attention" for x in types),
            linear_attention_layers=0 if ratios else sum(x == "linear_attention" for x in types),
            other_layers=0 if ratios else sum(
                x not in ("full_attention", "linear_attention") for x in types),
            num_kv_heads=1 if mla else t.get("num_key_value_heads") or heads,
            head_dim=mla or t.get("head_dim") or t.get("hidden_size", 0) // heads,
            linear_num_key_heads=t.get("linear_num_key_heads", 0),
            linear_num_value_heads=t.get("linear_num_value_heads", 0),
            linear_key_head_dim=t.get("linear_key_head_dim", 0),
            linear_value_head_dim=t.get("linear_value_head_dim", 0),
            linear_conv_kernel_dim=t.get("linear_conv_kernel_dim", 4),
            mamba_ssm_dtype=t.get("mamba_ssm_dtype"),
            dtype=str(
                t.get("torch_dtype") or t.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
            ),
            architecture=(cfg.get("architectures") or [""])[0],
            max_position_embeddings=t.get("max_position_embeddings", 0),
            kv_cache_quant_algo=kv_algo,
            weights=weights,
            sources=src,
        )

    @classmethod
    def from_declared(cls, facts: DeclaredFacts, architecture: str = "",
                      given_by: str = "recipe") -> ModelFacts:
        """From a recipe's `model.facts` (counts instead of layer_types): the fallback when
        the checkpoint is not on this machine. Non-expert parameters are stored in the
        model dtype; the rest are routed experts, NVFP4 when weight_bits is under 8.
        `kv_cache_quant_algo` stands in for the checkpoint's quant config."""
        weights, kv_algo = None, facts.kv_cache_quant_algo  # e.g. "FP8", as ModelOpt
        if facts.total_params_b:
            fmt = "nvfp4" if facts.weight_bits < 8 else "fp8" if facts.weight_bits < 16 \
                else "bf16"
            weights = WeightFacts.from_billions(
                facts.dense_params_b, facts.total_params_b - facts.dense_params_b,
                expert_format=fmt, expert_bits=facts.weight_bits,
                dense_bits=facts.dense_weight_bits or 0.0,
                layers=facts.full_attention_layers + facts.gdn_layers,
                mtp_layers=facts.mtp_layers)
        return cls(
            full_attention_layers=facts.full_attention_layers,
            linear_attention_layers=facts.gdn_layers,
            num_kv_heads=1 if facts.mla_latent_dim else facts.num_kv_heads,
            head_dim=facts.mla_latent_dim or facts.head_dim,
            mla_latent_dim=facts.mla_latent_dim,
            mtp_layers=facts.mtp_layers,
            compress_ratios=tuple(  # the MTP entries past the layers are left out, as vLLM does
                max(1, r) for r in (facts.compress_ratios or ())[:facts.full_attention_layers]),
            sliding_window=facts.sliding_window or 0,
            index_head_dim=facts.index_head_dim or 0,
            unmodelled=facts.compressed_attention_gap(),
            linear_num_key_heads=facts.gdn_key_heads,
            linear_num_value_heads=facts.gdn_value_heads,
            linear_key_head_dim=facts.gdn_key_head_dim,
            linear_value_head_dim=facts.gdn_value_head_dim,
            linear_conv_kernel_dim=facts.conv_kernel,
            mamba_ssm_dtype=facts.ssm_state_dtype,
            architecture=architecture,
            kv_cache_quant_algo=MODELOPT_KV.get(str(kv_algo).lower(), "auto") if kv_algo else None,
            max_position_embeddings=facts.max_position_embeddings or 0,
            weights=weights,
            sources={k: given_by for k in facts.model_dump(exclude_unset=True)},
        )


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

    @classmethod
    def _from_flags(cls, args: dict) -> EngineArgs:

        def get(name, conv=None, default=None):
            v = args.get(name, args.get(name.replace("-", "_"), default))
            return conv(v) if conv and v is not None else v

        def size(v) -> int | None:
            """vLLM's human_readable_int ("64M", "1.5g", "32k"; "auto"/-1 for the model's
            own length), as its parser reads these flags."""
            if isinstance(v, str) and not v.strip().lstrip("-").isdigit():
                if v.strip().lower() == "auto":
                    return None
                from launcher.sim.argv import human_readable_int  # only for such values

                return human_readable_int(v)
            return None if int(v) == -1 else int(v)

        spec = args.get("speculative-config") or {}
        if isinstance(spec, str):
            spec = json.loads(spec)
        prefix, prefix_flag = prefix_caching_from_flags(args)
        attn = args.get("attention-config") or {}
        if isinstance(attn, str):
            attn = json.loads(attn)
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
            max_num_batched_tokens=get("max-num-batched-tokens", size),
            num_gpu_blocks_override=get("num-gpu-blocks-override", int),
            kv_cache_memory_bytes=get("kv-cache-memory-bytes", size),
            max_model_len=get("max-model-len", size),
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


@dataclass(frozen=True)
class Overheads:
    """Memory vLLM measures at start-up and that no formula gives: all assumptions."""

    activation_peak_gib: float  # torch peak above steady allocations during profile_run
    non_torch_gib: float  # NCCL/all2all buffers, workspaces, allocator slack
    cudagraph_gib: float  # CUDA-graph pool estimate (subtracted by default since 0.21)
    why: str = "default"

    @property
    def total_bytes(self) -> int:
        return round((self.activation_peak_gib + self.non_torch_gib + self.cudagraph_gib) * GIB)


# Per GPU class: (activation peak GiB at the default max-num-batched-tokens, that default,
# non-torch GiB, CUDA graphs GiB). Assumptions, documented in docs/kv-capacity.md.
OVERHEAD_DEFAULTS = {
    "blackwell": (6.0, 16384, 2.0, 2.0),  # GB200/B200/GB300: >= 160 GiB
    "hopper": (4.0, 8192, 1.5, 1.5),  # H100/H200: >= 70 GiB
    "small": (2.0, 2048, 1.0, 1.0),
    "cpu": (0.0, 4096, 0.0, 0.0),
}


def gpu_class(device: Device) -> str:
    kind = device.kind.lower()
    if kind == "cpu":
        return "cpu"
    if kind.startswith(("gb", "b2", "b3")) or device.memory_gib >= 160:
        return "blackwell"
    if kind.startswith("h") or device.memory_gib >= 70:
        return "hopper"
    return "small"


def default_batch_limits(device: Device) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM's API server picks by device memory
    (engine/arg_utils.py:2973-3006)."""
    if device.memory_gib >= 160:
        return 16384, 1024
    if device.memory_gib >= 70:
        return 8192, 1024
    return 2048, 256


def default_overheads(
    device: Device, max_num_batched_tokens: int | None = None, enforce_eager: bool = False
) -> Overheads:
    """The activation peak scales with the tokens of the profiling run (assumed linear)."""
    cls = gpu_class(device)
    act, act_tokens, other, graphs = OVERHEAD_DEFAULTS[cls]
    tokens = max_num_batched_tokens or act_tokens
    act *= tokens / act_tokens
    graphs = 0.0 if enforce_eager else graphs
    return Overheads(round(act, 2), other, graphs, why=f"{cls} default at {tokens} batched tokens")


# ----- facts from a checkpoint -------------------------------------------------------------


def unmodelled_attention(t: dict, types: list[str]) -> str:
    """Why a config.json's attention is not what this estimate models ("" when it is): its
    keys that change vLLM's KV cache (docs/kv-architectures.md), so that such a model gets
    "no estimate", never a wrong number."""
    if "compress_ratios" in t or "compress_rates" in t:
        odd = [r for r in _listed_ratios(t) if not _is_ratio(r)]
        if odd:
            shown = ", ".join(sorted({repr(r) for r in odd}))
            return (f"its compress ratios [{shown}] are not DeepSeek-V4's (0 or 1, 4, 128; "
                    "vLLM's compressor takes no other)")
        ratios = compress_ratios(t)
        missing = [k for k in ("num_hidden_layers", "sliding_window", "index_head_dim")
                   if not t.get(k)]
        if missing or not ratios:
            return ("its compressed sparse attention lacks " + ", ".join(missing or
                    ["its per-layer compress ratios"]) + " in config.json")
        return ""
    if "index_topk" in t:
        return "its sparse attention indexer (index_topk) is not modelled yet"
    others = sorted({x for x in types if x not in ("full_attention", "linear_attention")})
    if others:
        return f"its {', '.join(others)} layers are not modelled yet"
    if t.get("use_sliding_window") is True and t.get("sliding_window"):
        return "its sliding-window attention (use_sliding_window) is not modelled yet"
    return ""


# config.json keys DeepSeek-V4's cache follows (beyond num_hidden_layers)
DSV4_FIELDS = ("compress_ratios", "compress_rates", "layer_types", "sliding_window",
               "index_head_dim", "num_nextn_predict_layers")


def _listed_ratios(t: dict) -> list:
    """config.json's compress ratios as written, one per decoder layer: the legacy
    `compress_ratios` list or `layer_types` + `compress_rates`; the MTP layers that the list
    may carry after num_hidden_layers are left out (transformers_utils/deepseek_v4_utils.py:
    6-18, attention.py:236-242)."""
    if isinstance(t.get("compress_ratios"), list):
        ratios = t["compress_ratios"]
    elif isinstance(t.get("compress_rates"), dict) and isinstance(t.get("layer_types"), list):
        ratios = [t["compress_rates"].get(x, 0) if isinstance(x, str) else x
                  for x in t["layer_types"]]
    else:
        return []
    n = t.get("num_hidden_layers")
    return ratios[:n] if isinstance(n, int) and n > 0 else ratios


def _is_ratio(r) -> bool:
    return r is None or (isinstance(r, int) and not isinstance(r, bool)
                         and max(1, r) in kv_compressed.RATIOS)


def compress_ratios(t: dict) -> tuple[int, ...]:
    """Each decoder layer's compress ratio (1 for a sliding-window-only layer); () when a
    value is not one (unmodelled_attention names it)."""
    ratios = _listed_ratios(t)
    if not all(_is_ratio(r) for r in ratios):
        return ()
    return tuple(max(1, r or 0) for r in ratios)


def mla_latent(t: dict) -> int:
    """The latent an MLA layer caches per token (kv_lora_rank + qk_rope_head_dim), 0 for
    other attention. vLLM uses MLA for DeepSeek-V2/V3-style configs unless both qk head dims
    are 0 (model_executor/models/deepseek_v2.py:1277-1284)."""
    rank = t.get("kv_lora_rank")
    if not rank:
        return 0
    return int(rank) + int(t.get("qk_rope_head_dim") or 0)


# MLA backends' default block on CUDA when --block-size is not given (their smallest kernel
# block; v1/attention/backends/mla/*.py, docs/kv-architectures.md section 2); FLASHINFER_MLA
# leads the SM100 order (platforms/cuda.py:96-133).
MLA_BLOCK = {"FLASHINFER_MLA": 32, "FLASHMLA": 64, "CUTLASS_MLA": 128, "TOKENSPEED_MLA": 32,
             "TRITON_MLA": 16, "FLASH_ATTN_MLA": 16}


def layer_types(t: dict) -> list[str]:
    """config.json's layer_types, else Qwen3-Next's full_attention_interval rule."""
    if isinstance(t.get("layer_types"), list) and t["layer_types"]:
        return [str(x) for x in t["layer_types"]]
    n = t.get("num_hidden_layers", 0)
    every = t.get("full_attention_interval")
    if every:
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    return ["full_attention"] * n


def kv_dtype_from_quant_config(quant: dict | None) -> tuple[str | None, str]:
    """The cache dtype `--kv-cache-dtype auto` resolves to, from a ModelOpt quant config.

    vLLM only reads it when the config's quant_method starts with "modelopt"; a ModelOpt
    producer gets that method from its quant_algo (transformers_utils/
    model_arch_config_convertor.py:248-281, utils/torch_utils.py:443-516).
    Returns (None, "") when the checkpoint does not ask for a KV dtype."""
    if not isinstance(quant, dict):
        return None, ""
    inner = (
        quant.get("quantization", quant) if isinstance(quant.get("quantization"), dict) else quant
    )
    method = str(quant.get("quant_method", "")).lower()
    producer = (
        (quant.get("producer") or {}).get("name")
        if isinstance(quant.get("producer"), dict)
        else None
    )
    if producer == "modelopt" or "modelopt_quant_config" in inner:
        method = "modelopt"
    if not method.startswith("modelopt"):
        return None, ""
    keys = ("kv_cache_scheme", "kv_cache_quant_algo")  # vLLM's order of preference
    algo = next((d.get(k) for k in keys for d in (inner, quant) if d.get(k)), None)
    if algo is None:
        return None, ""
    if isinstance(algo, dict):
        if (
            algo.get("dynamic") is False
            and algo.get("num_bits") == 8
            and algo.get("type") == "float"
        ):
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
        else:
            return "auto", "kv_cache_scheme (unknown to vLLM: auto)"
    return MODELOPT_KV.get(str(algo).lower(), "auto"), f"kv_cache_quant_algo={algo}"


def read_checkpoint(path: str | Path, weights: WeightFacts | None = None) -> ModelFacts | None:
    """Facts from a local checkpoint: config.json (text_config for multimodal ones) and the
    KV dtype from config.json's quantization_config, else hf_quant_config.json (the order
    vLLM uses, transformers_utils/config.py:951-963). Weights are counted from the config
    for Qwen3-Next/Qwen3.5 MoE unless given. None when there is no readable config.json."""
    root = Path(path).expanduser()
    try:
        cfg = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    quant, qsrc = cfg.get("quantization_config"), f"{root}/config.json:quantization_config"
    if quant is None:
        try:
            quant = json.loads((root / "hf_quant_config.json").read_text(encoding="utf-8"))
            qsrc = f"{root}/hf_quant_config.json"
        except (OSError, ValueError):
            quant = None
    text = cfg.get("text_config") or cfg
    if weights is None and "num_experts" in text and "linear_num_value_heads" in text:
        src = f"counted from {root}/config.json"
        weights = count_qwen3_next_params(text, expert_format(quant), source=src)
    facts = ModelFacts.from_config(cfg, quant, source=f"{root}/config.json", weights=weights)
    if facts.kv_cache_quant_algo is not None:
        facts.sources["kv_cache_quant_algo"] = f"{qsrc} ({facts.sources['kv_cache_quant_algo']})"
    return facts


def expert_format(quant: dict | None) -> str:
    """Routed-expert storage from a ModelOpt config (NVFP4 checkpoints: experts only)."""
    if not isinstance(quant, dict):
        return "bf16"
    inner = (
        quant.get("quantization", quant) if isinstance(quant.get("quantization"), dict) else quant
    )
    algo = str(inner.get("quant_algo") or quant.get("quant_algo") or "").upper()
    return {"NVFP4": "nvfp4", "FP8": "fp8"}.get(algo, "bf16")


def count_qwen3_next_params(
    t: dict, expert_format: str = "bf16", source: str = "config.json"
) -> WeightFacts:
    """Parameters of a Qwen3-Next / Qwen3.5 MoE text model, split into routed experts and
    the rest (what vLLM allocates: in_proj_qkvz/ba, conv1d, gated q_proj, shared expert)."""
    h, vocab = t["hidden_size"], t["vocab_size"]
    types = layer_types(t)
    nh = t["num_attention_heads"]
    nkv, hd = t.get("num_key_value_heads") or nh, t.get("head_dim") or h // nh
    q_out = nh * hd * (2 if t.get("attn_output_gate", True) else 1)  # query + output gate
    attn = h * q_out + 2 * h * nkv * hd + nh * hd * h + 2 * hd  # + q_norm, k_norm
    nk, nv = t.get("linear_num_key_heads", 0), t.get("linear_num_value_heads", 0)
    dk, dv = t.get("linear_key_head_dim", 0), t.get("linear_value_head_dim", 0)
    conv_dim = 2 * nk * dk + nv * dv
    in_proj = h * (conv_dim + nv * dv) + h * 2 * nv  # in_proj_qkvz + in_proj_ba
    conv1d = conv_dim * t.get("linear_conv_kernel_dim", 4)
    gdn = in_proj + conv1d + 2 * nv + dv + nv * dv * h  # + dt_bias, A_log, norm, out_proj
    n_exp, inter = t["num_experts"], t["moe_intermediate_size"]
    shared = t.get("shared_expert_intermediate_size", 0)
    router_shared = h * n_exp + (3 * h * shared + h if shared else 0)
    experts = n_exp * 3 * h * inter
    dense_mlp = 3 * h * t.get("intermediate_size", 0)
    mlp_only = set(t.get("mlp_only_layers") or [])
    step = t.get("decoder_sparse_step", 1) or 1
    sparse = [i not in mlp_only and (i + 1) % step == 0 for i in range(len(types))]
    dense = sum(attn if x == "full_attention" else gdn for x in types)
    dense += sum(router_shared if s else dense_mlp for s in sparse)
    dense += 2 * h * len(types) + h + vocab * h * (1 if t.get("tie_word_embeddings") else 2)
    mtp = t.get("mtp_num_hidden_layers", 0) * (attn + router_shared + experts + 2 * h * h + 5 * h)
    return WeightFacts(dense, experts * sum(sparse), expert_format, mtp_params=mtp, source=source)


# ----- the accounting ----------------------------------------------------------------------


def dtype_bytes(name: str, what: str) -> int:
    try:
        return DTYPE_BYTES[name.lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"{what}: dtype {name!r} is not one this estimate knows") from None


def resolve_kv_cache_dtype(flag: str, model: ModelFacts) -> tuple[str, str]:
    """(cache dtype, why). "auto" follows the checkpoint's ModelOpt KV algo, else the model
    dtype (engine/arg_utils.py:2296-2299)."""
    if flag != "auto":
        return flag, f"--kv-cache-dtype {flag}"
    if model.kv_cache_quant_algo and model.kv_cache_quant_algo != "auto":
        where = model.sources.get("kv_cache_quant_algo", "the checkpoint's quant config")
        return model.kv_cache_quant_algo, f"from {where}"
    return "auto", f"auto = model dtype {model.dtype} (checkpoint asks for no KV quantization)"


def kv_bytes_per_token(model: ModelFacts, kv_dtype: str, tp: int) -> int:
    """K and V of one token in one attention layer on one GPU. KV heads split over TP and
    are replicated when TP exceeds them (config/model.py:1683); NVFP4 packs head/2 bytes of
    data and head/16 of FP8 scales per head (utils/torch_utils.py nvfp4_kv_cache_full_dim)."""
    if model.mla_latent_dim:  # one latent, no V, the same on every TP rank
        if kv_dtype == "auto":
            return model.mla_latent_dim * dtype_bytes(model.dtype, "model")
        if kv_dtype in ONE_BYTE_KV:
            return model.mla_latent_dim
        if kv_dtype in NVFP4_KV:
            raise NoEstimate(f"an MLA cache in {kv_dtype} is not modelled (vLLM's sparse MLA "
                             "formats only)")
        return model.mla_latent_dim * dtype_bytes(kv_dtype, "--kv-cache-dtype")
    heads = max(1, model.num_kv_heads // tp)
    if kv_dtype == "auto":
        per_head = model.head_dim * dtype_bytes(model.dtype, "model")
    elif kv_dtype in ONE_BYTE_KV:
        per_head = model.head_dim
    elif kv_dtype in NVFP4_KV:
        per_head = model.head_dim // 2 + model.head_dim // 16
    else:
        per_head = model.head_dim * dtype_bytes(kv_dtype, "--kv-cache-dtype")
    return 2 * heads * per_head


def mamba_dtypes(model: ModelFacts, engine: EngineArgs) -> tuple[str, str, str]:
    """(conv dtype, SSM dtype, why): conv follows --mamba-cache-dtype (auto = model dtype);
    SSM follows --mamba-ssm-cache-dtype, whose auto is the conv dtype except for Qwen3.5,
    where it is config.json's mamba_ssm_dtype (model_executor/layers/mamba/mamba_utils.py:98-110,
    model_executor/models/config.py:953-977)."""
    conv = model.dtype if engine.mamba_cache_dtype == "auto" else engine.mamba_cache_dtype
    ssm, why = (
        engine.mamba_ssm_cache_dtype,
        f"--mamba-ssm-cache-dtype {engine.mamba_ssm_cache_dtype}",
    )
    if ssm == "auto":
        if model.architecture in QWEN35_ARCHS and model.mamba_ssm_dtype:
            ssm, why = (
                model.mamba_ssm_dtype,
                f"auto = config mamba_ssm_dtype {model.mamba_ssm_dtype}",
            )
        else:
            ssm, why = conv, f"auto = conv-state dtype {conv}"
    return conv, ssm, why


def gdn_state_bytes(
    model: ModelFacts, tp: int, conv_dtype: str, ssm_dtype: str, num_spec: int = 0
) -> tuple[int, int]:
    """(conv state, SSM state) bytes of one GDN layer for one request on one GPU.
    conv: (2 x key heads x key dim + value heads x value dim) / TP channels x (kernel - 1
    + speculative tokens); SSM: value heads / TP x value dim x key dim
    (model_executor/layers/mamba/mamba_utils.py:272-292). vLLM asserts divisibility."""
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim += model.linear_num_value_heads * model.linear_value_head_dim
    if conv_dim % tp or model.linear_num_value_heads % tp:
        raise ValueError(f"GDN heads ({model.linear_num_value_heads}) do not divide by TP={tp}")
    conv = conv_dim // tp * (model.linear_conv_kernel_dim - 1 + num_spec)
    ssm = (
        model.linear_num_value_heads // tp * model.linear_value_head_dim * model.linear_key_head_dim
    )
    return conv * dtype_bytes(conv_dtype, "conv state"), ssm * dtype_bytes(ssm_dtype, "SSM state")


def hybrid_block_size(
    attn_bytes_per_token: int, mamba_page: int, alignment: int, backend_alignment: int = 16
) -> int:
    """Smallest multiple of `alignment` whose attention page holds one GDN state, rounded to
    the backends' common kernel block (platforms/interface.py:1098-1104)."""
    block = alignment * math.ceil(mamba_page / (alignment * attn_bytes_per_token))
    return backend_alignment * math.ceil(block / backend_alignment)


def kv_cache_groups(attn_layers: int, mamba_layers: int) -> tuple[int, int, int]:
    """(layers per group, attention groups, GDN groups). Groups have equal layer counts:
    the smaller type's count, or the larger's when it is under 1.5x the smaller
    (v1/core/kv_cache_planning.py:519-543)."""
    if not mamba_layers:
        return attn_layers, 1, 0
    if not attn_layers:
        return mamba_layers, 0, 1
    size = min(attn_layers, mamba_layers)
    if max(attn_layers, mamba_layers) < size * 1.5:
        size = max(attn_layers, mamba_layers)
    return size, math.ceil(attn_layers / size), math.ceil(mamba_layers / size)


def mtp_cache_layers(model: ModelFacts, engine: EngineArgs) -> int:
    """MTP layers that join the cache: DeepSeek's MTP layers are MLA layers of the same spec
    (model_executor/models/deepseek_mtp.py:106, 147-162), loaded with method mtp."""
    if model.mla_latent_dim and engine.num_speculative_tokens and \
            engine.speculative_method in ("mtp", "deepseek_mtp"):
        return model.mtp_layers
    return 0


def random_dataset_lengths(w: Workload) -> Lengths:
    """The workload's bounds by its rule (launcher.run.lengths); vLLM's takes the special
    tokens off the input first, sa-bench's counts the chat template inside it."""
    return run_lengths.lengths(w.rule, w.input_len, w.output_len, w.range_ratio,
                               template_len=w.template_len, special_tokens=w.num_special_tokens,
                               prefix_len=w.prefix_len)


def weight_bytes_per_gpu(
    weights: WeightFacts, par: Parallelism, model_dtype: str, engine: EngineArgs
) -> int:
    """Dense weights split over TP (replicated across DP); routed experts over the EP
    group. The MTP layer is skipped without speculative decoding (its "mtp." weights map to
    None, model_executor/models/qwen3_5.py:478) and the vision tower with
    --language-model-only (interfaces.py:347-395, config/multimodal.py:700)."""
    dense = weights.dense_params
    if engine.num_speculative_tokens:
        dense += weights.mtp_params
    if not engine.language_model_only:
        dense += weights.vision_params
    per_dense = weights.dense_bits / 8 if weights.dense_bits else dtype_bytes(model_dtype, "model")
    dense_bytes = dense * per_dense / par.tp
    expert_bytes = weights.expert_params * weights.expert_bytes_per_param() / par.ep
    if engine.speculative_method in ("mtp", "deepseek_mtp") and engine.num_speculative_tokens \
            and not weights.mtp_params and weights.mtp_layers and weights.layers:
        # counts declared without the MTP layers: each weighs one decoder layer
        share = weights.mtp_layers / weights.layers
        dense_bytes += weights.dense_params * per_dense / par.tp * share
        expert_bytes += weights.expert_params * weights.expert_bytes_per_param() / par.ep * share
    return math.ceil(dense_bytes + expert_bytes)


@dataclass(frozen=True)
class KvCapacity:
    """One endpoint's KV capacity per DP rank and in all, with what it rests on."""

    name: str
    tp: int
    dp: int
    kv_cache_dtype: str
    ssm_dtype: str
    conv_dtype: str
    attention_bytes_per_token: int  # one layer, one GPU
    mamba_state_bytes: int  # one GDN layer, one request, one GPU (before padding)
    block_size: int  # attention tokens per block
    page_size_bytes: int  # one layer's page; GDN pages padded to it
    mamba_padding_pct: float
    mamba_cache_mode: str
    layers_per_group: int
    attention_groups: int
    mamba_groups: int
    bytes_per_block: int
    weights_bytes: int  # per GPU
    requested_bytes: int  # ceil(total x utilization)
    overhead_bytes: int  # activation peak + non-torch + CUDA graphs
    kv_cache_bytes: int  # per GPU
    num_gpu_blocks: int  # per DP rank, what vLLM logs as num_gpu_blocks
    lengths: Lengths
    state_blocks_per_request: int  # GDN state blocks a running request holds (on or off)
    state_blocks_at_boundary: int  # align mode: one more per GDN group, one step per boundary
    blocks_per_request_at_max: int
    blocks_per_request_at_mean: float
    max_num_seqs: int
    per_rank_at_max_length: int
    per_rank_at_mean_length: int
    max_model_len: int
    vllm_log_max_concurrency: float  # "Maximum concurrency for max_model_len tokens"
    vllm_log_kv_cache_tokens: int  # "GPU KV cache size: N tokens"
    assumptions: tuple[str, ...]
    sources: dict[str, str]
    prefix_caching: bool = True
    prefix_caching_why: str = ""
    alignment: int = 16  # the grid of the hybrid block
    other_prefix_caching: dict | None = None  # the same estimate with the flag flipped
    # steady state: a running request holds its prompt and the output so far, not its whole
    # length (vLLM allocates blocks as tokens come); the time-weighted average context
    in_flight_tokens: float = 0.0
    per_rank_in_flight: int = 0
    # a packed layout's groups (DeepSeek-V4), in words, and how many hold a window
    groups_text: str = ""
    window_groups: int = 0
    blocks_overridden: bool = False  # --num-gpu-blocks-override: the cache is that many blocks

    @property
    def endpoint_at_max_length(self) -> int:
        return self.per_rank_at_max_length * self.dp

    @property
    def endpoint_at_mean_length(self) -> int:
        return self.per_rank_at_mean_length * self.dp

    def describe(self) -> str:
        """The dry-run's lines: the numbers, how they follow (pages, page size, state pages
        per request with and without prefix caching), then what they rest on."""
        n = self.lengths
        kv = self.kv_cache_dtype if self.kv_cache_dtype != "auto" else "model dtype"
        lines = [
            f"KV capacity {self.name} (DP{self.dp} x TP{self.tp}): about "
            f"{self.endpoint_at_mean_length:,} concurrent requests for the sweep's length mix "
            f"(mean {n.mean_total:,.0f} tokens), {self.endpoint_at_max_length:,} if all reach "
            f"{n.max_total:,}; {self.num_gpu_blocks:,} blocks/rank of {self.block_size} tokens "
            + (f"in {_size(self.num_gpu_blocks * self.bytes_per_block)}/GPU, as "
               f"--num-gpu-blocks-override sets (the memory left would hold "
               f"{self.kv_cache_bytes / GIB:.1f} GiB; weights {self.weights_bytes / GIB:.1f})"
               if self.blocks_overridden else
               f"in {self.kv_cache_bytes / GIB:.1f} GiB/GPU (weights "
               f"{self.weights_bytes / GIB:.1f})")
        ]
        page = (
            f"  pages: {self.block_size:,} tokens x {self.attention_bytes_per_token:,} B = "
            f"{self.page_size_bytes:,} B per layer"
        )
        if self.mamba_groups:
            page += (
                f", the GDN state ({self.mamba_state_bytes:,} B) padded "
                f"{self.mamba_padding_pct:g} % to it ({self.alignment}-token grid)"
            )
        size = (
            f"{self.bytes_per_block / MIB:.1f} MiB"
            if self.bytes_per_block >= MIB
            else f"{self.bytes_per_block / 1024:.0f} KiB"
        )
        layers = f"{self.layers_per_group} layer{'s' if self.layers_per_group != 1 else ''}"
        page += (
            f"; a block is a page in each of {layers} ({size}): "
            f"{self.num_gpu_blocks:,} blocks/rank, {max(0, self.num_gpu_blocks - 1):,} usable"
        )
        if self.groups_text:  # a packed layout: one block id spans every group
            page = (f"  groups: {self.groups_text}; a block id is the widest group's pages "
                    f"({size}): {self.num_gpu_blocks:,} blocks/rank, "
                    f"{max(0, self.num_gpu_blocks - 1):,} usable")
        lines.append(page)
        attn = self.blocks_per_request_at_mean - self.state_blocks_per_request
        per = (
            f"  per request: {attn:.2f} attention blocks on average "
            f"({self.blocks_per_request_at_max - self.state_blocks_per_request} at most)"
        )
        if self.mamba_groups:
            per += (
                f" + {self.state_blocks_per_request} GDN state blocks "
                f"({self.state_blocks_per_request // self.mamba_groups} per group x "
                f"{self.mamba_groups} groups)"
            )
        if self.window_groups:
            per = (f"  per request: {attn:.2f} compressed blocks on average "
                   f"({self.blocks_per_request_at_max - self.state_blocks_per_request} at most) "
                   f"+ {self.state_blocks_per_request} blocks in the {self.window_groups} "
                   f"sliding-window and compressor-state groups, whatever its length")
        per += (
            f" = {self.blocks_per_request_at_mean:.2f} -> {self.per_rank_at_mean_length:,}/rank "
            f"x {self.dp} = {self.endpoint_at_mean_length:,}"
        )
        if self.per_rank_at_mean_length == self.max_num_seqs:
            per += f" (max-num-seqs {self.max_num_seqs} binds)"
        lines.append(per)
        if self.per_rank_in_flight:
            lines.append(
                f"  at steady state a running request holds {self.in_flight_tokens:,.0f} "
                f"tokens on average (its prompt and the output so far): about "
                f"{self.per_rank_in_flight * self.dp:,} in flight before requests wait; "
                f"{self.endpoint_at_max_length:,} if every one held its longest "
                f"({n.max_total:,} tokens)")
        if self.mamba_groups:
            state = self.state_blocks_per_request
            onoff = "on" if self.prefix_caching else "off"
            text = (
                f"  prefix caching {onoff} ({self.prefix_caching_why}): mamba_cache_mode "
                f"{self.mamba_cache_mode}; a running request holds {state} state blocks "
                + (
                    f"(+{self.state_blocks_at_boundary} for the step after each block boundary)"
                    if self.state_blocks_at_boundary
                    else "whatever its length"
                )
            )
            o = self.other_prefix_caching
            if o:
                text += (
                    f"; prefix caching {'on' if o['prefix_caching'] else 'off'} would give "
                    f"{o['block_size']:,}-token pages, {o['num_gpu_blocks']:,} blocks/rank, "
                    f"the same {o['state_blocks_per_request']} state blocks, "
                    f"{o['endpoint_at_mean_length']:,} requests"
                )
            lines.append(text)
        state = f", SSM state {self.ssm_dtype}" if self.ssm_dtype else ""
        given = sorted(k for k, v in self.sources.items() if v == "recipe" and k != "weights")
        known = {v for k, v in self.sources.items() if v.startswith(KNOWN_FACTS_SOURCE)}
        lines.append(
            f"  rests on: KV {kv}{state}, "
            f"{self.overhead_bytes / GIB:.1f} GiB/GPU of activations+graphs+buffers assumed; "
            f"vLLM would log {self.vllm_log_max_concurrency:.2f}x for "
            f"{self.max_model_len:,} tokens per request"
            + (f"; model facts given by the recipe (model.facts: {', '.join(given)}), no "
               "config.json read" if given else "")
            + (f"; model facts as {min(known)} records them (the checkpoint's published "
               "config.json), no config.json read here" if known and not given else "")
        )
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = asdict(self)
        d["endpoint_at_max_length"] = self.endpoint_at_max_length
        d["endpoint_at_mean_length"] = self.endpoint_at_mean_length
        d["lengths"]["mean_total"] = self.lengths.mean_total
        d["lengths"]["max_total"] = self.lengths.max_total
        return d


@dataclass(frozen=True)
class Geometry:
    """Block size and page vLLM settles on for one engine."""

    kv_cache_dtype: str
    attention_bytes_per_token: int
    conv_dtype: str = ""
    ssm_dtype: str = ""
    mamba_state_bytes: int = 0
    mamba_cache_mode: str = "none"
    block_size: int = 16
    page_size_bytes: int = 0
    notes: tuple[str, ...] = ()
    alignment: int = 16  # the grid the hybrid block is a multiple of
    prefix_caching: bool = True
    prefix_caching_why: str = ""

    @property
    def padding_pct(self) -> float:
        if not self.mamba_state_bytes:
            return 0.0
        return round(
            100 * (self.page_size_bytes - self.mamba_state_bytes) / self.mamba_state_bytes, 2
        )


def flashinfer_gdn(model: ModelFacts, engine: EngineArgs, device: Device) -> bool:
    """FlashInfer GDN prefill on CUDA needs key head dim 128 (Blackwell, CUDA >= 13 assumed)
    and flashinfer or auto (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:148-175)."""
    return (
        device.platform == "cuda"
        and engine.gdn_prefill_backend in ("auto", "flashinfer")
        and model.linear_key_head_dim == 128
    )


def prefix_caching(engine: EngineArgs) -> tuple[bool, str]:
    """(on, why). Without a flag vLLM turns it on for every generative model, hybrid ones
    included (engine/arg_utils.py:3075-3076 from config/model.py:2276-2291); for a hybrid
    model it then sets mamba_cache_mode "align", and "none" without it
    (model_executor/models/config.py:763-787)."""
    if engine.enable_prefix_caching is None:
        return True, "vLLM's default for a generative model"
    return engine.enable_prefix_caching, engine.prefix_caching_flag or (
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching"
    )


def geometry(model: ModelFacts, engine: EngineArgs, tp: int, device: Device) -> Geometry:
    """Block size, page and GDN state (platforms/interface.py:750-790, 940-1137).

    The starting block is --block-size or the backend's preference (16 on CUDA's FlashInfer,
    128 on CPU); hybrid models align it to max(smallest kernel block, that block), and in
    align mode also to FlashInfer's GDN checkpoint grid, then grow it until one attention
    page holds one GDN state."""
    kv_dtype, kv_why = resolve_kv_cache_dtype(engine.kv_cache_dtype, model)
    attn_tok = kv_bytes_per_token(model, kv_dtype, tp)
    block = engine.block_size or (128 if device.platform == "cpu" else 16)
    notes = [f"KV cache {kv_dtype if kv_dtype != 'auto' else model.dtype} ({kv_why})"]
    if model.mla_latent_dim:
        if device.platform == "cpu":  # vLLM for CPU forces 16 for MLA (platforms/cpu.py)
            block = 16
        elif not engine.block_size:
            backend = engine.attention_backend.upper() or "FLASHINFER_MLA"
            block = MLA_BLOCK.get(backend, 16)
        notes.append(f"MLA: one {model.mla_latent_dim}-wide latent per token and layer, not "
                     f"split by tensor parallelism; block {block}")
    prefix, prefix_why = prefix_caching(engine)
    if not model.hybrid:
        return Geometry(
            kv_dtype,
            attn_tok,
            block_size=block,
            page_size_bytes=block * attn_tok,
            notes=tuple(notes),
            alignment=block,
            prefix_caching=prefix,
            prefix_caching_why=prefix_why,
        )
    mode = "align" if prefix else "none"
    conv_dt, ssm_dt, ssm_why = mamba_dtypes(model, engine)
    conv_b, ssm_b = gdn_state_bytes(model, tp, conv_dt, ssm_dt, engine.num_speculative_tokens)
    kernel = 32 if device.platform == "cpu" else 16
    alignment = max(kernel, block)
    align_why = f"alignment {alignment}"
    if mode == "align" and flashinfer_gdn(model, engine, device):
        alignment = math.lcm(alignment, FLASHINFER_GDN_ALIGNMENT)
        align_why += f" (lcm with FlashInfer GDN's {FLASHINFER_GDN_ALIGNMENT}-token checkpoints)"
    block = max(block, hybrid_block_size(attn_tok, conv_b + ssm_b, alignment, kernel))
    notes.append(f"SSM state {ssm_dt} ({ssm_why}), conv state {conv_dt}")
    notes.append(
        f"mamba_cache_mode {mode} (prefix caching {'on' if prefix else 'off'}: {prefix_why}), "
        f"{align_why}"
    )
    return Geometry(
        kv_cache_dtype=kv_dtype,
        attention_bytes_per_token=attn_tok,
        conv_dtype=conv_dt,
        ssm_dtype=ssm_dt,
        mamba_state_bytes=conv_b + ssm_b,
        mamba_cache_mode=mode,
        block_size=block,
        page_size_bytes=block * attn_tok,
        notes=tuple(notes),
        alignment=alignment,
        prefix_caching=prefix,
        prefix_caching_why=prefix_why,
    )


def compressed_geometry(model: ModelFacts, engine: EngineArgs) -> tuple[Geometry,
                                                                       kv_compressed.Layout]:
    """DeepSeek-V4: FlashMLA's fp8_ds_mla layout for auto and every fp8 dtype (attention.py:
    94-129), 256-token compressed blocks (the only size its backends take), the MTP layers
    with --speculative-config method mtp, the indexer in MXFP4 or FP8."""
    dtype = engine.kv_cache_dtype
    if dtype != "auto" and dtype != "fp8_ds_mla" and not dtype.startswith("fp8"):
        raise NoEstimate(f"DeepSeek-V4's cache in {dtype} is not modelled: vLLM 0.33's FlashMLA "
                         "layout takes auto, fp8 or fp8_ds_mla")
    if not engine.hybrid_kv_cache_manager:
        raise NoEstimate("DeepSeek-V4 with --disable-hybrid-kv-cache-manager is not modelled: "
                         "vLLM then keeps each window cache whole, as full attention")
    block = engine.block_size or kv_compressed.COMPRESSED_BLOCK
    if block != kv_compressed.COMPRESSED_BLOCK:
        raise ValueError(f"--block-size {block}: DeepSeek-V4's sparse MLA and indexer backends "
                         f"take {kv_compressed.COMPRESSED_BLOCK} only")
    mtp = model.mtp_layers if engine.num_speculative_tokens and \
        engine.speculative_method in ("mtp", "deepseek_mtp") else 0
    packed = kv_compressed.layout(list(model.compress_ratios), mtp, model.sliding_window,
                                  model.head_dim, model.index_head_dim, block,
                                  engine.indexer_fp4)
    counts = {r: model.compress_ratios.count(r) for r in kv_compressed.RATIOS}
    prefix, prefix_why = prefix_caching(engine)
    notes = (
        f"KV cache fp8_ds_mla (--kv-cache-dtype {dtype}: FlashMLA's layout, 584 B per state, "
        f"pages padded to {kv_compressed.DS_MLA_ALIGN} B)",
        f"DeepSeek-V4: {counts[128]} HCA, {counts[4]} CSA, {counts[1]} sliding-window-only "
        f"layers{f' + {mtp} MTP' if mtp else ''}, window {model.sliding_window}; indexer keys "
        f"{'MXFP4' if engine.indexer_fp4 else 'FP8'}; {len(packed.groups)} KV-cache groups",
    )
    geo = Geometry(kv_cache_dtype="fp8_ds_mla",
                   attention_bytes_per_token=packed.bytes_per_block // block,
                   block_size=block, page_size_bytes=packed.bytes_per_block, notes=notes,
                   alignment=block, prefix_caching=prefix, prefix_caching_why=prefix_why)
    return geo, packed


@dataclass(frozen=True)
class _Memory:
    """One GPU's memory as vLLM divides it, with the assumptions it rests on."""

    requested_bytes: int  # ceil(total x utilization)
    weights_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    notes: tuple[str, ...]


def _kv_memory(
    model: ModelFacts,
    engine: EngineArgs,
    par: Parallelism,
    device: Device,
    overheads: Overheads | None,
) -> _Memory:
    """Memory per GPU: ceil(total x utilization) - weights - overheads (gpu_worker.py:753-757),
    or --kv-cache-memory-bytes as given."""
    requested = math.ceil(round(device.memory_gib * GIB) * engine.gpu_memory_utilization)
    notes = []
    weights = 0
    if model.weights:
        w = model.weights
        weights = weight_bytes_per_gpu(w, par, model.dtype, engine)
        notes.append(
            f"weights {weights / GIB:.1f} GiB/GPU ({w.dense_params / 1e9:.2f}B {model.dtype} "
            f"/ TP{par.tp} + {w.expert_params / 1e9:.1f}B {w.expert_format} experts / EP{par.ep})"
        )
    if engine.kv_cache_memory_bytes is not None:
        kv_bytes, overhead = engine.kv_cache_memory_bytes, 0
        notes.append(f"--kv-cache-memory-bytes {kv_bytes} (vLLM skips profiling)")
    else:
        if not model.weights:
            notes.append("weights unknown: counted as 0")
        mbt = engine.max_num_batched_tokens or default_batch_limits(device)[0]
        ov = overheads or default_overheads(device, mbt, engine.enforce_eager)
        overhead = ov.total_bytes
        kv_bytes = max(0, requested - weights - overhead)
        notes.append(
            f"{device.memory_gib:g} GiB x utilization {engine.gpu_memory_utilization:g}; "
            f"activation peak {ov.activation_peak_gib:g} + other {ov.non_torch_gib:g} + "
            f"CUDA graphs {ov.cudagraph_gib:g} GiB assumed ({ov.why})"
        )
    return _Memory(requested, weights, overhead, kv_bytes, tuple(notes))


def _vllm_log_concurrency(
    model: ModelFacts,
    engine: EngineArgs,
    device: Device,
    geo: Geometry,
    attn_groups: int,
    mamba_groups: int,
    num_blocks: int,
    lengths: Lengths,
    packed: kv_compressed.Layout | None = None,
) -> tuple[int, float]:
    """(max_model_len, the concurrency vLLM logs for it): every request at max_model_len,
    GDN groups at their reservation, window groups at their admission bound
    (kv_cache_utils.py:1061-1154)."""
    max_len = engine.max_model_len or model.max_position_embeddings or lengths.max_total
    if packed:
        batched = engine.max_num_batched_tokens or default_batch_limits(device)[0]
        in_flight = (2 if engine.async_scheduling else 1) * batched
        return max_len, num_blocks / packed.at_start_up(max_len, in_flight)
    reserve = 1 + engine.num_speculative_tokens
    if geo.mamba_cache_mode == "align":
        reserve += 1 + int(flashinfer_gdn(model, engine, device))
    log_blocks = attn_groups * math.ceil(max_len / geo.block_size) + mamba_groups * reserve
    return max_len, num_blocks / log_blocks


def _with_prefix_caching_flipped(
    model: ModelFacts,
    engine: EngineArgs,
    geo: Geometry,
    par: Parallelism,
    device: Device,
    workload: Workload,
    overheads: Overheads | None,
    name: str,
) -> dict:
    """The headline figures of the same estimate with prefix caching the other way."""
    flipped = dataclasses.replace(
        engine, enable_prefix_caching=not geo.prefix_caching, prefix_caching_flag=""
    )
    o = estimate(model, flipped, par, device, workload, overheads, name, False)
    return {
        "prefix_caching": o.prefix_caching,
        "mamba_cache_mode": o.mamba_cache_mode,
        "block_size": o.block_size,
        "num_gpu_blocks": o.num_gpu_blocks,
        "state_blocks_per_request": o.state_blocks_per_request,
        "blocks_per_request_at_mean": o.blocks_per_request_at_mean,
        "endpoint_at_mean_length": o.endpoint_at_mean_length,
        "endpoint_at_max_length": o.endpoint_at_max_length,
    }


def estimate(
    model: ModelFacts,
    engine: EngineArgs,
    par: Parallelism,
    device: Device,
    workload: Workload,
    overheads: Overheads | None = None,
    name: str = "",
    compare_prefix_caching: bool = True,
) -> KvCapacity:
    """The capacity vLLM 0.33 would allocate for one DP rank of this endpoint, and what the
    sweep's requests need of it. Raises ValueError for models it does not model. For a
    hybrid model the result also carries the same estimate with prefix caching the other
    way (`other_prefix_caching`), which is what the flag is worth."""
    if model.unmodelled:
        raise NoEstimate(f"no estimate for architecture {model.architecture or 'unknown'}: "
                         f"{model.unmodelled} (docs/kv-architectures.md)")
    if model.other_layers or not model.full_attention_layers:
        raise NoEstimate("only full-attention and GDN (linear_attention) layers are modelled")
    sources = {
        **model.sources,
        "accounting": "vLLM 0.33.0, docs/kv-capacity.md",
        "gpu_memory": f"{device.memory_gib:g} GiB ({device.kind})",
    }
    if model.weights:
        sources["weights"] = model.weights.source
    packed = None
    if model.compress_ratios:
        geo, packed = compressed_geometry(model, engine)
        per_group = max(len(g.pages) for g in packed.groups)
        attn_groups, mamba_groups = packed.full_groups, 0
        bytes_per_block = packed.bytes_per_block
        sources["accounting"] = "vLLM 0.33.0, docs/kv-architectures.md section 4"
    else:
        geo = geometry(model, engine, par.tp, device)
        per_group, attn_groups, mamba_groups = kv_cache_groups(
            model.full_attention_layers + mtp_cache_layers(model, engine),
            model.linear_attention_layers,
        )
        bytes_per_block = per_group * geo.page_size_bytes
    max_seqs = engine.max_num_seqs or default_batch_limits(device)[1]
    mem = _kv_memory(model, engine, par, device, overheads)
    assumptions = [*geo.notes, *mem.notes]
    num_blocks = mem.kv_cache_bytes // bytes_per_block  # kv_cache_planning.py:681
    if engine.num_gpu_blocks_override is not None:
        num_blocks = engine.num_gpu_blocks_override
        assumptions.append(f"--num-gpu-blocks-override {num_blocks}")
    usable = max(0, num_blocks - 1)  # the block pool keeps one null block (block_pool.py:191)

    # Requests: ceil(tokens / block) per attention group, one state block per GDN group
    # (plus one per speculative token) for a running request, prefix caching on or off.
    # "none": the GDN group's block is max_model_len tokens long, so cdiv(tokens, it) = 1
    # (model_executor/models/config.py:780-787, single_type_kv_cache_manager.py:1713-1729).
    # "align": one block per mamba_block_size (= the attention block) of positions, all but
    # the last nulled; the physical cap is 1 (+1 on a prefill chunk that exports a FlashInfer
    # checkpoint, never on a decode fed by NIXL), and the state block of the boundary just
    # crossed is freed on the next step (single_type_kv_cache_manager.py:1629-1657,
    # 1730-1795, kv_cache_interface.py:1146-1150: "only 2 + num_speculative_blocks state
    # blocks are resident at a time").
    lengths = random_dataset_lengths(workload)
    state_blocks = mamba_groups * (1 + engine.num_speculative_tokens)
    if packed:  # the window groups: a fixed number of blocks whatever the length
        state_blocks = packed.window_blocks(engine.num_speculative_tokens)
    boundary_blocks = mamba_groups if geo.mamba_cache_mode == "align" else 0
    # speculative decoding: num_speculative_tokens lookahead slots past the tokens held
    # (config/vllm.py:626-651, v1/core/sched/scheduler.py:914-918)
    ahead = engine.num_speculative_tokens if not model.hybrid else 0
    at_max = attn_groups * math.ceil((lengths.max_total + ahead) / geo.block_size) \
        + state_blocks
    at_mean = attn_groups * lengths.expected_blocks(geo.block_size, ahead) + state_blocks
    in_flight = attn_groups * lengths.in_flight_blocks(geo.block_size) + state_blocks
    assumptions.append(
        f"lengths uniform in [{lengths.input_low}, {lengths.input_high}] + "
        f"[{lengths.output_low}, {lengths.output_high}] ({run_lengths.RULE_TEXT[workload.rule]})"
    )
    max_len, log_conc = _vllm_log_concurrency(
        model, engine, device, geo, attn_groups, mamba_groups, num_blocks, lengths, packed
    )
    other = (
        _with_prefix_caching_flipped(model, engine, geo, par, device, workload, overheads, name)
        if model.hybrid and compare_prefix_caching
        else None
    )

    return KvCapacity(
        name=name,
        tp=par.tp,
        dp=par.dp,
        kv_cache_dtype=geo.kv_cache_dtype,
        ssm_dtype=geo.ssm_dtype,
        conv_dtype=geo.conv_dtype,
        attention_bytes_per_token=geo.attention_bytes_per_token,
        mamba_state_bytes=geo.mamba_state_bytes,
        block_size=geo.block_size,
        page_size_bytes=geo.page_size_bytes,
        mamba_padding_pct=geo.padding_pct,
        mamba_cache_mode=geo.mamba_cache_mode,
        layers_per_group=per_group,
        attention_groups=attn_groups,
        mamba_groups=mamba_groups,
        bytes_per_block=bytes_per_block,
        weights_bytes=mem.weights_bytes,
        requested_bytes=mem.requested_bytes,
        overhead_bytes=mem.overhead_bytes,
        kv_cache_bytes=mem.kv_cache_bytes,
        num_gpu_blocks=num_blocks,
        blocks_overridden=engine.num_gpu_blocks_override is not None,
        lengths=lengths,
        state_blocks_per_request=state_blocks,
        state_blocks_at_boundary=boundary_blocks,
        blocks_per_request_at_max=at_max,
        blocks_per_request_at_mean=round(at_mean, 4),
        max_num_seqs=max_seqs,
        per_rank_at_max_length=min(max_seqs, usable // at_max),
        per_rank_at_mean_length=min(max_seqs, math.floor(usable / at_mean)),
        in_flight_tokens=round(lengths.in_flight_mean, 1),
        per_rank_in_flight=min(max_seqs, math.floor(usable / in_flight)),
        max_model_len=max_len,
        vllm_log_max_concurrency=round(log_conc, 2),
        vllm_log_kv_cache_tokens=int(log_conc * max_len),
        assumptions=tuple(assumptions),
        sources=sources,
        prefix_caching=geo.prefix_caching,
        prefix_caching_why=geo.prefix_caching_why,
        alignment=geo.alignment,
        other_prefix_caching=other,
        groups_text=packed.describe() if packed else "",
        window_groups=len(packed.window_groups) if packed else 0,
    )


def kv_blocks_per_dp_rank(result: KvCapacity) -> int:
    """vLLM's num_gpu_blocks for one DP rank (blocks of `result.block_size` tokens)."""
    return result.num_gpu_blocks


def simulator_kv_blocks(result: KvCapacity) -> tuple[int, int, int]:
    """(block_size, num_gpu_blocks, state blocks per request) for the simulator, which charges
    a running request ceil(tokens / block_size) blocks in one attention group plus its state
    blocks, as vLLM does: its usable blocks are vLLM's less the null block. Several attention
    groups are folded into one (blocks and state divided by the group count). The state
    blocks are those of a running request, the same with prefix caching on or off; the
    one-step extra of align mode at a block boundary (`state_blocks_at_boundary`) is left
    out: a request crosses a boundary about once in its decode, for one step."""
    groups = max(1, result.attention_groups)
    blocks = max(1, (result.num_gpu_blocks - 1) // groups)
    return result.block_size, blocks, -(-result.state_blocks_per_request // groups)
