"""Token ids for text prompts when the simulator has no tokenizer (the toy tokenizer).

A prompt of N characters counts as round(N / chars_per_token) tokens (as before); token i
is the i-th group of w = round(chars_per_token) bytes of its UTF-8 text, read as a number.
So the ids are cheap (one C-level conversion), the same on every instance, and two prompts
that share a text prefix share their leading ids: what prefix caching needs. A chat prompt
gets 4 template ids in front of each message, as a chat template puts its markers there.
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_left
from collections.abc import Sequence

TEMPLATE_TOKENS = 4  # chat-template tokens the simulator counts around each message
_WIDTH_CODES = {1: "B", 2: "H"}
_MAX_ID = (1 << 63) - 1


def toy_count(text: str, chars_per_token: float) -> int:
    return max(1, round(len(text) / chars_per_token))


def toy_ids(text: str, n: int, chars_per_token: float) -> array:
    """``n`` ids for ``text`` (zero bytes pad a short last group and a short text), as an
    array of 32-bit items (64-bit past 4 bytes a token): a copy of the bytes, no loop."""
    w = max(1, round(chars_per_token))
    need = n * w
    data = text.encode()[:need].ljust(need, b"\0")
    if w == 4:
        return array("I", data)
    if w in _WIDTH_CODES:
        return array("I", array(_WIDTH_CODES[w], data))
    return array("q", (int.from_bytes(data[i:i + w], "little") & _MAX_ID
                       for i in range(0, need, w)))


def template_ids(role: str) -> list[int]:
    """The stand-in ids of one message's template markers (they depend on the role)."""
    base = 1_000_000 + (zlib.crc32(role.encode()) % 1000) * TEMPLATE_TOKENS
    return [base + k for k in range(TEMPLATE_TOKENS)]


def with_templates(ids: Sequence[int], token_starts: Sequence[int],
                   message_starts: Sequence[int], roles: Sequence[str]) -> array:
    """``ids`` with each message's template ids inserted before the token holding the
    message's first character. ``token_starts``: where each token begins in the text (same
    unit as ``message_starts``), ascending."""
    out = array(ids.typecode if isinstance(ids, array) else "q")
    prev = 0
    for start, role in zip(message_starts, roles, strict=True):
        cut = max(prev, bisect_left(token_starts, start + 1) - 1) if token_starts else 0
        cut = min(cut, len(ids))
        out.extend(ids[prev:cut])
        out.extend(template_ids(role))
        prev = cut
    out.extend(ids[prev:])
    return out
