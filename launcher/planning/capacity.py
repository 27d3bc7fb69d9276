"""The KV-capacity estimate of a plan's endpoints: launcher.planning.kv (vLLM 0.33's
own accounting, docs/kv-capacity.md) fed from the plan.

Model facts come from the checkpoint's config.json (and its quantization config for the
KV-cache dtype) when the model folder is on this machine, else from the recipe's
`model.facts`; the estimate says which. Endpoints whose model it cannot describe get no
estimate, not a guess.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from launcher.planning import kv
from launcher.planning.plan import Endpoint, Plan, engine_args
from launcher.run.vocab import Role
from launcher.schema.recipe import Recipe


def model_facts(plan: Plan) -> kv.ModelFacts | None:
    """The model's facts as the plan was made with them (read once, at the boundary)."""
    return plan.model


def resolve_model(recipe: Recipe) -> kv.ModelFacts | None:
    """What the checkpoint's config.json says when its folder is on this machine (the
    recipe's declared parameter counts filling in for the weights), else the recipe's
    `model.facts`, else the facts recorded for a known checkpoint of that name, else None.
    The one read of the model folder for a plan."""
    found = kv.read_checkpoint(recipe.model.path)
    declared, given_by = recipe.model.facts, "recipe"
    if declared is None and (known := known_facts(recipe.model.path)):
        declared, given_by = known
    if found is not None:
        if found.weights is None and declared is not None:
            # config.json has no parameter counts: the declared ones stand in for them
            found = dataclasses.replace(
                found, weights=kv.ModelFacts.from_declared(declared).weights)
        return found
    return None if declared is None else kv.ModelFacts.from_declared(declared,
                                                                           given_by=given_by)


def known_facts(path: str):
    """(DeclaredFacts, where) of a checkpoint launcher/data/model-facts.yaml records, by its
    Hugging Face id (an `hf:` prefix or a trailing slash aside); None for another path."""
    from launcher.schema.sections import DeclaredFacts

    repo = path.removeprefix("hf:").strip("/")
    table = _known_table()
    if repo not in table:
        return None
    return DeclaredFacts(**table[repo]), f"{kv.KNOWN_FACTS_SOURCE}:{repo}"


@functools.cache
def _known_table() -> dict:
    from importlib import resources

    from launcher.schema.yaml_io import yaml_module

    text = resources.files("launcher").joinpath("data/model-facts.yaml").read_text()
    return yaml_module().safe_load(text)


def device_kind(plan: Plan) -> str:
    """What the engines run on: vLLM built for CPU follows vLLM's CPU block-size rules."""
    return plan.recipe.engine_kind.device(plan.cluster.gpu_kind)


def estimate(plan: Plan, ep: Endpoint, facts: kv.ModelFacts) -> kv.KvCapacity | None:
    cap = _estimate(plan, ep, facts)
    return cap if isinstance(cap, kv.KvCapacity) else None


def _estimate(plan: Plan, ep: Endpoint, facts: kv.ModelFacts) -> kv.KvCapacity | str:
    """The estimate, or why there is none."""
    b = plan.recipe.benchmark
    pool = ep.pool
    try:
        return kv.estimate(
            facts,
            kv.EngineArgs.from_flags(engine_args(plan.recipe, pool)),
            kv.Parallelism(pool.tensor_parallel, pool.data_parallel, pool.expert_parallel,
                           pool.pipeline_parallel),
            kv.Device(plan.cluster.gpu_memory_gib, device_kind(plan)),
            kv.Workload(b.input_len, b.output_len, b.range_ratio, rule=b.length_rule),
            name=ep.name,
        )
    except kv.NoEstimate as e:
        return str(e)
    except (ValueError, KeyError, ZeroDivisionError) as e:
        return f"{type(e).__name__}: {e}"


def sessions_held(plan: Plan, context: int) -> list[tuple[str, int]]:
    """(decode endpoint, live sessions whose `context`-token contexts its KV cache holds at
    once) by the same estimate at that length: an agentic run's KV room."""
    facts = model_facts(plan)
    out: list[tuple[str, int]] = []
    if facts is None:
        return out
    for ep in plan.endpoints:
        if ep.role not in (Role.DECODE, Role.AGG):
            continue
        pool = ep.pool
        try:
            cap = kv.estimate(
                facts, kv.EngineArgs.from_flags(engine_args(plan.recipe, pool)),
                kv.Parallelism(pool.tensor_parallel, pool.data_parallel,
                               pool.expert_parallel, pool.pipeline_parallel),
                kv.Device(plan.cluster.gpu_memory_gib, device_kind(plan)),
                kv.Workload(max(1, context - 1), 1, 1.0, rule="sa-bench"), name=ep.name)
        except (kv.NoEstimate, ValueError, KeyError, ZeroDivisionError):
            continue
        out.append((ep.name, math.floor(max(0, cap.num_gpu_blocks - 1)
                                        / cap.blocks_per_request_at_mean) * cap.dp))
    return out


def missing(plan: Plan, caps: list[kv.KvCapacity]) -> str | None:
    """Why a decode (or aggregated) endpoint has no estimate, in one line; None if all do."""
    lacking = [ep for ep in plan.endpoints if ep.role in (Role.DECODE, Role.AGG)
               and ep.name not in {c.name for c in caps}]
    if not lacking:
        return None
    names = ", ".join(ep.name for ep in lacking)
    facts = model_facts(plan)
    if facts is None:
        return (f"no KV-capacity estimate for {names}: no config.json under model.path "
                f"({plan.recipe.model.path}) on this machine and no model.facts in the recipe")
    why = _estimate(plan, lacking[0], facts)
    return f"no KV-capacity estimate for {names}: {why}"


def estimates(plan: Plan) -> list[kv.KvCapacity]:
    """One estimate per decode endpoint (or aggregated endpoint): where requests stay."""
    facts = model_facts(plan)
    if facts is None:
        return []
    out = []
    for ep in plan.endpoints:
        if ep.role in (Role.DECODE, Role.AGG):
            cap = estimate(plan, ep, facts)
            if cap is not None:
                out.append(cap)
    return out


def warnings(plan: Plan, caps: list[kv.KvCapacity]) -> list[str]:
    """What the estimate says will go wrong: an endpoint that cannot hold one request, or a
    sweep the decode side cannot hold. None for an agentic run: its lengths are the trace's
    (the dry-run's KV line gives the live sessions held at them)."""
    if plan.recipe.benchmark.agentic is not None:
        return []
    out = []
    for c in caps:
        if c.per_rank_at_max_length < 1:
            out.append(
                f"{c.name} cannot hold one request of {c.lengths.max_total:,} tokens: its "
                f"weights take {c.weights_bytes / kv.GIB:.1f} GiB of each GPU and leave "
                f"{max(c.kv_cache_bytes, 0) / kv.GIB:.1f} GiB for the KV cache; vLLM "
                f"would refuse to start: spread it over more GPUs (data_parallel with "
                f"expert_parallel) or raise gpu-memory-utilization"
            )
    sweep = sweep_warning(plan, caps)
    return out + ([sweep] if sweep and not out else [])


def sweep_warning(plan: Plan, caps: list[kv.KvCapacity]) -> str | None:
    """A sweep whose top concurrency the decode side cannot hold: say so with the number,
    and whether the KV cache or max-num-seqs is the limit."""
    if not caps or not plan.recipe.benchmark.sweeps:
        return None
    top = max(plan.recipe.benchmark.points)
    room = sum(c.endpoint_at_mean_length for c in caps)
    if top <= room:
        return None
    side = "decode" if plan.recipe.mode == "disagg" else "serving"
    kv_room = sum(math.floor(max(0, c.num_gpu_blocks - 1) / c.blocks_per_request_at_mean) * c.dp
                  for c in caps)
    if kv_room > room:  # max-num-seqs binds before the KV cache runs out
        return (
            f"the sweep's top concurrency {top:,} exceeds what the {side} side runs at once: "
            f"about {room:,} (max-num-seqs binds; its KV cache would hold about {kv_room:,}): "
            f"points above it wait for a slot, which the sweep measures as TTFT, not throughput"
        )
    return (
        f"the sweep's top concurrency {top:,} exceeds the predicted KV capacity of about "
        f"{room:,} concurrent requests on the {side} side: points above it queue for KV "
        f"(waiting for capacity), which the sweep measures as TTFT, not throughput"
    )
