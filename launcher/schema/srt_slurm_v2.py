"""srt-slurm 2.x recipes (`schema: 2`) and override files (`base:` + `override_<name>:`), read
into the v1 layout the import maps key by key (launcher/schema/srt_slurm.py).

srt-slurm 2.x does the same: its 2.0 vocabularies (`engine:`, `roles:`, `placement:`,
`services:`, `dynamo.source`) are normalized into the v1 fields before validation
(NVIDIA/srt-slurm docs/legacy-v1.md). The import reports every key under the name the file
gives it: `renames` says which v1 key stands for which schema-2 key. Keys that have no v1
field (services, host_setup, post_eval, the per-role extras) get their row here. Pure: no
file is read. docs/srt-slurm.md has the table, with sources.
"""

from __future__ import annotations

import copy
import fnmatch
from typing import Any

from launcher.errors import UserError
from launcher.schema.wording import show

# schema-2 role -> (v1 mode under backend.*, v1 short name under resources.*)
ROLES = {"prefill": ("prefill", "prefill"), "decode": ("decode", "decode"),
         "agg": ("aggregated", "agg")}

# What becomes of each services[] type (docs/services.md): (category, why).
SERVICES = {
    "etcd": ("deviation", "Dynamo's discovery plane: not started, vllm-router needs none, and "
                          "no node is reserved for it"),
    "nats": ("deviation", "Dynamo's discovery plane: not started, vllm-router needs none, and "
                          "no node is reserved for it"),
    "dcgm-exporter": ("deviation", "GPU telemetry here is the launcher's own agent (NVML)"),
    "node-exporter": ("deviation", "host telemetry here is the launcher's own agent"),
}
# A service whose feature is another issue's: the whole file is refused in one sentence.
FEATURE_SERVICES = {
    "mooncake-store": "a standalone Mooncake store client (services type mooncake-store)",
    "lmcache-server": "an LMCache KV server (services type lmcache-server)",
}


def is_override_file(data: Any) -> bool:
    return isinstance(data, dict) and "base" in data


def variant_names(data: dict) -> list[str]:
    return [k for k in data if isinstance(k, str) and k.startswith("override_")]


def deep_merge(base: Any, over: Any) -> Any:
    """srt-slurm's override merge (docs/overrides.md): mappings merge key by key, a list or
    a scalar replaces, null deletes the key."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def select(data: dict, selector: str | None, source: str) -> dict:
    """One recipe of an override file: `override_<name>` deep-merged over `base` (`base`
    alone for the selector `base`). A file's top-level `schema` holds for every variant."""
    names = variant_names(data)
    zips = [k for k in data if isinstance(k, str) and k.startswith("zip_override_")]
    others = [k for k in data if k not in ("base", "schema", *names, *zips)]
    if others:
        raise UserError(f"cannot import {source}: an override file holds schema, base and "
                        f"override_<name> blocks; {show(others[0])} is none of them")
    if selector is None:
        raise UserError(f"{source} is an override file ({len(names)} override_ variant(s)): "
                        f"name one as {source}:override_NAME ({', '.join(names) or 'none'}), "
                        "or submit the file alone to run every variant as one study")
    if selector.startswith("zip_override_") or any(c in selector for c in "*?["):
        raise UserError(f"{source}:{selector}: zip_override_ groups and glob selectors are not "
                        "read here; expand them with `srtctl resolve-override` and import each "
                        "file, or name one override_<name>")
    base = data.get("base")
    if not isinstance(base, dict):
        raise UserError(f"cannot import {source}: base is {type(base).__name__}, srt-slurm "
                        "has a mapping of the recipe's keys there")
    if selector == "base":
        out = copy.deepcopy(base)
    else:
        if selector not in names:
            close = fnmatch.filter(names, f"*{selector.removeprefix('override_')}*")
            raise UserError(f"{source} has no variant {show(selector)}: it has "
                            f"{', '.join((close or names)[:20]) or 'none'}")
        over = data[selector]
        if not isinstance(over, dict):
            raise UserError(f"cannot import {source}:{selector}: the variant is "
                            f"{type(over).__name__}, srt-slurm merges a mapping over base")
        out = deep_merge(base, over)
        if "name" not in over and isinstance(base.get("name"), str):
            out["name"] = f"{base['name']}_{selector.removeprefix('override_')}"
    if "schema" in data and "schema" not in out:
        out["schema"] = data["schema"]
    return out


def split_ref(ref: str) -> tuple[str, str | None]:
    """`variants.yaml:override_x` -> ("variants.yaml", "override_x"); a plain path -> (path,
    None)."""
    head, sep, tail = ref.rpartition(":")
    if sep and head.endswith((".yaml", ".yml")) and tail and "/" not in tail:
        return head, tail
    return ref, None


def _feature(data: dict) -> str | None:
    """The feature another issue brings that this file needs, in words; None when none."""
    bench = data.get("benchmark") if isinstance(data.get("benchmark"), dict) else {}
    kind = bench.get("type")
    if kind in ("agentperf", "aiperf", "mooncake-router", "trace-replay"):
        return f"an agentic benchmark (benchmark.type {kind})"
    services = data.get("services")
    for s in services if isinstance(services, list) else []:
        if isinstance(s, dict) and s.get("type") in FEATURE_SERVICES:
            return FEATURE_SERVICES[s["type"]]
    return None


def refuse_features(data: dict, source: str) -> None:
    """One sentence, before any key is read, for a file built around a feature we do not
    run yet (agentic benchmarks, a standalone store client, LMCache): naming it is the whole
    answer."""
    what = _feature(data)
    if what:
        raise UserError(f"cannot import {source} (srt-slurm recipe): it needs {what}, which "
                        "this launcher does not run yet")


def normalize(data: dict) -> tuple[dict, list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(the v1 layout of a schema-2 recipe, [(v1 prefix, schema-2 prefix)], [(category,
    schema-2 key, text)] for the keys with no v1 field)."""
    rows: list[tuple[str, str, str]] = []
    renames: list[tuple[str, str]] = []
    out: dict[str, Any] = {}
    rows.append(("mapped", "schema", "2: srt-slurm 2.x's layout (engine, roles, services), "
                 "read key by key"))
    for k, v in data.items():
        if k in ("schema", "engine", "roles", "services", "host_setup", "post_eval"):
            continue
        if k == "backend":
            rows.append(("refused", "backend", "is the v1 layout; a schema-2 recipe writes "
                         "engine and roles (srtctl migrate rewrites it)"))
            continue
        out[k] = copy.deepcopy(v)
    backend, engine = _engine(data, rows, renames)
    renames.append(("backend.vllm_config", "roles"))  # a role missing is named as roles
    _roles(data, out, backend, rows, renames)
    _mooncake_service(data, backend, rows, renames)
    if backend or engine is not _ABSENT:
        out["backend"] = backend
    _placements(out, renames)
    _extras(data, rows)
    return out, renames, rows


def _engine(data: dict, rows: list, renames: list) -> tuple[dict, Any]:
    """`engine` as v1's backend (its type and engine-wide knobs)."""
    backend: dict[str, Any] = {}
    engine = data.get("engine", _ABSENT)
    if isinstance(engine, str):
        backend["type"] = engine
        renames.append(("backend.type", "engine"))
    elif isinstance(engine, dict):
        for k, v in engine.items():
            if k == "set_visible_devices":
                backend["set_cuda_visible_devices"] = v
            elif k == "failover":
                if v:
                    rows.append(("refused", "engine.failover", "shadow engines (Dynamo's GPU "
                                 "Memory Service) are not run here; remove it"))
            elif k == "vllm_serve_binary":
                rows.append(("mapped" if v == "vllm" else "refused", "engine.vllm_serve_binary",
                             "vllm" if v == "vllm" else f"{show(v)}: the engines run `vllm "
                             "serve` from the image"))
            else:
                backend[k] = v
        renames += [("backend.set_cuda_visible_devices", "engine.set_visible_devices"),
                    ("backend", "engine")]
    elif engine is _ABSENT:
        rows.append(("refused", "engine", "is required: name the engine (engine: vllm)"))
    else:
        rows.append(("refused", "engine", f"is {type(engine).__name__}: write the engine's "
                     "name (engine: vllm) or a mapping with type"))
    return backend, engine


def _roles(data: dict, out: dict, backend: dict, rows: list, renames: list) -> None:
    """`roles.<role>` as v1's resources.<role>_*, backend.<mode>_environment and
    backend.vllm_config.<mode>."""
    roles = data.get("roles", {})
    resources = out.setdefault("resources", {}) if isinstance(out.get("resources", {}),
                                                              dict) else None
    if not isinstance(roles, dict):
        rows.append(("refused", "roles", f"is {type(roles).__name__}: a mapping of prefill, "
                     "decode or agg to its nodes, workers, gpus, env and args"))
        roles = {}
    for role, body in roles.items():
        if role not in ROLES:
            rows.append(("refused", f"roles.{role}", "is not a role srt-slurm knows (prefill, "
                         "decode, agg)"))
            continue
        mode, short = ROLES[role]
        if body is None:
            continue
        if not isinstance(body, dict):
            rows.append(("refused", f"roles.{role}", f"is {type(body).__name__}: a mapping of "
                         "nodes, workers, gpus, env and args"))
            continue
        for k, v in body.items():
            where = f"roles.{role}.{k}"
            if k in ("nodes", "workers", "gpus"):
                if v == "colocate":
                    rows.append(("refused", where, "colocate: the planner never puts prefill "
                                 "and decode on one node"))
                elif resources is not None:
                    resources[{"nodes": f"{short}_nodes", "workers": f"{short}_workers",
                               "gpus": f"gpus_per_{short}"}[k]] = v
            elif k == "env":
                backend[f"{mode}_environment"] = v
            elif k == "args":
                backend.setdefault("vllm_config", {})[mode] = v
            elif k == "engine":
                name = v.get("type") if isinstance(v, dict) else v
                if name == "vllm" and not isinstance(v, dict):
                    rows.append(("mapped", where, "vllm"))
                else:
                    rows.append(("refused", where, "a per-role engine: name one top-level "
                                 "engine: vllm"))
            elif k == "container":
                same = v in (None, (data.get("model") or {}).get("container")
                             if isinstance(data.get("model"), dict) else None)
                rows.append(("mapped", where, "model.container (the same image)") if same
                            else ("refused", where, f"{show(v)}: every engine runs "
                                  "model.container here; a per-role image is not supported"))
            elif k == "critical":
                rows.append(("mapped", where, "true: a worker that exits fails the run") if v
                            is not False else ("refused", where, "false: a worker that exits "
                                               "always fails the run here"))
            elif k == "kv_events" and v and _front_end(data) == "dynamo":
                rows.append(("deviation", where, "the engines' KV events feed Dynamo's KV "
                             "router (router-mode kv); vllm-router fronts them here and reads "
                             "none (sessions are kept by consistent_hash), so they publish "
                             "none"))
            elif k in ("kv_events", "sidecar"):
                if v:
                    rows.append(("refused", where, "feeds Dynamo (its KV router or sidecar), "
                                 "which is not run here; remove it"))
                else:
                    rows.append(("mapped", where, "off, as here"))
            elif k in ("srun_options", "extra_args"):
                if v:
                    rows.append(("refused", where, "per-role srun options are not supported: "
                                 "set srun_options for the job" if k == "srun_options" else
                                 "raw extra arguments are TensorRT-LLM's only"))
                else:
                    rows.append(("mapped", where, "none"))
            else:
                rows.append(("refused", where, "is not a key of srt-slurm's RoleConfig"))
        renames += [(f"backend.vllm_config.{mode}", f"roles.{role}.args"),
                    (f"backend.{mode}_environment", f"roles.{role}.env"),
                    (f"resources.{short}_nodes", f"roles.{role}.nodes"),
                    (f"resources.{short}_workers", f"roles.{role}.workers"),
                    (f"resources.gpus_per_{short}", f"roles.{role}.gpus")]


def _front_end(data: dict) -> object:
    fe = data.get("frontend")
    return (fe.get("type") or "dynamo") if isinstance(fe, dict) else "dynamo"


def _mooncake_service(data: dict, backend: dict, rows: list, renames: list) -> None:
    """A `mooncake-master` service as v1's backend.mooncake_kv_store, as srt-slurm 2.x's
    expand_services does (docs/services.md): options.store_config, args (the master's extra
    flags)."""
    services = data.get("services")
    for i, s in enumerate(services if isinstance(services, list) else []):
        if not (isinstance(s, dict) and s.get("type") == "mooncake-master"
                and s.get("enabled") is not False):
            continue
        where = f"services[{i}]"
        if "mooncake_kv_store" in backend:
            rows.append(("refused", where, "a second Mooncake master: one store per job"))
            continue
        block: dict[str, Any] = {}
        for k, v in s.items():
            if k in ("name", "type"):
                rows.append(("mapped", f"{where}.{k}", "kv_store (the launcher's "
                             "mooncake-master process)"))
            elif k == "placement":
                node = v.get("node") if isinstance(v, dict) else v
                if node in (None, "infra", "head"):
                    rows.append(("mapped", f"{where}.placement", "the first node (the head, "
                                 "where the router's node block begins)"))
                else:
                    rows.append(("refused", f"{where}.placement", f"{show(node)}: the master "
                                 "runs on the first node here (infra or head)"))
            elif k == "options" and isinstance(v, dict):
                for o, ov in v.items():
                    if o == "store_config":
                        block["store_config"] = ov
                        renames.append(("backend.mooncake_kv_store.store_config",
                                        f"{where}.options.store_config"))
                    elif o == "default_kv_lease_ttl_ms":
                        block[o] = ov
                        renames.append((f"backend.mooncake_kv_store.{o}", f"{where}.options.{o}"))
                    else:
                        rows.append(("refused", f"{where}.options.{o}", "is not read here "
                                     "(store_config, default_kv_lease_ttl_ms): remove it"))
            elif k == "args":
                block["master_extra_args"] = v
                renames.append(("backend.mooncake_kv_store.master_extra_args", f"{where}.args"))
            elif k == "container":
                block["container"] = v
                renames.append(("backend.mooncake_kv_store.container", f"{where}.container"))
            elif k == "env" and not v:
                rows.append(("mapped", f"{where}.env", "none, as here"))
            elif k == "enabled":
                rows.append(("mapped", f"{where}.enabled", "true"))
            else:
                rows.append(("refused", f"{where}.{k}", "is not read for a mooncake-master "
                             "service here (name, type, placement, options.store_config, args, "
                             "container): remove it"))
        renames.append(("backend.mooncake_kv_store", where))
        backend["mooncake_kv_store"] = block


def _placements(out: dict, renames: list) -> None:
    """`frontend.placement` and `benchmark.placement` as v1's placement keys."""
    for section in ("frontend", "benchmark"):
        body = out.get(section)
        if not isinstance(body, dict) or "placement" not in body:
            continue
        place = body.pop("placement")
        node = place.get("node", "head") if isinstance(place, dict) else place
        if node == "dedicated":
            key = "dedicated_node" if section == "frontend" else "client_dedicated_node"
            body[key] = True
        else:
            key = "orchestrator_placement" if section == "frontend" else "client_placement"
            body[key] = node
        renames.append((f"{section}.{key}", f"{section}.placement.node"))


def _extras(data: dict, rows: list) -> None:
    """services, host_setup and post_eval: no v1 field, a row each."""
    services = data.get("services", [])
    if not isinstance(services, list):
        rows.append(("refused", "services", f"is {type(services).__name__}: a list of "
                     "{name, type, ...}"))
        services = []
    for i, s in enumerate(services):
        kind = s.get("type", "generic") if isinstance(s, dict) else None
        where = f"services[{i}]" + (f" ({s.get('name')})" if isinstance(s, dict) else "")
        if isinstance(s, dict) and s.get("enabled") is False:
            rows.append(("mapped", where, "enabled: false, as here"))
        elif kind == "mooncake-master":
            continue  # read as backend.mooncake_kv_store (_mooncake_service)
        elif kind in SERVICES:
            cat, why = SERVICES[kind]
            rows.append((cat, where, f"type {kind}: {why}"))
        else:
            rows.append(("refused", where, f"type {show(kind)}: a service beside the engines "
                         "is not run by this launcher; remove it"))
    host = data.get("host_setup")
    if host is not None:
        if isinstance(host, dict) and not host.get("commands") and not host.get("teardown"):
            rows.append(("mapped", "host_setup", "no commands, as here"))
        else:
            rows.append(("refused", "host_setup", "commands on each node's bare host are not "
                         "run by this launcher (the profile's step_preamble runs in the "
                         "engine's step); remove it"))
    post = data.get("post_eval")
    if post is not None:
        if isinstance(post, dict) and not any(post.values()):
            rows.append(("mapped", "post_eval", "none, as here"))
        else:
            rows.append(("refused", "post_eval", "a post-benchmark evaluation command is not "
                         "run here (the accuracy section runs GSM8K); remove it"))


_ABSENT = object()
