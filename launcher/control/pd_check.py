"""The P->D path before the sweep: one request through every prefill endpoint that must move
its KV to a decode (launcher.control.preflight.pd_path), and the transport UCX picked for
the KV reads (a silent fall-back to TCP between racks shows in run.json, status and the
dashboard). The orchestrator calls it once the router serves, and again after a restart.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from launcher.control import preflight
from launcher.control.backends import Handle
from launcher.control.record import Book, say
from launcher.errors import RunFailed
from launcher.planning import ucx
from launcher.planning.plan import Plan
from launcher.run.plandoc import PlanDoc
from launcher.run.rundir import tail
from launcher.run.vocab import Kind, Role
from launcher.telemetry.statslog import ucx_transports


def check_pd_path(plan: Plan, doc: PlanDoc, book: Book, handles: list[Handle],
                  watch: Callable[[], None]) -> None:
    """Every prefill endpoint hands one request's KV to a decode before the sweep. It
    waits as long as vLLM keeps a prefill's blocks for a decode, saying so meanwhile;
    `watch` fails the run meanwhile on a dead process, a lost node or a cancel."""
    t0 = time.monotonic()
    r = plan.recipe
    wait_s = preflight.pd_wait_s(r.kv_connector, r.health.pd_wait_s)
    checks = preflight.pd_path(doc, wait_s, watch=watch, say=say,
                               handshake_seen=lambda ep: handshake_seen(handles, ep))
    watch()
    bad = [c for c in checks if not c.ok]
    book.event(
        "pd_path", seconds=round(time.monotonic() - t0, 2), wait_s=wait_s,
        checks=[dataclasses.asdict(c) for c in checks],
    )  # fmt: skip
    if bad:
        c = bad[0]
        raise RunFailed(
            f"the P->D path is broken: a request through {c.prefill} did not reach "
            f"{c.decode} with its KV ({c.detail}); check NIXL/UCX between their nodes "
            f"(UCX_TLS, network interface) in their logs"
            + (f"; {len(bad) - 1} more prefill endpoint(s) likewise" if len(bad) > 1 else ""),
            culprit=c.prefill,
        )
    say(f"P/D path: {len(checks)} prefill endpoint(s) moved KV to a decode")
    note_transport(plan, book, handles)


def handshake_seen(handles: list[Handle], endpoint: str) -> bool:
    """Whether any process of this endpoint logged vLLM's NIXL handshake line."""
    return any(
        preflight.HANDSHAKE_LINE in line
        for h in handles if h.proc.endpoint == endpoint
        for line in tail(h.log_path, 20000, max_bytes=4 << 20)
    )


def note_transport(plan: Plan, book: Book, handles: list[Handle]) -> None:
    """The transport UCX picked for the KV reads (decode logs, UCX_PROTO_INFO), in the
    run's identity; TCP fails the run where the profile refuses it, else is a note."""
    seen: dict[str, list[str]] = {}
    for h in handles:
        if h.proc.kind == Kind.ENGINE and h.proc.role == Role.DECODE:
            found = ucx_transports("\n".join(tail(h.log_path, 400)))
            if found:
                seen[h.proc.name] = found
    book.record.identity["kv_transport"] = seen
    book.save()
    error, note = tcp_verdict(plan, seen)
    if error:
        raise RunFailed(error, culprit=sorted(seen)[0] if seen else None)
    if note:
        book.note(note)


def tcp_verdict(plan: Plan, seen: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """(error, note) for the transports each decode's UCX chose: TCP is an error where it is
    refused (launcher.planning.ucx.kv_tcp_refused), else a note (none for a CPU engine,
    which has no NVLink). Either names the setting that left UCX only TCP, when one did."""
    tcp = sorted(n for n, cfgs in seen.items() if any(c.startswith("tcp/") for c in cfgs))
    if not tcp:
        return None, None
    chose = next(c for c in seen[tcp[0]] if c.startswith("tcp/"))
    cause = ucx.tcp_only(plan)
    if ucx.kv_tcp_refused(plan):
        why = (f"the cause: {cause.text()}; {cause.fix()}" if cause else
               "check UCX_TLS and UCX_NET_DEVICES in the profile's env (UCX's defaults keep "
               "every lane)")
        return (f"the P->D KV transfer of {', '.join(tcp)} went over TCP (UCX chose {chose}), "
                f"which {plan.cluster.name} refuses: NVLink/RDMA is not in use between prefill "
                f"and decode; {why}, or set network.kv_over_tcp: allow in the profile", None)
    if plan.recipe.engine_kind.kv_over_tcp_expected:
        return None, None
    return None, (f"KV transfers of {', '.join(tcp)} go over TCP (UCX chose {chose}): "
                  "NVLink/RDMA is not in use between P and D; "
                  + (cause.text() if cause else "check UCX_TLS and the profile's network"))
