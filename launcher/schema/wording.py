"""What a validation problem says to a person: pydantic's errors in the launcher's words
(the accepted form, the real bound, the name that was probably meant), never its own, and
user input shown inside a message.

`format_error` words a recipe's or a cluster profile's ValidationError alike, each caller
naming its own model.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import TYPE_CHECKING, Any

from launcher.errors import UserError

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

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

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def show(text: object, limit: int = 80) -> str:
    """User input inside a one-line message: as is when short and printable, else quoted
    (escapes visible) and cut."""
    text = str(text)
    if len(text) <= limit and text.isprintable() and not _SURROGATE.search(text):
        return text
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


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


def format_error(
    e: ValidationError, source: str, overrides: list[str] | None = None, sweep: list[str] = (),
    *, model: type[BaseModel], data: Any = None,
) -> UserError:
    """Every problem, in the launcher's words (the accepted form, the real bound, the key or
    value probably meant), not pydantic's, each naming the key and the --set or --sweep value
    that brought it; one problem is one sentence naming the file. `model`: the pydantic model
    that raised `e` (an unknown key is matched against its keys)."""
    origins = [(o.partition("=")[0].strip(), f"--set {o.partition('=')[0].strip()}") for o in overrides or []]
    origins += [(s.partition("=")[0].strip(), f"--sweep value {show(s)}") for s in sweep]
    errors, seen, members = [], set(), {}
    for err in e.errors():
        loc = tuple(str(x) for x in err["loc"] if not _union_member(x))
        tried = [str(x) for x in err["loc"] if _union_member(x)]
        if tried:
            members.setdefault(loc, []).append(tried[-1])
        if loc not in seen:
            seen.add(loc)
            errors.append((".".join(loc), err))
    items = []  # (the --set or --sweep that brought it, the problem)
    for loc, err in errors:
        msg = err["msg"].removeprefix("Value error, ")
        for one in (msg.split(PROBLEMS_SEP) if err["type"] == "value_error" else [msg]):
            came = [
                label for k, label in origins
                if loc and (loc == k or loc.startswith(k + ".") or k.startswith(loc + "."))
                or not loc and k in one
            ]  # fmt: skip
            items.append((came[-1] if came else None, _problem(
                loc, err, one, members, model, data)))
    source = show(source, 200)
    if len(items) == 1:
        came, text = items[0]
        return UserError(f"{source}{f' with {came}' if came else ''}: {text}")
    shown = [text + (f" (from {came})" if came else "") for came, text in items]
    return UserError(f"{source}: {len(shown)} problems: "
                     + "; ".join(f"({i}) {t}" for i, t in enumerate(shown, 1)),
                     problems=(f"{source}: {len(shown)} problems:", shown))


# Recipe-wide checks report every problem in one ValueError, one per part.
PROBLEMS_SEP = "\n"


def _problem(loc: str, err: dict, msg: str, members: dict, model, data) -> str:
    if err["type"] == "extra_forbidden":
        *parent, key = loc.split(".")
        hint = did_you_mean(key, fields_at(model, parent))
        return f"unknown key {loc!r}" + (f"; {hint}" if hint else "")
    if err["type"] == "missing":
        return f"missing required key {loc!r}"
    got = err.get("input")
    if err["type"] == "value_error":  # one part of a check that found several
        has_value = isinstance(got, str) and bool(got.strip()) and "".join(got.split()) in msg
    else:
        msg, has_value = message(err, members.get(tuple(loc.split(".")), []))
    if err["type"] in ("greater_than_equal", "greater_than"):
        msg = real_bound(loc, data) or msg
    shown = ("" if has_value or isinstance(got, dict | list) or not loc
             else f" (got {str(got)[:60]!r})")
    return f"{loc + ': ' if loc else ''}{msg}{shown}"


def _union_member(part: object) -> bool:
    """pydantic names the union member it tried in the error location: not a key."""
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool", "none") or part.startswith(("function-", "list["))
    )



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
        # a validated type reads as the type it validates (Annotated[X, validator] -> X)
        kind = re.sub(r"Annotated\[(.*?), BeforeValidator\([^)]*\)\]", r"\1", kind)
        if f.is_required():
            default = "(required)"
        elif f.default_factory is not None:
            default = repr(f.default_factory())
        else:
            default = repr(f.default)
        out.append((path, kind, default, " ".join((f.description or "").split())))
    return out
