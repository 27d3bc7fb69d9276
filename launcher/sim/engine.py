"""One simulated engine core (a DP rank): a vLLM-v1-like scheduler loop on asyncio.

Each step schedules running requests first (decode: 1 token, unfinished prefill: a chunk),
then admits waiting requests while the token budget (--max-num-batched-tokens), the
sequence limit (--max-num-seqs) and free KV blocks allow. A running request that needs a
block when none is free preempts the newest running request (recompute). The step then
lasts as long as the speed model says (scaled by SIM_SPEED) and emits one token per
finished-prefill/decoding request. Requests only wake their HTTP handler every
--stream-interval tokens, so there is no per-token Python work beyond a counter.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from launcher.sim import vlog
from launcher.sim.cli import SimConfig
from launcher.sim.metrics import CACHED_SOURCES, EngineStats
from launcher.sim.prefix_cache import BlockPool
from launcher.sim.tiers import Tier

_MAX_DEBT_S = 0.005
LOADING = "loading"  # _admit_cached: blocks allocated, a KV tier's load comes first
# kv fetch stages of a consumer request (vllm:num_requests_kv_fetch_by_stage)
NO_FETCH, FETCH_WAITING, FETCH_RUNNING, FETCH_DONE = 0, 1, 2, 3


class Req:
    """One request inside an engine; the HTTP handler reads it after ``event`` fires."""

    __slots__ = (
        "arrival",
        "block_ids",
        "cached_blocks",
        "computed",
        "counted_prompt",
        "error",
        "event",
        "ext_source",
        "external",
        "fail_kv",
        "finished",
        "first_token",
        "generated",
        "hashes",
        "hold_until",
        "id",
        "kv_params",
        "last_token",
        "local_hit",
        "max_tokens",
        "n",
        "preemptions",
        "prompt_len",
        "queued",
        "remote",
        "remote_decode",
        "saved_blocks",
        "scheduled",
        "stage",
        "state_ids",
        "stop_after",
        "tier_hits",
    )

    def __init__(self, req_id: str, prompt_len: int, max_tokens: int,
                 stop_after: int | None = None, remote: dict[str, Any] | None = None,
                 remote_decode: bool = False, n: int = 1,
                 hashes: list[int] | None = None) -> None:
        self.id = req_id
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.stop_after = stop_after  # EOS after this many generated tokens (None: never)
        self.arrival = time.time()
        self.queued = self.arrival
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.computed = 0
        self.generated = 0
        self.block_ids: list[int] = []  # attention blocks, in token order
        self.state_ids: list[int] = []  # a hybrid model's recurrent-state blocks
        self.cached_blocks = 0  # leading blocks of block_ids already named by their hash
        # chained hashes of the prompt's full blocks (empty: nothing to look up or cache)
        self.hashes = hashes or []
        self.local_hit = 0  # prompt tokens found in the local prefix cache at admission
        self.preemptions = 0
        self.remote = remote
        self.remote_decode = remote_decode
        self.stage = FETCH_WAITING if remote else NO_FETCH
        self.external = 0
        self.ext_source = "p2p"  # vLLM's CacheHitSource of the external tokens
        # (tier, leading blocks it holds) per KV tier, from the lookup made on arrival
        self.tier_hits: list[tuple[Tier, int]] = []
        self.saved_blocks = 0  # leading prompt blocks handed to the tiers to keep
        self.finished: str | None = None
        self.error: str | None = None
        self.event = asyncio.Event()
        self.kv_params: dict[str, Any] | None = None
        self.n = n
        self.counted_prompt = False
        self.hold_until = 0.0
        self.fail_kv = False

    @property
    def blocks(self) -> int:
        return len(self.block_ids) + len(self.state_ids)


@dataclass
class Interval:
    """Counters since the last stats log line (LoggingStatLogger's interval)."""

    start: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    gen_tokens: int = 0
    preemptions: int = 0
    xfer_s: list[float] = field(default_factory=list)
    post_s: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    descs: list[int] = field(default_factory=list)
    failed: int = 0
    expired: int = 0
    notifs_after_expiry: int = 0
    last_prompt_tp: float = 0.0
    last_gen_tp: float = 0.0
    # speculative decoding (SpecDecodingLogging's interval): drafts, their tokens, accepted
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)


# vLLM 0.33 vllm/v1/spec_decode/metrics.py SpecDecodingProm (labels model_name, engine;
# the per-position one adds position)
SPEC_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens")
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


# A KV pull: (engine, request) -> awaits the transfer; raises KVTransferError on failure.
PullFn = Callable[["Engine", Req], Awaitable[None]]


class KVTransferError(Exception):
    pass


class Engine:
    def __init__(self, cfg: SimConfig, rank: int, engine_id: str,
                 side_channel_host: str) -> None:
        self.cfg = cfg
        self.k = cfg.knobs
        self.rank = rank
        self.engine_id = f"{engine_id}_dp{rank}"
        self.side_channel_host = side_channel_host
        self.side_channel_port = cfg.side_channel_port + rank
        self.block_size = cfg.block_size
        self.num_blocks = cfg.num_gpu_blocks
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        # (requests, queries, hits) per scheduler step with lookups: the stats line's prefix
        # cache hit rate is over the most recent 1000 requests (vLLM's CachingMetrics)
        self._hit_window: deque[tuple[int, int, int]] = deque()
        self._hit_window_sums = [0, 0, 0]
        self.waiting: deque[Req] = deque()
        self.ready: deque[Req] = deque()  # KV pulled, waiting to be scheduled
        self.fetching: set[Req] = set()  # blocks allocated, pull in flight
        self.running: list[Req] = []
        self.held: dict[str, Req] = {}  # producer: finished, blocks kept for the decode
        self.stats = EngineStats(max_model_len=cfg.max_model_len)
        self.interval = Interval()
        self.wake = asyncio.Event()
        self.pull: PullFn | None = None
        self.tiers: list[Tier] = []  # KV tiers below the GPU blocks, in chain order
        self._task: asyncio.Task[None] | None = None
        self._last_step_end = time.time()
        self._virtual_end = self._last_step_end
        self._last_dur = 0.0
        self._ext_window: deque[tuple[int, int]] = deque(maxlen=1000)
        self.spec = cfg.num_spec_tokens  # draft tokens per decode step (0: none)
        self._draws = random.Random(f"{engine_id}-{rank}")
        if self.spec:
            for name in SPEC_COUNTERS:
                self.stats.counters[name] = 0.0
            for pos in range(self.spec):
                self.stats.counters[f"{SPEC_PER_POS}|{pos}"] = 0.0

    # ----- public API --------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def fails_kv(self, request_id: str) -> bool:
        """The SIM_KV_FAIL_FRACTION fault, decided per request (the same on every try)."""
        return _fraction(request_id) < self.k.kv_fail_fraction

    def add(self, req: Req) -> None:
        if req.remote and self.cfg.is_consumer:
            req.fail_kv = self.fails_kv(req.remote.get("remote_request_id", req.id))
        if self.tiers and req.hashes:
            # the tiers are asked before the request queues (vLLM asks each connector at
            # admission; the store's answer is a round trip, so it is made here, once). A
            # request pulled over NIXL is asked about too (MultiConnector asks every child)
            # but NIXL, first in the chain, serves it.
            asyncio.get_running_loop().create_task(self._look_up_tiers(req))
            return
        self.waiting.append(req)
        self.wake.set()

    async def _look_up_tiers(self, req: Req) -> None:
        cap = (req.prompt_len - 1) // self.block_size  # the last token is recomputed
        for tier in self.tiers:
            if tier.lookup_enabled and cap > 0:
                req.tier_hits.append((tier, await tier.lookup(self.stats, req.hashes[:cap])))
        if req.finished:  # aborted meanwhile
            return
        self.waiting.append(req)
        self.wake.set()

    def abort(self, req: Req) -> None:
        """Client went away: drop the request wherever it is and free its blocks."""
        if req.finished:
            return
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        try:
            self.ready.remove(req)
        except ValueError:
            pass
        if req in self.running:
            self.running.remove(req)
        self._finish(req, "abort", time.time())

    def load_score(self) -> int:
        # vLLM's internal DP load balancer: waiting weighs 4x running.
        return (len(self.waiting) + len(self.ready) + len(self.fetching)) * 4 + \
            len(self.running)

    def gauges(self) -> dict[str, Any]:
        capacity = len(self.waiting)
        deferred = len(self.fetching) + len(self.ready)
        waiting_start = sum(1 for r in self.waiting if r.stage == FETCH_WAITING)
        return {
            "running": len(self.running),
            "waiting": capacity + deferred,
            "waiting_by_reason": {"capacity": capacity, "deferred": deferred},
            "kv_fetch": {"waiting_to_start": waiting_start,
                         "in_progress": len(self.fetching),
                         "completed_waiting": len(self.ready)},
            "sleep": {"awake": 1, "weights_offloaded": 0, "discard_all": 0},
            "kv_usage": self.kv_usage(),
        }

    @property
    def free_blocks(self) -> int:
        return self.pool.num_free

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.num_blocks if self.num_blocks else 0.0

    def cache_config(self) -> dict[str, str]:
        c = self.cfg
        # A hybrid model (one with state blocks) gets mamba_cache_mode "align" and a mamba
        # block of the attention block with prefix caching, "none" and max_model_len without
        # (vLLM 0.33 model_executor/models/config.py:763-787); other models keep "none".
        hybrid = self.k.state_blocks_per_request > 0
        mode = "align" if hybrid and c.enable_prefix_caching else "none"
        mamba_block = (c.block_size if mode == "align" else c.max_model_len) if hybrid else None
        return {
            "_block_size_resolved": "True", "block_size": str(c.block_size),
            "cache_dtype": c.kv_cache_dtype, "cache_hit_alignment_tokens": "None",
            "effective_attention_block_size": "None",
            "enable_mamba_shared_prefix_checkpoint": "False",
            "enable_prefix_caching": str(c.enable_prefix_caching),
            "engine": str(self.rank), "gpu_memory_utilization": str(c.gpu_memory_utilization),
            "hash_block_size": "None", "is_attention_free": "False",
            "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
            "kv_cache_max_concurrency": "None", "kv_cache_memory_bytes": "None",
            "kv_cache_size_tokens": "None", "kv_offloading_backend": "native",
            "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
            "mamba_block_size": str(mamba_block), "mamba_cache_dtype": "auto",
            "mamba_cache_mode": mode,
            "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": c.mamba_ssm_cache_dtype,
            "num_cpu_blocks": "None", "num_gpu_blocks": str(c.num_gpu_blocks),
            "num_gpu_blocks_override": str(c.num_gpu_blocks_override),
            "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
            "prefix_match_unit": "None", "replayssm_buffer_len": "16",
            "simple_cpu_offload_num_blocks": "None", "skip_page_size_padded": "None",
            "sliding_window": "None", "swa_bounded_replay": "True",
            "use_kda_recoverssm": "False", "use_replayssm": "False",
            "user_specified_block_size": str(c.user_block_size),
        }

    def prefix_hit_window(self) -> tuple[int, int] | None:
        """(queries, hits) of the local prefix cache over the most recent 1000 requests;
        None before any lookup (the stats line then has no 'Prefix cache hit rate')."""
        if not self._hit_window:
            return None
        return self._hit_window_sums[1], self._hit_window_sums[2]

    def _observe_lookups(self, requests: int, queries: int, hits: int) -> None:
        win, sums = self._hit_window, self._hit_window_sums
        win.append((requests, queries, hits))
        for i, v in enumerate((requests, queries, hits)):
            sums[i] += v
        while len(win) > 1 and sums[0] > 1000:  # the newest step's stays, whatever its size
            for i, v in enumerate(win.popleft()):
                sums[i] -= v

    def external_hit_rate(self) -> float | None:
        """External prefix-cache hit rate over the last 1000 requests (None: not observed)."""
        if not self._ext_window:
            return None
        q = sum(x for x, _ in self._ext_window)
        h = sum(y for _, y in self._ext_window)
        return 100.0 * h / q if q else 0.0

    # ----- producer side: blocks held for a decode to read ---------------------------------
    def read_held(self, request_id: str, engine_id: str) -> dict[str, Any]:
        """Side-channel read of a held request; raises KeyError if unknown or expired."""
        if engine_id != self.engine_id:
            raise KeyError(f"engine id {engine_id} is not {self.engine_id}")
        req = self.held.get(request_id)
        if req is None:
            raise KeyError(f"request {request_id} has no held KV blocks on {self.engine_id}")
        return {"num_tokens": req.prompt_len, "num_blocks": req.blocks}

    def release_held(self, request_id: str) -> bool:
        req = self.held.pop(request_id, None)
        if req is None:
            self.stats.inc("vllm:nixl_num_notifications_after_expiry")
            self.interval.notifs_after_expiry += 1
            return False
        self._free(req)
        self.wake.set()
        return True

    def _expire_held(self, now: float) -> None:
        # held is in insertion order and every lease is equally long: oldest first.
        expired = []
        for req in self.held.values():
            if req.hold_until > now:
                break
            expired.append(req)
        for req in expired:
            del self.held[req.id]
            self._free(req)
            self.stats.inc("vllm:nixl_num_kv_expired_reqs")
            self.interval.expired += 1
            vlog.warning("base_worker.py:3370", f"Releasing expired KV blocks for request "
                         f"{req.id} which were retrieved by 0 remote worker(s) before lease "
                         "expired.", proc="EngineCore_DP0")

    # ----- block accounting ----------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        # A hybrid model's request also holds its recurrent state's blocks while it runs.
        return -(-tokens // self.block_size) + self.k.state_blocks_per_request

    def _alloc(self, req: Req, tokens: int) -> bool:
        need_attn = max(0, -(-tokens // self.block_size) - len(req.block_ids))
        need_state = 0 if req.state_ids else self.k.state_blocks_per_request
        need = need_attn + need_state
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        if need_state:
            req.state_ids = self.pool.take(need_state)
        req.block_ids += self.pool.take(need_attn)
        return True

    def _admit_cached(self, req: Req, tokens: int) -> bool | str:
        """Admit a new request: take the longest cached run of its leading blocks (never its
        last token: vLLM recomputes it for the logits), then blocks for `tokens` more tokens
        (capped at the prompt). False, with nothing taken, when that does not fit; LOADING when a
        KV tier holds blocks past the local hit: those are allocated and loaded first."""
        bs = self.block_size
        hit = self.pool.longest_hit(req.hashes, (req.prompt_len - 1) // bs)
        computed = len(hit) * bs
        if not req.preemptions:
            # the first tier holding blocks past the local hit serves them (vLLM's
            # MultiConnector picks the first child with new matched tokens)
            tier, more = next(((t, n - len(hit)) for t, n in req.tier_hits if n > len(hit)),
                              (None, 0))
            if tier is not None:
                if not self._take_hit(req, hit, computed + more * bs):
                    return False
                req.tier_hits = [(tier, more)]
                return LOADING
        n = min(tokens, req.prompt_len + req.generated - computed)
        return self._take_hit(req, hit, computed + n)

    def _take_hit(self, req: Req, hit: list[int], tokens: int) -> bool:
        """The request takes its cached blocks `hit` and blocks for `tokens` tokens in all;
        False, with nothing taken, when they do not fit."""
        need = (-(-tokens // self.block_size) - len(hit) + self.k.state_blocks_per_request
                + self.pool.free_among(hit))
        if need > self.pool.num_free:
            return False
        self.pool.touch(hit)
        req.block_ids = list(hit)
        req.cached_blocks = len(hit)
        req.computed = len(hit) * self.block_size
        self._alloc(req, tokens)
        return True

    def _admit_remote(self, req: Req) -> bool:
        """A decode's request with do_remote_prefill: its own prefix-cache hit first, then
        blocks for the whole prompt; the pull brings only the tokens past the hit (vLLM asks
        NixlConnector for the tokens past the local hit). A hybrid model's prefill stops one
        token short (vLLM's prefill backoff): with the hit reaching there, nothing is pulled
        and the prefill is only told to free its blocks."""
        hit = self.pool.longest_hit(req.hashes, (req.prompt_len - 1) // self.block_size)
        if not self._take_hit(req, hit, req.prompt_len):
            return False
        backoff = 1 if self.k.state_blocks_per_request else 0
        req.external = max(0, req.prompt_len - backoff - req.computed)
        return True

    def _cache_blocks(self, req: Req, tokens: int) -> None:
        """Name the request's blocks that `tokens` computed prompt tokens fill (vLLM caches
        them when they are scheduled, so a request admitted next step can hit them)."""
        full = min(tokens // self.block_size, len(req.hashes), len(req.block_ids))
        pool = self.pool
        for i in range(req.cached_blocks, full):
            pool.cache(req.block_ids[i], req.hashes[i])
        req.cached_blocks = max(req.cached_blocks, full)

    def _free(self, req: Req) -> None:
        self.pool.release(req.block_ids)
        self.pool.release(req.state_ids)
        req.block_ids = []
        req.state_ids = []
        req.cached_blocks = 0

    def block_ids(self, req: Req) -> list[list[int]]:
        # The request's blocks (one KV-cache group); the decode reads only their count.
        return [req.block_ids + req.state_ids]

    # ----- the scheduler loop --------------------------------------------------------------
    async def _loop(self) -> None:
        speed = self.k.speed
        busy = False
        while True:
            now = time.time()
            if self.held:
                self._expire_held(now)
            if not (self.waiting or self.ready or self.running):
                self.wake.clear()
                timeout = None
                if self.held:
                    timeout = max(0.05, next(iter(self.held.values())).hold_until - now)
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout)
                except TimeoutError:
                    pass
                self._last_step_end = time.time()
                busy = False
                continue
            now = time.time()
            # Back-to-back steps follow a virtual clock: a step starts when the previous one
            # was due to end, so the scheduler's own CPU time overlaps the modelled GPU time
            # (as with async scheduling) and timer overshoot (~1 ms) is caught up on the next
            # step. A backlog beyond half a step means the sim is CPU-bound: restart.
            if busy and now - self._virtual_end < max(_MAX_DEBT_S, self._last_dur / 2):
                step_start = self._virtual_end
            else:
                step_start = now
            scheduled, prefill_tokens, decode_seqs, ctx = self._schedule(now)
            if not scheduled:
                # Nothing fits (all blocks held or fetching): wait for a release.
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.05)
                except TimeoutError:
                    pass
                busy = False
                continue
            dur_ms = (self.k.step_base_ms + decode_seqs * self.k.decode_per_seq_ms
                      + ctx / 1000.0 * self.k.decode_per_ktoken_ms
                      + prefill_tokens * 1000.0 / self.k.prefill_tokens_per_s)
            self._last_dur = dur_ms / 1000.0 / speed
            self._virtual_end = step_start + self._last_dur
            await asyncio.sleep(max(0.0, self._virtual_end - time.time()))
            self._complete(scheduled, prefill_tokens + decode_seqs)
            busy = True

    def _schedule(self, now: float) -> tuple[list[tuple[Req, int]], int, int, int]:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Req, int]] = []
        prefill_tokens = 0
        decode_seqs = 0
        ctx = 0
        preempted = False
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            target = req.prompt_len + req.generated
            n = min(target - req.computed, budget)
            # a decode step also holds slots for its draft tokens (vLLM's lookahead slots)
            drafts = self.spec if req.computed >= req.prompt_len else 0
            while not self._alloc(req, req.computed + n + drafts):
                victim = running.pop()  # newest request is preempted (recompute)
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n + drafts
                if req.computed >= req.prompt_len:
                    decode_seqs += 1
                    ctx += req.computed
                else:
                    prefill_tokens += n
                    self._cache_blocks(req, req.computed + n)
                i += 1
                continue
            break
        if preempted:
            return scheduled, prefill_tokens, decode_seqs, ctx
        # KV pulled from a prefill (the last prompt token is computed here) or loaded from a
        # tier (the rest of the prompt is, in chunks)
        while self.ready and budget > 0 and len(running) < cfg.max_num_seqs:
            req = self.ready[0]
            n = min(req.prompt_len - req.computed, budget)
            if not self._alloc(req, req.computed + n):
                break
            self.ready.popleft()
            req.stage = NO_FETCH
            req.scheduled = req.scheduled or now
            running.append(req)
            scheduled.append((req, n))
            budget -= n
            prefill_tokens += n
            self._cache_blocks(req, req.computed + n)
        waiting = self.waiting
        lookups = [0, 0, 0]  # this step's (requests, queried tokens, hit tokens)
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            req = waiting[0]
            if req.stage == FETCH_WAITING:
                # The local hit, blocks for the whole prompt, then the pull of the rest
                # (no compute budget).
                if not self._admit_remote(req):
                    break
                waiting.popleft()
                self._count_lookup(req, lookups)
                self._start_pull(req)
                continue
            admitted = self._admit_cached(req, budget)
            if not admitted:
                break
            waiting.popleft()
            self._count_lookup(req, lookups)
            if admitted == LOADING:
                self._start_load(req)
                continue
            n = min(req.prompt_len + req.generated - req.computed, budget)
            if req.scheduled is None:
                req.scheduled = now
            running.append(req)
            scheduled.append((req, n))
            budget -= n
            prefill_tokens += n
            self._cache_blocks(req, req.computed + n)
        if lookups[0]:
            self._observe_lookups(*lookups)
        return scheduled, prefill_tokens, decode_seqs, ctx

    def _count_lookup(self, req: Req, lookups: list[int]) -> None:
        """A prefix-cache lookup at admission, counted as vLLM counts it: only with prefix
        caching on, and a preempted request's repeat lookup is not counted."""
        if not self.pool.caching or req.preemptions:
            return
        req.local_hit = req.computed
        c = self.stats.counters
        c["vllm:prefix_cache_queries"] += req.prompt_len
        c["vllm:prefix_cache_hits"] += req.local_hit
        c["vllm:prompt_tokens_cached_by_source|device"] += req.local_hit
        lookups[0] += 1
        lookups[1] += req.prompt_len
        lookups[2] += req.local_hit

    def _preempt(self, req: Req) -> None:
        self._free(req)
        req.computed = 0
        req.preemptions += 1
        self.stats.inc("vllm:num_preemptions")
        self.interval.preemptions += 1
        self.waiting.appendleft(req)

    def _start_load(self, req: Req) -> None:
        self.fetching.add(req)
        asyncio.get_running_loop().create_task(self._run_load(req))

    async def _run_load(self, req: Req) -> None:
        """Load the blocks a tier holds past the local hit (vLLM's load_async: the request
        waits for them, then computes the rest of its prompt)."""
        [(tier, more)] = req.tier_hits
        first = req.computed // self.block_size
        got = await tier.load(self.stats, req.hashes[first:first + more])
        self.fetching.discard(req)
        if req.finished:  # aborted meanwhile
            self._free(req)
            return
        if got < more and self.cfg.kv_load_failure_policy == "fail":
            vlog.warning("scheduler.py:3764", "Failing 1 request(s) due to KV load failure "
                         f"(failure_policy=fail, {req.prompt_len} tokens affected). "
                         f"Request IDs: ['{req.id}']", proc="EngineCore_DP0")
            req.error = f"KV load from {tier.name} failed"
            self._finish(req, "error", time.time())
            self.wake.set()
            return
        req.external = got * self.block_size  # 'recompute': what arrived whole is kept
        req.ext_source = tier.source
        req.computed += req.external
        req.stage = FETCH_DONE
        self.ready.append(req)
        self.wake.set()

    def _start_pull(self, req: Req) -> None:
        req.stage = FETCH_RUNNING
        self.fetching.add(req)
        asyncio.get_running_loop().create_task(self._run_pull(req))

    async def _run_pull(self, req: Req) -> None:
        try:
            if self.pull is None:
                raise KVTransferError("no KV connector")
            await self.pull(self, req)
        except KVTransferError as exc:
            self.fetching.discard(req)
            self.stats.inc("vllm:nixl_num_failed_transfers")
            self.interval.failed += 1
            # the connector's and the scheduler's lines, as vLLM 0.33 logs a failed read
            # with kv_load_failure_policy fail (docs/log-signals.md)
            vlog.error("base_worker.py:1377", f"NIXL transfer failure: transfer_failed | "
                       f"Context: {{'failure_type': 'transfer_failed', 'request_id': "
                       f"'{req.id}', 'error': '{exc}'}}", proc="EngineCore_DP0")
            vlog.warning("scheduler.py:3764", "Failing 1 request(s) due to KV load failure "
                         f"(failure_policy=fail, {req.prompt_len} tokens affected). "
                         f"Request IDs: ['{req.id}']", proc="EngineCore_DP0")
            if not req.finished:  # not aborted meanwhile
                req.error = f"KV transfer failed: {exc}"
                self._finish(req, "error", time.time())
            self.wake.set()
            return
        self.fetching.discard(req)
        if req.finished:  # aborted meanwhile
            self._free(req)
            return
        # the last prompt token is computed here, whatever arrived (vLLM recomputes it)
        req.computed = min(req.prompt_len - 1, req.computed + req.external)
        req.stage = FETCH_DONE
        self.ready.append(req)
        self.wake.set()

    def record_transfer(self, xfer_s: float, post_s: float, nbytes: int, descs: int) -> None:
        st = self.stats.hists
        st["vllm:nixl_xfer_time_seconds"].observe(xfer_s)
        st["vllm:nixl_post_time_seconds"].observe(post_s)
        st["vllm:nixl_bytes_transferred"].observe(nbytes)
        st["vllm:nixl_num_descriptors"].observe(descs)
        if not self.cfg.stats_logging:
            return  # nobody takes the interval: do not let its lists grow
        iv = self.interval
        iv.xfer_s.append(xfer_s)
        iv.post_s.append(post_s)
        iv.bytes.append(nbytes)
        iv.descs.append(descs)

    def _complete(self, scheduled: list[tuple[Req, int]], total_tokens: int) -> None:
        now = time.time()
        stats = self.stats
        itl = now - self._last_step_end
        self._last_step_end = now
        stats.hists["vllm:iteration_tokens_total"].observe(total_tokens)
        interval = self.interval
        decoded = 0
        gen = 0
        finished = False
        zero = self.k.zero_tokens
        stream_interval = self.cfg.stream_interval
        for req, n in scheduled:
            if req.finished:
                continue
            if req.computed < req.prompt_len:
                interval.prompt_tokens += min(n, req.prompt_len - req.computed)
                req.computed += n
                if self.saving:
                    self._save(req)
            else:
                req.computed += n
            if req.computed < req.prompt_len + req.generated:
                continue  # chunked prefill not done yet
            if req.first_token is None:
                req.first_token = now
                self._count_prompt(req, now)
                if zero:
                    req.last_token = now
                    self._finish(req, "stop", now)
                    finished = True
                    continue
            else:
                decoded += 1
            step = 1
            if self.spec and req.generated:  # a decode step: the target's token + accepted drafts
                step += self._accept(req.max_tokens - req.generated - 1)
                req.computed += step - 1
            req.generated += step
            gen += step
            req.last_token = now
            g = req.generated
            if g >= req.max_tokens:
                self._finish(req, "length", now)
                finished = True
            elif req.stop_after is not None and g >= req.stop_after:
                self._finish(req, "stop", now)
                finished = True
            elif g == 1 or g % stream_interval == 0:
                req.event.set()
        if decoded:
            stats.hists["vllm:inter_token_latency_seconds"].observe(itl, decoded)
        stats.counters["vllm:generation_tokens"] += gen
        interval.gen_tokens += gen
        if finished:
            self.running = [r for r in self.running if not r.finished]

    def _accept(self, room: int) -> int:
        """One draft of self.spec tokens verified: how many are accepted (a run from the
        first, each at SIM_SPEC_ACCEPT), at most `room` (tokens left to generate)."""
        accepted = 0
        while accepted < self.spec and self._draws.random() < self.k.spec_accept:
            accepted += 1
        accepted = max(0, min(accepted, room))
        c = self.stats.counters
        c["vllm:spec_decode_num_drafts"] += 1
        c["vllm:spec_decode_num_draft_tokens"] += self.spec
        c["vllm:spec_decode_num_accepted_tokens"] += accepted
        for pos in range(accepted):
            c[f"{SPEC_PER_POS}|{pos}"] += 1
        if self.cfg.stats_logging:
            iv = self.interval
            iv.spec_drafts += 1
            iv.spec_draft_tokens += self.spec
            iv.spec_accepted += accepted
            if len(iv.spec_accepted_per_pos) < self.spec:
                iv.spec_accepted_per_pos = [0] * self.spec
            for pos in range(accepted):
                iv.spec_accepted_per_pos[pos] += 1
        return accepted

    @property
    def saving(self) -> bool:
        return any(t.can_save for t in self.tiers)

    def _save(self, req: Req) -> None:
        """Hand the prompt's newly computed full blocks to the tiers that keep them (vLLM's
        connectors save as the forward pass writes them)."""
        full = min(req.computed // self.block_size, len(req.hashes))
        if full <= req.saved_blocks:
            return
        new = req.hashes[req.saved_blocks:full]
        req.saved_blocks = full
        for tier in self.tiers:
            if tier.can_save:
                tier.save(self.stats, new)

    def _count_prompt(self, req: Req, now: float) -> None:
        st = self.stats
        c = st.counters
        ext = req.external
        local = req.local_hit
        c["vllm:prompt_tokens"] += req.prompt_len
        c["vllm:prompt_tokens_by_source|local_compute"] += req.prompt_len - ext - local
        c["vllm:prompt_tokens_by_source|local_cache_hit"] += local
        c["vllm:prompt_tokens_by_source|external_kv_transfer"] += ext
        c["vllm:prompt_tokens_cached"] += ext + local
        c[f"vllm:prompt_tokens_cached_by_source|{req.ext_source}"] += ext
        if self.cfg.kv_connector:
            # vLLM's scheduler asks the connector about every new request, on the producer
            # too (no hits there): both print "External prefix cache hit rate". It asks for
            # the tokens past the local hit (scheduler.py:1211).
            asked = req.prompt_len - local
            c["vllm:external_prefix_cache_queries"] += asked
            c["vllm:external_prefix_cache_hits"] += ext
            self._ext_window.append((asked, ext))
        st.hists["vllm:time_to_first_token_seconds"].observe(now - req.arrival)

    def _finish(self, req: Req, reason: str, now: float) -> None:
        req.finished = reason
        st = self.stats
        st.counters[f"vllm:request_success|{reason}"] += 1
        if reason not in ("abort", "error"):
            h = st.hists
            g = req.generated
            sched = req.scheduled or req.arrival
            first = req.first_token or now
            last = req.last_token or now
            h["vllm:request_prompt_tokens"].observe(req.prompt_len)
            h["vllm:request_generation_tokens"].observe(g)
            h["vllm:request_max_num_generation_tokens"].observe(req.max_tokens)
            h["vllm:request_params_n"].observe(req.n)
            h["vllm:request_params_max_tokens"].observe(req.max_tokens)
            h["vllm:e2e_request_latency_seconds"].observe(now - req.arrival)
            h["vllm:request_queue_time_seconds"].observe(sched - req.queued)
            h["vllm:request_inference_time_seconds"].observe(last - sched)
            h["vllm:request_prefill_time_seconds"].observe(first - sched)
            h["vllm:request_decode_time_seconds"].observe(last - first)
            tpot = (last - first) / (g - 1) if g > 1 else 0.0
            h["vllm:request_time_per_output_token_seconds"].observe(tpot)
            h["vllm:request_num_preemptions"].observe(req.preemptions)
            cached = req.local_hit + req.external
            theirs = (req.remote or {}).get("remote_prefill_cached_tokens")
            if isinstance(theirs, int):
                cached = max(theirs, 0)  # a decode reports its prefill's cached tokens
            h["vllm:request_prefill_kv_computed_tokens"].observe(req.prompt_len - cached)
        if req.remote_decode and reason in ("length", "stop"):
            # Producer: keep the blocks until the decode reads them or the lease runs out.
            req.kv_params = self._kv_params(req)
            req.hold_until = now + self.cfg.kv_lease_s
            self.held[req.id] = req
        else:
            self._free(req)
        req.event.set()

    def _kv_params(self, req: Req) -> dict[str, Any]:
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": self.block_ids(req),
            "remote_engine_id": self.engine_id,
            "remote_request_id": req.id,
            "remote_host": self.side_channel_host,
            "remote_port": self.side_channel_port,
            "tp_size": self.cfg.tp_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": req.prompt_len,
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": req.local_hit + req.external,
        }

    # ----- stats log interval --------------------------------------------------------------
    def take_interval(self) -> tuple[Interval, float]:
        iv = self.interval
        now = time.time()
        self.interval = Interval(start=now)
        elapsed = max(1e-9, now - iv.start)
        self.interval.last_prompt_tp = iv.prompt_tokens / elapsed
        self.interval.last_gen_tp = iv.gen_tokens / elapsed
        return iv, elapsed


def _fraction(key: str) -> float:
    """A deterministic number in [0, 1) from a string (same on every host and run)."""
    return (zlib.crc32(key.encode()) & 0xFFFFFFFF) / 2**32


def transfer_cost(cfg: SimConfig, num_tokens: int) -> tuple[float, float, int, int]:
    """(xfer seconds, post seconds, bytes, descriptors) of pulling num_tokens of KV."""
    k = cfg.knobs
    nbytes = num_tokens * k.kv_bytes_per_token + k.kv_state_bytes
    post = k.kv_post_ms / 1000.0
    xfer = post + nbytes / (k.kv_bandwidth_gbps * 1e9)
    blocks = max(1, math.ceil(num_tokens / cfg.block_size))
    descs = blocks * 60  # one descriptor per block and layer (60 layers)
    return xfer, post, nbytes, descs


__all__ = ["CACHED_SOURCES", "Engine", "KVTransferError", "Req", "transfer_cost"]
