"""The recipe's sections as pydantic models (model, container, pools, router, benchmark,
accuracy, telemetry, slurm, health, sim), and the checks they share with the Recipe model
(launcher.schema.recipe), cluster profiles and the planner: value checks, sbatch words,
option names.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from launcher.run import lengths as run_lengths
from launcher.run import slo as run_slo
from launcher.schema.secrets import env_refusal, secret_env
from launcher.schema.wording import _SURROGATE, did_you_mean, show

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


def check_mounts(mounts: list[str]) -> list[str]:
    """Container mounts as pyxis takes them: SRC:DST or SRC:DST:ro, no commas (its list
    separator)."""
    for m in mounts:
        parts = m.split(":")
        if not 2 <= len(parts) <= 3 or not all(parts[:2]) or "," in m:
            raise ValueError(f"mount {show(m)}: write it as SRC:DST or SRC:DST:ro")
    return mounts


# srun options the launcher sets on every step (or that would move a step out of its place).
OWNED_SRUN = {
    "jobid": "every step runs in the job's allocation",
    "overlap": "steps share the job's nodes",
    "nodes": "the planner places each step", "ntasks": "the planner places each step",
    "ntasks-per-node": "the planner places each step",
    "nodelist": "the planner places each step", "exclude": "the planner places each step",
    "job-name": "steps are named after their process",
    "kill-on-bad-exit": "the launcher stops a step whose task fails",
    "gpus-per-node": "set the profile's gpu_directive", "gres": "set the profile's gpu_directive",
    "gpus": "set the profile's gpu_directive",
    "output": "each process logs to the run directory",
    "error": "each process logs to the run directory", "input": "steps read no input",
    "export": "each process's environment is rendered on its command line",
    "pty": "steps run in the background",
}
_SRUN_NAME = re.compile(r"--([a-z][a-z0-9-]{0,40})(=.*)?\Z", re.S)
_ASSIGN = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=")


def check_srun_options(opts: list[str]) -> list[str]:
    """Extra srun options as `--name` or `--name=value`, one word each (quoted in commands.sh),
    none the launcher sets, no secret in them."""
    for o in opts:
        m = _SRUN_NAME.match(o)
        if not m:
            raise ValueError(f"srun option {show(o)}: write it as --name or --name=value, one "
                             "item per option")
        name = m[1]
        if name.startswith(("container-", "no-container-")):
            raise ValueError(f"remove {show(o)}: the container runtime's flags come from the "
                             "profile's containers and the recipe's container")
        if name in OWNED_SRUN:
            raise ValueError(f"remove {show(o)}: {OWNED_SRUN[name]}")
        longer = sorted(k for k in OWNED_SRUN if k.startswith(name))
        if longer:
            raise ValueError(f"remove {show(o)}: srun reads it as --{longer[0]}, which the "
                             "launcher sets")
        check_no_secret(o, f"srun option {show(o)}")
    return opts


def check_no_secret(text: str, where: str) -> None:
    """A value written into commands.sh and the run's files must not set a secret."""
    for name in _ASSIGN.findall(text):
        if what := secret_env(name):
            raise ValueError(env_refusal(f"{where} ({name})", what))


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


def _flag_list(v: Any) -> Any:
    """A flag that takes several values (`numa-bind-nodes: [0, 0, 1, 1]`), rendered as the
    flag followed by each (srt-slurm renders a list so): words and numbers only, none that
    argparse would read as an option."""
    if not isinstance(v, list):
        return v
    if not v:
        raise ValueError("an empty list gives the flag no value: remove the flag or list its "
                         "values")
    for item in v:
        if isinstance(item, (bool, list, dict)) or item is None:
            raise ValueError(f"{show(item)} in a list of flag values: write numbers or words")
        if isinstance(item, str) and (not item or item.startswith("-")):
            raise ValueError(f"{show(item)} in a list of flag values would be read as an "
                             "option (or is empty): write it as one string instead")
    return v


# A `vllm serve` flag's value: one value, or several after the flag (nargs="+").
FlagValue = Annotated[ArgValue | list[int | float | str], BeforeValidator(_flag_list)]


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
    mla_latent_dim: int = Field(
        default=0, ge=0, le=65_536,
        description="multi-head latent attention: kv_lora_rank + qk_rope_head_dim (one "
        "latent per token and layer, not split by TP); num_kv_heads and head_dim then unused",
    )  # fmt: skip
    mtp_layers: int = Field(
        default=0, ge=0, le=64,
        description="num_nextn_predict_layers: MTP layers that join the cache (MLA, "
        "DeepSeek-V4) with --speculative-config method mtp; each weighs one decoder layer",
    )  # fmt: skip
    dense_weight_bits: float | None = Field(
        default=None, ge=1, le=64,
        description="average bits per non-expert weight as stored (default: the model dtype's "
        "16; an FP8 checkpoint with bf16 embeddings ~9)",
    )  # fmt: skip
    compress_ratios: list[int] | None = Field(
        default=None, max_length=10_000,
        description="DeepSeek-V4: config.json's compress_ratios, one per layer (0 or 1: "
        "sliding window only, 4: CSA, 128: HCA); with sliding_window and index_head_dim",
    )  # fmt: skip
    sliding_window: int | None = Field(default=None, ge=1, le=1 << 24,
                                       description="DeepSeek-V4: config.json's sliding_window")
    index_head_dim: int | None = Field(default=None, ge=1, le=65_536,
                                       description="DeepSeek-V4: config.json's index_head_dim")

    def compressed_attention_gap(self) -> str:
        """Why declared DeepSeek-V4 facts do not describe its cache ("" when they do)."""
        if self.compress_ratios is None:
            return ""
        odd = sorted({r for r in self.compress_ratios if r not in (0, 1, 4, 128)})
        if odd:
            return (f"model.facts.compress_ratios has {odd}: DeepSeek-V4's ratios are 0 or 1 "
                    "(sliding window only), 4 (CSA) and 128 (HCA)")
        if len(self.compress_ratios) < self.full_attention_layers:
            return (f"model.facts.compress_ratios has {len(self.compress_ratios)} entries for "
                    f"{self.full_attention_layers} layers (full_attention_layers): one per layer")
        missing = [k for k in ("sliding_window", "index_head_dim") if not getattr(self, k)]
        if missing:
            return "model.facts gives compress_ratios without " + " and ".join(missing)
        return ""

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
    pipeline_parallel: int = Field(
        default=1, ge=1, le=64,
        description="--pipeline-parallel-size: stages of the model's layers, each "
        "tensor_parallel GPUs; an engine of tensor_parallel x pipeline_parallel GPUs larger "
        "than a node spans whole nodes (vLLM's --nnodes launch, docs/pipeline-parallel.md)",
    )
    expert_parallel: bool = False
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=64, description="GPUs each node gives this endpoint (default: all)"
    )
    api_servers: int = Field(
        default=1, ge=1, le=64, description="--api-server-count; >1 turns stats logs off"
    )
    fronts: Literal["one", "per_node"] = Field(
        default="one",
        description="an endpoint over several nodes: one API server on its first node and "
        "the others --headless ('one'), or one on every node with --data-parallel-hybrid-lb "
        "('per_node'), each a worker of the router (docs/gb200-launch.md)",
    )
    srun_options: list[str] = Field(
        default_factory=list,
        description="extra srun options for this pool's engine steps (after the profile's "
        "and slurm.srun_options)",
    )

    @field_validator("srun_options")
    @classmethod
    def _srun(cls, v: list[str]) -> list[str]:
        return check_srun_options(v)
    args: dict[str, FlagValue] = Field(default_factory=dict,
                                       description="extra `vllm serve` flags")
    args_from_concurrency: dict[int, dict[str, FlagValue]] = Field(
        default_factory=dict,
        description="`vllm serve` flags from this sweep concurrency up, over args: the "
        "pool's engines restart with them before that point",
    )
    env: EnvMap = Field(default_factory=dict)
    kv_connector: dict[str, Any] | None = Field(
        default=None,
        description="this role's --kv-transfer-config as written, kv_role included (e.g. a "
        "MultiConnector of NixlConnector and MooncakeStoreConnector or a CPU offload "
        "connector, each child with its own kv_role); it replaces the recipe's kv_connector "
        "for this role (docs/kv-store.md)",
    )

    @field_validator("kv_connector")
    @classmethod
    def _kv_json(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            json_only(v)
        return v

    @property
    def model_parallel(self) -> int:
        """GPUs of one data-parallel rank: vLLM's world size, tensor x pipeline parallel."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.model_parallel

    def args_at(self, concurrency: int | None) -> dict[str, FlagValue]:
        """args with every args_from_concurrency step at or below `concurrency` on top, in
        ascending order (None: args alone, what the engines start with)."""
        out = dict(self.args)
        for c in sorted(self.args_from_concurrency):
            if concurrency is not None and c <= concurrency:
                out.update(self.args_from_concurrency[c])
        return out


def json_only(v: Any) -> None:
    """A mapping that becomes vLLM's --kv-transfer-config JSON."""
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ValueError(
            "it becomes vLLM's --kv-transfer-config JSON: write strings, finite numbers, "
            "true/false, null, lists and mappings only"
        ) from None


class KvStore(Strict):
    """A Mooncake KV store the engines share through MooncakeStoreConnector: its
    `mooncake_master` runs on the first node before the engines (docs/kv-store.md)."""

    store_config: dict[str, Any] = Field(
        description="vLLM's MooncakeStoreConfig as JSON (the file at MOONCAKE_CONFIG_PATH): "
        "metadata_server, protocol, device_name, mode, global_segment_size, "
        "local_buffer_size, ...; the launcher fills in master_server_address only",
    )
    env: EnvMap = Field(
        default_factory=dict,
        description="environment of every engine that shares the store (Mooncake's MC_* "
        "knobs)",
    )
    master_args: list[str] = Field(
        default_factory=list, max_length=64,
        description="extra mooncake_master flags (--name=value), after the launcher's own; "
        "its ports are the launcher's",
    )
    master_command: str = Field(
        default="mooncake_master", min_length=1, max_length=4096,
        description="the master's executable where it runs: in the engines' container when "
        "the recipe has one (the vLLM image ships Mooncake), else on the node's PATH",
    )
    lease_ttl_ms: int = Field(
        default=10000, ge=1, le=86_400_000,
        description="the master's --default_kv_lease_ttl (ms): how long a read holds an "
        "object against eviction",
    )

    @field_validator("store_config")
    @classmethod
    def _store_json(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise ValueError("it becomes the store's JSON config: write strings, finite "
                             "numbers, true/false and null only") from None
        return v

    @field_validator("master_args")
    @classmethod
    def _master_flags(cls, v: list[str]) -> list[str]:
        for a in v:
            if not re.fullmatch(r"--[A-Za-z0-9_]+(=.*)?", a) or "\n" in a:
                raise ValueError(f"{a!r} is not a mooncake_master flag: write --name=value")
        return v


class Router(Strict):
    placement: Literal["prefill", "decode"] = Field(
        default="prefill",
        description="the node the router and the benchmark and accuracy clients run on: the "
        "first node of this role's first endpoint (prefill: off the decode head, which "
        "streams every token; an aggregated recipe uses its first node)",
    )
    policy: str | None = None
    prefill_policy: str | None = None
    decode_policy: str | None = None
    args: dict[str, ArgValue] = Field(default_factory=dict)


class CustomBenchmark(Strict):
    """srt-slurm's `benchmark.type: custom`: a shell command run in place of the sweep, with
    srt-slurm 2.x's environment contract (docs/custom-benchmark.md)."""

    command: str = Field(
        max_length=65_536,
        description="run as `bash -lc COMMAND` where the benchmark client runs (the "
        "router's node, in the container), after the router is up; its exit status is the "
        "benchmark's (docs/custom-benchmark.md)",
    )
    env: EnvMap = Field(
        default_factory=dict,
        description="its environment, over SRT_FRONTEND_HOST/PORT, SRT_<ROLE>_IPS/ENDPOINTS, "
        "AIPERF_SERVER_METRICS_URLS, SRT_WORKER_NODES, SRT_GPUS_PER_NODE and the recipe's env",
    )

    @field_validator("command")
    @classmethod
    def _a_command(cls, v: str) -> str:
        # a script over several lines (YAML's `|`) is one bash -lc argument; commands.sh
        # writes it on one line ($'...'), so only other control characters are refused
        if _CONTROL.search(v.replace("\n", "").replace("\r", "")):
            raise ValueError("the command holds a control character other than a line break; "
                             "write it as plain text")
        if not v.strip():
            raise ValueError("the command is empty: write the shell command to run (e.g. bash "
                             "/path/bench.sh), or remove benchmark.custom for the builtin sweep")
        check_no_secret(v, "benchmark.custom.command")
        return v


# AIPerf 0.13.0's public session corpora (its plugins.yaml, public_dataset_loader entries):
# the name a recipe gives -> (the --public-dataset spelling its CLI takes, the Hugging Face
# dataset it downloads). docs/agentic.md.
# The AIPerf `env prepare --aiperf` stages for the nodes (docs/agentic.md); its metadata
# asks Python >=3.11,<3.14
AIPERF_VERSION = "0.13.0"
AIPERF_PYTHONS = ("3.11", "3.12", "3.13")
AGENTIC_CORPORA = {
    "semianalysis_cc_traces_weka": ("semianalysis-cc-traces-weka",
                                    "semianalysisai/cc-traces-weka-no-subagents-051826"),
    "semianalysis_cc_traces_weka_no_subagents": (
        "semianalysis-cc-traces-weka-no-subagents",
        "semianalysisai/cc-traces-weka-no-subagents-051826"),
    "semianalysis_cc_traces_weka_with_subagents": (
        "semianalysis-cc-traces-weka-with-subagents", "semianalysisai/cc-traces-weka-062126"),
    "semianalysis_cc_traces_weka_061326": ("semianalysis-cc-traces-weka-061326",
                                           "semianalysisai/cc-traces-weka-061326"),
    "semianalysis_cc_traces_weka_061526": ("semianalysis-cc-traces-weka-061526",
                                           "semianalysisai/cc-traces-weka-061526"),
    "semianalysis_cc_traces_weka_062126": ("semianalysis-cc-traces-weka-062126",
                                           "semianalysisai/cc-traces-weka-062126"),
    "semianalysis_cc_traces_weka_062126_256k": ("semianalysis-cc-traces-weka-062126-256-k",
                                                "semianalysisai/cc-traces-weka-062126-256k"),
}
AGENTX_SCENARIO = "inferencex-agentx-mvp"


@functools.cache
def aiperf_env_names() -> frozenset[str]:
    """The environment variables AIPerf 0.13.0 reads (its settings), from the list made from
    its source (docs/agentic.md)."""
    text = (Path(__file__).parent.parent / "data" / "aiperf-0.13.0-env.txt").read_text()
    return frozenset(line for line in text.split() if line.startswith("AIPERF_"))
NO_SUBAGENTS = ("semianalysis_cc_traces_weka", "semianalysis_cc_traces_weka_no_subagents")


class AgenticBenchmark(Strict):
    """Multi-turn session replay with the real AIPerf (docs/agentic.md): each sweep point is
    `aiperf profile` at benchmark.concurrency live sessions, through the router."""

    trace: str = Field(
        max_length=4096,
        description="the session trace: a local file or folder in trace_format, or one of "
        "AIPerf's public corpora by name (e.g. semianalysis_cc_traces_weka_062126), which "
        "stage-dataset puts on the shared filesystem first",
    )
    trace_format: Literal["mooncake_trace", "weka_trace"] = Field(
        default="mooncake_trace",
        description="a local trace's format as AIPerf reads it (--custom-dataset-type): "
        "mooncake_trace (JSONL, session_id/delay/hash_ids per turn) or weka_trace (the "
        "session-tree corpus format); a public corpus has its own",
    )
    block_size: int = Field(
        default=512, ge=1, le=1 << 20,
        description="tokens per hash id of a mooncake_trace (--isl-block-size; Mooncake's "
        "and AIPerf's default 512)")
    duration_s: float | None = Field(
        default=None, gt=0, le=30 * 86400,
        description="each point's length (--benchmark-duration); none: every session of "
        "the trace played once (--conversation-num)",
    )
    sessions_per_point: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="sessions replayed per point when duration_s is not set (default: "
        "every session in a local trace)",
    )
    warmup_requests: int = Field(default=0, ge=0, le=10_000_000,
                                 description="warm-up requests before each point "
                                 "(--warmup-request-count), not measured")
    tokenizer: str | None = Field(
        default=None, max_length=4096,
        description="the tokenizer AIPerf builds prompts with (a hub id or folder; default "
        "the model's path)")
    seed: int = Field(default=42, ge=0, le=2**31 - 1, description="--random-seed")
    think_time_cap_s: float | None = Field(
        default=None, ge=0, le=86400,
        description="cap on a turn's recorded think time (--inter-turn-delay-cap-seconds); "
        "none: as recorded")
    max_context: int | None = Field(
        default=None, ge=1, le=1 << 24,
        description="drop whole sessions whose context exceeds this (--max-context-length)")
    extra_inputs: list[str] = Field(
        default_factory=list, max_length=64,
        description="more fields of every request's body, each key:value (AIPerf's "
        "--extra-inputs, e.g. thinking:true), after the launcher's ignore_eos:true")
    grace_period_s: float | None = Field(
        default=None, ge=0, le=86400,
        description="after duration_s, how long AIPerf still waits for answers that then "
        "count (--benchmark-grace-period); none: AIPerf's 30 s")
    cache_warmup_s: float | None = Field(
        default=None, gt=0, le=86400,
        description="AIPerf's accelerated cache warm-up after the snapshot warm-up, seconds "
        "(--agentic-cache-warmup-duration); agentic replay only (scenario "
        "inferencex-agentx-mvp)")
    failed_request_threshold: float = Field(
        default=0.10, gt=0, le=1,
        description="AIPerf ends a point once this share of its requests failed "
        "(InferenceX's 0.10)")
    scenario: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,63}$",
        description="an AIPerf scenario that locks its settings (--scenario, e.g. "
        "inferencex-agentx-mvp)")
    session_header: str = Field(
        default="X-Session-ID", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,63}$",
        description="the header AIPerf carries each session's id in (--session-header); "
        "vllm-router's consistent_hash keys a session on it")
    aiperf: str | None = Field(
        default=None, max_length=4096,
        description="the aiperf command on the router's node; none: AIPerf "
        f"{AIPERF_VERSION} as `python -m launcher env prepare --cluster PROFILE --aiperf` "
        "staged it on the shared filesystem (a profile whose compute_env.mode is shared), "
        "else the aiperf on PATH")
    drain_poll_s: float = Field(
        default=10.0, gt=0, le=600,
        description="after a point, every engine is polled this often until it holds no "
        "running or waiting request three polls in a row")
    env: EnvMap = Field(
        default_factory=dict,
        description="AIPerf's own settings as its environment variables (AIPERF_*, e.g. "
        "AIPERF_DATASET_MMAP_CACHE_ENABLED: false), passed to its process; only names "
        "AIPerf 0.13.0 reads")

    @field_validator("env")
    @classmethod
    def _aiperf_reads(cls, v: dict[str, str]) -> dict[str, str]:
        # a name AIPerf does not read would be ignored silently: say so before the run
        known = aiperf_env_names()
        for k in v:
            if k not in known:
                hint = did_you_mean(k, known)
                raise ValueError(f"{k} is not a setting AIPerf 0.13.0 reads"
                                 + (f"; {hint}" if hint else
                                    " (launcher/data/aiperf-0.13.0-env.txt lists them)"))
        return v

    @field_validator("extra_inputs")
    @classmethod
    def _key_value(cls, v: list[str]) -> list[str]:
        for item in v:  # AIPerf splits each on its first colon
            if not isinstance(item, str) or ":" not in item or item.startswith(":") \
                    or _CONTROL.search(item) or any(c.isspace() for c in item):
                raise ValueError(f"{show(item)} is not key:value (one request field, no "
                                 "spaces, e.g. thinking:true)")
        return v

    @model_validator(mode="after")
    def _scenario_locks(self) -> AgenticBenchmark:
        # what AIPerf 0.13.0's inferencex-agentx-mvp scenario refuses at start-up
        # (aiperf/common/scenario/inferencex_agentx_mvp.py), said before a GPU is spent
        if self.scenario != AGENTX_SCENARIO:
            if self.cache_warmup_s is not None:  # AIPerf refuses it outside agentic replay
                raise ValueError(f"cache_warmup_s needs AIPerf's agentic replay, which "
                                 f"scenario {AGENTX_SCENARIO} sets: add it or remove "
                                 "cache_warmup_s")
            return self
        if self.duration_s is not None and self.duration_s < 900:
            raise ValueError(f"duration_s {self.duration_s:g} is below the 900 s scenario "
                             f"{AGENTX_SCENARIO} requires; raise it or remove scenario")
        if self.think_time_cap_s is not None:
            raise ValueError(f"think_time_cap_s: scenario {AGENTX_SCENARIO} keeps the "
                             "recorded think times (it caps idle gaps at 10 s itself); "
                             "remove one of them")
        allowed = [c for c in AGENTIC_CORPORA if c not in NO_SUBAGENTS]
        if self.corpus in NO_SUBAGENTS or not (self.corpus or self.trace_format == "weka_trace"):
            raise ValueError(f"scenario {AGENTX_SCENARIO} replays a Weka corpus with "
                             "subagents only: name one of " + ", ".join(allowed)
                             + " or a weka_trace, or remove scenario")
        return self

    @property
    def corpus(self) -> str | None:
        """The public corpus this trace names, or None for a local trace."""
        return self.trace if self.trace in AGENTIC_CORPORA else None

    @field_validator("trace")
    @classmethod
    def _a_trace(cls, v: str) -> str:
        v = v.strip()
        if not v or _CONTROL.search(v):
            raise ValueError("the trace is empty or holds a control character: name a local "
                             "trace file or folder, or one of AIPerf's public corpora ("
                             + ", ".join(AGENTIC_CORPORA) + ")")
        if "/" not in v and not v.endswith((".jsonl", ".json", ".gz")) \
                and v not in AGENTIC_CORPORA:
            raise ValueError(f"{show(v)} is neither a path nor a corpus AIPerf 0.13.0 knows: "
                             "name a local trace file or folder (with a /), or one of "
                             + ", ".join(AGENTIC_CORPORA))
        return v

class Slo(Strict):
    """benchmark.slo: latency limits and the search for the highest concurrency that meets
    them all (docs/slo.md). Written as the limits alone (`slo: ttft_p99<=2s,itl_p90<=30ms`)
    or as this mapping."""

    limits: str = Field(description="limits joined by commas, each <metric>_<statistic><="
                        "<number><unit>: ttft|tpot|itl|e2el, p50|p90|p99|mean|median, ms|s; "
                        "e.g. ttft_p99<=2s,itl_p90<=30ms")
    precision: float = Field(
        default=run_slo.DEFAULT_PRECISION, ge=0, le=1,
        description="bisect until the first failing concurrency is within this fraction of "
        "the last passing one (and at most 1 apart at 0)")
    max_concurrency: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="the top of the search (default: the largest of benchmark.concurrency); "
        "it probes from the first of benchmark.concurrency, doubling")

    @model_validator(mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return {"limits": v} if isinstance(v, str) else v

    @field_validator("limits")
    @classmethod
    def _grammar(cls, v: str) -> str:
        run_slo.parse(v)  # ValueError: one sentence naming what to fix
        return v

    def parsed(self) -> list:
        return run_slo.parse(self.limits)


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
    concurrency: list[int] = Field(
        default_factory=lambda: [64], min_length=1, max_length=64,
        description="requests in flight per sweep point; with benchmark.agentic, live sessions")
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
    custom: CustomBenchmark | None = Field(
        default=None,
        description="{command, env}: run this command instead of the concurrency sweep "
        "(srt-slurm's benchmark.type: custom); the sweep's keys then do not apply",
    )
    agentic: AgenticBenchmark | None = Field(
        default=None,
        description="{trace, ...}: replay multi-turn sessions with AIPerf at each "
        "concurrency (then the number of live sessions) in place of the fixed-length "
        "sweep; the length keys then do not apply (docs/agentic.md)",
    )
    slo: Slo | None = Field(
        default=None,
        description="latency limits (e.g. ttft_p99<=2s,itl_p90<=30ms): each configuration's "
        "sweep becomes a search for the highest concurrency meeting them all (docs/slo.md)",
    )

    @property
    def sweeps(self) -> bool:
        """The builtin concurrency sweep runs (a custom command stands in its place)."""
        return self.enabled and self.custom is None

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
        if self.agentic is not None and self.custom is not None:
            raise ValueError("set benchmark.agentic (AIPerf's session replay) or "
                             "benchmark.custom (your own command), not both")
        if self.slo is not None and self.custom is not None:
            raise ValueError(
                "slo with a custom benchmark: the SLO search measures the concurrency sweep's "
                "points; remove benchmark.slo or benchmark.custom"
            )
        if self.slo is not None and self.slo.max_concurrency is not None \
                and self.slo.max_concurrency < self.concurrency[0]:
            raise ValueError(
                f"slo.max_concurrency {self.slo.max_concurrency} is below the first "
                f"concurrency {self.concurrency[0]}, where the search starts: raise it or "
                "lower benchmark.concurrency"
            )
        if self.chat_template and self.driver == "vllm":
            raise ValueError(
                "chat_template with driver vllm: vllm bench serve's random dataset sends no "
                "chat template; use driver builtin (sa-bench's prompts) or chat_template: false"
            )
        return self

    @property
    def points(self) -> list[int]:
        """The sweep's planned concurrencies: the list, or with an SLO its probe ladder (the
        first, doubling to the top); the search adds its bisection points as it runs."""
        if self.slo is None:
            return list(self.concurrency)
        return run_slo.ladder(self.concurrency[0], self.slo_top)

    @property
    def slo_top(self) -> int:
        """The top of the SLO search: slo.max_concurrency, else the largest concurrency."""
        top = self.slo.max_concurrency if self.slo is not None else None
        return top or max(self.concurrency)

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
    srun_options: list[str] = Field(
        default_factory=list,
        description="extra srun options for every step of the job (after the profile's)",
    )

    @field_validator("srun_options")
    @classmethod
    def _srun(cls, v: list[str]) -> list[str]:
        return check_srun_options(v)

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
