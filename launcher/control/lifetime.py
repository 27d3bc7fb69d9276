"""The engines' lifetime in a run, and in a study whose configurations share one allocation:
which engines a run starts and with which command line, which it takes over loaded from an
earlier configuration, which it restarts before a sweep point (args_from_concurrency), and
which it leaves loaded at its end for the next configuration.

Each of these asks launcher.planning.study's one rule, "is this the same engine?"
(same_engine, through signatures and changed here and EnginePool.settle in the
pool), the rule the dry-run's plan of turns asks too, so both decide alike. The orchestrator
calls it at its stages; what it starts, keeps and stops is recorded by
launcher.control.processes.
"""

from __future__ import annotations

import dataclasses

from launcher.control.backends import Handle
from launcher.control.pool import STOP_GRACE_S, EnginePool
from launcher.control.processes import Processes
from launcher.control.record import Book, say
from launcher.planning.plan import Plan
from launcher.planning.study import changed
from launcher.planning.study import signatures as study_signatures
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.vocab import Kind


class EngineLifetime:
    """The engines of one run; `pool`: a study's allocation keeps them loaded from one
    configuration to the next (None: a run of its own, its engines start with it and stop
    at its end)."""

    def __init__(self, run: rundir.RunDir, plan: Plan, book: Book, processes: Processes,
                 pool: EnginePool | None = None):
        self.run = run
        self.plan = plan
        self.book = book
        self.processes = processes
        self.pool = pool
        self.first: int | None = None  # a study visit's first point: its engines' setting
        self.want: dict[str, tuple] = {}  # endpoint -> the engine this run starts it as
        self.kept: set[str] = set()  # endpoints taken over loaded from an earlier configuration

    # --- the rule, asked ---
    def signatures(self, engines: list[Process], at: int | None = None) -> dict[str, tuple]:
        """In a study's allocation: endpoint -> what makes it the same engine (`at`: as it
        runs at that sweep concurrency)."""
        if self.pool is None:
            return {}
        return study_signatures(engines, str(self.run.path), at=at)

    def first_argv(self, proc: Process) -> list[str] | None:
        """The command line an engine starts with: in a study's visit, the one its first
        point needs (args_from_concurrency), so the visit's points restart nothing; else its
        own (None)."""
        if self.pool is None or self.first is None or not proc.restarts:
            return None
        return proc.argv_at(self.first)

    def changed_at(self, c: int) -> list[str]:
        """The endpoints whose command line at sweep concurrency `c` differs from the one
        running (args_from_concurrency): restarted before that point."""
        parts = self._engine_parts()
        procs = [h.proc for h in parts]
        running = study_signatures([dataclasses.replace(h.proc, argv=h.running_argv)
                                    for h in parts], str(self.run.path))
        return changed(study_signatures(procs, str(self.run.path), at=c), running)

    # --- at the orchestrator's stages ---
    def take_over(self, engines: list[Process], first: int | None = None) -> None:
        """Before the engines start (and the agents, which read where logs stand): the
        engines this run wants (in a study's visit, as its first point `first` needs them);
        in a study's allocation those already loaded as it wants them are taken over as its
        own (what died is dropped, what it wants with another command line is stopped)."""
        self.first = first
        self.want = self.signatures(engines, at=first)
        if self.pool is None:
            return
        self.kept = self.pool.settle(self.want, self.run.run_id)
        for p in engines:
            if p.endpoint in self.kept:
                old = self.pool.handle(p.name)
                assert old is not None, p.name
                self.processes.adopt(p, old, self.pool.loaded[p.endpoint].started_by)
        if self.kept:
            say("engines kept loaded from an earlier configuration: "
                + ", ".join(sorted(self.kept)))

    def start(self, engines: list[Process]) -> None:
        """Every engine not taken over; in a study's allocation each is kept in its pool."""
        for ep in dict.fromkeys(p.endpoint for p in engines):
            if ep in self.kept:
                continue
            handles = [self.processes.start(p, self.first_argv(p))
                       for p in engines if p.endpoint == ep]
            if self.pool is not None and ep is not None:
                self.pool.add(ep, handles, self.want[ep], self.run.run_id, self.processes.backend)

    def sources_at(self, eps: list[str], c: int) -> str:
        """Where these endpoints' command lines at concurrency `c` come from: the recipe's
        args_from_concurrency steps, else each role's args."""
        old = self._parts(eps)
        steps = {f"{h.proc.role}.args_from_concurrency.{x['from_concurrency']}"
                 for h in old for x in h.proc.restarts if x["from_concurrency"] <= c}
        roles = sorted({f"{h.proc.role}.args" for h in old})
        return ", ".join(sorted(steps) or roles)

    def restart(self, eps: list[str], c: int) -> list[Handle]:
        """Before a sweep point: these endpoints, whole, stopped and started with their
        command line at concurrency `c`, while the others stay loaded; a study's pool holds
        them as they run now. The parts started."""
        old = self._parts(eps)
        self.processes.backend.stop(old, grace_s=STOP_GRACE_S)
        for h in old:
            self.book.event("process_stopped", process=h.proc.name, exit_code=h.exit_code(),
                            why=f"restart before concurrency {c}")
        self.processes.remove(old)
        if self.pool is not None:
            for ep in eps:
                if ep in self.pool.loaded:
                    self.pool.drop(ep, self.run.run_id, f"restarted before concurrency {c}")
        started = [self.processes.start(h.proc, h.proc.argv_at(c)) for h in old]
        if self.pool is not None:
            want = self.signatures([dataclasses.replace(h.proc, argv=h.running_argv)
                                    for h in started])
            for ep in eps:
                self.pool.add(ep, [h for h in started if h.proc.endpoint == ep], want[ep],
                              self.run.run_id, self.processes.backend)
        return started

    def leave_loaded(self, keep: bool) -> None:
        """At teardown (`keep`: a study's allocation goes on): the engines its next
        configuration may use stay loaded: every part of the endpoint is running, and its
        head answered healthy here. Engines sharing a KV store go down with it: its master
        is this configuration's, and their segments cannot move to the next one's."""
        if not keep or self.pool is None or self.plan.recipe.kv_store is not None:
            self.processes.left_loaded = set()
            return
        by_ep: dict[str, list[Handle]] = {}
        for h in self._engine_parts():
            by_ep.setdefault(h.proc.endpoint, []).append(h)
        self.processes.left_loaded = {
            h.proc.name for hs in by_ep.values()
            if all(h.exit_code() is None and not h.lost for h in hs)
            and any(h.proc.name in self.processes.healthy for h in hs)
            for h in hs
        }  # fmt: skip

    def drop_stopped(self) -> None:
        """After teardown: what this configuration stopped is no longer loaded."""
        if self.pool is None:
            return
        stopped = {h.proc.name for h in self.processes.handles} - self.processes.left_loaded
        for ep, e in list(self.pool.loaded.items()):
            if stopped & {h.proc.name for h in e.handles}:
                self.pool.drop(ep, self.run.run_id, "stopped at the end of this configuration")

    def _parts(self, eps: list[str]) -> list[Handle]:
        """Every running part of these endpoints."""
        return [h for h in self._engine_parts() if h.proc.endpoint in eps]

    def _engine_parts(self) -> list[Handle]:
        """This run's engine processes that belong to an endpoint (each name once)."""
        return [h for h in self.processes.handles if h.proc.kind == Kind.ENGINE and h.proc.endpoint]
