"""What every architecture module reads of a config.json the same way."""

from __future__ import annotations


def layer_types(t: dict) -> list[str]:
    """config.json's layer_types, else the full_attention_interval rule (Qwen3-Next)."""
    if isinstance(t.get("layer_types"), list) and t["layer_types"]:
        return [str(x) for x in t["layer_types"]]
    n = t.get("num_hidden_layers", 0)
    every = t.get("full_attention_interval")
    if every:
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    return ["full_attention"] * n


def attention_gaps(t: dict, modelled: tuple[str, ...]) -> str:
    """What of a config.json changes vLLM's cache beyond the layer types an architecture
    models: said in one sentence, so that such a model gets no estimate, never a wrong
    number."""
    if "index_topk" in t:
        return "its sparse attention indexer (index_topk) is not modelled yet"
    others = sorted({x for x in layer_types(t) if x not in modelled})
    if others:
        return f"its {', '.join(others)} layers are not modelled yet"
    if t.get("use_sliding_window") is True and t.get("sliding_window"):
        return "its sliding-window attention (use_sliding_window) is not modelled yet"
    return ""
