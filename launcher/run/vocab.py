"""The words every part uses for a run: states, stages, process kinds, endpoint roles.

They are `StrEnum`s, so they are written to JSON as the plain strings below and compare
equal to them: files stay readable by `jq` and by older readers.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """A run's life: planned -> submitted (Slurm) -> running -> one final state; or planned
    -> refused, when the submission was refused before anything ran (a blocker, --check,
    sbatch)."""

    PLANNED = "planned"
    SUBMITTED = "submitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REFUSED = "refused"

    @property
    def final(self) -> bool:
        return self in FINAL_STATES

    @property
    def live(self) -> bool:
        return not self.final


FINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.REFUSED})


class Stage(StrEnum):
    """What a running orchestrator is doing, in order."""

    PLAN = "plan"
    PREFLIGHT = "preflight"  # checks that need no model: GPUs, addresses, argv, model dir
    AGENTS = "agents"
    ENDPOINTS = "endpoints"
    HEALTH = "health"
    ROUTER = "router"
    SWEEP = "sweep"
    RESTART = "restart"  # between sweep points: engines restarted (args_from_concurrency)
    HOLD = "hold"
    ACCURACY = "accuracy"
    TEARDOWN = "teardown"
    REPORT = "report"


class Kind(StrEnum):
    """What a process is; decides its start order, health check and teardown order."""

    ENGINE = "engine"
    ROUTER = "router"
    AGENT = "agent"
    BENCH = "bench"
    ACCURACY = "accuracy"
    STORE = "store"  # a KV store's master (mooncake_master): up before the engines, down last

    @property
    def client(self) -> bool:
        """Clients run to their end; servers run until teardown."""
        return self in (Kind.BENCH, Kind.ACCURACY)


class Role(StrEnum):
    """An endpoint's part in serving."""

    PREFILL = "prefill"
    DECODE = "decode"
    AGG = "agg"

    @property
    def disaggregated(self) -> bool:
        return self is not Role.AGG


# Teardown order: clients first, then the router, the engines, the agents last (they record
# the end of everything else).
TEARDOWN_ORDER = (
    (Kind.BENCH, Kind.ACCURACY),
    (Kind.ROUTER,),
    (Kind.ENGINE,),
    (Kind.STORE,),
    (Kind.AGENT,),
)
