"""Gated DeltaNet layers beside full attention (Qwen3-Next, Qwen3.5): each GDN layer keeps
one conv + SSM state per request (vLLM's MambaSpec), which the planner pads to the
attention page after growing the attention block to hold it (docs/kv-capacity.md).
With prefix caching on vLLM sets mamba_cache_mode "align", else "none"
(model_executor/models/config.py:763-787); in align mode FlashInfer's GDN prefill puts the
block on its 64-token checkpoint grid (platforms/interface.py:1089-1094)."""

from __future__ import annotations

import math

from launcher.planning.kv import specs
from launcher.planning.kv.archs.common import attention_gaps, layer_types
from launcher.planning.kv.cache import (
    Caches,
    default_block,
    dtype_note,
    kv_cache_dtype,
    require_attention,
)
from launcher.planning.kv.engine import prefix_caching
from launcher.planning.kv.weights import WeightFacts

NAMES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
         "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# Those whose --mamba-ssm-cache-dtype "auto" means config.json's mamba_ssm_dtype
# (vllm/model_executor/models/config.py:953-977, 1259-1262).
SSM_DTYPE_FROM_CONFIG = {n for n in NAMES if n.startswith("Qwen3_5")}
CONFIG_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_ssm_dtype")
# FlashInfer's GDN prefill emits states every 64 tokens (v1/attention/backends/gdn_attn.py:34).
FLASHINFER_GDN_ALIGNMENT = 64


def claims(t: dict) -> bool:
    return "linear_attention" in layer_types(t)


def describes(model) -> bool:
    return model.linear_attention_layers > 0


def read(t: dict) -> dict:
    return {"linear_attention_layers": layer_types(t).count("linear_attention"),
            "linear_num_key_heads": t.get("linear_num_key_heads", 0),
            "linear_num_value_heads": t.get("linear_num_value_heads", 0),
            "linear_key_head_dim": t.get("linear_key_head_dim", 0),
            "linear_value_head_dim": t.get("linear_value_head_dim", 0),
            "linear_conv_kernel_dim": t.get("linear_conv_kernel_dim", 4),
            "mamba_ssm_dtype": t.get("mamba_ssm_dtype")}


def unmodelled(t: dict) -> str:
    return attention_gaps(t, ("full_attention", "linear_attention"))


def mamba_dtypes(model, engine) -> tuple[str, str, str]:
    """(conv dtype, SSM dtype, why): conv follows --mamba-cache-dtype (auto = model dtype);
    SSM follows --mamba-ssm-cache-dtype, whose auto is the conv dtype except for Qwen3.5,
    where it is config.json's mamba_ssm_dtype (model_executor/layers/mamba/mamba_utils.py:
    98-110, model_executor/models/config.py:953-977)."""
    conv = model.dtype if engine.mamba_cache_dtype == "auto" else engine.mamba_cache_dtype
    ssm = engine.mamba_ssm_cache_dtype
    if ssm != "auto":
        return conv, ssm, f"--mamba-ssm-cache-dtype {ssm}"
    if model.architecture in SSM_DTYPE_FROM_CONFIG and model.mamba_ssm_dtype:
        return conv, model.mamba_ssm_dtype, f"auto = config mamba_ssm_dtype {model.mamba_ssm_dtype}"
    return conv, conv, f"auto = conv-state dtype {conv}"


def state_bytes(model, tp: int, conv_dtype: str, ssm_dtype: str, num_spec: int = 0) -> int:
    """Conv + SSM state of one GDN layer for one request on one GPU. conv: (2 x key heads x
    key dim + value heads x value dim) / TP channels x (kernel - 1 + speculative tokens);
    SSM: value heads / TP x value dim x key dim (model_executor/layers/mamba/mamba_utils.py:
    272-292). vLLM asserts divisibility."""
    conv_dim = 2 * model.linear_num_key_heads * model.linear_key_head_dim
    conv_dim += model.linear_num_value_heads * model.linear_value_head_dim
    if conv_dim % tp or model.linear_num_value_heads % tp:
        raise ValueError(f"GDN heads ({model.linear_num_value_heads}) do not divide by TP={tp}")
    conv = conv_dim // tp * (model.linear_conv_kernel_dim - 1 + num_spec)
    ssm = model.linear_num_value_heads // tp * model.linear_value_head_dim \
        * model.linear_key_head_dim
    return conv * specs.dtype_bytes(conv_dtype, "conv state") + \
        ssm * specs.dtype_bytes(ssm_dtype, "SSM state")


def flashinfer_gdn(model, engine, device) -> bool:
    """FlashInfer GDN prefill on CUDA needs key head dim 128 (Blackwell, CUDA >= 13 assumed)
    and flashinfer or auto (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:148-175)."""
    return device.platform == "cuda" and engine.gdn_prefill_backend in ("auto", "flashinfer") \
        and model.linear_key_head_dim == 128


def state_spec(model, engine, tp: int, device, block: int) -> tuple[specs.MambaSpec, list[str]]:
    """The GDN state and the grid the attention block grows on: max(smallest kernel block,
    the block), in align mode also FlashInfer's GDN checkpoints."""
    on, why = prefix_caching(engine)
    mode = "align" if on else "none"
    conv_dt, ssm_dt, ssm_why = mamba_dtypes(model, engine)
    kernel = 32 if device.platform == "cpu" else 16
    alignment = max(kernel, block)
    align_why = f"alignment {alignment}"
    checkpoints = mode == "align" and flashinfer_gdn(model, engine, device)
    if checkpoints:
        alignment = math.lcm(alignment, FLASHINFER_GDN_ALIGNMENT)
        align_why += f" (lcm with FlashInfer GDN's {FLASHINFER_GDN_ALIGNMENT}-token checkpoints)"
    k = engine.num_speculative_tokens
    spec = specs.MambaSpec(state_bytes(model, tp, conv_dt, ssm_dt, k), conv_dt, ssm_dt, mode,
                           alignment, kernel, k, checkpoints)
    return spec, [f"SSM state {ssm_dt} ({ssm_why}), conv state {conv_dt}",
                  f"mamba_cache_mode {mode} (prefix caching {'on' if on else 'off'}: {why}), "
                  f"{align_why}"]


def caches(model, engine, tp: int, device) -> Caches:
    require_attention(model)
    kv_dtype, why = kv_cache_dtype(engine.kv_cache_dtype, model)
    block = default_block(engine, device)
    attention = specs.attention(block, max(1, model.num_kv_heads // tp), model.head_dim,
                                kv_dtype, model.dtype)
    state, notes = state_spec(model, engine, tp, device, block)
    return Caches((attention,) * model.full_attention_layers
                  + (state,) * model.linear_attention_layers,
                  kv_dtype, (dtype_note(kv_dtype, why, model), *notes))


def count_weights(t: dict, expert_format: str = "bf16",
                  source: str = "config.json") -> WeightFacts | None:
    """Parameters of a Qwen3-Next / Qwen3.5 MoE text model, split into routed experts and
    the rest (what vLLM allocates: in_proj_qkvz/ba, conv1d, gated q_proj, shared expert);
    None for a config without experts."""
    if "num_experts" not in t or "linear_num_value_heads" not in t:
        return None
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
