"""Reading YAML, bounded (recipes and cluster profiles), and parsing --set/--sweep values.

`--set a.b.c=value` overrides any field; values are parsed as YAML scalars/lists.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.errors import UserError
from launcher.schema.wording import show


def yaml_module():
    import yaml

    return yaml


# Recipes and profiles are a few KB; these bounds keep a hostile file to well under a second
# of parsing (PyYAML's pure-Python parser takes about 10 us per byte).
MAX_YAML_BYTES = 64 << 10
MAX_YAML_NODES = 5000
MAX_YAML_DEPTH = 32
# Aliases (*name) and merge keys (<<) are read as PyYAML's safe_load reads them (srt-slurm
# loads its recipes so), but what they expand to is bounded: nested aliases double at each
# level (the "billion laughs" file), so the expanded count is measured before anything
# walks the value.
MAX_YAML_EXPANDED = 20000
# YAML types JSON cannot carry: the run files are JSON and the values reach command lines.
NOT_JSON_TAGS = ("timestamp", "binary", "set", "omap", "pairs")


@functools.cache
def _loader():
    """PyYAML's safe loader, minus what does not belong in a recipe: dates stay strings and
    explicit tags of non-JSON types are refused (the run files are JSON), aliases and merge
    keys resolve as in safe_load with their expansion bounded (MAX_YAML_EXPANDED), and size,
    count and depth are bounded."""
    yaml = yaml_module()
    ComposerError = yaml.composer.ComposerError
    ConstructorError = yaml.constructor.ConstructorError

    class Loader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self.pd_nodes = 0
            self.pd_depth = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            mark = event.start_mark
            if isinstance(event, yaml.AliasEvent):
                self.pd_aliases = True
                return super().compose_node(parent, index)
            self.pd_nodes += 1
            if self.pd_nodes > MAX_YAML_NODES:
                raise ComposerError(None, None, f"more than {MAX_YAML_NODES:,} values", mark)
            if self.pd_depth >= MAX_YAML_DEPTH:
                raise ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark
                )
            self.pd_depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.pd_depth -= 1

        def compose_document(self):
            node = super().compose_document()
            if getattr(self, "pd_aliases", False):
                _expanded_size(node, ComposerError)
            return node

        def construct_yaml_int(self, node):
            try:
                return super().construct_yaml_int(node)
            except ValueError:  # Python refuses int() of more than 4,300 digits
                why = f"a number of {len(node.value):,} digits is too long"
                raise ConstructorError(None, None, why, node.start_mark) from None

    def refuse(loader, node):
        kind = node.tag.rpartition(":")[2]
        raise ConstructorError(
            None, None,
            f"{kind} values (!!{kind}) are not supported: write strings, numbers, lists and "
            "mappings",
            node.start_mark,
        )  # fmt: skip

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    for tag in NOT_JSON_TAGS:
        Loader.add_constructor(f"tag:yaml.org,2002:{tag}", refuse)
    Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


def _expanded_size(root, error: type[Exception]) -> None:
    """Raise `error` when the document's aliases expand past MAX_YAML_EXPANDED values or
    MAX_YAML_DEPTH levels, or refer to a value that contains them. Each node is measured
    once, so a file of doubling aliases costs its own size, not its expansion."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def children(node) -> list:
        v = node.value
        if isinstance(v, list):
            return [x for pair in v for x in (pair if isinstance(pair, tuple) else (pair,))]
        return []

    def measure(node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise error(None, None, "an alias (*name) refers to a value that contains it",
                        node.start_mark)
        open_.add(key)
        count, depth = 1, 0
        for child in children(node):
            c, d = measure(child)
            count, depth = count + c, max(depth, d)
            if count > MAX_YAML_EXPANDED:
                raise error(None, None, f"its aliases (*name) expand to more than "
                            f"{MAX_YAML_EXPANDED:,} values", node.start_mark)
        if depth + 1 > MAX_YAML_DEPTH:
            raise error(None, None, f"its aliases (*name) nest values more than "
                        f"{MAX_YAML_DEPTH} levels deep", node.start_mark)
        open_.discard(key)
        sizes[key] = (count, depth + 1)
        return sizes[key]

    measure(root)


def _unshared(value: Any) -> Any:
    """A copy in which no two places hold the same list or mapping (an alias is a second
    reference in PyYAML's result): a change made at one place stays there."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def yaml_value(text: str):
    return yaml_module().load(text, Loader=_loader())


def _yaml_problem(e: Exception) -> str:
    """One line from one of PyYAML's errors (or a RecursionError from its composer)."""
    why = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return " ".join(str(why).split())[:160]


def parse_override(text: str, flag: str = "--set") -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(
            f"{flag} {show(text)}: write it as key.path=value, e.g. prefill.endpoints=8"
        )
    parts = key.strip().split(".")
    if any(not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", p) for p in parts) or len(parts) > 16:
        raise UserError(
            f"{flag} {show(text)}: {show(key.strip())} is not a key path (names of letters, "
            "digits, '_' or '-', joined by '.')"
        )
    if len(raw) > MAX_YAML_BYTES:
        raise UserError(
            f"{flag} {key.strip()}: the value is {len(raw):,} characters; the most is "
            f"{MAX_YAML_BYTES:,}"
        )
    try:
        value = yaml_value(raw) if raw.strip() else ""
    except Exception as e:  # yaml's errors are many classes; any means "not a value"
        raise UserError(
            f"{flag} {key.strip()}: {show(raw, 60)} is not a YAML value ({_yaml_problem(e)})"
        ) from None
    return parts, value


def apply_overrides(
    data: dict, overrides: list[str], flag: str = "--set",
    defaults: Callable[[str], dict] | None = None,
) -> dict:
    """`data` with each of `overrides` (key.path=value) set in it. `defaults(key)`: what a
    top-level section missing from `data` starts as before a --set into it (default {})."""
    for text in overrides:
        path, value = parse_override(text, flag)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = defaults(part) if defaults and node is data else {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise UserError(f"{flag} {show(text)}: {where} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def read_yaml(path: Path, what: str) -> dict:
    """A YAML mapping from `path`, or one sentence saying what is wrong with the file."""
    name = show(path, 200)
    try:
        # Non-blocking, so a FIFO in place of the file cannot hang us before the check below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {name}: {getattr(e, 'strerror', None) or e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{name} is a directory, not {what} file")
        if not stat.S_ISREG(mode):
            raise UserError(f"{name} is not a regular file: {what} is a YAML file")
        chunks: list[bytes] = []
        while (got := sum(map(len, chunks))) <= MAX_YAML_BYTES:
            chunk = os.read(fd, MAX_YAML_BYTES + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b"".join(chunks)
    except OSError as e:
        raise UserError(f"cannot read {name}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_YAML_BYTES:
        raise UserError(f"{name} is larger than {MAX_YAML_BYTES:,} bytes, the most {what} may be")
    if b"\0" in raw:
        raise UserError(f"{name} contains a NUL byte: {what} is a text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{name} is not UTF-8 text: {what} is a YAML file") from None
    try:
        data = _unshared(yaml_module().load(text, Loader=_loader()))
    except Exception as e:  # yaml's errors are many classes; all mean "fix the file"
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{name}: not valid YAML{at}: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise UserError(f"{name}: {what} is a YAML mapping of keys to values")
    return data

