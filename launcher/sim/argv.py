"""`vllm serve`'s command line, exactly as strict as vLLM 0.33's own parser.

The flag table is ``launcher.sim.vllm_flags`` (generated from vLLM 0.33.0's parser; see its
header). This module rebuilds that parser with Python's argparse, the library vLLM uses, so
errors are argparse's own words and exit status (2), printed the way vLLM prints them:

* an unknown flag is rejected by the top-level ``vllm`` parser (argparse collects a
  subcommand's leftovers there), so the usage line is the top-level one::

      usage: vllm [-h] [-v]
                  {chat,complete,serve,launch,bench,collect-env,download-kernels,preload,run-batch,snapshot}
                  ...
      vllm: error: unrecognized arguments: --my-flag

* a bad value is rejected by the ``serve`` subparser::

      usage: vllm serve [model_tag] [options]
      vllm serve: error: argument --gdn-prefill-backend: invalid choice: 'auto' (choose from 'flashinfer', 'triton', 'cutedsl', 'aiter_flydsl', 'sycl')

What vLLM's ``FlexibleArgumentParser`` (``vllm/utils/argparse_utils.py``) does before argparse
sees the argv is done here too, in the same order: ``--model X`` after ``serve`` becomes the
positional model (with vLLM's warning); ``--served-model-name`` without a positional model is
a ValueError; ``--config FILE.yaml`` is expanded in place (CLI > file > defaults; booleans
become ``--key`` / ``--no-key``, lists repeat, dicts become JSON); underscores in flag names
become dashes (``--max_num_seqs`` == ``--max-num-seqs``; only the name before ``=`` or the
first ``.``); ``-O3``/``-O=3``/``-O 3`` become ``--optimization-level``; dotted JSON flags
(``--kv-transfer-config.kv_role kv_producer``, ``--x.list+ a,b``) are merged into one JSON
value, and repeated keys log vLLM's "Found duplicate keys" warning. ``--flag=value`` and
unambiguous prefixes (argparse's allow_abbrev, on in vLLM) work as in vLLM.

Value converters are re-implemented from their documented behaviour (names as vLLM's, so
argparse's "invalid int value: 'x'" messages match). JSON-valued config flags
(``--kv-transfer-config``, ``--compilation-config``, ...) are pydantic dataclasses in vLLM with
``extra="forbid"``; the simulator checks what can be checked without vLLM (valid JSON object,
no unknown keys, Literal-typed fields, kv_role when kv_connector is set) and words the error
like pydantic's ValidationError repr. Approximate there: JSON syntax messages (pydantic uses
its own JSON parser) and validation of nested or non-Literal field types (not done).

Messages are those of Python 3.11-3.13's argparse (vLLM's images run 3.12); 3.14 prints
choices without quotes.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from launcher.sim import vllm_flags as vf

PROG = vf.PARSER["prog"]


class VllmArgError(Exception):
    """An argparse error: ``text`` is exactly what vLLM prints on stderr; exit status 2.
    Help and version end the parse too: ``out`` is what vLLM prints on stdout, status 0."""

    def __init__(self, text: str, code: int = 2, out: str = "") -> None:
        super().__init__(text or out)
        self.text = text
        self.code = code
        self.out = out


class VllmStartupError(Exception):
    """An exception vLLM raises while handling the argv (it exits 1 with a traceback)."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type


# ----- value converters (named like vLLM's, for argparse's messages) ------------------------


def human_readable_int(value: str) -> int:
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        try:
            return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean "
                f"to use {number}{suffix.lower()} instead?") from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def loads(value: str) -> Any:
    return json.loads(value)


def union_dict_and_str(value: str) -> Any:
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return str(value)
    return _optional(loads)(value)


def parse_reasoning_parser(value: str) -> str:
    return "" if value.lower() == "none" else value


def _type_repr(fn: Callable[[str], Any]) -> str:
    if fn in (int, float, str):
        return f"<class '{fn.__name__}'>"
    return f"<function {fn.__name__}>"


def _parse_type(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _parse_type(value: str) -> Any:
        try:
            return inner(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Value {value} cannot be converted to {_type_repr(inner)}.") from None

    return _parse_type


def _optional(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    def _optional_type(value: str) -> Any:
        if value in ("", "None"):
            return None
        return _parse_type(inner)(value)

    return _optional_type


def _lower_underscore() -> Callable[[str], str]:
    fn = lambda s: s.lower().replace("-", "_")  # noqa: E731 - argparse names it <lambda>
    return fn


def _comma_list() -> Callable[[str], list[Any]]:
    fn = lambda s: [int(p) if p.isdigit() else p for p in (x.strip() for x in s.split(","))]  # noqa: E731
    return fn


# ----- pydantic-style validation of the JSON config flags ------------------------------------


def _input_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 50 else text[:25] + "..." + text[-24:]


def _pyd_error(cls_name: str, errors: list[tuple[str | None, str, str, Any]]) -> str:
    """pydantic's ``repr(ValidationError)``: errors are (loc, msg, type, input)."""
    version = ".".join(vf.PARSER["pydantic"].split(".")[:2])
    n = len(errors)
    lines = [f"{n} validation error{'s' if n != 1 else ''} for {cls_name}"]
    for loc, msg, kind, value in errors:
        if loc is not None:
            lines.append(loc)
        lines.append(f"  {msg} [type={kind}, input_value={_input_repr(value)}, "
                     f"input_type={type(value).__name__}]")
        lines.append(f"    For further information visit https://errors.pydantic.dev/"
                     f"{version}/v/{kind}")
    return "\n".join(lines)


_JSON_MSGS = {
    "Expecting property name enclosed in double quotes": "key must be a string",
    "Expecting value": "expected value",
    "Expecting ',' delimiter": "expected `,` or `}`",
    "Expecting ':' delimiter": "expected `:`",
    "Extra data": "trailing characters",
    "Unterminated string starting at": "EOF while parsing a string",
}


def _expand_numbers(value: str) -> str:
    """Bare 80m / 1K tokens outside JSON strings become integers, as vLLM does first."""
    parts = re.split(r'("(?:[^"\\]|\\.)*")', value)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b",
                          lambda m: str(human_readable_int(m.group())), parts[i])
    return "".join(parts)


def _literal_msg(options: list[Any]) -> str:
    shown = [repr(o) for o in options if o is not None]
    return "Input should be " + (", ".join(shown[:-1]) + " or " + shown[-1]
                                 if len(shown) > 1 else shown[0])


def _dataclass(cls_name: str) -> Callable[[str], Any]:
    info = vf.CONFIG_CLASSES[cls_name]

    def parse_dataclass(value: str) -> dict[str, Any]:
        text = _expand_numbers(value)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = _JSON_MSGS.get(exc.msg, exc.msg)
            raise argparse.ArgumentTypeError(_pyd_error(cls_name, [(
                None, f"Invalid JSON: {msg} at line {exc.lineno} column {exc.colno}",
                "json_invalid", text)])) from None
        if not isinstance(obj, dict):
            raise argparse.ArgumentTypeError(_pyd_error(
                cls_name, [(None, "Input should be an object", "dataclass_type", obj)]))
        # pydantic reports the fields in their declaration order, then the unknown keys
        errors: list[tuple[str | None, str, str, Any]] = [
            (key, _literal_msg(info["literals"][key]), "literal_error", obj[key])
            for key in info["fields"]
            if key in obj and key in info["literals"] and obj[key] not in info["literals"][key]]
        if info["forbid_extra"]:
            errors += [(key, "Unexpected keyword argument", "unexpected_keyword_argument", val)
                       for key, val in obj.items() if key not in info["fields"]]
        if errors:
            raise argparse.ArgumentTypeError(_pyd_error(cls_name, errors))
        if cls_name == "KVTransferConfig" and obj.get("kv_connector") and not obj.get("kv_role"):
            roles = tuple(r for r in info["literals"]["kv_role"] if r is not None)
            raise argparse.ArgumentTypeError(_pyd_error(cls_name, [(
                None, f"Value error, Please specify kv_role when kv_connector is set, "
                      f"supported roles are {roles}", "value_error", obj)]))
        return obj

    return parse_dataclass


def converter(name: str) -> Callable[[str], Any] | None:
    """The value converter named in the flag table."""
    if name.startswith("optional:"):
        inner = converter(name.removeprefix("optional:")) or str
        return _optional(inner)
    if name.startswith("parse_type:"):
        inner = converter(name.removeprefix("parse_type:")) or str
        return _parse_type(inner)
    if name.startswith("dataclass:"):
        return _dataclass(name.removeprefix("dataclass:"))
    simple: dict[str, Callable[[str], Any] | None] = {
        "str": None, "int": int, "float": float, "json.loads": loads,
        "human_readable_int": human_readable_int,
        "human_readable_int_or_auto": human_readable_int_or_auto,
        "union_dict_and_str": union_dict_and_str,
        "parse_reasoning_parser": parse_reasoning_parser,
    }
    if name in simple:
        return simple[name]
    if name == "lower_underscore":
        return _lower_underscore()
    if name == "comma_list_int_or_str":
        return _comma_list()
    raise KeyError(f"launcher.sim.argv has no converter {name!r}")


# ----- actions that remember which flags were given ------------------------------------------

GIVEN = "_sim_given"  # namespace attribute: dest -> the option string used


def _mark(namespace: argparse.Namespace, dest: str, option: str | None) -> None:
    given = getattr(namespace, GIVEN, None)
    if given is None:
        given = {}
        setattr(namespace, GIVEN, given)
    given.setdefault(dest, option or dest)


class _Store(argparse._StoreAction):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _mark(namespace, self.dest, option_string)
        super().__call__(parser, namespace, values, option_string)


class _StoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _mark(namespace, self.dest, option_string)
        super().__call__(parser, namespace, values, option_string)


class _Append(argparse._AppendAction):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _mark(namespace, self.dest, option_string)
        super().__call__(parser, namespace, values, option_string)


class _Bool(argparse.Action):
    """vLLM's EnableDisableAction: ``--enable-x``/``--disable-x`` (and ``--no-...``) pairs."""

    def __init__(self, option_strings: Sequence[str], dest: str, negative: Sequence[str] = (),
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negative = set(negative)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _mark(namespace, self.dest, option_string)
        setattr(namespace, self.dest, option_string not in self.negative)


class _LoraModules(argparse.Action):
    """``--lora-modules name=path`` or JSON objects, with vLLM's two error messages."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        _mark(namespace, self.dest, option_string)
        out = []
        for item in values or []:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=", 1)
                out.append({"name": name, "path": path})
                continue
            try:
                obj = json.loads(item)
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            if not isinstance(obj, dict) or not {"name", "path"} <= set(obj):
                parser.error(f"Invalid fields for --lora-modules: {item} - LoRAModulePath."
                             "__init__() missing required arguments")
            out.append(obj)
        setattr(namespace, self.dest, out)


# ----- the parsers -------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with vLLM's error text, raised instead of printed (the caller prints it)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        if (self.prog.endswith(" serve") or getattr(self, "_task_hint", False)) and \
                message.startswith("unrecognized arguments:") and \
                re.search(r"(^|\s)--task(=|\s|$)", message):
            message += ("\n\nHint: --task is not a vllm serve option. For embedding, reranking, "
                        "or reward models, use --runner pooling. To adapt a generative model "
                        "for pooling, also use --convert embed, --convert classify, or "
                        "--convert reward.")
        raise VllmArgError(self.format_usage() + f"{self.prog}: error: {message}\n")

    def _print_message(self, message: str, file: Any = None) -> None:
        # help and version text go to the caller with the exit: a check must not print it
        self._printed = getattr(self, "_printed", "") + (message or "")

    def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
        out, self._printed = getattr(self, "_printed", ""), ""
        raise VllmArgError(message or "", status, out)


def _add_flag(p: argparse.ArgumentParser, rec: dict[str, Any]) -> None:
    opts = rec["options"]
    kw: dict[str, Any] = {"dest": rec["dest"]}
    if rec.get("hidden"):
        kw["help"] = argparse.SUPPRESS
    action = rec["action"]
    default = rec.get("default")
    if isinstance(default, dict) and set(default) == {"__repr__"}:
        default = None  # an object default (a config class instance): not needed here
    if default == argparse.SUPPRESS:
        default = argparse.SUPPRESS  # argparse tests it by identity: leave the attribute unset
    if action == "help":
        return  # the parser's own -h/--help (add_help), as in vLLM
    if action == "bool":
        act = p.add_argument(*opts, *rec.get("hidden_options", ()), action=_Bool,
                             negative=rec.get("negative", ()), default=default, **kw)
        act.option_strings = list(opts)  # hidden ones stay registered, as in vLLM
        return
    if action in ("store_true", "store_false"):
        act = p.add_argument(*opts, *rec.get("hidden_options", ()), action=_StoreTrue,
                             default=default, **kw)
        act.option_strings = list(opts)
        return
    kw["type"] = converter(rec.get("type", "str"))
    if "nargs" in rec:
        kw["nargs"] = rec["nargs"]
    if "const" in rec:
        kw["const"] = rec["const"]
    if "choices" in rec:
        kw["choices"] = rec["choices"]
    cls = {"store": _Store, "append": _Append, "lora_modules": _LoraModules}[action]
    act = p.add_argument(*opts, *rec.get("hidden_options", ()), action=cls, default=default,
                         **kw)
    act.option_strings = list(opts)


@functools.lru_cache(maxsize=4)
def build(extra: Callable[[argparse.ArgumentParser], None] | None = None
          ) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level ``vllm`` parser and its ``serve`` subparser (``extra`` adds flags)."""
    top = _Parser(prog=PROG, description="vLLM CLI",
                  allow_abbrev=vf.PARSER["top_allow_abbrev"])
    top.add_argument("-v", "--version", action="version", version=vf.VLLM_VERSION)
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = None
    for name in vf.PARSER["subcommands"]:
        if name == "serve":
            serve = subparsers.add_parser(name, usage=vf.PARSER["serve_usage"],
                                          allow_abbrev=vf.PARSER["serve_allow_abbrev"])
        else:
            subparsers.add_parser(name, add_help=False)
    assert serve is not None
    for pos in vf.POSITIONALS:
        serve.add_argument(pos["dest"], nargs=pos["nargs"], type=converter(pos["type"]),
                           default=pos["default"])
    for rec in vf.FLAGS:
        _add_flag(serve, rec)
    if extra is not None:
        extra(serve)
    return top, serve


@functools.lru_cache(maxsize=1)
def _plain() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """build() without extras, once: the dry-run reads several command lines with it."""
    return build()


# ----- what FlexibleArgumentParser does before argparse ---------------------------------------

Warn = Callable[[str, str], None]  # (where, message): a WARNING log line


def _load_config(path: str, option_strings: set[str]) -> list[str]:
    ext = path.split(".")[-1]
    if ext not in ("yaml", "yml"):
        raise VllmStartupError("ValueError",
                               f"Config file must be of a yaml/yml type. {ext} supplied")
    import yaml

    try:
        with open(path) as fh:
            config = yaml.safe_load(fh)
    except OSError as exc:
        raise VllmStartupError(type(exc).__name__, str(exc)) from None
    out: list[str] = []
    for key, value in (config or {}).items():
        if isinstance(value, bool):
            if value:
                out.append("--" + key)
            elif f"--no-{key}" in option_strings:
                out.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                out += ["--" + key, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += ["--" + key, json.dumps(value)]
        else:
            out += ["--" + key, str(value)]
    return out


def _pull_config(args: list[str], option_strings: set[str]) -> list[str]:
    if args.count("--config") > 1:
        raise VllmStartupError("AssertionError", "More than one config file specified!")
    index = args.index("--config")
    if index == len(args) - 1:
        raise VllmStartupError(
            "ValueError", "No config file specified! Please check your command-line arguments.")
    config_args = _load_config(args[index + 1], option_strings)
    if args[0].startswith("-"):
        return config_args + args[:index] + args[index + 2:]
    if args[0] != "serve":
        return [args[0]] + config_args + args[1:index] + args[index + 2:]
    model_in_cli = len(args) > 1 and not args[1].startswith("-")
    if not model_in_cli and "--model" not in config_args:
        raise VllmStartupError("ValueError", "No model specified! Please specify model either "
                                             "as a positional argument or in a config file.")
    if model_in_cli:
        return args[:2] + config_args + args[2:index] + args[index + 2:]
    return args[:1] + config_args + args[1:index] + args[index + 2:]


def _dashes(arg: str) -> str:
    """Underscores to dashes in the flag name: after '--', up to '=' or the first '.'."""
    key, eq, value = arg.partition("=")
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + eq + value


def preprocess(args: list[str], option_strings: set[str], warn: Warn) -> list[str]:
    """The argv as vLLM's FlexibleArgumentParser hands it to argparse."""
    args = list(args)
    if args and args[0] == "serve":
        idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if idx is not None:
            warn("argparse_utils.py:330",
                 "With `vllm serve`, you should provide the model as a positional argument or "
                 "in a config file instead of via the `--model` option. The `--model` option "
                 "will be removed in a future version.")
            if args[idx] == "--model":
                if idx + 1 >= len(args):
                    raise VllmStartupError("IndexError", "list index out of range")
                model, rest = args[idx + 1], idx + 2
            else:
                model, rest = args[idx].removeprefix("--model="), idx + 1
            args = ["serve", model, *args[1:idx], *args[rest:]]
        if len(args) > 1 and args[1].startswith("-") and \
                not any(re.match(r"^--config(=.+|$)", a) for a in args) and \
                any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args):
            raise VllmStartupError(
                "ValueError", "`model` should be provided as the first positional argument "
                              "when using `vllm serve`. i.e. `vllm serve <model> --<arg> "
                              "<value>`.")
    if "--config" in args:
        args = _pull_config(args, option_strings)

    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append("--help")
        elif arg.startswith("--"):
            processed.append(_dashes(arg))
        elif arg.startswith("-O") and arg != "-O":
            processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append("--optimization-level")
        else:
            processed.append(arg)

    dotted: dict[str, dict[str, Any]] = {}
    duplicates: list[str] = []
    seen: set[str] = set()
    out: list[str] = []
    skip = False
    for i, arg in enumerate(processed):
        if skip:
            skip = False
            continue
        if arg.startswith("--") and "." not in arg:
            name = arg.split("=", 1)[0]
            if name in seen:
                duplicates.append(name)
            seen.add(name)
            out.append(arg)
            continue
        if arg.startswith("-") and "." in arg:
            if "=" in arg:
                name, value = arg.split("=", 1)
                if "." not in name:  # the dot was in the value
                    out.append(arg)
                    continue
            else:
                name = arg
                if i + 1 >= len(processed):
                    raise VllmStartupError("IndexError", "list index out of range")
                value = processed[i + 1]
                skip = True
            if name.endswith("+"):
                name = name[:-1]
                value = json.dumps(value.split(","))
            key, *path = name.split(".")
            try:
                parsed: Any = json.loads(value)
            except json.JSONDecodeError:
                try:
                    parsed = human_readable_int(value)
                except (ValueError, argparse.ArgumentTypeError):
                    parsed = value
            node = dotted.setdefault(key, {})
            for part in path[:-1]:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            leaf = path[-1] if path else ""
            if isinstance(parsed, list) and isinstance(node.get(leaf), list):
                node[leaf] += parsed
            else:
                if leaf in node:
                    duplicates.append(f"{key}.{'.'.join(path)}")
                node[leaf] = parsed
            continue
        out.append(arg)
    if duplicates:
        warn("argparse_utils.py:495", "Found duplicate keys " + ", ".join(duplicates))
    for key, value in dotted.items():
        out += [key, json.dumps(value)]
    return out


def parse(argv: list[str], warn: Warn,
          extra: Callable[[argparse.ArgumentParser], None] | None = None
          ) -> tuple[argparse.Namespace, dict[str, str]]:
    """Parse ``vllm``'s argv (``serve MODEL ...``): the namespace and the flags given.

    Raises VllmArgError (argparse's text, exit 2) or VllmStartupError (exit 1).
    """
    top, serve = build(extra) if extra is not None else _plain()
    option_strings = set(serve._option_string_actions)
    args = preprocess(argv, option_strings, warn)
    top._task_hint = args[:1] == ["serve"] and any(  # type: ignore[attr-defined]
        re.match(r"^--task(=.+|$)", a) for a in args[1:])
    ns = top.parse_args(args, argparse.Namespace())
    given = dict(getattr(ns, GIVEN, None) or {})
    if hasattr(ns, GIVEN):
        delattr(ns, GIVEN)
    return ns, given
