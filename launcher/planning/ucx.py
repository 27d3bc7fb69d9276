"""What UCX (NIXL's transport) will get between prefill and decode nodes, read off the engines'
rendered environment, and whether a KV transfer over TCP is refused there: one rule for the
dry-run and for the P->D check after the load (docs/gb200-launch.md, "KV over TCP").

UCX facts this relies on (UCX 1.x `ucx_info -d`, docs/gb200-launch.md): `UCX_TLS` lists the
transports UCX may use (`all` by default; `^x` means all but x); RDMA lanes are the InfiniBand
/RoCE transports (`rc`, `dc`, `ud` and their `_x`/`_v`/`_mlx5` forms, `ib`); `cuda_ipc`
crosses trays only for fabric-handle memory, which vLLM's KV cache is not. `UCX_NET_DEVICES`
names the devices UCX may use: RDMA devices are `<hca>:<port>` (`mlx5_0:1`), a name without a
port (`ib0`, `eth0`) is a network interface, which only the `tcp` transport can use.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.planning import schedulers
from launcher.run.vocab import Role

RDMA = ("rc", "dc", "ud", "ib")


def _rdma_name(tl: str) -> bool:
    return tl.split("_")[0] in RDMA


def rdma_in_tls(tls: str | None) -> bool:
    """Whether UCX_TLS leaves UCX an RDMA lane (unset, `all`, or a `^` list that does not drop
    every RDMA transport)."""
    if not tls or not tls.strip():
        return True
    items = [t.strip() for t in tls.split(",") if t.strip()]
    if items[0].startswith("^"):
        dropped = {items[0][1:], *items[1:]}
        return not ({"ib"} <= dropped or {"rc", "dc", "ud"} <= {d.split("_")[0] for d in dropped})
    return any(t == "all" or _rdma_name(t) for t in items)


def rdma_devices(devices: str | None) -> bool:
    """Whether UCX_NET_DEVICES leaves UCX an RDMA device (unset, `all`, or a `hca:port`)."""
    if not devices or not devices.strip():
        return True
    items = [d.strip() for d in devices.split(",") if d.strip()]
    return any(d == "all" or ":" in d for d in items)


@dataclass(frozen=True)
class TcpOnly:
    """The engines' UCX has no lane but TCP between nodes: `key` (the setting that does it,
    as the user writes it), `value`, `from_recipe` (the recipe's own env, not the profile's)."""

    key: str
    value: str
    from_recipe: bool

    def text(self) -> str:
        if self.key == "network.interface":
            return (f"network.interface {self.value} is exported as UCX_NET_DEVICES={self.value}, "
                    "a network interface, not an RDMA device (those are named like mlx5_0:1): "
                    "UCX gets only TCP between nodes")
        return (f"{self.key}={self.value} has no RDMA lane (rc, dc, ud or ib): UCX gets only "
                "TCP between nodes (cuda_ipc crosses trays only for fabric memory, not vLLM's "
                "KV cache)")

    def fix(self) -> str:
        if self.key == "network.interface":
            return ("set UCX_NET_DEVICES in the profile's env to the RDMA devices "
                    "(e.g. mlx5_0:1,mlx5_1:1, or all), which the interface then leaves alone")
        return f"add an RDMA lane to {self.key} (e.g. rc,cuda_copy,cuda_ipc,tcp) or remove it"


def tcp_only(plan) -> TcpOnly | None:
    """The setting that leaves a disaggregated engine's UCX only TCP between nodes, if any."""
    r, c = plan.recipe, plan.cluster
    if r.mode != "disagg":
        return None
    for role in (Role.DECODE, Role.PREFILL):
        pool = getattr(r, str(role))
        for key, env in ((f"{role}.env", pool.env), ("env", r.env)):
            if "UCX_TLS" in env:
                if not rdma_in_tls(env["UCX_TLS"]):
                    return TcpOnly(f"{key}.UCX_TLS", env["UCX_TLS"], True)
                break
        else:
            if "UCX_TLS" in c.env and not rdma_in_tls(c.env["UCX_TLS"]):
                return TcpOnly("the profile's env.UCX_TLS", c.env["UCX_TLS"], False)
        for key, env in ((f"{role}.env", pool.env), ("env", r.env)):
            if "UCX_NET_DEVICES" in env:
                if not rdma_devices(env["UCX_NET_DEVICES"]):
                    return TcpOnly(f"{key}.UCX_NET_DEVICES", env["UCX_NET_DEVICES"], True)
                break
        else:
            if "UCX_NET_DEVICES" in c.env:
                if not rdma_devices(c.env["UCX_NET_DEVICES"]):
                    return TcpOnly("the profile's env.UCX_NET_DEVICES",
                                   c.env["UCX_NET_DEVICES"], False)
            elif c.network.interface and not rdma_devices(c.network.interface):
                return TcpOnly("network.interface", c.network.interface, False)
    return None


def other_hosts(plan) -> bool:
    """Whether P and D may sit on other hosts (there TCP is a real network, not loopback)."""
    return schedulers.of(plan.cluster).remote_nodes(plan.cluster)


def kv_tcp_refused(plan) -> bool:
    """Whether a P->D KV transfer over TCP fails the run: the profile's network.kv_over_tcp
    when it says; by default refused where the nodes are other hosts (there TCP means
    NVLink and RDMA are not in use by mistake), except where the recipe's own env pins a UCX
    without an RDMA lane: then TCP is what the recipe asks for (DeepSeek-V4's published
    recipes, whose figures were measured so), said at dry-run, not a mistake to stop."""
    c = plan.cluster
    if c.network.kv_over_tcp is not None:
        return c.network.kv_over_tcp == "refuse"
    if not other_hosts(plan):
        return False
    found = tcp_only(plan)
    return not (found and found.from_recipe)


def ucx_lines(plan) -> tuple[list[str], list[str]]:
    """(warnings, blockers) of the dry-run about the P->D transport: what UCX will get where
    it has only TCP between nodes, and whether the P->D check will then fail the run."""
    found = tcp_only(plan)
    if found is None or plan.recipe.engine_kind.kv_over_tcp_expected:
        return [], []
    if not other_hosts(plan):
        return [], []
    if kv_tcp_refused(plan):
        return [], [f"{found.text()}, and {plan.cluster.name} refuses KV over TCP "
                    f"(network.kv_over_tcp): the P->D check after the model load would fail "
                    f"the run; {found.fix()}, or set network.kv_over_tcp: allow in the profile"]
    why = ("the recipe pins it, as its published figures were measured, so the P->D check "
           "lets it run" if found.from_recipe and plan.cluster.network.kv_over_tcp is None
           else "the profile allows it (network.kv_over_tcp: allow)")
    return [f"{found.text()}: KV moves between trays over TCP ({why}); for NVLink/RDMA "
            f"speed, {found.fix()}"], []

