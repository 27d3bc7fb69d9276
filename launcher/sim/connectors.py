"""The KV connectors a simulated engine runs, by vLLM's names: what its --kv-transfer-config
chains, and which of them are KV tiers (a store, CPU offload) rather than the P->D handoff.
Imports nothing of the simulator and starts nothing, so its parts (and the planner, for a
store's sizes) read them from here."""

from __future__ import annotations

import re
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


def parse_size(value: Any) -> int:
    """A size as vLLM's Mooncake config reads it (``_parse_size``): bytes, or a number with
    gb/mb/kb/b, powers of 1024, any case."""
    if isinstance(value, bool):
        raise ValueError("a size, not true/false")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    m = re.fullmatch(r"\s*([\d.]+)\s*(gb|mb|kb|b)?\s*", str(value).lower())
    try:
        number = float(m.group(1)) if m else None
    except ValueError:
        number = None
    if number is None:
        raise ValueError(f"{value!r} is not a size (bytes, or a number with GB, MB, KB)")
    return int(number * {"gb": 1024**3, "mb": 1024**2, "kb": 1024, "b": 1}[m.group(2) or "b"])
