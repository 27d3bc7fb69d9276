"""What a validation problem says to a person: pydantic's errors in the launcher's words
(the accepted form, the real bound, the name that was probably meant), never its own.

Used by `recipe.format_error` for recipes and cluster profiles alike.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

# Patterns of fields, in words (a regex is not a message).
PATTERNS = {
    r"^[A-Za-z0-9_.,:+-]{1,128}$": "a Slurm name: letters, digits and _ . , : + - only, at "
    "most 128 of them",
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$": "letters, digits, '.', '_' and '-', beginning with a "
    "letter or digit",
    r"^[0-9][0-9A-Za-z.+-]*$": "a version such as 0.33 or 0.33.0",
    r"^3\.\d+$": "a Python version X.Y, such as 3.12",
    r"^[A-Za-z0-9_.-]+$": "letters, digits, '.', '_' and '-' only",
}
# Union members pydantic names in an error's location, in words.
MEMBERS = {"str": "text", "int": "a whole number", "float": "a number", "bool": "true/false",
           "none": "null"}  # fmt: skip


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """"did you mean 'x'?" for the closest of `choices` to a misspelled `word`, or ''."""
    choices = [str(c) for c in choices]
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if not close:  # a name that differs in case only, or one typed with '-' for '_'
        low = {c.lower().replace("-", "_"): c for c in choices}
        hit = low.get(str(word).lower().replace("-", "_"))
        close = [hit] if hit else []
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def fields_at(model: type | None, path: typing.Sequence[str]) -> list[str]:
    """The key names allowed under `path` of pydantic `model` ([] when it is free-form)."""
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return []
        model = _model_of(fields[part].annotation)
    return list(getattr(model, "model_fields", None) or [])


def _model_of(annotation: Any) -> type | None:
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _choices(expected: str) -> list[str]:
    return re.findall(r"'([^']*)'", expected)


def _num(v: Any) -> str:
    """A bound as written in the field (pydantic hands a float field's 100000 as 100000.0)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _shown(v: Any) -> str:
    text = str(v)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def message(err: dict, members: list[str] = ()) -> tuple[str, bool]:
    """(what is wrong, in words; whether the message already shows the value given) for one
    pydantic error. `members`: the union members tried for this key (str, int, ...)."""
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    words = [MEMBERS[m] for m in members if m in MEMBERS]
    if "a number" in words and "a whole number" in words:
        words.remove("a whole number")
    if len(words) > 1:
        return f"must be {', '.join(words[:-1])} or {words[-1]}", False
    if kind == "greater_than_equal":
        return f"must be {_num(ctx.get('ge'))} or more", False
    if kind == "greater_than":
        return f"must be more than {_num(ctx.get('gt'))}", False
    if kind == "less_than_equal":
        return f"must be {_num(ctx.get('le'))} or less", False
    if kind == "less_than":
        return f"must be less than {_num(ctx.get('lt'))}", False
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be a whole number", False
    if kind in ("float_type", "float_parsing"):
        return "must be a number", False
    if kind == "finite_number":
        return "must be a finite number (not inf or nan)", False
    if kind in ("bool_type", "bool_parsing"):
        return "must be true or false", False
    if kind == "string_type":
        if isinstance(got, int | float | bool) or got is None:  # YAML read it as another type
            return f"must be text: quote it, e.g. '{got}'", True
        return "must be text", False
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return ("must not be empty" if n == 1 else f"must be at least {n} characters"), False
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters", False
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return f"must be {PATTERNS.get(pattern, 'written without the characters it has')}", False
    if kind in ("literal_error", "enum"):
        options = _choices(str(ctx.get("expected", "")))
        hint = did_you_mean(got, options) if isinstance(got, str) else ""
        return f"must be one of {', '.join(options)}{'; ' + hint if hint else ''}", False
    if kind in ("list_type", "tuple_type", "set_type"):
        if isinstance(got, str | int | float) and not isinstance(got, bool):
            form = str(got).strip("[]() ")
            return f"must be a list, written [{form}] (got {_shown(got)})", True
        return "must be a list, written [a, b]", False
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be a section of keys and values, not a single value", False
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return f"must hold at least {n} value{'s' if n != 1 else ''}", False
    if kind == "too_long":
        return f"must hold at most {ctx.get('max_length')} values", False
    return str(err.get("msg", "is not valid")).removeprefix("Value error, "), False


# Bounds the recipe's own check tightens beyond the field's: a pool's endpoints depend on
# the mode (recipe.Recipe._check), so "0 or more" would be a bound that 0 then fails.
def real_bound(loc: str, data: Any) -> str | None:
    pool, _, key = loc.partition(".")
    if key != "endpoints" or pool not in ("prefill", "decode", "agg") or not isinstance(data, dict):
        return None
    mode = data.get("mode", "disagg")
    if mode not in ("disagg", "agg"):
        return None
    if (pool == "agg") == (mode == "agg"):
        return f"must be 1 or more with mode {mode}"
    return f"must be 0 with mode {mode} (it takes no {pool} endpoints)"


def field_reference(model: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) of every field of pydantic `model`, nested
    sections flattened: the reference `recipes fields` prints."""
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_of(f.annotation)
        if sub is not None and not path.startswith("sim"):
            out.append((path, "section", "", f.description or ""))
            out += field_reference(sub, path + ".")
            continue
        kind = re.sub(r"typing\.|<class '([^']+)'>", r"\1", str(f.annotation))
        if f.is_required():
            default = "(required)"
        elif f.default_factory is not None:
            default = repr(f.default_factory())
        else:
            default = repr(f.default)
        out.append((path, kind, default, " ".join((f.description or "").split())))
    return out
