"""What a prefill and a decode must agree on for NIXL to hand KV over (pure).

One rule set, fed twice: at dry-run from the recipe (`side_of_pool`), and in preflight
from the rendered command lines with what the engine's container saw (`side_of_argv`, the
model's config.json there and the real vLLM version). Each disagreement is one sentence
naming both values and the fix. Sources are in docs/vllm-metrics.md ("P/D agreement").
"""

from __future__ import annotations

from dataclasses import dataclass, field

# VLLM_SSM_CONV_STATE_LAYOUT=DS: vLLM's NIXL worker asserts it for a Mamba/GDN conv-state
# transfer on both sides (nixl/base_worker.py, 0.32 and 0.33).
CONV_LAYOUT = "VLLM_SSM_CONV_STATE_LAYOUT"
# The async-scheduling fixes the published result needed (vLLM PRs #48481 and #45357) are in
# the 2026-08 nightly it ran; 0.32.0 (built 2026-10-20) is the first release known to be
# built after it. Older releases scored 0 on GSM8K with a hybrid P/D and async scheduling.
ASYNC_FIXED = (0, 32)


@dataclass(frozen=True)
class Side:
    """What every engine of one role runs, as far as the hand-over cares."""

    role: str
    model: str
    served_name: str | None
    tensor_parallel: int = 1
    kv_cache_dtype: str = "auto"
    block_size: str | None = None
    async_scheduling: bool = False
    env: dict[str, str] = field(default_factory=dict)


def side_of_pool(role: str, model: str, served: str | None, tp: int, args: dict,
                 env: dict[str, str]) -> Side:
    """A side from the recipe: the merged `vllm serve` flags of the pool and its env."""
    def text(v) -> str | None:
        return None if v is None or v is False else str(v)

    return Side(role, model, served, tp, text(args.get("kv-cache-dtype")) or "auto",
                text(args.get("block-size")), args.get("async-scheduling") is True, dict(env))


def side_of_argv(role: str, argv: list[str], env: dict[str, str]) -> Side:
    """A side from a rendered `... serve MODEL --flag value ...` command line."""
    rest = argv[argv.index("serve") + 1:] if "serve" in argv else list(argv)
    model = rest[0] if rest and not rest[0].startswith("-") else ""
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(rest):
        a = rest[i]
        if a.startswith("--"):
            key, eq, val = a[2:].partition("=")
            if eq:
                flags[key] = val
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                flags[key] = rest[i + 1]
                i += 1
            else:
                flags[key] = True
        i += 1
    tp = flags.get("tensor-parallel-size") or flags.get("tp") or 1
    asynch = flags.get("async-scheduling") is True and "no-async-scheduling" not in flags
    return Side(role, model, _str(flags.get("served-model-name")), int(str(tp)),
                _str(flags.get("kv-cache-dtype")) or "auto", _str(flags.get("block-size")),
                asynch, dict(env))


def _str(v) -> str | None:
    return v if isinstance(v, str) else None


def version_tuple(text: str | None) -> tuple[int, int] | None:
    """'0.33.0+cpu' -> (0, 33); None when it is not a vLLM version."""
    try:
        major, minor = (text or "").split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def disagreements(p: Side, d: Side, hybrid: bool, engine_version: str | None = None) -> list[str]:
    """One sentence per thing prefill and decode must share and do not. `hybrid`: the model
    has Mamba/GDN layers (declared in the recipe or read from its config.json)."""
    out = []
    if p.model != d.model:
        out.append(f"prefill and decode must serve the same model path literally (it is in "
                   f"NIXL's handshake hash): prefill has {p.model!r}, decode {d.model!r}")
    if p.served_name != d.served_name:
        out.append(f"prefill and decode must have the same served model name (the router "
                   f"sends one name to both): prefill {p.served_name!r}, decode "
                   f"{d.served_name!r}")
    if p.kv_cache_dtype != d.kv_cache_dtype:
        out.append(f"prefill and decode need the same KV cache dtype for KV transfer "
                   f"(prefill: {p.kv_cache_dtype}, decode: {d.kv_cache_dtype}): set "
                   f"kv-cache-dtype in vllm_args, not per pool")
    if p.block_size != d.block_size:
        out.append(f"prefill and decode need the same block size for KV transfer "
                   f"(prefill: {p.block_size or 'default'}, decode: {d.block_size or 'default'})")
    if not hybrid:
        return out
    if p.tensor_parallel != d.tensor_parallel:
        out.append(f"hybrid (SSM) models need the same tensor parallel size on prefill and "
                   f"decode for NIXL: prefill.tensor_parallel is {p.tensor_parallel}, "
                   f"decode.tensor_parallel is {d.tensor_parallel}")
    wrong = [s.role for s in (p, d) if s.env.get(CONV_LAYOUT) != "DS"]
    if wrong:
        out.append(f"a hybrid (SSM) model's conv state crosses NIXL only in the DS layout: set "
                   f"env {CONV_LAYOUT}: DS for {' and '.join(wrong)} (vLLM asserts it on both "
                   f"sides at the first transfer)")
    ver = version_tuple(engine_version)
    if (p.async_scheduling or d.async_scheduling) and ver is not None and ver < ASYNC_FIXED:
        out.append(f"--async-scheduling with a hybrid P/D needs vLLM "
                   f"{ASYNC_FIXED[0]}.{ASYNC_FIXED[1]} or later (the race fixes of PRs #48481 "
                   f"and #45357; without them GSM8K fell to 0): the engine is vLLM "
                   f"{engine_version}; use a newer image or drop async-scheduling")
    return out
