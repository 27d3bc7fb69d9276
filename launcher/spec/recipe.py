"""Recipes: what to serve, on what topology, and how to measure it (YAML, validated by pydantic).

A recipe is picked by file path or by the name of a shipped recipe (launcher/recipes/).
`--set a.b.c=value` overrides any field; values are parsed as YAML scalars/lists.
Unknown keys, wrong types and bad values are errors that name the key and the file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from launcher.errors import UserError
from launcher.run.vocab import Role

RECIPES_DIR = Path(__file__).parents[1] / "recipes"

# Values of these env names are secrets: they travel by name (env_from_host), never by value.
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|CREDENTIAL)", re.IGNORECASE
)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

ArgValue = str | int | float | bool | None


def _env_values(v: Any) -> Any:
    """YAML reads `X: 1` as an int; environment values are strings, so say it once here."""
    if isinstance(v, dict):
        return {
            k: ("1" if x is True else "0" if x is False else str(x))
            if isinstance(x, int | float | bool)
            else x
            for k, x in v.items()
        }
    return v


EnvMap = Annotated[dict[str, str], BeforeValidator(_env_values)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelFacts(Strict):
    """Architecture facts for the KV-capacity estimate (read config.json when you can)."""

    total_params_b: float = Field(gt=0, description="parameters, billions")
    weight_bits: float = Field(
        default=16, gt=0, description="bits per weight as stored (NVFP4 ~4.5)"
    )
    full_attention_layers: int = Field(ge=0)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    gdn_layers: int = Field(default=0, ge=0, description="linear-attention (GDN/Mamba) layers")
    gdn_value_heads: int = Field(default=0, ge=0)
    gdn_key_head_dim: int = Field(default=0, ge=0)
    gdn_value_head_dim: int = Field(default=0, ge=0)
    gdn_key_heads: int = Field(default=0, ge=0)
    conv_kernel: int = Field(default=4, ge=1)
    dense_params_b: float = Field(
        default=0, ge=0, description="non-expert parameters (replicated on every EP rank), billions"
    )
    ssm_state_dtype: str = Field(default="float32", description="config's mamba_ssm_dtype")
    hybrid: bool = Field(default=False, description="hybrid SSM model: P and D need equal TP")


class Model(Strict):
    path: str = Field(min_length=1, description="HF id or path; the same literal on P and D")
    served_name: str | None = None
    facts: ModelFacts | None = None

    @property
    def name(self) -> str:
        return self.served_name or self.path


class Container(Strict):
    image: str = Field(min_length=1)
    mounts: list[str] = Field(default_factory=list, description="SRC:DST[:FLAGS]")
    workdir: str | None = None


class Pool(Strict):
    """A set of identical endpoints: prefill, decode, or aggregated."""

    endpoints: int = Field(default=1, ge=0)
    data_parallel: int = Field(default=1, ge=1)
    tensor_parallel: int = Field(default=1, ge=1)
    expert_parallel: bool = False
    gpus_per_node: int | None = Field(
        default=None, ge=1, description="GPUs each node gives this endpoint (default: all)"
    )
    api_servers: int = Field(
        default=1, ge=1, description="--api-server-count; >1 turns stats logs off"
    )
    args: dict[str, ArgValue] = Field(default_factory=dict, description="extra `vllm serve` flags")
    env: EnvMap = Field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.tensor_parallel


class Router(Strict):
    policy: str | None = None
    prefill_policy: str | None = None
    decode_policy: str | None = None
    args: dict[str, ArgValue] = Field(default_factory=dict)


class Benchmark(Strict):
    driver: Literal["builtin", "vllm"] = "builtin"
    input_len: int = Field(default=8192, ge=1)
    output_len: int = Field(default=1024, ge=1)
    range_ratio: float = Field(default=0.8, ge=0, lt=1)
    concurrency: list[int] = Field(default_factory=lambda: [64], min_length=1)
    prompts_per_point: int | None = Field(
        default=None, ge=1, description="requests per point (default: 5 x concurrency)"
    )
    prompts_multiplier: int = Field(default=5, ge=1)
    warmup: int = Field(default=0, ge=0, description="warmup requests before each point")
    on_failure: Literal["continue", "stop"] = "continue"
    enabled: bool = True

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(c < 1 for c in v):
            raise ValueError("every concurrency must be >= 1")
        return v

    def prompts(self, concurrency: int) -> int:
        return self.prompts_per_point or self.prompts_multiplier * concurrency


class Accuracy(Strict):
    enabled: bool = True
    task: Literal["gsm8k"] = "gsm8k"
    data: str | None = Field(
        default=None, description="local GSM8K jsonl (clusters may lack internet)"
    )
    num_questions: int = Field(default=1319, ge=1)
    num_shots: int = Field(default=5, ge=0)
    threshold: float = Field(default=0.88, ge=0, le=1)
    concurrency: int = Field(default=64, ge=1)
    max_tokens: int = Field(default=256, ge=1)


class Telemetry(Strict):
    enabled: bool = True
    interval_s: float = Field(default=1.0, gt=0)


class Slurm(Strict):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = Field(default="02:00:00", description="HH:MM:SS or minutes")
    directives: dict[str, ArgValue] = Field(
        default_factory=dict, description="extra #SBATCH --key=value lines"
    )

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if not re.fullmatch(r"\d+|(\d+-)?\d{1,2}:\d{2}(:\d{2})?", str(v)):
            raise ValueError("use minutes or [D-]HH:MM[:SS], e.g. 02:00:00")
        return str(v)

    @property
    def minutes(self) -> int:
        v = self.time_limit
        if v.isdigit():
            return int(v)
        days, _, hms = v.rpartition("-")
        parts = [int(p) for p in hms.split(":")] + [0]
        h, m, s = (parts + [0, 0])[:3]
        return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


class Health(Strict):
    timeout_s: float = Field(default=1800, gt=0, description="all endpoints healthy within this")
    router_timeout_s: float = Field(default=120, gt=0)


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    cluster: str = Field(description="cluster profile: gb200-nvl72, devcluster, local")
    engine: Literal["vllm", "sim"] = "vllm"
    mode: Literal["disagg", "agg"] = "disagg"
    model: Model
    container: Container | None = None
    vllm_args: dict[str, ArgValue] = Field(
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
        description="--kv-transfer-config without kv_role (the launcher sets the role)",
    )
    prefill: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    decode: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    agg: Pool = Field(default_factory=lambda: Pool(endpoints=0))
    router: Router = Field(default_factory=Router)
    benchmark: Benchmark = Field(default_factory=Benchmark)
    accuracy: Accuracy = Field(default_factory=Accuracy)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    slurm: Slurm = Field(default_factory=Slurm)
    health: Health = Field(default_factory=Health)
    hold_s: float = Field(
        default=0, ge=0, description="keep serving this long after the sweep, before accuracy"
    )
    sim: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="simulator knobs (engine: sim), rendered as SIM_* env"
    )

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        if self.mode == "disagg":
            if self.prefill.endpoints < 1 or self.decode.endpoints < 1:
                raise ValueError(
                    "mode disagg needs prefill.endpoints >= 1 and decode.endpoints >= 1"
                )
            if self.agg.endpoints:
                raise ValueError("mode disagg takes no agg endpoints; set agg.endpoints: 0")
        else:
            if self.agg.endpoints < 1:
                raise ValueError("mode agg needs agg.endpoints >= 1")
            if self.prefill.endpoints or self.decode.endpoints:
                raise ValueError("mode agg takes no prefill/decode endpoints; set them to 0")
        envs = [("env", self.env)] + [(f"{p}.env", getattr(self, p).env) for p in POOLS]
        for where, env in envs:
            for key in env:
                if not ENV_NAME.match(key):
                    raise ValueError(f"{where}: {key!r} is not a valid environment variable name")
                if SECRET_NAME.search(key):
                    raise ValueError(
                        f"{where}.{key} looks like a secret: list its name under env_from_host "
                        "so its value never lands in the sbatch script, plan or logs"
                    )
        for key in self.env_from_host:
            if not ENV_NAME.match(key):
                raise ValueError(f"env_from_host: {key!r} is not a valid environment variable name")
        if self.sim and self.engine != "sim":
            raise ValueError("sim knobs are only for engine: sim")
        return self

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
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


def resolve_path(ref: str) -> Path:
    """A recipe file path, or the name of a shipped recipe."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise UserError(f"recipe file {ref} does not exist")
        return p
    found = shipped()
    if ref in found:
        return found[ref]
    names = ", ".join(found) or "none"
    raise UserError(f"no recipe named {ref!r}: give a YAML path or one of: {names}")


def yaml_module():
    import yaml

    return yaml


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {text!r}: write it as key.path=value, e.g. prefill.endpoints=8")
    try:
        value = yaml_module().safe_load(raw) if raw.strip() else ""
    except Exception as e:  # yaml's errors are many classes; any means "not a value"
        raise UserError(f"--set {text!r}: {raw!r} is not a YAML value ({e})") from None
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise UserError(f"--set {text!r}: {where} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def format_error(e: ValidationError, source: str, overrides: list[str] | None = None) -> str:
    """One line per problem, naming the file (or the --set that brought the value) and key."""
    set_keys = [o.partition("=")[0].strip() for o in overrides or []]
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        came = [
            k for k in set_keys if loc == k or loc.startswith(k + ".") or k.startswith(loc + ".")
        ]
        where = f"{source} with --set {came[-1]}" if came else source
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key {loc!r}")
        elif err["type"] == "missing":
            lines.append(f"{where}: missing required key {loc!r}")
        else:
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {loc}: {msg}{shown}")
    return "\n".join(lines)


def load(ref: str, overrides: list[str] | None = None) -> Recipe:
    path = resolve_path(ref)
    try:
        data = yaml_module().safe_load(path.read_text(encoding="utf-8"))
    except Exception as e:  # yaml's errors are many classes; all mean "fix the file"
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{path}: not valid YAML{at}: {what}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe is a YAML mapping of keys to values")
    _resolve_relative(data, path.parent)
    data = apply_overrides(data, overrides or [])
    return validate(data, str(path), overrides)


def _resolve_relative(data: dict, base: Path) -> None:
    """Data paths in a recipe file are relative to that file (overrides: to the cwd)."""
    acc = data.get("accuracy")
    if isinstance(acc, dict) and isinstance(acc.get("data"), str) and acc["data"]:
        p = Path(acc["data"]).expanduser()
        if not p.is_absolute():
            acc["data"] = str((base / p).resolve())


def validate(data: dict, source: str, overrides: list[str] | None = None) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise UserError(format_error(e, source, overrides)) from None


def dump(recipe: Recipe) -> str:
    """The fully resolved recipe, as written to the run directory."""
    return yaml_module().safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
