"""The KV connectors a simulated engine runs, by vLLM's names: what its --kv-transfer-config
chains, and which of them are KV tiers (a store, CPU offload) rather than the P->D handoff.
Imports nothing of the simulator, so its parts all read the names from here."""

from __future__ import annotations

from typing import Any

STORE = "MooncakeStoreConnector"
OFFLOADING = "OffloadingConnector"
SIMPLE_OFFLOAD = "SimpleCPUOffloadConnector"
TIER_CONNECTORS = (STORE, OFFLOADING, SIMPLE_OFFLOAD)


def chain(kv: dict[str, Any]) -> list[dict[str, Any]]:
    """The connectors a --kv-transfer-config runs: a MultiConnector's children, else the one."""
    if kv.get("kv_connector") == "MultiConnector":
        kids = (kv.get("kv_connector_extra_config") or {}).get("connectors")
        return [c for c in kids if isinstance(c, dict)] if isinstance(kids, list) else []
    return [kv] if kv.get("kv_connector") else []
