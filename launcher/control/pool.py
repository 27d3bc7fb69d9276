"""The engines a study's one allocation keeps loaded from one configuration to the next;
launcher.control.lifetime decides with it what each configuration keeps, starts and restarts."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from launcher.control.backends import Backend, Handle
from launcher.planning.study import holds, in_the_way, same_engine

STOP_GRACE_S = 30.0  # an engine stopped between configurations: its own shutdown


@dataclass
class Loaded:
    """One endpoint's running parts, what they were started as and by which backend."""

    handles: list[Handle]
    signature: tuple
    started_by: str  # the run id of the configuration that started it
    backend: Backend  # what started them, and so stops them (srun steps or processes)

    def alive(self) -> bool:
        return all(h.exit_code() is None for h in self.handles)


@dataclass
class EnginePool:
    loaded: dict[str, Loaded] = field(default_factory=dict)  # endpoint -> its engine
    # every engine start and stop of the allocation, in order (the study's record)
    events: list[dict] = field(default_factory=list)

    def handle(self, name: str) -> Handle | None:
        return next((h for e in self.loaded.values() for h in e.handles
                     if h.proc.name == name), None)

    def ports(self) -> frozenset[int]:
        """Every port the pool's engines hold (on whatever node)."""
        return frozenset(int(what.split()[1]) for e in self.loaded.values()
                         for _, what in holds(e.signature) if what.startswith("port "))

    def settle(self, want: dict[str, tuple], run: str) -> set[str]:
        """Before a configuration starts its engines: drop what died, stop what it needs
        with another command line, and what it does not use but whose GPUs or ports it needs
        (a configuration of another shape, a plan moved off a lost node); the endpoints it
        may use as they are."""
        taken = {h for sig in want.values() for h in holds(sig)}
        for ep, e in list(self.loaded.items()):
            if not e.alive():
                self.drop(ep, run, "a part of it had exited")
            elif ep in want and not same_engine(want[ep], e.signature):
                self.drop(ep, run, "this configuration starts it with another command line")
            elif ep not in want and (mine := in_the_way(e.signature, taken)):
                kinds = sorted({what.split()[0] + "s" for _, what in mine})
                self.drop(ep, run, f"this configuration's engines take its {' and '.join(kinds)} ("
                          + ", ".join(f"{n} {what}" for n, what in mine[:4])
                          + (f" and {len(mine) - 4} more" if len(mine) > 4 else "") + ")")
        return {ep for ep in want if ep in self.loaded}

    def lose(self, nodes: set[str], run: str) -> None:
        """Nodes the allocation lost: every engine with a part there goes, without asking
        its steps to stop (nothing there answers)."""
        for ep, e in list(self.loaded.items()):
            if on := sorted({h.proc.node for h in e.handles} & nodes):
                self.drop(ep, run, f"its node {', '.join(on)} was lost", lost=True)

    def drop(self, ep: str, run: str, why: str, lost: bool = False,
             settle: bool = True) -> None:
        """`settle`: sruns follow (Backend.stop); not at the allocation's end."""
        e = self.loaded.pop(ep)
        live = [h for h in e.handles if h.exit_code() is None]
        if live and lost:
            e.backend.abandon(live)
        elif live:
            e.backend.stop(live, grace_s=STOP_GRACE_S, settle=settle)
        self.events.append({"event": "stopped", "endpoint": ep, "run": run, "why": why,
                            "ts": time.time()})

    def add(self, ep: str, handles: list[Handle], signature: tuple, run: str,
            backend: Backend) -> None:
        self.loaded[ep] = Loaded(handles, signature, run, backend)
        self.events.append({"event": "started", "endpoint": ep, "run": run,
                            "processes": [h.proc.name for h in handles], "ts": time.time()})

    def stop_all(self, run: str, why: str) -> None:
        for ep in list(self.loaded):
            self.drop(ep, run, why, settle=False)
