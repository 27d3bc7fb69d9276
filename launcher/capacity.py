"""KV-capacity estimate per decode endpoint, from the model facts (an estimate, not a promise).

Per DP rank (data-parallel attention: each rank holds the KV and SSM state of its own
requests): memory for the cache = GPU memory x gpu-memory-utilization - weights - a reserve
for activations and CUDA graphs. A request at its longest needs KV for ISL+OSL tokens on
the full-attention layers plus one fixed-size GDN/SSM state.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import ValidationError

from launcher.planning.plan import Endpoint, Plan, engine_args
from launcher.spec.recipe import ModelFacts

GIB = 1024**3
RESERVE_GIB = 8.0  # activations, CUDA graphs, NCCL/NIXL buffers: a typical GB200 figure
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2,
               "bf16": 2, "auto": None}  # fmt: skip


@dataclass(frozen=True)
class Capacity:
    endpoint: str
    gpus: int
    usable_gib_per_gpu: float
    weights_gib_per_gpu: float
    cache_gib_per_gpu: float
    kv_bytes_per_token: float
    state_bytes_per_request: float
    tokens_per_request: int
    max_concurrency: int
    assumptions: str
    facts_from: str

    def to_json(self) -> dict:
        return asdict(self)


def _kv_bytes(args: dict) -> int:
    dtype = str(args.get("kv-cache-dtype", "auto")).lower()
    return 1 if dtype.startswith("fp8") else 2


def _ssm_bytes(args: dict, config_dtype: str) -> int:
    dtype = str(args.get("mamba-ssm-cache-dtype", "auto")).lower()
    return DTYPE_BYTES.get(dtype) or DTYPE_BYTES.get(config_dtype.lower(), 4)


def config_facts(model_path: str) -> dict:
    """Architecture facts from a local checkpoint's config.json ({} when there is none).
    Multimodal checkpoints keep the language model's numbers under text_config."""
    path = Path(model_path).expanduser() / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    t = data.get("text_config") or data
    layers = t.get("num_hidden_layers")
    types = t.get("layer_types")
    facts: dict = {}
    if isinstance(types, list) and types:
        facts["full_attention_layers"] = sum(1 for x in types if x == "full_attention")
        facts["gdn_layers"] = sum(1 for x in types if x == "linear_attention")
    elif layers and t.get("full_attention_interval"):
        facts["full_attention_layers"] = layers // t["full_attention_interval"]
        facts["gdn_layers"] = layers - facts["full_attention_layers"]
    elif layers:
        facts["full_attention_layers"] = layers
    if t.get("num_key_value_heads"):
        facts["num_kv_heads"] = t["num_key_value_heads"]
    head_dim = t.get("head_dim") or (
        t["hidden_size"] // t["num_attention_heads"]
        if t.get("hidden_size") and t.get("num_attention_heads")
        else None
    )
    if head_dim:
        facts["head_dim"] = head_dim
    for ours, theirs in (
        ("gdn_value_heads", "linear_num_value_heads"),
        ("gdn_key_heads", "linear_num_key_heads"),
        ("gdn_key_head_dim", "linear_key_head_dim"),
        ("gdn_value_head_dim", "linear_value_head_dim"),
        ("conv_kernel", "linear_conv_kernel_dim"),
        ("ssm_state_dtype", "mamba_ssm_dtype"),
    ):
        if t.get(theirs) is not None:
            facts[ours] = t[theirs]
    if facts.get("gdn_layers"):
        facts["hybrid"] = True
    return facts


def model_facts(plan: Plan) -> tuple[ModelFacts | None, str]:
    """The checkpoint's config.json wins where it speaks; the recipe fills in the rest
    (parameter counts and weight bits are not in config.json)."""
    recipe_facts = plan.recipe.model.facts
    found = config_facts(plan.recipe.model.path)
    if not found:
        return recipe_facts, "recipe"
    merged = {**(recipe_facts.model_dump() if recipe_facts else {}), **found}
    try:
        return ModelFacts.model_validate(merged), f"{plan.recipe.model.path}/config.json + recipe"
    except ValidationError:
        return recipe_facts, "recipe (config.json lacks what the estimate needs)"


def estimate(
    plan: Plan, ep: Endpoint, facts: ModelFacts | None = None, source: str = "recipe"
) -> Capacity | None:
    if facts is None:
        return None
    pool = ep.pool
    args = engine_args(plan.recipe, pool)
    tp = pool.tensor_parallel
    ep_size = pool.gpus if pool.expert_parallel else tp
    util = float(args.get("gpu-memory-utilization", 0.9))
    usable = plan.cluster.gpu_memory_gib * util
    bytes_per_weight = facts.weight_bits / 8
    dense = facts.dense_params_b * 1e9 * bytes_per_weight / tp
    experts = (facts.total_params_b - facts.dense_params_b) * 1e9 * bytes_per_weight / ep_size
    weights = (dense + experts) / GIB
    cache = max(usable - weights - RESERVE_GIB, 0.0)

    kv_heads_per_rank = max(facts.num_kv_heads // tp, 1)
    kv_per_token = 2 * kv_heads_per_rank * facts.head_dim * facts.full_attention_layers
    kv_per_token *= _kv_bytes(args)
    ssm = _ssm_bytes(args, facts.ssm_state_dtype)
    value_heads = max(facts.gdn_value_heads // tp, 1) if facts.gdn_value_heads else 0
    key_heads = max(facts.gdn_key_heads // tp, 1) if facts.gdn_key_heads else 0
    ssm_state = facts.gdn_layers * value_heads * facts.gdn_key_head_dim * facts.gdn_value_head_dim
    conv_channels = 2 * key_heads * facts.gdn_key_head_dim + value_heads * facts.gdn_value_head_dim
    conv_state = facts.gdn_layers * conv_channels * (facts.conv_kernel - 1)
    state = ssm_state * ssm + conv_state * 2  # conv state is kept in the model dtype (bf16)

    b = plan.recipe.benchmark
    tokens = b.input_len + b.output_len
    per_request = kv_per_token * tokens + state
    dp = pool.data_parallel
    # Bytes above are per GPU (heads split over TP), so a TP group's request count is
    # one GPU's cache over one GPU's share of a request.
    per_rank = int(cache * GIB // per_request) if per_request else 0
    return Capacity(
        endpoint=ep.name,
        gpus=pool.gpus,
        usable_gib_per_gpu=round(usable, 1),
        weights_gib_per_gpu=round(weights, 1),
        cache_gib_per_gpu=round(cache, 1),
        kv_bytes_per_token=kv_per_token,
        state_bytes_per_request=state,
        tokens_per_request=tokens,
        max_concurrency=per_rank * dp,
        assumptions=(
            f"gpu-memory-utilization {util:g}, {RESERVE_GIB:g} GiB/GPU reserve, "
            f"KV {_kv_bytes(args)} B/elem, SSM state {ssm} B/elem, ISL+OSL {tokens} tokens"
        ),
        facts_from=source,
    )


def estimates(plan: Plan) -> list[Capacity]:
    facts, source = model_facts(plan)
    out = []
    for ep in plan.endpoints:
        if ep.role in ("decode", "agg"):
            cap = estimate(plan, ep, facts, source)
            if cap:
                out.append(cap)
    return out
