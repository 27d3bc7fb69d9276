"""vLLM's OpenAI-compatible HTTP API over simulated engines (aiohttp).

/health, /v1/models, /version, /metrics, /v1/completions, /v1/chat/completions (streaming
SSE with stream_options.include_usage, and non-streaming), /v1/completions/render and
/v1/chat/completions/render (what vllm-router calls before routing; like vLLM 0.33 they
answer 403 unless the server runs with --enable-scale-out or --tokens-only, see
``SCALE_OUT_PATHS``). P/D: a request with
kv_transfer_params.do_remote_decode on a producer returns its kv_transfer_params; one with
do_remote_prefill on a consumer pulls the KV over the side channel first. Every response
carries ``x-simulated-engine: launcher.sim``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from launcher.sim import SIM_HEADER, SIM_HEADER_VALUE, metrics, tokens, vlog
from launcher.sim.answers import Answerer, text_of
from launcher.sim.cli import SimConfig
from launcher.sim.engine import Engine, Req
from launcher.sim.prefix_cache import block_hashes
from launcher.sim.vllm_flags import VLLM_VERSION  # the release the flag table was read from

# vLLM 0.33 (vllm/entrypoints/scale_out/factories.py, register_scale_out_api_routers): without
# --enable-scale-out (or --tokens-only) every scale-out route answers 403 with this body,
# serialised by Starlette's JSONResponse (compact separators), and the server logs the
# message once at start-up.
SCALE_OUT_DISABLED = ("Scale-out endpoints are disabled. Restart vllm serve with "
                      "--enable-scale-out to enable them.")
SCALE_OUT_WHERE = "factories.py:105"
SCALE_OUT_PATHS = ("/v1/chat/completions/render", "/v1/messages/render",
                   "/v1/completions/render", "/v1/responses/render",
                   "/v1/chat/completions/derender", "/v1/completions/derender",
                   "/inference/v1/generate", "/inference/v1/abort_requests")
SCALE_OUT_403 = json.dumps(
    {"error": {"message": SCALE_OUT_DISABLED, "type": "PermissionDeniedError", "param": None,
               "code": 403}}, separators=(",", ":"), ensure_ascii=False).encode()


def uvicorn_line(message: str) -> None:
    """A line as uvicorn prints it next to vLLM's own records ("INFO:     ...")."""
    sys.stdout.write(f"INFO:     {message}\n")
    sys.stdout.flush()


def uvicorn_startup() -> None:
    uvicorn_line(f"Started server process [{os.getpid()}]")
    uvicorn_line("Waiting for application startup.")
    uvicorn_line("Application startup complete.")


class UvicornAccessLog(AbstractAccessLogger):
    """uvicorn's access line, which vLLM's API server prints for every request
    (off with --disable-uvicorn-access-log):
    ``INFO:     127.0.0.1:34054 - "POST /v1/completions HTTP/1.1" 200 OK``."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "-"
        v = request.version
        uvicorn_line(f'{who} - "{request.method} {request.path_qs} HTTP/{v.major}.{v.minor}" '
                     f"{response.status} {response.reason}")



def conversation(body: dict[str, Any]) -> str:
    """The simulation's name for a chat's conversation: the start of the sha256 of its first
    user message, which every later turn of a session resends. vllm-router's P/D mode does
    not forward the session header, so this is what tells an engine's requests apart by
    session (docs/agentic.md)."""
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content
                                  if isinstance(p, dict))
            return hashlib.sha256(str(content or "").encode()).hexdigest()[:16]
    return "none"

def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class _Prompt:
    __slots__ = ("text", "ids", "num_tokens")

    def __init__(self, text: str, ids: Sequence[int], num_tokens: int) -> None:
        self.text = text
        self.ids = ids  # the prompt's token ids, num_tokens of them
        self.num_tokens = num_tokens


def _tokenizer(path: str):
    """The `tokenizer` knob's tokenizer (None without one): a text prompt then counts as
    vLLM's tokenizer counts it."""
    if not path:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("SIM_TOKENIZER is set but the tokenizers package is not installed "
                         "where the simulator runs") from None
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same one sentence
        raise SystemExit(f"SIM_TOKENIZER {path}: cannot read {file} ({e})") from None


class Api:
    def __init__(self, cfg: SimConfig, engines: list[Engine], answerer: Answerer) -> None:
        self.cfg = cfg
        self.engines = engines
        self.answerer = answerer
        self.created = int(time.time())
        self._rr = itertools.count()
        self.http = metrics.HttpStats()
        self.tokenizer = _tokenizer(cfg.knobs.tokenizer)

    # ----- app ---------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._count])
        app.on_response_prepare.append(self._tag)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/v1/models", self.models)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        if self.cfg.scale_out:
            r.add_post("/v1/completions/render", self.render_completions)
            r.add_post("/v1/chat/completions/render", self.render_chat)
        else:
            for path in SCALE_OUT_PATHS:
                r.add_post(path, self.scale_out_disabled)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The instrumentator's view of every request (vLLM's http_* families): the route's
        path (untemplated: "none"), the method, the status, the Content-Length headers."""
        t0 = time.perf_counter()
        status, size = 500, 0
        try:
            resp = await handler(request)
            status, size = resp.status, resp.content_length or 0
            return resp
        except web.HTTPException as exc:
            status, size = exc.status, exc.content_length or 0
            raise
        finally:
            info = request.match_info
            route = info.route.resource.canonical if info.route.resource is not None else "none"
            self.http.observe(route, request.method, status, request.content_length or 0,
                              size, time.perf_counter() - t0)

    async def scale_out_disabled(self, request: web.Request) -> web.Response:
        return web.Response(status=403, body=SCALE_OUT_403, content_type="application/json")

    async def _tag(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[SIM_HEADER] = SIM_HEADER_VALUE
        rid = request.headers.get("X-Request-Id")
        # vLLM echoes the id only with --enable-request-id-headers
        if rid and self.cfg.request_id_headers and "X-Request-Id" not in response.headers:
            response.headers["X-Request-Id"] = rid

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.cfg.served_model_name, "object": "model", "created": self.created,
            "owned_by": "vllm", "root": self.cfg.model, "parent": None,
            "max_model_len": self.cfg.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": self.created, "allow_create_engine": False,
                "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        body = metrics.render(self.engines, self.cfg.served_model_name,
                              nixl=self.cfg.nixl, consumer=self.cfg.is_consumer,
                              multiproc=self.cfg.api_server_count > 1, http=self.http)
        return web.Response(body=body.encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; "
                                                     "charset=utf-8"})

    # ----- request parsing -------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in self.cfg.served_model_names:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        return body

    def _text_prompt(self, text: str) -> _Prompt:
        ids, _ = self._encode(text)
        return _Prompt(text, ids, len(ids))

    def _encode(self, text: str) -> tuple[Sequence[int], Sequence[int]]:
        """The text's token ids and where each token starts in ``text.encode()`` (toy) or
        in ``text`` (a real tokenizer's character offsets)."""
        if self.tokenizer is not None:
            enc = self.tokenizer.encode(text)
            if not enc.ids:
                return [0], [0]
            return enc.ids, [start for start, _ in enc.offsets]
        cpt = self.cfg.knobs.chars_per_token
        n = tokens.toy_count(text, cpt)
        w = max(1, round(cpt))
        return tokens.toy_ids(text, n, cpt), range(0, n * w, w)

    def _completion_prompts(self, body: dict[str, Any]) -> list[_Prompt]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [self._text_prompt(prompt)]
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return [_Prompt("", prompt, len(prompt))]
            out = []
            for p in prompt:
                if isinstance(p, str):
                    out.append(self._text_prompt(p))
                elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
                    out.append(_Prompt("", p, len(p)))
                else:
                    raise BadRequest("prompt must be a string, a list of strings or token ids")
            return out
        raise BadRequest("prompt must be a non-empty string or list of token ids")

    def _chat_prompt(self, body: dict[str, Any]) -> _Prompt:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        texts, roles, starts = [], [], []
        at = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            texts.append(str(content or ""))
            roles.append(str(m.get("role", "")) if isinstance(m, dict) else "")
            starts.append(at)
            # offsets in the unit _encode reports token starts in
            at += (len(texts[-1]) if self.tokenizer is not None
                   else len(texts[-1].encode())) + 1
        text = "\n".join(texts)
        ids, token_starts = self._encode(text)
        # chat-template tokens in front of each message
        ids = tokens.with_templates(ids, token_starts, starts, roles)
        return _Prompt(text, ids, len(ids))

    def _ids(self, p: _Prompt) -> list[int]:
        # The same text gives the same ids on every instance, so the router's prefix-aware
        # routing and the engines' prefix caches see stable prefixes.
        return list(p.ids)

    def _engine(self, request: web.Request) -> Engine:
        # vLLM 0.33 reads the header as an index into the engines this front manages (all
        # ranks, or its local ones with hybrid LB); a non-integer is ignored
        # (entrypoints/generate/base/serving.py:221-228, v1/engine/input_processor.py:393-400).
        try:
            pinned = int(request.headers.get("X-data-parallel-rank", ""))
        except ValueError:
            pinned = None
        if pinned is not None:
            if not 0 <= pinned < len(self.engines):
                raise BadRequest(f"data_parallel_rank {pinned} is out of range "
                                 f"[0, {len(self.engines)}).")
            return self.engines[pinned]
        start = next(self._rr)
        n = len(self.engines)
        best = self.engines[start % n]
        for i in range(1, n):
            e = self.engines[(start + i) % n]
            if e.load_score() < best.load_score():
                best = e
        return best

    def _make_req(self, body: dict[str, Any], prompt: _Prompt, base_id: str, idx: int,
                  chat: bool, engine: Engine) -> tuple[Req, list[str] | None]:
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = 16 if not chat else self.cfg.max_model_len - prompt.num_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be an integer >= 1")
        total = prompt.num_tokens + max_tokens
        if total > self.cfg.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. "
                f"However, you requested {total} tokens ({prompt.num_tokens} in the "
                f"messages, {max_tokens} in the completion). Please reduce the length of the "
                "messages or completion.")
        if engine._blocks_for(prompt.num_tokens + 1) > engine.num_blocks:
            raise BadRequest(f"prompt of {prompt.num_tokens} tokens does not fit the KV cache "
                             f"of {engine.num_blocks} blocks of {engine.block_size} tokens")
        answer = self.answerer.answer_tokens(prompt.text) if prompt.text else None
        stop_after = None
        if not body.get("ignore_eos") and answer is not None:
            stop_after = len(answer)
        kvp = body.get("kv_transfer_params")
        remote = None
        remote_decode = False
        if isinstance(kvp, dict):
            if kvp.get("do_remote_decode") and self.cfg.is_producer:
                remote_decode = True
            if kvp.get("do_remote_prefill") and self.cfg.is_consumer and \
                    kvp.get("remote_engine_id"):
                remote = kvp
        n = body.get("n", 1)
        hashes = None
        if engine.pool.caching or engine.tiers:  # the tiers key blocks by the same hashes
            salt = body.get("cache_salt")
            try:
                hashes = block_hashes(prompt.ids, engine.block_size,
                                      salt if isinstance(salt, str) else None)
            except OverflowError:  # an id beyond 64 bits: such a prompt is never cached
                hashes = None
        req = Req(f"{base_id}-{idx}-{uuid.uuid4().hex[:8]}", prompt.num_tokens, max_tokens,
                  stop_after, remote, remote_decode, n if isinstance(n, int) else 1, hashes)
        return req, answer

    # ----- generation ----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompts = [self._chat_prompt(body)] if chat else self._completion_prompts(body)
            engine = self._engine(request)
            base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
            rid = ("chatcmpl-" if chat else "cmpl-") + base
            reqs = [self._make_req(body, p, rid, i, chat, engine)
                    for i, p in enumerate(prompts)]
            stream = bool(body.get("stream"))
            if stream and len(reqs) > 1:
                raise BadRequest("launcher.sim streams one prompt per request")
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        if self.cfg.log_requests and chat:
            vlog.info("sim.py:5", f"SIMULATED request {rid}: conversation "
                                  f"{conversation(body)}, {prompts[0].num_tokens} prompt tokens")
        for req, _ in reqs:
            engine.add(req)
        if stream:
            req, answer = reqs[0]
            return await self._stream(request, body, engine, req, answer, rid, chat, prompts[0])
        return await self._whole(body, engine, reqs, rid, chat, prompts)

    async def _wait_finished(self, engine: Engine, req: Req) -> None:
        try:
            while not req.finished:
                await req.event.wait()
                req.event.clear()
        except BaseException:
            engine.abort(req)
            raise

    async def _whole(self, body: dict[str, Any], engine: Engine,
                     reqs: list[tuple[Req, list[str] | None]], rid: str, chat: bool,
                     prompts: list[_Prompt]) -> web.Response:
        try:
            for req, _ in reqs:
                await self._wait_finished(engine, req)
        except BaseException:
            for req, _ in reqs:  # the client went away: drop the whole batch
                engine.abort(req)
            raise
        for req, _ in reqs:
            if req.finished == "error":
                return _error(500, req.error or "internal error", "InternalServerError")
        created = int(time.time())
        choices = []
        for i, (req, answer) in enumerate(reqs):
            text = text_of(answer, 0, req.generated)
            if chat:
                choices.append({
                    "index": i,
                    "message": {"role": "assistant", "content": text, "refusal": None,
                                "annotations": None, "audio": None, "function_call": None,
                                "tool_calls": [], "reasoning_content": None},
                    "logprobs": None, "finish_reason": req.finished, "stop_reason": None,
                })
            else:  # vLLM 0.33's CompletionResponseChoice, every field
                choices.append({
                    "index": i, "text": text, "logprobs": None, "finish_reason": req.finished,
                    "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                    "prompt_token_ids": None, "routed_experts": None, "weight_versions": None,
                })
        prompt_tokens = sum(p.num_tokens for p in prompts)
        completion_tokens = sum(r.generated for r, _ in reqs)
        out: dict[str, Any] = {
            "id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": created, "model": self.cfg.served_model_name, "choices": choices,
            "service_tier": None, "system_fingerprint": self.cfg.system_fingerprint,
            "usage": {"prompt_tokens": prompt_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens": completion_tokens, "prompt_tokens_details": None,
                      "completion_tokens_details": None},
        }
        if chat:
            out["prompt_logprobs"] = None
            out["prompt_token_ids"] = None
        out["kv_transfer_params"] = reqs[0][0].kv_params
        if not chat:  # vLLM 0.33's CompletionResponse
            out["ec_transfer_params"] = None
            out["metrics"] = None
        return web.json_response(out)

    async def _stream(self, request: web.Request, body: dict[str, Any], engine: Engine,
                      req: Req, answer: list[str] | None, rid: str, chat: bool,
                      prompt: _Prompt) -> web.StreamResponse:
        opts = body.get("stream_options") or {}
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))
        plen = prompt.num_tokens
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        created = int(time.time())
        model = self.cfg.served_model_name
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage_null = ', "usage": null' if include_usage and chat else ""
        head = json.dumps({"id": rid, "object": obj, "created": created, "model": model})[:-1]
        fingerprint = self.cfg.system_fingerprint

        def chunk(text: str | None, finish: str | None, role: bool = False) -> bytes:
            usage = usage_null
            if continuous:
                g = req.generated
                usage = (f', "usage": {{"prompt_tokens": {plen}, "total_tokens": {plen + g}, '
                         f'"completion_tokens": {g}}}')
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else \
                    ({"content": text} if text is not None else {})
                choice = {"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish, "stop_reason": None}
                tail = ""
            else:
                # vLLM 0.33's completion chunk (exclude_unset): the choice's fields it sets,
                # kv_transfer_params on every chunk, the fingerprint on the last one when no
                # usage chunk follows
                choice = {"index": 0, "text": text or "", "logprobs": None,
                          "finish_reason": finish, "stop_reason": None,
                          "prompt_token_ids": None, "token_ids": None, "weight_versions": None}
                tail = f', "kv_transfer_params": {json.dumps(req.kv_params if finish else None)}'
                if finish and not include_usage and fingerprint is not None:
                    tail += f', "system_fingerprint": {json.dumps(fingerprint)}'
            return (f"data: {head}, \"choices\": [{json.dumps(choice)}]{usage}{tail}}}\n\n"
                    ).encode()

        try:
            await resp.prepare(request)
            if chat:
                await resp.write(chunk(None, None, role=True))
            sent = 0
            while True:
                await req.event.wait()
                req.event.clear()
                g = req.generated
                fin = req.finished
                if fin == "error":
                    err = {"error": {"message": req.error or "internal error",
                                     "type": "InternalServerError", "param": None,
                                     "code": 500}}
                    await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                    break
                if g > sent or fin:
                    await resp.write(chunk(text_of(answer, sent, g), fin if fin else None))
                    sent = g
                if fin:
                    if include_usage:
                        usage = {"prompt_tokens": prompt.num_tokens,
                                 "total_tokens": prompt.num_tokens + g,
                                 "completion_tokens": g}
                        fp = (f', "system_fingerprint": {json.dumps(fingerprint)}'
                              if fingerprint is not None and not chat else "")
                        await resp.write(
                            f"data: {head}, \"choices\": [], \"usage\": {json.dumps(usage)}"
                            f"{fp}}}\n\n".encode())
                    break
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            engine.abort(req)  # the client went away
        except BaseException:
            engine.abort(req)
            raise
        return resp

    # ----- tokenize / detokenize -------------------------------------------------------------
    # `vllm bench serve` asks /tokenize (through the router, on the P/D path) whether its
    # tokenizer agrees with the server's, and /detokenize to cut prompts that came out long.
    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            if "messages" in body:
                p = self._chat_prompt(body)
            elif isinstance(body.get("prompt"), str):
                p = self._text_prompt(body["prompt"])
            else:
                raise BadRequest("prompt must be a string (or give messages)")
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        ids = self._ids(p)
        ids = (ids + [0] * p.num_tokens)[: p.num_tokens]  # as many ids as tokens counted
        return web.json_response({"count": len(ids), "max_model_len": self.cfg.max_model_len,
                                  "tokens": ids, "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        """The simulator has no vocabulary: the text it gives back is one it counts as exactly
        len(tokens) tokens (a letter per id, chars_per_token of them per token)."""
        try:
            body = await self._body(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise BadRequest("tokens must be a list of non-negative integers")
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        if self.tokenizer is not None:
            return web.json_response({"prompt": self.tokenizer.decode(ids,
                                                                      skip_special_tokens=False)})
        per = max(1.0, self.cfg.knobs.chars_per_token)
        n = len(ids)
        text = "".join(chr(0x61 + ids[min(n - 1, int(j / per))] % 26)
                       for j in range(round(n * per))) if n else ""
        return web.json_response({"prompt": text})

    # ----- render (tokens in <> tokens out) -------------------------------------------------
    def _sampling(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        keys = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "max_tokens",
                "min_tokens", "ignore_eos", "presence_penalty", "frequency_penalty",
                "repetition_penalty", "skip_special_tokens", "logprobs")
        sp = {k: body[k] for k in keys if k in body}
        if chat and "max_completion_tokens" in body:
            sp["max_tokens"] = body["max_completion_tokens"]
        return sp

    def _render_one(self, body: dict[str, Any], p: _Prompt, rid: str, chat: bool
                    ) -> dict[str, Any]:
        return {
            "request_id": rid, "token_ids": self._ids(p), "assistant_tokens_mask": None,
            "token_offsets": None, "features": None,
            "sampling_params": self._sampling(body, chat),
            "model": self.cfg.served_model_name, "stream": bool(body.get("stream", False)),
            "stream_options": body.get("stream_options"), "cache_salt": body.get("cache_salt"),
            "priority": body.get("priority", 0),
            "kv_transfer_params": body.get("kv_transfer_params"),
        }

    async def render_completions(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            prompts = self._completion_prompts(body)
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        return web.json_response([self._render_one(body, p, f"cmpl-{base}-{i}", False)
                                  for i, p in enumerate(prompts)])

    async def render_chat(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            prompt = self._chat_prompt(body)
        except BadRequest as exc:
            return _error(exc.status, str(exc), exc.kind)
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        return web.json_response(self._render_one(body, prompt, f"chatcmpl-{base}", True))
