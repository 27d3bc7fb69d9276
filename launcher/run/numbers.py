"""The one way a number is written for a person: `launcher diff`, the dashboard's tables and
the HTML report all call `number` (issue 41: "1.028e+04 -> 7,821" and "10276.9763" were
three ways for one figure).

Thousands separated, as many decimals as the figure's size needs (or as the caller fixes
for a column), and MISSING where there is no number: never "None", "nan" or an exponent.
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "—"


def value(v: Any) -> float | None:
    """`v` as a finite float, or None (None, NaN, inf, a bool, a non-number)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def auto_digits(v: float) -> int:
    """Decimals by size: none from 100 up, one from 10, two from 1, else three significant."""
    a = abs(v)
    if a >= 100 or a == 0:
        return 0
    if a >= 10:
        return 1
    if a >= 1:
        return 2
    return min(6, 2 - math.floor(math.log10(a)))


def number(v: Any, digits: int | None = None, unit: str = "") -> str:
    """'10,277', '148.1', '0.733', '—'. `digits` fixes the decimals (a table column);
    `unit` follows the number after a space ('ms', '%')."""
    f = value(v)
    if f is None:
        return MISSING
    if digits is None:
        digits = 0 if isinstance(v, int) else auto_digits(f)
    text = f"{f:,.{digits}f}"
    if text.startswith("-") and not any(c not in "-0.," for c in text):
        text = text[1:]  # no "-0"
    return f"{text} {unit}" if unit else text


def signed_pct(v: Any, digits: int = 1) -> str:
    """A change in per cent: '+1.2 %', '-30.0 %', '—'."""
    f = value(v)
    return MISSING if f is None else f"{f:+,.{digits}f} %"


def same_digits(*vs: Any) -> list[str]:
    """Numbers set side by side (A -> B, a column) with the decimals the largest needs."""
    fs = [abs(f) for f in map(value, vs) if f is not None]
    d = auto_digits(max(fs)) if fs else 0
    return [number(v, d) for v in vs]
