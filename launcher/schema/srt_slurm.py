"""srt-slurm recipes, imported: every key carried over, marked as a deviation, or refused.

srt-slurm (NVIDIA/srt-slurm) is where GB200 users keep their recipes. The schema read is the
one of its tag v1.0.68 (`src/srtctl/core/schema.py` and the modules that read each key); a
`schema: 2` file (srt-slurm 2.x) is first read into that layout by srt_slurm_v2, as srt-slurm
itself does. docs/srt-slurm.md has the key-by-key tables this module follows, with sources. The import is
pure: a mapping in, a recipe mapping of ours and a report out. Nothing is dropped silently:
each source key is named in the report as mapped, deviation (with why) or refused (one
sentence), and a key this import does not know is refused by name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import UserError
from launcher.schema import native_bench
from launcher.schema.sections import AGENTIC_CORPORA, aiperf_env_names, flag_key
from launcher.schema.wording import did_you_mean, show

SCHEMA_READ = "NVIDIA/srt-slurm v1.0.68 (c88ef731)"
# schema 2: srt-slurm 2.x's generated reference (docs/schema-reference.md, docs/legacy-v1.md)
SCHEMA2_READ = "NVIDIA/srt-slurm 2.x schema 2 (docs/schema-reference.md at 01aebde8)"
# Top-level keys only schema 2 has: a v1 file that writes one is named with the fix.
V2_TOP = ("engine", "roles", "services", "host_setup", "post_eval")

# resources.gpu_type -> our cluster profile
CLUSTERS = {"gb200": "gb200-nvl72"}

# srt-slurm's defaults where ours differ (benchmarks/sa_bench.py, core/schema.py, cli/submit.py)
SA_BENCH_DEFAULTS = {"random_range_ratio": 0.8, "num_prompts_mult": 10, "num_warmup_mult": 2,
                     "use_chat_template": True}
# sa-bench's adapter of vLLM's DeepSeek-V4 renderer (benchmarks/scripts/sa-bench/
# sa_bench_tokenizers/vllm_deepseek_v4.py): the engines' tokenizer-mode deepseek_v4 loads it
VLLM_DSV4_TOKENIZER = "sa_bench_tokenizers.vllm_deepseek_v4.VLLMDeepseekV4Tokenizer"
TIME_LIMIT_DEFAULT = "01:00:00"
HEALTH_DEFAULTS = {"max_attempts": 180, "interval_seconds": 10}

MODES = {"prefill": "prefill", "decode": "decode", "aggregated": "agg"}

# vllm_config flags that become recipe keys of ours, or that the launcher derives.
DERIVED_FLAGS = {
    "data-parallel-rpc-port": "the launcher owns every port (srt-slurm too uses its own for "
                              "node-local DP)",
    "data-parallel-hybrid-lb": "the planner sets it for an endpoint with a front per node "
                               "(<pool>.fronts: per_node), as srt-slurm derives it",
    "data-parallel-size-local": "the planner derives it from the GPUs per node",
    "data-parallel-start-rank": "the planner assigns DP ranks",
    "data-parallel-address": "the planner sets the head node's address",
    "host": "the launcher binds every server",
    "port": "the launcher owns every port",
    "master-addr": "the planner sets the multi-node rendezvous",
    "nnodes": "the planner sets the multi-node rendezvous",
    "node-rank": "the planner sets the multi-node rendezvous",
    "device-ids": "the planner pins GPUs with CUDA_VISIBLE_DEVICES",
}

# Whole sections that belong to a feature we do not run: one sentence each.
REFUSED_SECTIONS = {
    "profiling": "profiling (nsys or the torch profiler) is not run by this launcher; remove "
                 "the section or set profiling.type: none",
    "reporting": "reporting (status API, AI analysis, S3 upload) is not run by this launcher; "
                 "remove the section",
}

# Sections of Dynamo and its services: recorded, not run (vllm-router serves instead).
DYNAMO_SECTIONS = {
    "dynamo": "Dynamo is not installed: vllm-router fronts the engines, which run `vllm serve`",
    "infra": "etcd and NATS serve Dynamo only: not started, and no node is reserved for them",
}


@dataclass
class Report:
    """What became of each source key."""

    source: str
    sha256: str
    layout: int = 1  # the file's schema: 1 (v1.0.68's layout) or 2
    mapped: list[tuple[str, str]] = field(default_factory=list)  # (key, ours)
    deviations: list[tuple[str, str]] = field(default_factory=list)  # (key, why)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (key, sentence)

    def summary(self) -> str:
        return (f"{len(self.mapped)} keys mapped, {len(self.deviations)} deviations, "
                f"{len(self.refused)} refused")

    def lines(self) -> list[str]:
        read = SCHEMA2_READ if self.layout == 2 else SCHEMA_READ
        out = [f"imported {self.source} (srt-slurm recipe, sha256 {self.sha256[:12]}, schema "
               f"{self.layout}, read as {read}): {self.summary()}"]
        out += [f"  mapped     {k} -> {v}" for k, v in self.mapped]
        out += [f"  deviation  {k}: {v}" for k, v in self.deviations]
        out += [f"  refused    {k}: {v}" for k, v in self.refused]
        return out


def looks_like(data: Any) -> bool:
    """An srt-slurm recipe (`resources` and `backend` or `model.container`; `schema: 2`; an
    override file's `base`), not one of ours."""
    if not isinstance(data, dict) or "cluster" in data:
        return False
    if "base" in data or data.get("schema") == 2:
        return True
    return "resources" in data and (
        "backend" in data or "roles" in data
        or isinstance(data.get("model"), dict) and "container" in data["model"])


def file_sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise UserError(f"cannot read {show(path)}: {e.strerror or e}") from None


class _Source:
    """The source mapping, with every key read marked, so the rest can be named."""

    def __init__(self, data: dict, report: Report, renames: list[tuple[str, str]] = ()):
        self.data = data
        self.report = report
        self.seen: set[str] = set()
        # (v1 prefix, the file's own prefix): a schema-2 file's keys are reported by its names
        self.renames = sorted(renames, key=lambda r: -len(r[0]))

    def name(self, key: str) -> str:
        """`key` (v1 layout) as the file writes it."""
        for old, new in self.renames:
            if key == old or key.startswith(old + "."):
                return new + key[len(old):]
        return key

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        self.seen.add(key)
        return node

    def has(self, key: str) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def peek(self, key: str, default: Any = None) -> Any:
        """The value at `key` without marking it read (a section whose keys are read one by
        one)."""
        node: Any = self.data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def section(self, key: str) -> dict:
        v = self.peek(key, {})
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.refuse(key, f"is {type(v).__name__}, srt-slurm's schema has a mapping here")
            return {}
        return v

    # a key reported is a key read; one key read for both sides is reported once
    def _add(self, rows: list[tuple[str, str]], key: str, text: str) -> None:
        self.seen.add(key)
        key = self.name(key)
        if (key, text) not in rows:
            rows.append((key, text))

    def map(self, key: str, ours: str) -> None:
        self._add(self.report.mapped, key, ours)

    def deviate(self, key: str, why: str) -> None:
        self._add(self.report.deviations, key, why)

    def refuse(self, key: str, why: str) -> None:
        self._add(self.report.refused, key, why)

    def unread(self) -> list[str]:
        """Leaf keys of the source that no rule read (a key read whole covers its children)."""
        out = []

        def walk(node: dict, prefix: str) -> None:
            for k, v in node.items():
                key = f"{prefix}{k}"
                if key in self.seen:
                    continue
                if isinstance(v, dict) and v and any(s.startswith(key + ".") for s in self.seen):
                    walk(v, key + ".")
                else:
                    out.append(key)

        walk(self.data, "")
        return out


_MISSING = object()

# Keys of srt-slurm's schema that belong to harnesses or features we do not run, when the
# rules above did not read them (docs/srt-slurm.md, the benchmark table).
_OTHER_HARNESS = "belongs to a benchmark this launcher does not run (it runs sa-bench's "
KNOWN_ELSEWHERE = {
    "benchmark.dataset_path": "a custom dataset file: the client sends sa-bench's random "
                              "dataset only; remove it",
    "benchmark.trace_file": _OTHER_HARNESS + "workload); remove it",
    "benchmark.client_placement": "the clients run where router.placement puts them; remove it",
    "benchmark.client_dedicated_node": "no node is reserved for the client here; remove it",
    "benchmark.colocate_with_frontend": "no node is reserved for the client here; remove it",
    "benchmark.sweep": "srt-slurm parses it and never reads it (v1.0.68); remove it",
    "benchmark.command": "an arbitrary client command is not run here; remove it",
    "benchmark.container_image": "an arbitrary client image is not run here; remove it",
    "benchmark.env": "an arbitrary client's environment: not run here; remove it",
    "benchmark.aiperf_package": _OTHER_HARNESS + "workload, not aiperf); remove it",
    "benchmark.aiperf_args": _OTHER_HARNESS + "workload, not aiperf); remove it",
    "benchmark.num_threads": "SGLang's GSM8K harness only; remove it",
    "benchmark.top_p": "SGLang's GSM8K harness only; remove it",
    "benchmark.top_k": "SGLang's GSM8K harness only; remove it",
    "benchmark.max_context_length": _OTHER_HARNESS + "workload and GSM8K); remove it",
    "benchmark.categories": _OTHER_HARNESS + "workload and GSM8K); remove it",
    "benchmark.num_requests": _OTHER_HARNESS + "workload); remove it",
    "benchmark.prefix_ratios": _OTHER_HARNESS + "workload); remove it",
    "benchmark.mooncake_workload": _OTHER_HARNESS + "workload); remove it",
    "benchmark.ttft_threshold_ms": _OTHER_HARNESS + "workload); remove it",
    "benchmark.itl_threshold_ms": _OTHER_HARNESS + "workload); remove it",
    "benchmark.slow_down_sleep_time": "SGLang's /slow_down only; remove it",
    "benchmark.slow_down_wait_time": "SGLang's /slow_down only; remove it",
}

# Every key of srt-slurm v1.0.68's recipe schema, for naming a misspelt one.
KNOWN_TOP = ("name", "model", "resources", "slurm", "backend", "frontend", "dynamo", "infra",
             "benchmark", "health_check", "output", "profiling", "observability", "telemetry",
             "environment", "container_mounts", "extra_mount", "srun_options",
             "sbatch_directives", "enable_config_dump", "setup_script", "identity", "reporting",
             "base", "sweep", "lock", "schema")


def convert(data: dict, source: str, sha256: str, aliases: dict[str, str] | None = None,
            given: set[str] = frozenset()) -> tuple[dict, Report]:
    """(recipe of ours, report) from an srt-slurm recipe mapping, either layout (the file's
    `schema` says which). `aliases`: srtslurm.yaml's model_paths/containers entries (the
    site file's or --alias); `given`: our keys --set provides (an alias needs no resolving
    then). Raises UserError naming every refused key."""
    from launcher.schema import srt_slurm_v2

    layout = data.get("schema", 1)
    if layout not in (1, 2) or isinstance(layout, bool):
        raise UserError(f"cannot import {source} (srt-slurm recipe): schema {show(layout)}: "
                        "srt-slurm recipes are schema 1 (the v1 layout) or 2")
    srt_slurm_v2.refuse_features(data, source)
    renames: list[tuple[str, str]] = []
    rows: list[tuple[str, str, str]] = []
    if layout == 2:
        data, renames, rows = srt_slurm_v2.normalize(data)
    elif "schema" in data:
        data = {k: v for k, v in data.items() if k != "schema"}
        rows = [("mapped", "schema", "1: the v1 layout")]
    report = Report(source, sha256, layout)
    src = _Source(data, report, renames)
    for category, key, text in rows:
        {"mapped": report.mapped, "deviation": report.deviations,
         "refused": report.refused}[category].append((key, text))
    aliases = aliases or {}
    out: dict[str, Any] = {}

    kind = src.get("backend.type", "sglang" if layout == 1 else None)
    if kind != "vllm":  # the rest of such a file is another engine's: one sentence
        raise UserError(
            f"cannot import {source} (srt-slurm recipe): {src.name('backend.type')} {show(kind)}"
            + (" (srt-slurm's default when backend is absent)" if layout == 1
               and not src.has("backend") else "")
            + ": this launcher runs vLLM only")
    src.map("backend.type", "engine: vllm")
    _file_level(src)
    out["name"] = _name(src)
    gpu_type = src.get("resources.gpu_type")
    out["cluster"] = CLUSTERS.get(str(gpu_type).lower(), "")
    if out["cluster"]:
        src.map("resources.gpu_type", f"cluster: {out['cluster']}")
    else:
        src.refuse("resources.gpu_type", f"{show(gpu_type)}: this import knows the GB200 "
                   f"NVL72 profile only (gpu_type: {', '.join(CLUSTERS)}); import a GB200 recipe")
    out["engine"] = "vllm"
    provenance: list[str] = []
    _model(src, out, aliases, given, provenance)
    _identity(src, out, provenance, given)
    _version_from_image(src, out)
    mode = _pools(src, out)
    out["mode"] = mode
    _environment(src, out)
    _frontend(src, out, provenance)
    _benchmark(src, out)
    _slurm(src, out)
    _health(src, out)
    _job_wide(src, out)
    _observability(src, out)

    for key in src.unread():
        top = key.split(".")[0]
        read = SCHEMA2_READ if layout == 2 else SCHEMA_READ
        if top in KNOWN_TOP and src.peek(key, 0) in ({}, [], None):
            src.map(key, "empty: sets nothing")  # published files keep empty sections
        elif key in KNOWN_ELSEWHERE:
            src.refuse(key, KNOWN_ELSEWHERE[key])
        elif layout == 1 and top in V2_TOP:
            src.refuse(key, "is a schema-2 key: a recipe in srt-slurm 2.x's layout says "
                       "schema: 2 at its top")
        elif top not in KNOWN_TOP:  # (a renamed key's top is a known one)
            hint = did_you_mean(top, KNOWN_TOP)
            src.refuse(key, "is not a key of srt-slurm's recipe schema as this import reads it ("
                       f"{read}){f'; {hint}' if hint else ''}")
        else:
            src.refuse(key, f"is not a key this import knows under {src.name(top)} ({read}): "
                       "remove it, or report it with the srt-slurm version that reads it")

    out["description"] = _description(out, source, sha256, provenance, report)
    out = _ordered(out)
    if report.refused:
        raise UserError.of(f"cannot import {source} (srt-slurm recipe):",
                           [f"{k} {v}" if v.startswith("is ") else f"{k}: {v}"
                            for k, v in report.refused], head_on_one=True)
    return out, report


def _file_level(src: _Source) -> None:
    for key in ("base", "sweep", "lock"):
        if src.has(key):
            src.refuse(key, {
                "base": "an override file (base + override_*/zip_override_*): expand its "
                        "variants with srt-slurm first, or import each as its own recipe",
                "sweep": "srt-slurm's sweep section: import each combination, or use "
                         "submit --sweep on the imported recipe",
                "lock": "a lockfile section: import the recipe it was made from",
            }[key])
    for key in list(src.data):
        if isinstance(key, str) and key.startswith(("override_", "zip_override_")):
            src.get(key)
            src.refuse(key, "an override variant: expand it with srt-slurm first, or import "
                            "each variant as its own recipe")


def _name(src: _Source) -> str:
    raw = src.get("name")
    if not isinstance(raw, str) or not raw.strip():
        src.refuse("name", "is required: srt-slurm names every recipe")
        return "imported"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", raw.strip()).strip("-._")[:100] or "imported"
    src.map("name", f"name: {name}" + (" (characters outside [A-Za-z0-9._-] become -)"
                                       if name != raw else ""))
    return name


def _model(src: _Source, out: dict, aliases: dict[str, str], given: set[str],
           provenance: list[str]) -> None:
    model: dict[str, Any] = {}
    path = src.get("model.path")
    if not isinstance(path, str) or not path:
        src.refuse("model.path", "is required: a hub id (hf:ORG/NAME) or a folder")
    elif path in aliases:
        model["path"] = aliases[path]
        src.map("model.path", f"model.path: {aliases[path]} (alias {path}, from --alias)")
    elif "model.path" in given:
        model["path"] = path.removeprefix("hf:")
        src.map("model.path", f"model.path: from --set (alias {path} not resolved)")
    elif path.startswith("hf:"):
        model["path"] = path[3:]
        src.map("model.path", f"model.path: {model['path']}")
    elif path.startswith(("/", "./", "~")):
        model["path"] = path
        src.map("model.path", f"model.path: {path} (a folder the nodes see)")
    else:
        repo = src.peek("identity.model.repo")  # the checkpoint the file says it serves
        value = repo if isinstance(repo, str) and repo else "HF_ID_OR_FOLDER"
        src.refuse("model.path", f"{show(path)} is an alias that only a site's srtslurm.yaml "
                   f"resolves: give --alias {path}={value}"
                   + (" (the file's identity.model.repo)" if value == repo else "")
                   + ", the site's file (--site SRTSLURM_YAML) or --set model.path=...")
    image = src.get("model.container")
    if not isinstance(image, str) or not image:
        src.refuse("model.container", "is required: the engine image")
    elif image in aliases:
        out["container"] = {"image": aliases[image]}
        src.map("model.container", f"container.image: {aliases[image]} (alias {image}, from "
                "--alias)")
    elif "container.image" in given or "/" in image or ":" in image:
        out["container"] = {"image": image}
        src.map("model.container", "container.image" + (
            " (from --set)" if "container.image" in given else f": {image}"))
    else:
        src.refuse("model.container", f"{show(image)} is an alias that only a site's "
                   f"srtslurm.yaml resolves: give --site SRTSLURM_YAML, --alias {image}=IMAGE "
                   "or --set container.image=...")
    if src.has("model.precision"):
        provenance.append(f"precision {src.get('model.precision')}")
        src.deviate("model.precision", "a label in srt-slurm too: kept in the description")
    if src.has("model.stage_dir"):
        src.refuse("model.stage_dir", "copying the checkpoint to node-local disk is not done "
                   "here (python -m launcher stage-model stages it to the shared cache): "
                   "remove it")
    out["model"] = model


def _identity(src: _Source, out: dict, provenance: list[str], given: set[str]) -> None:
    model = out["model"]
    repo = src.get("identity.model.repo")
    if repo is not None:
        if "model.path" in given:
            src.deviate("identity.model.repo", f"{show(repo)}: --set model.path replaces the "
                        "checkpoint it names")
        elif model.get("path") and str(repo) != model["path"]:
            src.refuse("identity.model.repo", f"{show(repo)} is not model.path "
                       f"({show(model['path'])}): make them the same checkpoint")
        else:
            src.map("identity.model.repo", "checked equal to model.path")
    rev = src.get("identity.model.revision")
    if rev is not None:
        model["revision"] = str(rev)
        src.map("identity.model.revision", f"model.revision: {rev}")
    img = src.get("identity.container.image")
    if img is not None:
        provenance.append(f"identity image {img}")
        src.deviate("identity.container.image", "recorded in the description (srt-slurm does "
                    "not verify it either)")
    frameworks = src.section("identity.frameworks")
    for name, version in frameworks.items():
        if name == "vllm":
            out["engine_version"] = str(version)
            src.map("identity.frameworks.vllm", f"engine_version: {version} (preflight "
                    "checks the image reports it)")
        else:
            provenance.append(f"{name} {version}")
            src.deviate(f"identity.frameworks.{name}", f"{name} is not run here: its version "
                        "is kept in the description")


def _version_from_image(src: _Source, out: dict) -> None:
    """vLLM's release images say their version in the tag (vllm/vllm-openai:v0.20.1-...):
    the dry-run then checks flags with that version's parser only if it is the one it has."""
    if out.get("engine_version"):
        return
    image = (out.get("container") or {}).get("image") or ""
    m = re.match(r"^(?:docker\.io/)?vllm/vllm-openai:v(\d+\.\d+(?:\.\d+)?)(?:[-@]|$)", image)
    if m:
        out["engine_version"] = m.group(1)
        src.map("model.container", f"engine_version: {m.group(1)} (the release image's tag)")


def _args_of(src: _Source, mode: str) -> dict[str, Any]:
    cfg = src.section(f"backend.vllm_config.{mode}")
    for k in cfg:  # reported under the flag's dashed name; the source may write _
        src.get(f"backend.vllm_config.{mode}.{k}")
    out = {}
    for k, v in cfg.items():
        name = flag_key(str(k))
        full = _abbreviated(name)
        if full is not None and full not in cfg:
            src.map(f"backend.vllm_config.{mode}.{k}", f"--{full}: vLLM's parser takes "
                    f"--{name} as that flag (argparse's allow_abbrev), written in full")
            name = full
        out[name] = v
    return out


@functools.cache
def _vllm_flags() -> frozenset[str]:
    from launcher.sim import vllm_flags

    return frozenset(o.removeprefix("--") for rec in vllm_flags.FLAGS
                     for o in rec["options"] if o.startswith("--"))


def _vllm_version() -> str:
    from launcher.sim import vllm_flags

    return vllm_flags.VLLM_VERSION


def _abbreviated(name: str) -> str | None:
    """The one vLLM flag `name` is a prefix of, where it is no flag itself."""
    known = _vllm_flags()
    if name in known or name.split(".", 1)[0] in known:
        return None
    longer = [f for f in known if f.startswith(name)]
    return longer[0] if len(longer) == 1 else None


def _int_flag(src: _Source, key: str, value: Any, default: int = 1) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        try:
            n = int(str(value))
            if n >= 1:
                return n
        except ValueError:
            pass
        src.refuse(key, f"{show(value)} is not a positive whole number")
        return default
    return value


def _pool_flags(src: _Source, key: str, ours: str, args: dict) -> None:
    """A role's remaining vllm_config flags: each mapped to `ours`.args as srt-slurm renders
    it, or a deviation or refusal (taken out of `args`)."""
    for flag in list(args):
        if flag in DERIVED_FLAGS:
            args.pop(flag)
            src.deviate(f"{key}.{flag}", DERIVED_FLAGS[flag])
        elif flag.startswith("dyn-"):  # Dynamo's worker reads these; vllm serve has none
            args.pop(flag)
            src.deviate(f"{key}.{flag}", "one of Dynamo's frontend options (read by "
                        "`python -m dynamo.vllm`, not `vllm serve`): vllm-router fronts "
                        "the engines here, so it is not passed on")
        elif flag.startswith("router-") and flag not in _vllm_flags():
            # Dynamo's router options (dynamo.frontend --router-mode, --router-session-
            # affinity-ttl-secs) written on a worker: vllm serve has no such flag
            value = args.pop(flag)
            src.deviate(f"{key}.{flag}", f"{show(value)}: one of Dynamo's router options, "
                        f"not a `vllm serve` flag (vLLM {_vllm_version()} has none named so): "
                        "vllm-router routes here, so it is not passed on")
        elif flag == "headless":
            args.pop(flag)
            src.refuse(f"{key}.headless", "the planner decides which parts are headless "
                       "(srt-slurm refuses it too)")
        elif flag == "profiler-config":
            args.pop(flag)
            src.refuse(f"{key}.profiler-config", "profiling is not run by this launcher; "
                       "remove it")
        elif args[flag] is False:
            # srt-slurm writes no flag for a false value (backends/vllm.py)
            args.pop(flag)
            src.map(f"{key}.{flag}", "false: no flag, as srt-slurm renders it")
        elif args[flag] is None:
            args.pop(flag)
            src.map(f"{key}.{flag}", "null: no flag, as srt-slurm renders it")
        elif isinstance(args[flag], (list, dict)):
            v = args[flag]
            if isinstance(v, dict):
                args[flag] = json.dumps(v, separators=(",", ":"))
                src.map(f"{key}.{flag}", f"{ours}.args.{flag} (as JSON)")
            elif v and all(isinstance(x, (int, float, str)) and not isinstance(x, bool)
                           for x in v):
                src.map(f"{key}.{flag}", f"{ours}.args.{flag} (a list: the flag, then "
                        "each value, as srt-slurm renders it)")
            else:
                src.refuse(f"{key}.{flag}", "a list of flag values holds numbers or words "
                           "only, at least one")
                args.pop(flag)
        else:
            src.map(f"{key}.{flag}", f"{ours}.args.{flag}")


def _pools(src: _Source, out: dict) -> str:
    """prefill/decode (or agg) pools, the flags every pool shares, and the KV connector."""
    cfg = src.section("backend.vllm_config")
    modes = [m for m in MODES if cfg.get(m)]
    for m in cfg:
        if m not in MODES:
            src.get(f"backend.vllm_config.{m}")
            src.refuse(f"backend.vllm_config.{m}", "is not a vLLM mode srt-slurm knows "
                       "(prefill, decode, aggregated)")
    mode = "agg" if modes == ["aggregated"] else "disagg"
    if mode == "disagg" and ("prefill" not in modes or "decode" not in modes):
        src.get("resources")  # read with the roles they size: the refusal below covers them
        src.get("backend")
        src.refuse("backend.vllm_config", "needs prefill and decode (disaggregated) or "
                   "aggregated alone")
        return mode
    res = src.section("resources")
    gpn = res.get("gpus_per_node", 4)
    src.get("resources.gpus_per_node")
    if gpn != 4 or isinstance(gpn, bool):
        src.refuse("resources.gpus_per_node", f"{show(gpn)}: a GB200 NVL72 tray has 4 GPUs")
        gpn = 4  # the rest is read as for a tray, so each key gets its own sentence
    else:
        src.map("resources.gpus_per_node", "the profile's gpus_per_node (4)")
    connectors = []
    pools: dict[str, dict] = {}
    for m in ([ "aggregated"] if mode == "agg" else ["prefill", "decode"]):
        ours = MODES[m]
        short = "agg" if m == "aggregated" else m
        args = _args_of(src, m)
        key = f"backend.vllm_config.{m}"
        pool: dict[str, Any] = {}
        tp = _int_flag(src, f"{key}.tensor-parallel-size", args.pop("tensor-parallel-size", None))
        dp = _int_flag(src, f"{key}.data-parallel-size", args.pop("data-parallel-size", None))
        pool["tensor_parallel"], pool["data_parallel"] = tp, dp
        src.map(f"{key}.tensor-parallel-size", f"{ours}.tensor_parallel: {tp}")
        src.map(f"{key}.data-parallel-size", f"{ours}.data_parallel: {dp}")
        if args.get("pipeline-parallel-size", 1) != 1:  # 1, vLLM's default, passes through
            pp = _int_flag(src, f"{key}.pipeline-parallel-size",
                           args.pop("pipeline-parallel-size"))
            pool["pipeline_parallel"] = pp
            src.map(f"{key}.pipeline-parallel-size", f"{ours}.pipeline_parallel: {pp}")
        if "enable-expert-parallel" in args:
            pool["expert_parallel"] = bool(args.pop("enable-expert-parallel"))
            src.map(f"{key}.enable-expert-parallel", f"{ours}.expert_parallel: "
                    f"{str(pool['expert_parallel']).lower()}")
        if "api-server-count" in args:
            pool["api_servers"] = _int_flag(src, f"{key}.api-server-count",
                                            args.pop("api-server-count"))
            src.map(f"{key}.api-server-count", f"{ours}.api_servers")
        if "served-model-name" in args:
            name = str(args.pop("served-model-name"))
            prev = out["model"].get("served_name")
            if prev is not None and prev != name:
                src.refuse(f"{key}.served-model-name", f"{show(name)} differs from the other "
                           f"side's {show(prev)}: the router serves one name")
            out["model"]["served_name"] = name
            src.map(f"{key}.served-model-name", "model.served_name")
        conn = args.pop("connector", _MISSING)
        kv = args.pop("kv-transfer-config", None)
        shared_kv, own_kv = _connector(src, key, ours, conn, kv)
        connectors.append(shared_kv)
        if own_kv is not None:
            pool["kv_connector"] = own_kv
        _pool_flags(src, key, ours, args)
        pool["args"] = args
        workers = _int_flag(src, f"resources.{short}_workers", res.get(f"{short}_workers"))
        src.get(f"resources.{short}_workers")
        pool["endpoints"] = workers
        src.map(f"resources.{short}_workers", f"{ours}.endpoints: {workers}")
        _gpus_per(src, res, short, ours, pool, gpn)
        if dp > 1 and dp * tp * pool.get("pipeline_parallel", 1) > gpn:
            pool["fronts"] = "per_node"  # srt-slurm's dp_launch_mode per_node: a front per node
        pools[ours] = pool
    _dp_launch_mode(src)
    for k in ("prefill_nodes", "decode_nodes", "agg_nodes"):
        if k in res:
            src.get(f"resources.{k}")
            src.deviate(f"resources.{k}", "derived by the planner from endpoints x GPUs "
                        "(the dry-run shows the count)")
    for k in ("spread_workers", "het_jobs"):
        if res.get(k):
            src.get(f"resources.{k}")
            src.refuse(f"resources.{k}", {
                "spread_workers": "spreading partial-node endpoints one per node is not done "
                                  "here: the planner packs them; remove it",
                "het_jobs": "heterogeneous jobs are an sglang-only option in srt-slurm; remove "
                            "it",
            }[k])
        elif k in res:
            src.get(f"resources.{k}")
            src.map(f"resources.{k}", "false: the planner packs endpoints into one job")
    for k in ("set_cuda_visible_devices",):
        if src.has(f"backend.{k}"):
            src.deviate(f"backend.{k}", "GPUs are always pinned with CUDA_VISIBLE_DEVICES here")
    _mooncake(src, out)
    dynamo_events = bool(src.peek("backend.kv_events_config")) and \
        src.peek("frontend.type", "dynamo") == "dynamo"
    if dynamo_events:
        src.get("backend.kv_events_config")
        src.deviate("backend.kv_events_config", "the engines' KV events feed Dynamo's KV router "
                    "(router-mode kv); vllm-router fronts them here and reads none (sessions "
                    "are kept by consistent_hash), so the engines publish none")
    for k, why in (("kv_events_config", "KV events feed Dynamo's KV router, not run here"),
                   ("allow_prefill_decode_colocation", "the planner never puts prefill and "
                    "decode on one node"),
                   ("allow_prefill_decode_colocation_across_nodes", "the planner never puts "
                    "prefill and decode on one node")):
        if k == "kv_events_config" and dynamo_events:
            continue
        v = src.get(f"backend.{k}")
        if v:
            src.refuse(f"backend.{k}", f"{why}; remove it")
        elif v is not None:
            src.map(f"backend.{k}", "off, as here")
    shared = [c for c in connectors if c is not None]
    if shared:
        if any(json.dumps(c, sort_keys=True) != json.dumps(shared[0], sort_keys=True)
               for c in shared):  # e.g. one side pins its engine_id: each keeps its own
            for pool, c in zip(pools.values(), connectors, strict=True):
                if c is not None:
                    pool["kv_connector"] = c
            src.deviate("backend.vllm_config", "prefill and decode write different NIXL "
                        "kv-transfer-configs: each role's kv_connector is its own, as written")
        else:
            out["kv_connector"] = shared[0]
    # flags equal on every side go to vllm_args, the rest stay per pool
    sides = list(pools.values())
    common = {k: v for k, v in sides[0]["args"].items()
              if all(k in p["args"] and p["args"][k] == v for p in sides[1:])}
    if len(sides) > 1:
        for p in sides:
            for k in common:
                p["args"].pop(k)
    out["vllm_args"] = common
    out.update(pools)
    return mode


def _gpus_per(src: _Source, res: dict, short: str, ours: str, pool: dict, gpn: int) -> None:
    key = f"resources.gpus_per_{short}"
    pp = pool.get("pipeline_parallel", 1)
    have = pool["data_parallel"] * pool["tensor_parallel"] * pp
    names = "data-parallel-size x tensor-parallel-size" + (
        " x pipeline-parallel-size" if pp > 1 else "")
    if key.split(".")[1] in res:
        n = src.get(key)
        if n != have:
            src.refuse(key, f"{show(n)} is not {names} ({have}) of "
                       f"vllm_config.{'aggregated' if short == 'agg' else short}: make them "
                       "agree")
        else:
            src.map(key, f"{ours}.data_parallel x {ours}.tensor_parallel"
                    + (f" x {ours}.pipeline_parallel" if pp > 1 else "") + f" = {have}")


def _dp_launch_mode(src: _Source) -> None:
    v = src.get("backend.dp_launch_mode")
    if v is None:
        return
    if v == "per_node":
        src.map("backend.dp_launch_mode", "<pool>.fronts: per_node for endpoints over several "
                "nodes (a front per node, --data-parallel-hybrid-lb)")
    elif v == "per_gpu":  # the same DP ranks, one process each instead of one per node
        src.deviate("backend.dp_launch_mode", "per_gpu: a process per DP rank is srt-slurm's "
                    "deprecated layout of the same data-parallel engine (and srtctl runs one "
                    "process per node behind a vllm front end itself): one vllm serve per "
                    "node here, its local ranks inside it")
    else:
        src.refuse("backend.dp_launch_mode", f"{show(v)}: srt-slurm's layouts are per_node "
                   "and per_gpu")


def _connector(src: _Source, key: str, ours: str, conn: Any,
               kv: Any) -> tuple[dict | None, dict | None]:
    """The KV connector of one mode: its own `connector`, else backend.connector, as
    (the connector both sides share, or this role's own). NIXL alone (kv_both or no role) is
    shared; any other kv-transfer-config (a MultiConnector of NIXL and a store or offload
    connector, a role of its own) is the role's, as written."""
    where = f"{key}.connector"
    if conn is _MISSING:
        where = "backend.connector"
        conn = src.get("backend.connector", "nixl")
    if conn is None:
        if kv is None:
            return None, None
        try:
            parsed = json.loads(kv) if isinstance(kv, str) else dict(kv)
        except (ValueError, TypeError):
            src.refuse(f"{key}.kv-transfer-config", "is not JSON: write the connector as a "
                       "JSON object")
            return None, None
        if not isinstance(parsed, dict):
            src.refuse(f"{key}.kv-transfer-config", "is not a JSON object: write the "
                       "connector as one")
            return None, None
        src.map(where, "null: the mode's kv-transfer-config")
        if parsed.get("kv_connector") == "NixlConnector" and parsed.get("kv_role") in (
                None, "kv_both"):
            src.map(f"{key}.kv-transfer-config", "kv_connector")
            return parsed, None
        src.map(f"{key}.kv-transfer-config", f"{ours}.kv_connector (as written, each "
                "connector with its own kv_role)")
        return None, parsed
    if conn == "nixl":
        src.map(where, "kv_connector: NixlConnector, kv_role kv_both")
        if kv is not None:
            src.deviate(f"{key}.kv-transfer-config", "srt-slurm's connector preset wins over "
                        "it, as here")
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, None
    src.refuse(where, f"{show(conn)}: this launcher takes srt-slurm's nixl preset, or null "
               "with the role's own kv-transfer-config (NIXL, or a MultiConnector of NIXL and "
               "a Mooncake store or CPU offload connector)")
    return None, None


# srt-slurm's mooncake_kv_store keys (docs/mooncake-kv-store.md) -> kv_store's
MOONCAKE_KEYS = {"store_config": "kv_store.store_config", "env": "kv_store.env",
                 "master_extra_args": "kv_store.master_args",
                 "default_kv_lease_ttl_ms": "kv_store.lease_ttl_ms"}


def _mooncake(src: _Source, out: dict) -> None:
    """backend.mooncake_kv_store (a schema-2 mooncake-master service arrives here too) as
    kv_store: the master runs on the first node; the store config is passed on as written,
    its master_server_address the launcher's, as srt-slurm does."""
    key = "backend.mooncake_kv_store"
    block = src.peek(key)
    if block is None:
        return
    if not isinstance(block, dict):
        src.get(key)
        src.refuse(key, f"is {type(block).__name__}, srt-slurm's schema has a mapping here")
        return
    store: dict[str, Any] = {}
    for k in block:
        v = src.get(f"{key}.{k}")
        if k == "store_config" and isinstance(v, dict):
            cfg = dict(v)
            if "master_server_address" in cfg:
                cfg.pop("master_server_address")
                src.deviate(f"{key}.store_config.master_server_address", "the launcher fills "
                            "in the master's address (srt-slurm ignores this value too)")
            store["store_config"] = cfg
            src.map(f"{key}.store_config", MOONCAKE_KEYS[k])
        elif k == "env" and isinstance(v, dict):
            store["env"] = {str(n): "" if x is None else str(x) for n, x in v.items()}
            src.map(f"{key}.env", MOONCAKE_KEYS[k])
        elif k == "master_extra_args" and isinstance(v, list):
            store["master_args"] = [str(a) for a in v]
            src.map(f"{key}.master_extra_args", MOONCAKE_KEYS[k])
        elif k == "default_kv_lease_ttl_ms" and isinstance(v, int):
            store["lease_ttl_ms"] = v
            src.map(f"{key}.{k}", MOONCAKE_KEYS[k])
        elif k == "container":
            if v in (None, src.peek("model.container")):
                src.map(f"{key}.container", "the engines' image (the master runs in it)")
            else:
                src.refuse(f"{key}.container", f"{show(v)}: the master runs in the engines' "
                           "image here; remove it")
        elif k in MOONCAKE_KEYS:
            want = {"master_extra_args": "list", "default_kv_lease_ttl_ms": "whole number"}
            src.refuse(f"{key}.{k}", f"is {type(v).__name__}: srt-slurm takes a "
                       f"{want.get(k, 'mapping')} here")
        else:
            src.refuse(f"{key}.{k}", "is not a key of srt-slurm's mooncake_kv_store "
                       "(store_config, env, master_extra_args, default_kv_lease_ttl_ms, "
                       "container)")
    if "store_config" not in store:
        src.refuse(key, "has no store_config: vLLM's MooncakeStoreConnector reads its "
                   "configuration from it (srt-slurm requires it for vLLM)")
        return
    out["kv_store"] = store


def _env_map(src: _Source, key: str, ours: str) -> dict[str, str]:
    env = src.section(key)
    out = {}
    for name, value in env.items():
        if str(name).startswith("DYN_"):
            src.deviate(f"{key}.{name}", "a Dynamo setting: there is no Dynamo here")
            continue
        if isinstance(value, str) and "{node" in value:
            src.refuse(f"{key}.{name}", "a {node}/{node_id} placeholder has no meaning here: "
                       "write the value")
            continue
        out[str(name)] = "" if value is None else (
            str(value).lower() if isinstance(value, bool) else str(value))
        src.map(f"{key}.{name}", ours)
    return out


def _environment(src: _Source, out: dict) -> None:
    out["env"] = _env_map(src, "environment", "env")
    per: dict[str, dict[str, str]] = {}
    for m, ours in MODES.items():
        env = _env_map(src, f"backend.{m}_environment", f"{ours}.env")
        if env and ours in out:
            per[ours] = env
        elif env:
            src.deviate(f"backend.{m}_environment", f"no {m} workers in this recipe: unused")
    # srt-slurm applies the mode's env, then `environment` over it; what every pool sets
    # alike (and `environment` does not override) reads best once, in env
    pools = [p for p in MODES.values() if p in out]
    if len(pools) > 1 and all(p in per for p in pools):
        common = {k: v for k, v in per[pools[0]].items()
                  if all(per[p].get(k) == v for p in pools) and k not in out["env"]}
        for p in pools:
            per[p] = {k: v for k, v in per[p].items() if k not in common}
        out["env"] = {**common, **out["env"]}
    for p, env in per.items():
        if env:
            out[p]["env"] = env


# Dynamo's session routing of an agentic recipe, and the nearest vllm-router setting
# (vllm-router 0.1.17 --help; docs/agentic.md)
DYNAMO_SESSION_ROUTING = {
    "router-mode": "Dynamo's router mode; here vllm-router's consistent_hash for prefill and "
    "decode on the session header (an agentic run that names no router policy), the "
    "nearest setting that keeps every turn of a session on the engines holding its prefix "
    "(vllm-router's kv_aware needs a KV event source per worker)",
    "router-session-affinity-ttl-secs": "Dynamo's session affinity; consistent_hash keeps a "
    "session on its engines for the whole run (no idle expiry)",
}


def _frontend(src: _Source, out: dict, provenance: list[str]) -> None:
    kind = src.get("frontend.type", "dynamo")
    if kind == "dynamo":
        src.deviate("frontend.type", "dynamo: vllm-router (--vllm-pd-disaggregation) fronts the "
                    "engines until Dynamo is run here")
    elif kind in ("vllm", "vllm-router"):
        src.map("frontend.type", "vllm-router")
    else:
        src.refuse("frontend.type", f"{show(kind)}: another engine's front end; this launcher "
                   "runs vllm-router")
    fe = src.section("frontend")
    for k in ("enable_multiple_frontends", "num_additional_frontends", "nginx_container",
              "nginx_raise_ulimit", "nginx_session_affinity", "nginx_session_affinity_header",
              "nginx_keepalive_timeout"):
        if k in fe:
            src.get(f"frontend.{k}")
            src.deviate(f"frontend.{k}", "nginx over several Dynamo frontends: one vllm-router "
                        "here")
    if "args" in fe and kind == "vllm-router":
        _router_args(src, out)
    elif "args" in fe:
        agentic = native_bench.is_agentic(src.peek("benchmark.command"))
        for k, v in (src.section("frontend.args") or {}).items():
            if agentic and k in DYNAMO_SESSION_ROUTING:
                src.deviate(f"frontend.args.{k}", f"{show(v)}: {DYNAMO_SESSION_ROUTING[k]}")
                continue
            src.deviate(f"frontend.args.{k}", f"{show(v)} is a Dynamo frontend flag with no "
                        "vllm-router meaning (router.policy chooses vllm-router's)")
    if "env" in fe:
        src.get("frontend.env")
        src.deviate("frontend.env", "the Dynamo frontend's environment: not carried")
    for k in ("ctx_router", "gen_router", "server_config_extra"):
        if fe.get(k):
            src.get(f"frontend.{k}")
            src.refuse(f"frontend.{k}", "TensorRT-LLM's disaggregated server only")
    if "orchestrator_placement" in fe:
        src.get("frontend.orchestrator_placement")
        src.deviate("frontend.orchestrator_placement", "the router runs where router.placement "
                    "puts it (default a prefill node)")
    if fe.get("dedicated_node"):
        src.get("frontend.dedicated_node")
        src.refuse("frontend.dedicated_node", "no node is reserved for the router here; remove it")
    for section, why in DYNAMO_SECTIONS.items():
        body = src.section(section)
        for k, v in body.items():
            src.get(f"{section}.{k}")
            src.deviate(f"{section}.{k}", why)
            if section == "dynamo" and k in ("version", "wheel", "hash"):
                provenance.append(f"dynamo {k} {v}")
            elif section == "dynamo" and k == "source" and isinstance(v, dict):
                provenance += [f"dynamo {kk} {vv}" for kk, vv in v.items()]


# vllm-router flags the launcher sets from the plan (launcher/planning/render.py)
ROUTER_OWNED = ("host", "port", "vllm-pd-disaggregation", "prefill", "decode", "kv-connector",
                "worker-urls", "prometheus-host", "prometheus-port",
                "intra-node-data-parallel-size", "worker-startup-timeout-secs")


def _router_args(src: _Source, out: dict) -> None:
    """frontend.args of a vllm-router front end: vllm-router's own flags, as ours."""
    router = out.setdefault("router", {})
    for k, v in (src.section("frontend.args") or {}).items():
        key, flag = f"frontend.args.{k}", flag_key(str(k))
        src.get(key)
        if flag in ("policy", "prefill-policy", "decode-policy"):
            router[flag.replace("-", "_")] = str(v)
            src.map(key, f"router.{flag.replace('-', '_')}")
        elif flag in ROUTER_OWNED:
            src.deviate(key, "the launcher sets it from the plan")
        elif isinstance(v, (dict, list)):
            src.refuse(key, "a vllm-router flag takes one value here")
        else:
            router.setdefault("args", {})[flag] = v
            src.map(key, f"router.args.{flag}")


def _concurrencies(src: _Source, value: Any) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        parts = value.split("x")
    elif isinstance(value, list):
        parts = value
    else:
        parts = None
    try:
        out = [int(str(p).strip()) for p in parts] if parts else None
    except ValueError:
        out = None
    if not out or min(out) < 1:
        src.refuse("benchmark.concurrencies", f"{show(value)}: write positive whole numbers, "
                   "as a list or \"AxBxC\"")
        return None
    return out


def _benchmark(src: _Source, out: dict) -> None:
    b = src.section("benchmark")
    kind = src.get("benchmark.type", "manual")
    bench: dict[str, Any] = {}
    acc: dict[str, Any] = {"enabled": False}
    if kind == "sa-bench":
        bench.update(driver="builtin", length_rule="sa-bench")
        src.map("benchmark.type", "benchmark: the builtin client on sa-bench's workload "
                "(length_rule: sa-bench)")
        for k, ours in (("isl", "input_len"), ("osl", "output_len")):
            if k in b:
                bench[ours] = _int_flag(src, f"benchmark.{k}", src.get(f"benchmark.{k}"))
                src.map(f"benchmark.{k}", f"benchmark.{ours}")
            else:
                src.refuse(f"benchmark.{k}", "is required by sa-bench")
        if "concurrencies" in b:
            conc = _concurrencies(src, src.get("benchmark.concurrencies"))
            if conc:
                bench["concurrency"] = conc
                src.map("benchmark.concurrencies", "benchmark.concurrency")
        else:
            src.refuse("benchmark.concurrencies", "is required by sa-bench")
        for k, ours in (("random_range_ratio", "range_ratio"),
                        ("num_prompts_mult", "prompts_multiplier"),
                        ("num_warmup_mult", "warmup_multiplier"),
                        ("use_chat_template", "chat_template")):
            v = src.get(f"benchmark.{k}", SA_BENCH_DEFAULTS[k])
            bench[ours] = v
            if k == "use_chat_template" and b.get("custom_tokenizer"):
                continue  # custom_tokenizer's deviation says what becomes of it
            src.map(f"benchmark.{k}", f"benchmark.{ours}: {json.dumps(v)}" + (
                "" if k in b else " (srt-slurm's default, written out)"))
        rate = src.get("benchmark.req_rate", "inf")
        if str(rate) == "inf":
            src.map("benchmark.req_rate", "inf: every request as soon as a slot frees")
        else:
            src.refuse("benchmark.req_rate", f"{show(rate)}: the client sends at the "
                       "concurrency's pace (inf) only")
        tok = src.get("benchmark.custom_tokenizer")
        modes = {src.peek(f"backend.vllm_config.{m}.tokenizer-mode") for m in MODES} - {None}
        if tok == VLLM_DSV4_TOKENIZER and modes == {"deepseek_v4"}:
            src.map("benchmark.custom_tokenizer", "benchmark.chat_template: true; the client "
                    "loads vLLM's deepseek_v4 tokenizer, as the engines' tokenizer-mode names "
                    "it (what this class loads), and renders DeepSeek-V4's chat encoding")
        elif tok:
            bench["chat_template"] = False
            src.deviate("benchmark.custom_tokenizer", f"{show(tok)} renders DeepSeek-V4's "
                        "chat encoding in sa-bench; the builtin client has no such renderer, "
                        "so prompts go without a chat template (each request a few tokens "
                        "shorter than published)")
        if "dataset_name" in b:
            v = src.get("benchmark.dataset_name")
            if v == "random":
                src.map("benchmark.dataset_name", "random")
            else:
                src.refuse("benchmark.dataset_name", f"{show(v)}: the client sends sa-bench's "
                           "random dataset only")
        if b.get("reuse_http_connections") is not None:
            src.get("benchmark.reuse_http_connections")
            src.deviate("benchmark.reuse_http_connections", "the builtin client always pools "
                        "connections")
        if b.get("export_node_metrics") is not None:
            src.get("benchmark.export_node_metrics")
            src.deviate("benchmark.export_node_metrics", "telemetry always records per node here")
    elif kind == "gsm8k":
        bench["enabled"] = False
        acc = {"enabled": True, "task": "gsm8k", "harness": "vllm", "threshold": 0.0}
        src.map("benchmark.type", "accuracy: vLLM's GSM8K harness (no sweep)")
        src.deviate("benchmark.type", "gsm8k: srt-slurm reports the score without a pass mark; "
                    "accuracy.threshold 0 (set it to gate)")
        for k, ours in (("num_examples", "num_questions"), ("max_tokens", "max_tokens"),
                        ("repeat", "repeat"), ("num_shots", "num_shots")):
            if k in b:
                acc[ours] = src.get(f"benchmark.{k}")
                src.map(f"benchmark.{k}", f"accuracy.{ours}")
        t = src.get("benchmark.temperature")
        if t not in (None, 0, 0.0):
            src.refuse("benchmark.temperature", f"{show(t)}: the gate samples greedily "
                       "(temperature 0)")
        for k in ("isl", "osl", "concurrencies"):
            if k in b:
                src.get(f"benchmark.{k}")
                src.deviate(f"benchmark.{k}", "not read by srt-slurm's gsm8k benchmark")
    elif kind == "custom" and native_bench.is_agentic(src.peek("benchmark.command")):
        bench.update(_agentic_benchmark(src))
    elif kind == "custom":
        spec = _custom_benchmark(src)
        if spec is not None:
            bench["custom"] = spec
            src.map("benchmark.type", "custom: benchmark.custom (the command runs in the "
                    "recipe's image with srt-slurm's environment, docs/custom-benchmark.md)")
            native = native_bench.recognise(spec["command"], spec["env"])
            if native is not None:
                src.deviate("benchmark.command", native.text())
    elif kind == "manual":
        bench["enabled"] = False
        src.map("benchmark.type", "manual: no sweep and no accuracy run (benchmark.enabled: "
                "false)")
    else:
        src.get("benchmark")  # another harness's settings: the type's refusal covers them
        src.refuse("benchmark.type", f"{show(kind)}: this launcher runs sa-bench's workload "
                   "and vLLM's GSM8K harness (sa-bench, gsm8k, manual)")
    out["benchmark"] = bench
    out["accuracy"] = acc


# InferenceX's agentic replay (benchmarks/srt_agentic.sh and benchmark_lib.sh's
# build_replay_cmd, SemiAnalysisAI/InferenceX@4fa2a2ff): what it runs when its workflow
# does not say otherwise (docs/agentic.md)
AGENTX_DEFAULTS = {"scenario": "inferencex-agentx-mvp", "duration_s": 1800.0, "seed": 42,
                   "failed_request_threshold": 0.10}
AGENTX_SESSIONS = [256]  # the published DeepSeek-V4-Pro P/D anchor's (srt-slurm #229)
# benchmark.env keys of srt_agentic.sh that the launcher's own driver makes moot
AGENTX_ENV_MOOT = {
    "INFMAX_CONTAINER_WORKSPACE": "InferenceX's checkout in the container: the launcher "
    "runs AIPerf itself, no checkout needed",
    "RESULT_DIR": "AIPerf's files go to the run directory's bench/aiperf-cNNNNN/",
    "PORT": "the router's port is the plan's",
    "IS_MULTINODE": "the script's switch between one node and many: every point runs in "
    "this one allocation",
    "AIPERF_DATASET_MMAP_CACHE_DIR": "AIPerf's dataset cache stays its default",
    "HF_HUB_CACHE": "the corpus is read from the profile's models.hf_home, where "
    "stage-dataset puts it",
    "AIPERF_SERVER_METRICS_URLS": "the engines' /metrics URLs, which srtctl fills in for a "
    "custom benchmark: the launcher gives AIPerf every engine's from the plan "
    "(--server-metrics)",
    "AIPERF_DYNAMO_SESSION_TIMEOUT_SECONDS": "the lease of Dynamo's conversation-aware "
    "routing (--dynamo-session-timeout-seconds, only with FRAMEWORK dynamo-*): vllm-router's "
    "consistent_hash keeps a session on its engines for the whole run, with no lease",
    "AIPERF_TRACE_IDLE_GAP_CAP_SECONDS": "--trace-idle-gap-cap-seconds, which AIPerf 0.13.0's "
    "scenario inferencex-agentx-mvp refuses (forbid_trace_idle_gap_cap; it caps whole-system "
    "idle gaps at 10 s itself): not passed, so a trace's own idle gaps stay as recorded",
    "AGENTIC_WARMUP_GRACE_PERIOD": "--warmup-grace-period of InferenceX's per-lane warm-up "
    "(--warmup-requests-per-lane), which AIPerf 0.13.0 does not have; its --warmup-grace-"
    "period needs --warmup-duration, which benchmark.agentic.warmup_requests does not set: "
    "the warm-up requests are waited for in full",
    "ENABLE_AGENTX_POWER": "InferenceX's power figure per point (its script's GPU monitor, off "
    "where IS_MULTINODE, where srt-slurm's telemetry measures it): the launcher's agent "
    "records every GPU's power and energy (NVML) on every run",
    "REQUIRE_POWER": "fails InferenceX's result without a power figure: the launcher's agent "
    "records every GPU's power on every run, and no point fails for want of it",
    # labels of InferenceX's result file (benchmark_lib.sh set_parallelism_metadata): the
    # plan records the shape itself
    "TP": "a label of InferenceX's result file: the plan records each role's shape",
    "EP_SIZE": "a label of InferenceX's result file: the plan records each role's shape",
    "DP_ATTENTION": "a label of InferenceX's result file: the plan records each role's shape",
}


def _agentic_benchmark(src: _Source) -> dict:
    """InferenceX's agentic AIPerf replay (benchmark.type custom running srt_agentic.sh) as
    our benchmark.agentic: its env settings mapped, the script's own defaults written out,
    anything else refused by name."""
    src.get("benchmark.command")
    env = src.get("benchmark.env", {}) or {}
    image = src.get("benchmark.container_image")
    if image is not None:
        src.refuse("benchmark.container_image", f"{show(image)}: AIPerf runs from its own "
                   "environment on the router's node; remove it")
    if not isinstance(env, dict):
        src.refuse("benchmark.env", "is a mapping of variable names to values")
        env = {}
    ag: dict[str, Any] = dict(AGENTX_DEFAULTS)
    out: dict[str, Any] = {"agentic": ag, "concurrency": list(AGENTX_SESSIONS)}
    src.map("benchmark.type", "custom running InferenceX's agentic replay: benchmark.agentic, "
            "the real AIPerf per point at benchmark.concurrency live sessions "
            "(docs/agentic.md)")
    src.map("benchmark.command", "benchmark.agentic with the script's own settings written "
            f"out: scenario {AGENTX_DEFAULTS['scenario']}, duration_s "
            f"{AGENTX_DEFAULTS['duration_s']:g}, seed {AGENTX_DEFAULTS['seed']}, "
            f"failed_request_threshold {AGENTX_DEFAULTS['failed_request_threshold']:g}")
    text = {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in env.items()}

    def seconds(key: str, v: str, field: str, said: str) -> None:
        try:
            ag[field] = float(v)
            src.map(key, said)
        except ValueError:
            src.refuse(key, f"{show(v)}: seconds, a number")

    for k, v in text.items():
        key = f"benchmark.env.{k}"
        if k == "WEKA_LOADER_OVERRIDE":
            if v in AGENTIC_CORPORA:
                ag["trace"] = v
                src.map(key, f"benchmark.agentic.trace: {v} ({AGENTIC_CORPORA[v][1]}; "
                        "stage-dataset puts it on the shared filesystem)")
            else:
                src.refuse(key, f"{show(v)} is not a corpus AIPerf 0.13.0 knows: "
                           + ", ".join(AGENTIC_CORPORA))
        elif k in ("CONC_LIST", "CONC"):
            conc = _concurrencies(src, [int(x) for x in v.replace("x", " ").split()
                                        if x.isdigit()] or v)
            if conc:
                out["concurrency"] = conc
                src.map(key, "benchmark.concurrency (live sessions)")
        elif k == "DURATION":
            seconds(key, v, "duration_s", "benchmark.agentic.duration_s")
        elif k == "AIPERF_MAX_CONTEXT_LENGTH":
            if v.isdigit() and int(v) > 0:
                ag["max_context"] = int(v)
                src.map(key, "benchmark.agentic.max_context")
            else:
                src.refuse(key, f"{show(v)}: a positive whole number of tokens")
        elif k in ("AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID",
                   "AIPERF_HTTP_X_SESSION_ID_FROM_CORRELATION_ID"):
            src.map(key, "benchmark.agentic.session_header X-Session-ID: AIPerf sends each "
                    "session's id in the header vllm-router's consistent_hash reads first")
        elif k == "AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING":
            if v in ("0", "false", ""):
                src.map(key, f"{v or 'unset'}: off (Dynamo's own routing hint; the router "
                        "keeps sessions by consistent_hash here)")
            else:
                src.deviate(key, "Dynamo's conversation-aware routing: vllm-router keeps "
                            "a session on one prefill and decode by consistent_hash instead")
        elif k in ("AIPERF_LIVE_FAILED_REQUEST_THRESHOLD", "AIPERF_FAILED_REQUEST_THRESHOLD"):
            live = "AIPERF_LIVE_FAILED_REQUEST_THRESHOLD"
            if k != live and live in text:  # the live one is what AIPerf gets
                src.deviate(key, f"InferenceX's post-run gate; {live} is the threshold AIPerf "
                            "gets, benchmark.agentic.failed_request_threshold")
                continue
            try:
                ag["failed_request_threshold"] = float(v)
                src.map(key, "benchmark.agentic.failed_request_threshold (AIPerf's "
                        "--failed-request-threshold)")
            except ValueError:
                src.refuse(key, f"{show(v)}: a share of requests, a number in (0, 1]")
        elif k == "AIPERF_EXTRA_INPUTS":
            ag["extra_inputs"] = v.split()
            src.map(key, "benchmark.agentic.extra_inputs (AIPerf's --extra-inputs, after the "
                    "launcher's ignore_eos:true)")
        elif k == "AIPERF_BENCHMARK_GRACE_PERIOD":
            seconds(key, v, "grace_period_s", "benchmark.agentic.grace_period_s (AIPerf's "
                    "--benchmark-grace-period, as the script passes it)")
        elif k == "AIPERF_AGENTIC_CACHE_WARMUP_DURATION":
            seconds(key, v, "cache_warmup_s", "benchmark.agentic.cache_warmup_s (AIPerf's "
                    "--agentic-cache-warmup-duration)")
        elif k == "AIPERF_REQUIRED_SERVER_METRIC_PREFIX":
            src.map(key, "AIPerf records every engine's /metrics (vllm:*) in "
                    "server_metrics_export.json")
        elif k in AGENTX_ENV_MOOT:
            src.deviate(key, AGENTX_ENV_MOOT[k])
        elif k in aiperf_env_names():  # AIPerf's own setting: AIPerf reads it, as there
            ag.setdefault("env", {})[k] = v
            src.map(key, f"benchmark.agentic.env.{k} (AIPerf's own setting, passed to its "
                    "environment)")
        else:
            src.refuse(key, "is read by InferenceX's script, not by the launcher's AIPerf "
                       "driver; remove it or set the benchmark.agentic key it means")
    if src.has("benchmark.aiperf_server_metrics"):
        v = src.get("benchmark.aiperf_server_metrics")
        src.map("benchmark.aiperf_server_metrics", f"{show(v)}: AIPerf records every engine's "
                "/metrics (--server-metrics, the plan's URLs) on every agentic run")
    if "trace" not in ag:
        ag["trace"] = "semianalysis_cc_traces_weka_062126"
        src.deviate("benchmark.env", "names no WEKA_LOADER_OVERRIDE: the trace is the "
                    "script's default corpus, semianalysis_cc_traces_weka_062126")
    if "CONC_LIST" not in text and "CONC" not in text:
        src.deviate("benchmark.command", "InferenceX's workflow passes CONC_LIST, which "
                    f"the file does not hold: benchmark.concurrency {AGENTX_SESSIONS} live "
                    "sessions (the published DeepSeek-V4-Pro P/D anchor's); --set "
                    "benchmark.concurrency=[...] for others")
    return out


def _custom_benchmark(src: _Source) -> dict | None:
    """benchmark.type custom: {"command": str, "env": {str: str}} (our benchmark.custom),
    or None with the key refused."""
    command = src.get("benchmark.command")
    env = src.get("benchmark.env", {})
    image = src.get("benchmark.container_image")
    if image is not None:
        src.refuse("benchmark.container_image", f"{show(image)}: the custom command runs in "
                   "the recipe's image; remove it")
    if not isinstance(command, str) or not command.strip():
        src.refuse("benchmark.command", "is required by benchmark.type custom: the shell "
                   "command that runs the benchmark")
        return None
    if env is None:
        env = {}
    if not isinstance(env, dict) or any(isinstance(v, (dict, list)) for v in env.values()):
        src.refuse("benchmark.env", "is a mapping of variable names to values")
        return None
    return {"command": command,
            "env": {str(k): "" if v is None else str(v).lower() if isinstance(v, bool)
                    else str(v) for k, v in env.items()}}


def _slurm(src: _Source, out: dict) -> None:
    s: dict[str, Any] = {}
    for k in ("account", "partition"):
        if src.get(f"slurm.{k}") is not None:
            s[k] = str(src.get(f"slurm.{k}"))
            src.map(f"slurm.{k}", f"slurm.{k}")
    limit = src.get("slurm.time_limit")
    s["time_limit"] = str(limit) if limit is not None else TIME_LIMIT_DEFAULT
    src.map("slurm.time_limit", f"slurm.time_limit: {s['time_limit']}"
            + ("" if limit is not None else " (srt-slurm's default, written out)"))
    directives = src.section("sbatch_directives")
    if directives:
        s["directives"] = {str(k).lstrip("-"): v for k, v in directives.items()}
        src.map("sbatch_directives", "slurm.directives")
    srun = dict(src.section("srun_options"))
    for k in [k for k in srun if str(k).lstrip("-").startswith("container-")]:
        srun.pop(k)  # pyxis's flags: ours come from the profile (InferenceX sets remap-root)
        src.deviate(f"srun_options.{k}", "the container runtime's flags come from the "
                    "profile (containers.remap_root, containers.writable)")
    if srun:
        s["srun_options"] = [f"--{str(k).lstrip('-')}" if v in (None, True, "")
                             else f"--{str(k).lstrip('-')}={v}" for k, v in srun.items()]
        src.map("srun_options", "slurm.srun_options")
    out["slurm"] = s


def _health(src: _Source, out: dict) -> None:
    h = src.section("health_check")
    if not h:
        return
    attempts = src.get("health_check.max_attempts", HEALTH_DEFAULTS["max_attempts"])
    interval = src.get("health_check.interval_seconds", HEALTH_DEFAULTS["interval_seconds"])
    try:
        timeout = float(attempts) * float(interval)
    except (TypeError, ValueError):
        src.refuse("health_check", "max_attempts and interval_seconds must be numbers")
        return
    out["health"] = {"timeout_s": timeout}
    src.map("health_check.max_attempts", f"health.timeout_s: {timeout:g} (attempts x interval)")
    src.map("health_check.interval_seconds", "health.timeout_s")


def _job_wide(src: _Source, out: dict) -> None:
    mounts = []
    for k, v in src.section("container_mounts").items():
        mounts.append(f"{k}:{v}")
        src.map(f"container_mounts.{k}", "container.mounts")
    extra = src.get("extra_mount")
    if extra:
        for m in extra if isinstance(extra, list) else [extra]:
            mounts.append(str(m))
        src.map("extra_mount", "container.mounts")
    if any("{" in m for m in mounts):
        src.refuse("container_mounts", "a {placeholder} in a mount: write the path")
    if any("$" in m for m in mounts):  # the mount reaches srun quoted: nothing expands it
        src.refuse("container_mounts", "an environment variable ($NAME) in a mount is not "
                   "expanded here: write the path")
    if mounts:
        out.setdefault("container", {})["mounts"] = mounts
    script = src.get("setup_script")
    if script:
        out["setup_script"] = str(script)
        src.map("setup_script", f"setup_script: {show(script)}, a file beside the recipe (a "
                "copy of srt-slurm's configs/ or configs/patches/ one), run in each engine's "
                "container before it starts")
    if src.has("enable_config_dump"):
        src.deviate("enable_config_dump", "plan.json and commands.sh are always written")
    if src.has("output"):
        src.get("output")
        src.deviate("output", "logs go to the run directory (--runs-dir)")
    for k, why in REFUSED_SECTIONS.items():
        v = src.get(k)
        if v and not (k == "profiling" and isinstance(v, dict)
                      and v.get("type", "none") == "none" and len(v) == 1):
            src.refuse(k, why)
        elif v is not None:
            src.map(k, "off, as here")


def _observability(src: _Source, out: dict) -> None:
    obs = src.section("observability")
    for k in obs:
        src.get(f"observability.{k}")
        src.deviate(f"observability.{k}", "the launcher's telemetry (vLLM metrics and stats "
                    "log, GPU and host agents, Prometheus) is always on")
    tel = src.section("telemetry")
    for k, v in tel.items():
        src.get(f"telemetry.{k}")
        if k == "enabled":
            out.setdefault("telemetry", {})["enabled"] = bool(v)
            src.map("telemetry.enabled", "telemetry.enabled (NVML power, not a DCGM exporter)")
        elif k == "default_frequency":
            try:
                out.setdefault("telemetry", {})["interval_s"] = 1.0 / float(v)
                src.map("telemetry.default_frequency", "telemetry.interval_s")
            except (TypeError, ValueError, ZeroDivisionError):
                src.refuse("telemetry.default_frequency", f"{show(v)} is not a positive number")
        else:
            src.deviate(f"telemetry.{k}", "a DCGM exporter setting: GPU telemetry here is NVML")


ORDER = ("name", "description", "cluster", "engine", "engine_version", "mode", "model",
         "container", "kv_connector", "vllm_args", "env", "prefill", "decode", "agg", "router",
         "benchmark", "accuracy", "telemetry", "slurm", "health")
POOL_ORDER = ("endpoints", "data_parallel", "tensor_parallel", "pipeline_parallel",
              "expert_parallel", "fronts",
              "api_servers", "args", "env")


def _ordered(out: dict) -> dict:
    """Keys in the order our shipped recipes use, empty mappings left out."""
    def clean(d: dict, order: tuple) -> dict:
        keys = [k for k in order if k in d] + [k for k in d if k not in order]
        return {k: d[k] for k in keys if d[k] != {}}

    res = clean(out, ORDER)
    for p in ("prefill", "decode", "agg"):
        if isinstance(res.get(p), dict):
            res[p] = clean(res[p], POOL_ORDER)
    return res


def shape(pool: dict) -> str:
    """A pool's shape as srt-slurm's file names write it: DEP8, TEP4, TP8, DP2."""
    dp, tp = pool.get("data_parallel", 1), pool.get("tensor_parallel", 1)
    ep = pool.get("expert_parallel", False)
    pp = pool.get("pipeline_parallel", 1)
    stages = f" x PP{pp}" if pp > 1 else ""
    if dp > 1:
        return f"{'DEP' if ep else 'DP'}{dp}" + (f" x TP{tp}" if tp > 1 else "") + stages
    return f"{'TEP' if ep else 'TP'}{tp}" + stages


def _description(out: dict, source: str, sha256: str, provenance: list[str],
                 report: Report) -> str:
    pools = [f"{out[p].get('endpoints', 1)} x {shape(out[p])} {p}"
             for p in ("prefill", "decode", "agg") if isinstance(out.get(p), dict)]
    b = out.get("benchmark") or {}
    what = f"{(out.get('model') or {}).get('path', '?')}: {', '.join(pools)}"
    if b.get("input_len"):
        what += (f"; sa-bench {b['input_len']}/{b.get('output_len')} at concurrency "
                 f"{', '.join(map(str, b.get('concurrency') or []))}")
    elif (out.get("accuracy") or {}).get("enabled"):
        what += "; GSM8K"
    read = f"schema 2, read as {SCHEMA2_READ}" if report.layout == 2 else \
        f"schema of {SCHEMA_READ}"
    lines = [what + ".", f"Imported from the srt-slurm recipe {source} (sha256 {sha256}; "
             f"{read})."]
    if provenance:
        lines.append("Source records: " + "; ".join(provenance) + ".")
    if report.deviations:
        keys = list(dict.fromkeys(k for k, _ in report.deviations))
        lines.append(f"Deviations ({len(keys)}; `recipes import` says why each): "
                     + ", ".join(keys) + ".")
    return " ".join(lines)


# The copies of NVIDIA/srt-slurm-recipes this package carries (launcher/data/srt-slurm-recipes)
BUNDLED = Path(__file__).parents[1] / "data" / "srt-slurm-recipes"
BUNDLED_FROM = "NVIDIA/srt-slurm-recipes@8b088c0e1cdf7b5803fbac34b84b6c87096d5c59"


# Copies of other repositories' srt-slurm recipes, under BUNDLED/<repository>/<its path>
# (README.md): the commit each was read at.
# InferenceX/: every GB200 vLLM agentic recipe on InferenceX's main at this commit, and
# the few below at their own commit (files since removed from main)
INFERENCEX_AT = "SemiAnalysisAI/InferenceX@843c6254ff69b567f772f6a5fd97675af3d04431"
BUNDLED_OTHERS = {
    "InferenceX/benchmarks/multi_node/srt-slurm-recipes/dsv4/vllm/gb200-fp4/agentx/"
    "disagg-1p1d-dep8-dep8-mtp.yaml":
        "SemiAnalysisAI/InferenceX@4fa2a2ffe45a668403bc3cec91b05a9d65811bc4",
    "InferenceX/benchmarks/multi_node/srt-slurm-recipes/vllm/deepseek-v4/agentic/"
    "disagg-gb200-4p1d-tep4-tp8-agentic.yaml":
        "SemiAnalysisAI/InferenceX@76ad0903625044821f8b26df236f9d98face9028",
    "InferenceX/benchmarks/multi_node/srt-slurm-recipes/vllm/deepseek-r1/agentic/"
    "disagg-gb200-1p2d-dep4-vllm-router-agentic.yaml":
        "SemiAnalysisAI/InferenceX@395d57f0e1355628e84e12b9826d0ee634d9c631",
}


def label_of(path: Path) -> str:
    """How the source is recorded: a bundled copy by its upstream path and commit."""
    try:
        rel = path.resolve().relative_to(BUNDLED.resolve())
    except (OSError, ValueError):
        return str(path)
    if rel.parts[0] == "InferenceX":
        return f"{BUNDLED_OTHERS.get(str(rel), INFERENCEX_AT)}:{Path(*rel.parts[1:])}"
    return f"{BUNDLED_FROM}:{rel}"


def variant_refs(ref: str) -> list[str]:
    """`ref`, or for an override file named without a selector, one `FILE:override_NAME`
    per variant (srtctl runs every variant of such a file; `submit` makes them one study)."""
    from launcher.schema import srt_slurm_v2
    from launcher.schema.yaml_io import read_yaml

    path, selector = srt_slurm_v2.split_ref(ref)
    if selector is not None or not path.endswith((".yaml", ".yml")) or not Path(path).is_file():
        return [ref]
    try:
        data = read_yaml(Path(path), "a recipe")
    except UserError:
        return [ref]  # said when it is loaded
    if not (looks_like(data) and srt_slurm_v2.is_override_file(data)):
        return [ref]
    return [f"{path}:{name}" for name in srt_slurm_v2.variant_names(data)] or [ref]


def import_data(data: dict, path: Path, selector: str | None = None,
                aliases: dict[str, str] | None = None, given: set[str] = frozenset(),
                label: str | None = None, site: Site | None = None) -> tuple[dict, Report]:
    """Convert a recipe mapping read from `path` (one variant of an override file: its
    selector), with the site file's defaults."""
    from launcher.schema import srt_slurm_v2

    source = label or label_of(path)
    if srt_slurm_v2.is_override_file(data):
        source = f"{source}:{selector}" if selector else source
        data = srt_slurm_v2.select(data, selector, label or label_of(path))
    elif selector is not None:
        raise UserError(f"{show(path)} is not an override file (it has no base block): name "
                        "the file without :{selector}".replace("{selector}", selector))
    rows: list[tuple[str, str, str]] = []
    if site is not None:
        data, site_aliases = site.apply(data)
        aliases = {**site_aliases, **(aliases or {})}
        rows = site.rows
        bad = [f"{k} {v}" if v.startswith("is ") else f"{k}: {v}"
               for c, k, v in rows if c == "refused"]
        if bad:
            raise UserError(f"cannot use the site file {show(site.label)}: " + "; ".join(bad))
    recipe, report = convert(data, source, file_sha256(path), aliases, given)
    for category, key, text in rows:
        {"mapped": report.mapped, "deviation": report.deviations,
         "refused": report.refused}[category].append((key, text))
    return recipe, report


def import_file(ref: Path | str, aliases: dict[str, str] | None = None,
                given: set[str] = frozenset(), label: str | None = None,
                site: Site | None = None) -> tuple[dict, Report]:
    """Read and convert one srt-slurm recipe file (`FILE:override_NAME`: one variant)."""
    from launcher.schema import srt_slurm_v2
    from launcher.schema.yaml_io import read_yaml

    name, selector = srt_slurm_v2.split_ref(str(ref))
    path = Path(name)
    data = read_yaml(path, "an srt-slurm recipe")
    if not looks_like(data):
        raise UserError(f"{show(path)} is not an srt-slurm recipe (it has no resources, or it "
                        "has our cluster key): `submit` and `recipes show` take ours as is")
    return import_data(data, path, selector, aliases, given, label, site)


# --- the site file: srtslurm.yaml (ClusterConfig) --------------------------------------------
SITE_FILE = "srtslurm.yaml"
# ClusterConfig keys (docs/schema-reference.md "Cluster config") the import applies to a
# recipe as srt-slurm does at load (a recipe's own value wins), and the row each gets.
SITE_APPLIED = {
    "default_account": "slurm.account when the recipe sets none",
    "default_partition": "slurm.partition when the recipe sets none",
    "default_time_limit": "slurm.time_limit when the recipe sets none",
    "default_sbatch_directives": "slurm.directives under the recipe's own",
    "default_health_check": "health.timeout_s when the recipe has no health_check",
    "default_mounts": "container.mounts, after the recipe's container_mounts",
    "model_paths": "model.path aliases",
    "containers": "container.image aliases",
}
# Keys our cluster profile holds (launcher/clusters/*.yaml): the profile decides them.
SITE_PROFILE = {
    "cluster": "the profile's name",
    "gpus_per_node": "the profile's gpus_per_node",
    "default_gpu_type": "the recipe's resources.gpu_type picks the profile",
    "network_interface": "the profile's network.interface",
    "use_gpus_per_node_directive": "the profile's gpu_directive",
    "use_segment_sbatch_directive": "the profile's segment",
    "use_exclusive_sbatch_directive": "the profile's exclusive",
    "visible_devices_env": "engines are pinned with CUDA_VISIBLE_DEVICES",
    "output_dir": "runs go to --runs-dir",
    "srtctl_root": "srt-slurm's own checkout: not used",
    "preflight": "the launcher's preflight always runs",
}


@dataclass
class Site:
    """A site's srtslurm.yaml: what it gives a recipe, and a row for each of its keys."""

    label: str
    data: dict
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def apply(self, recipe: dict) -> tuple[dict, dict[str, str]]:
        """(the recipe with the site's defaults under it, {alias: value})."""
        import copy

        d, out = self.data, copy.deepcopy(recipe)
        rows: list[tuple[str, str, str]] = []
        aliases: dict[str, str] = {}

        def row(key: str, category: str, text: str) -> None:
            rows.append((category, f"{self.label}:{key}", text))

        slurm = out.get("slurm") if isinstance(out.get("slurm"), dict) else None
        for key, value in d.items():
            if key in ("model_paths", "containers"):
                if not isinstance(value, dict) or any(isinstance(v, (dict, list))
                                                      for v in value.values()):
                    row(key, "refused", "is a mapping of alias to path or image")
                    continue
                aliases.update({str(k): str(v) for k, v in value.items()})
                row(key, "mapped", SITE_APPLIED[key])
            elif key in ("default_account", "default_partition", "default_time_limit"):
                ours = key.removeprefix("default_")
                if value is None:
                    row(key, "mapped", "null: none")
                    continue
                if isinstance(value, (dict, list)):
                    row(key, "refused", "is one value")
                    continue
                if slurm is None and "slurm" not in out:
                    slurm = out["slurm"] = {}
                if isinstance(slurm, dict) and slurm.get(ours) is None:
                    slurm[ours] = value
                row(key, "mapped", SITE_APPLIED[key])
            elif key == "default_sbatch_directives":
                if value and not isinstance(value, dict):
                    row(key, "refused", "is a mapping of directive to value")
                    continue
                mine = out.get("sbatch_directives")
                if isinstance(mine, dict) or mine is None:
                    out["sbatch_directives"] = {**(value or {}), **(mine or {})}
                row(key, "mapped", SITE_APPLIED[key])
            elif key == "default_health_check":
                if value and not isinstance(value, dict):
                    row(key, "refused", "is a mapping of max_attempts and interval_seconds")
                    continue
                if value and "health_check" not in out:
                    out["health_check"] = dict(value)
                row(key, "mapped", SITE_APPLIED[key])
            elif key == "default_mounts":
                if value and not isinstance(value, dict):
                    row(key, "refused", "is a mapping of host path to container path")
                    continue
                mine = out.get("container_mounts")
                if isinstance(mine, dict) or mine is None:
                    out["container_mounts"] = {**(value or {}), **(mine or {})}  # the recipe's win
                row(key, "mapped", SITE_APPLIED[key])
            elif key == "gpus_per_node":
                row(key, "mapped" if value in (None, 4) else "refused",
                    "4, the GB200 NVL72 profile's" if value in (None, 4)
                    else f"{show(value)}: the GB200 NVL72 profile has 4 GPUs a node")
            elif key in SITE_PROFILE:
                row(key, "deviation", f"{SITE_PROFILE[key]} (launcher/clusters/*.yaml)")
            else:
                row(key, "deviation", "not run by this launcher: the site's setting is not "
                    "used")
        self.rows = rows
        return out, aliases


def load_site(path: Path | None) -> Site | None:
    """The site file named by --site, else ./srtslurm.yaml when there is one; None when
    neither."""
    from launcher.schema.yaml_io import read_yaml

    if path is None:
        here = Path(SITE_FILE)
        if not here.is_file():
            return None
        path = here
    data = read_yaml(Path(path), "a site file (srtslurm.yaml)")
    return Site(str(path), data)


def render(recipe: dict, report: Report) -> str:
    """The imported recipe as YAML a person reads: the report on top as comments."""
    from launcher.schema.yaml_io import yaml_module

    yaml = yaml_module()
    head = ["# " + line for line in report.lines()]
    body = yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(head) + "\n" + body


def parse_aliases(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UserError(f"--alias {show(item)}: write NAME=VALUE (the srtslurm.yaml alias "
                            "and what it stands for)")
        out[name] = value
    return out


# --- the shipped recipes: `python -m launcher.schema.srt_slurm` writes them ----------------
# Each published GB200 vLLM disaggregated recipe of DeepSeek-V4-Pro, Kimi-K2.5 and
# MiniMax-M2.5 in the bundled copies, imported as it is into launcher/recipes/srt-slurm/
# <family>/<family>-gb200-<isl><osl>-<configuration>.yaml. Qwen3.5's are the seed recipe
# (checked against their import by tests/test_srt_import.py, which also fails when these
# files are stale).
SHIPPED = Path(__file__).parents[1] / "recipes" / "srt-slurm"

FAMILIES = {"DeepSeek-V4-Pro": "deepseek-v4-pro", "Kimi-K2.5": "kimi-k2.5",
            "MiniMax-M2.5": "minimax-m2.5"}
# srtslurm.yaml aliases the published files use, as the same family's other files name the
# checkpoint: MiniMax-M2.5's 1k1k recipes serve hf:MiniMaxAI/MiniMax-M2.5 at precision fp8
# (the checkpoint is FP8), its 8k1k ones the alias minimax-m2.5-fp8.
ALIASES = {"minimax-m2.5-fp8": "MiniMaxAI/MiniMax-M2.5"}


def name_of(source: Path) -> tuple[str, str]:
    """(family folder, recipe name) of a bundled source file."""
    parts = source.parts
    family = FAMILIES[parts[parts.index("multi-node") + 1]]
    lengths = next(p for p in parts if re.fullmatch(r"\d+k\d+k(-sa)?", p)).removesuffix("-sa")
    config = source.stem.removeprefix("disagg-gb200-")
    return family, f"{family}-gb200-{lengths}-{config}"


def render_shipped() -> dict[Path, str]:
    """{path under SHIPPED: text} of every shipped srt-slurm recipe."""
    from launcher.schema.yaml_io import yaml_module

    yaml = yaml_module()
    out = {}
    root = BUNDLED / "recipes" / "multi-node"
    for source in sorted(root.rglob("*.yaml")):
        if source.parts[len(root.parts)] not in FAMILIES:
            continue
        data, report = import_file(source, ALIASES)
        family, name = name_of(source)
        theirs, data["name"] = data["name"], name
        head = [
            f"# {name}: generated by python -m launcher.schema.srt_slurm (do not edit)",
            f"# from {report.source}",
            f"# sha256 {report.sha256}, read with the recipe schema of {SCHEMA_READ}:",
            f"# {report.summary()} (python -m launcher recipes import on the source lists "
            "each).",
            f"# name: the source's is {theirs}; here it says the family, lengths and shape.",
        ]
        if any(k == "model.path" and "alias" in v for k, v in report.mapped):
            head.append(f"# model.path: the source's alias {next(iter(ALIASES))} is "
                        f"{ALIASES[next(iter(ALIASES))]} (this family's other recipes name it)")
        head += [f"# deviation  {k}: {v}" for k, v in report.deviations]
        body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
        out[Path(family) / f"{name}.yaml"] = "\n".join(head) + "\n" + body
    return out



def ship() -> int:
    files = render_shipped()
    for old in SHIPPED.rglob("*.yaml"):
        if old.relative_to(SHIPPED) not in files:
            old.unlink()
    for rel, text in files.items():
        (SHIPPED / rel).parent.mkdir(parents=True, exist_ok=True)
        (SHIPPED / rel).write_text(text)
    print(f"wrote {len(files)} recipes under {SHIPPED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(ship())
