"""A model's facts as config.json (text_config for multimodal checkpoints) or a recipe's
`model.facts` give them, plus its weights. `read_checkpoint` is the one function of the
estimate that reads files: config.json and the quantization config. Which fields a config
fills is the architecture's (launcher/planning/kv/archs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.planning.kv import archs
from launcher.planning.kv.weights import WeightFacts

if TYPE_CHECKING:
    from launcher.schema.sections import DeclaredFacts

# ModelOpt kv_cache_quant_algo -> vLLM cache dtype (vllm/utils/torch_utils.py:78-81).
MODELOPT_KV = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
# where the facts of a known checkpoint come from (launcher/planning/capacity.known_facts)
KNOWN_FACTS_SOURCE = "launcher/data/model-facts.yaml"
# config.json fields every architecture's cache reads; an architecture's own come between
# these and max_position_embeddings in `sources`
ATTENTION_FIELDS = ("layer_types", "num_key_value_heads", "head_dim")


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate knows of a model. The attention fields are those of every
    architecture the estimate models; each architecture reads its own (archs/)."""

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
    sliding_window_layers: int = 0  # layers that attend to the last `sliding_window` tokens
    # why vLLM's accounting of this architecture is not the one modelled here ("": it is)
    unmodelled: str = ""
    # multi-head latent attention: kv_lora_rank + qk_rope_head_dim, one latent per token and
    # layer, not split by TP (model_executor/layers/attention/mla_attention.py:480, 1371-1399)
    mla_latent_dim: int = 0
    mtp_layers: int = 0  # num_nextn_predict_layers: MTP layers with the same cache (MLA, V4)
    # DeepSeek-V4's compressed sparse attention: each layer's compress ratio (1: sliding
    # window only, 4: CSA, 128: HCA), its window and the indexer's head (archs/deepseek_v4.py)
    compress_ratios: tuple[int, ...] = ()
    sliding_window: int = 0
    index_head_dim: int = 0
    weights: WeightFacts | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def hybrid(self) -> bool:
        return self.linear_attention_layers > 0

    @classmethod
    def from_config(cls, cfg: dict, quant: dict | None = None, source: str = "config.json",
                    weights: WeightFacts | None = None) -> ModelFacts:
        """Facts from a parsed config.json; `quant` is its quantization_config or the
        checkpoint's hf_quant_config.json."""
        t = cfg.get("text_config") or cfg
        arch = archs.for_config(t)
        heads = t.get("num_attention_heads") or 1
        kv_algo, kv_src = kv_dtype_from_quant_config(quant)
        where = f"{source}:text_config." if "text_config" in cfg else f"{source}:"
        read = (*ATTENTION_FIELDS, *arch.CONFIG_FIELDS, "max_position_embeddings")
        src = {k: where + k for k in read if k in t}
        if kv_src:
            src["kv_cache_quant_algo"] = kv_src
        fields = {
            "full_attention_layers": sum(x == "full_attention" for x in archs.layer_types(t)),
            "num_kv_heads": t.get("num_key_value_heads") or heads,
            "head_dim": t.get("head_dim") or t.get("hidden_size", 0) // heads,
            "unmodelled": arch.unmodelled(t),
        }
        return cls(**{**fields, **arch.read(t)},
                   dtype=str(t.get("torch_dtype") or t.get("dtype") or cfg.get("torch_dtype")
                             or "bfloat16"),
                   architecture=archs.architecture_name(cfg),
                   max_position_embeddings=t.get("max_position_embeddings", 0),
                   kv_cache_quant_algo=kv_algo, weights=weights, sources=src)

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


def _quant_inner(quant: dict) -> dict:
    return quant.get("quantization", quant) if isinstance(quant.get("quantization"), dict) \
        else quant


def kv_dtype_from_quant_config(quant: dict | None) -> tuple[str | None, str]:
    """The cache dtype `--kv-cache-dtype auto` resolves to, from a ModelOpt quant config.

    vLLM only reads it when the config's quant_method starts with "modelopt"; a ModelOpt
    producer gets that method from its quant_algo (transformers_utils/
    model_arch_config_convertor.py:248-281, utils/torch_utils.py:443-516).
    Returns (None, "") when the checkpoint does not ask for a KV dtype."""
    if not isinstance(quant, dict):
        return None, ""
    inner = _quant_inner(quant)
    method = str(quant.get("quant_method", "")).lower()
    producer = (quant.get("producer") or {}).get("name") \
        if isinstance(quant.get("producer"), dict) else None
    if producer == "modelopt" or "modelopt_quant_config" in inner:
        method = "modelopt"
    if not method.startswith("modelopt"):
        return None, ""
    keys = ("kv_cache_scheme", "kv_cache_quant_algo")  # vLLM's order of preference
    algo = next((d.get(k) for k in keys for d in (inner, quant) if d.get(k)), None)
    if algo is None:
        return None, ""
    if isinstance(algo, dict):
        if algo.get("dynamic") is False and algo.get("num_bits") == 8 \
                and algo.get("type") == "float":
            algo = "fp8"
        elif algo.get("num_bits") == 4 and algo.get("type") == "float":
            algo = "nvfp4"
        else:
            return "auto", "kv_cache_scheme (unknown to vLLM: auto)"
    return MODELOPT_KV.get(str(algo).lower(), "auto"), f"kv_cache_quant_algo={algo}"


def expert_format(quant: dict | None) -> str:
    """Routed-expert storage from a ModelOpt config (NVFP4 checkpoints: experts only)."""
    if not isinstance(quant, dict):
        return "bf16"
    inner = _quant_inner(quant)
    algo = str(inner.get("quant_algo") or quant.get("quant_algo") or "").upper()
    return {"NVFP4": "nvfp4", "FP8": "fp8"}.get(algo, "bf16")


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_checkpoint(path: str | Path, weights: WeightFacts | None = None) -> ModelFacts | None:
    """Facts from a local checkpoint: config.json (text_config for multimodal ones) and the
    KV dtype from config.json's quantization_config, else hf_quant_config.json (the order
    vLLM uses, transformers_utils/config.py:951-963). Weights are counted from the config
    where the architecture can count them, unless given. None without a readable
    config.json."""
    root = Path(path).expanduser()
    cfg = _read_json(root / "config.json")
    if cfg is None:
        return None
    quant, qsrc = cfg.get("quantization_config"), f"{root}/config.json:quantization_config"
    if quant is None:
        quant, qsrc = _read_json(root / "hf_quant_config.json"), f"{root}/hf_quant_config.json"
    text = cfg.get("text_config") or cfg
    if weights is None:
        weights = archs.for_config(text).count_weights(text, expert_format(quant),
                                                       f"counted from {root}/config.json")
    facts = ModelFacts.from_config(cfg, quant, source=f"{root}/config.json", weights=weights)
    if facts.kv_cache_quant_algo is not None:
        facts.sources["kv_cache_quant_algo"] = f"{qsrc} ({facts.sources['kv_cache_quant_algo']})"
    return facts
