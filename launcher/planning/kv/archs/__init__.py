"""The architectures the estimate models, one module each: which config.json it is, the
facts it reads from it, and the specs its layers report to vLLM's planner (`caches`).

Each module has: NAMES (vLLM's `architectures` it stands for), CONFIG_FIELDS (the
config.json keys it reads, for the estimate's sources), claims(config) and
describes(facts) (is this model one of mine?), read(config) -> ModelFacts fields,
unmodelled(config) -> why not ("" when it is), count_weights(config, format, source)
(None where config.json cannot count them), caches(facts, engine, tp, device) -> Caches.
The first module that claims a model is its architecture: add a new one before `dense`,
the fallback (docs/kv-architectures.md, "Add an architecture").
"""

from __future__ import annotations

from launcher.planning.kv.archs import deepseek_v4, dense, gdn_hybrid, mla, sliding_window
from launcher.planning.kv.archs.common import layer_types
from launcher.planning.kv.specs import NoEstimate

__all__ = ["ARCHITECTURES", "architecture_name", "caches", "for_config", "for_facts",
           "layer_types"]

ARCHITECTURES = (deepseek_v4, mla, gdn_hybrid, sliding_window, dense)


def for_config(t: dict):
    """The architecture of a config.json (its text_config for multimodal ones)."""
    return next(a for a in ARCHITECTURES if a.claims(t))


def for_facts(model):
    """The architecture of facts read from a config.json or declared by a recipe."""
    return next(a for a in ARCHITECTURES if a.describes(model))


def caches(model, engine, tp: int, device):
    """What the model's layers report for this engine, or why there is no estimate."""
    if model.unmodelled:
        raise NoEstimate(f"no estimate for architecture {model.architecture or 'unknown'}: "
                         f"{model.unmodelled} (docs/kv-architectures.md)")
    return for_facts(model).caches(model, engine, tp, device)


def architecture_name(cfg: dict) -> str:
    return (cfg.get("architectures") or [""])[0]
