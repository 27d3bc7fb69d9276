"""The request lengths a sweep sends, from one place: each length rule's bounds and moments.

`benchmark.range_ratio` means two things in the tools people compare against
(docs/workload.md):

- `sa-bench` (srt-slurm's sa-bench, SGLang's bench_serving, InferenceX): input uniform in
  `[int(r*L), L]`, output in `[int(r*OSL), OSL]`; with the chat template its tokens are
  inside L (the body is drawn from `L - T`, then the template's T tokens added back).
- `vllm` (`vllm bench serve --dataset-name random` since vLLM PR #16126): uniform in
  `[floor(n*(1-r)), ceil(n*(1+r))]`, n = L less the tokenizer's special tokens; outputs at
  least 1.

Both draw integers uniformly with both ends included. Stdlib only: the bench client, the
planner, the analysis and the report read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RULES = ("sa-bench", "vllm")
RULE_TEXT = {
    "sa-bench": "sa-bench's rule [r x L, L]",
    "vllm": "vLLM's rule [L(1-r), L(1+r)]",
}


@dataclass(frozen=True)
class Lengths:
    """Integer-uniform, independent input and output lengths (inclusive bounds); the input
    counts a shared prefix and the chat template where there is one."""

    input_low: int
    input_high: int
    output_low: int
    output_high: int

    @property
    def mean_input(self) -> float:
        return (self.input_low + self.input_high) / 2

    @property
    def mean_output(self) -> float:
        return (self.output_low + self.output_high) / 2

    @property
    def mean_total(self) -> float:
        return self.mean_input + self.mean_output

    @property
    def max_total(self) -> int:
        return self.input_high + self.output_high

    @property
    def in_flight_mean(self) -> float:
        """The context a running request holds on average at steady state: a request stays
        one step per output token, so it is seen with probability in proportion to its
        output length, at input + k tokens for k in 1..o (E[o(in + (o+1)/2)] / E[o])."""
        outs = range(self.output_low, self.output_high + 1)
        e_o = sum(outs) / len(outs)
        e_o2 = sum(o * o for o in outs) / len(outs)
        return self.mean_input + (e_o2 + e_o) / (2 * e_o)

    def contains(self, input_len: int, output_len: int) -> bool:
        return (self.input_low <= input_len <= self.input_high
                and self.output_low <= output_len <= self.output_high)

    def text(self) -> str:
        def span(lo: int, hi: int) -> str:
            return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"

        if (self.input_low, self.output_low) == (self.input_high, self.output_high):
            return (f"every input {self.input_low:,} and every output {self.output_low:,} "
                    "tokens exactly")
        return (f"inputs {span(self.input_low, self.input_high)}, outputs "
                f"{span(self.output_low, self.output_high)} tokens")

    def p_total_above(self, x: int) -> float:
        """P(input + output > x): for each output o the inputs above x - o number n_in
        (o >= x - input_low + 1), input_high - x + o (o in [x - input_high + 1,
        x - input_low]) or 0."""
        n_in = self.input_high - self.input_low + 1
        n_out = self.output_high - self.output_low + 1
        full_from = max(self.output_low, x - self.input_low + 1)
        count = n_in * max(0, self.output_high - full_from + 1)
        lo, hi = (
            max(self.output_low, x - self.input_high + 1),
            min(self.output_high, x - self.input_low),
        )
        if hi >= lo:  # sum of (input_high - x + o) for o in [lo, hi]
            count += (hi - lo + 1) * (self.input_high - x) + (lo + hi) * (hi - lo + 1) // 2
        return count / (n_in * n_out)

    def expected_blocks(self, block_size: int, ahead: int = 0) -> float:
        """E[ceil((input + output + ahead) / block_size)] = sum over k >= 0 of
        P(total + ahead > k x block) (`ahead`: speculative lookahead slots)."""
        return sum(
            self.p_total_above(k * block_size - ahead)
            for k in range((self.max_total + ahead) // block_size + 1)
        )

    def in_flight_blocks(self, block_size: int) -> float:
        """Blocks a running request holds on average at steady state (the time-weighted
        context of `in_flight_mean`, rounded up to blocks as vLLM allocates them)."""
        ctx = self.in_flight_mean
        return math.ceil(ctx / block_size) if ctx <= block_size else ctx / block_size + 0.5


def lengths(rule: str, input_len: int, output_len: int, range_ratio: float | dict, *,
            template_len: int = 0, special_tokens: int = 0, prefix_len: int = 0) -> Lengths:
    """The bounds `rule` draws from for ISL/OSL `input_len`/`output_len` and `range_ratio`.
    `template_len`: the chat template's own tokens (sa-bench counts them inside the input
    length); `special_tokens`: what vLLM's random dataset takes off the input first;
    `prefix_len`: a shared prefix before every prompt (vLLM's --random-prefix-len)."""
    if isinstance(range_ratio, dict):  # vLLM's {"input": r, "output": r}
        if rule != "vllm":
            raise ValueError("a range ratio per side is vLLM's form only")
        r_in, r_out = float(range_ratio["input"]), float(range_ratio["output"])
    else:
        r_in = r_out = float(range_ratio)
    r = r_in
    if rule == "sa-bench":
        if not 0 <= r <= 1:
            raise ValueError("sa-bench's range ratio must be in [0, 1]")
        body = max(1, input_len - template_len)
        return Lengths(
            input_low=prefix_len + template_len + max(1, int(body * r)),
            input_high=prefix_len + template_len + body,
            output_low=max(1, int(output_len * r)),
            output_high=max(1, output_len),
        )
    if rule == "vllm":
        if not (0 <= r_in < 1 and 0 <= r_out < 1):
            raise ValueError("vLLM's range ratio must be in [0, 1)")
        n = max(0, input_len - special_tokens)
        return Lengths(
            input_low=prefix_len + math.floor(n * (1 - r_in)),
            input_high=prefix_len + math.ceil(n * (1 + r_in)),
            output_low=max(1, math.floor(output_len * (1 - r_out))),
            output_high=max(1, math.ceil(output_len * (1 + r_out))),
        )
    raise ValueError(f"length rule {rule!r}: use {' or '.join(RULES)}")


def of_benchmark(b, template_len: int = 0) -> Lengths:
    """The lengths of a recipe's `benchmark` section (anything with input_len, output_len,
    range_ratio and length_rule)."""
    return lengths(getattr(b, "length_rule", "vllm"), b.input_len, b.output_len,
                   b.range_ratio, template_len=template_len)


def vllm_window(target: Lengths) -> tuple[int, int, float | dict[str, float]]:
    """(--random-input-len, --random-output-len, --random-range-ratio) for `vllm bench serve`
    whose windows lie inside `target`, as wide as they can be. vLLM's windows are symmetric
    about an integer (even widths), so a lower-bounded window of odd width comes one token
    narrower at its top; the ratio is a float when input and output share one, else vLLM's
    JSON form {"input": r, "output": r} (vLLM 0.32 and later)."""
    l_in, r_in = _side(target.input_low, target.input_high)
    l_out, r_out = _side(target.output_low, target.output_high)
    if r_in == r_out:
        return l_in, l_out, r_in
    # one ratio for both when one fits both windows exactly as wide
    for r in (r_in, r_out):
        got = lengths("vllm", l_in, l_out, r)
        if got == lengths("vllm", l_in, l_out, {"input": r_in, "output": r_out}):
            return l_in, l_out, r
    return l_in, l_out, {"input": r_in, "output": r_out}


def _side(lo: int, hi: int) -> tuple[int, float]:
    """(centre, ratio) of the widest window [c - h, c + h] inside [lo, hi] that vLLM's
    [floor(c(1-r)), ceil(c(1+r))] draws: ceil(c r) = h, so r in ((h-1)/c, h/c]."""
    h = (hi - lo) // 2
    c = lo + h
    if h == 0:
        return c, 0.0
    return c, _short_ratio((h - 1) / c, h / c)


def _short_ratio(lo: float, hi: float) -> float:
    """The ratio with the fewest decimals strictly inside (lo, hi], kept away from the ends
    where floor and ceil could tip over in floating point."""
    for digits in range(2, 12):
        step = 10.0 ** -digits
        r = round(math.floor(hi / step) * step, digits)
        if r >= hi:
            r = round(r - step, digits)
        if lo < r < hi and r - lo > 1e-9 and hi - r > 1e-9:
            return r
    return (lo + hi) / 2


def workload_text(b, chat_template: bool | None = None) -> str:
    """One line for a benchmark section: ISL/OSL, the rule and the bounds it draws from,
    and the prompts. `chat_template`: whether it is applied (None: as the recipe says)."""
    n = of_benchmark(b)
    rule = getattr(b, "length_rule", "vllm")
    line = (f"ISL/OSL {b.input_len}/{b.output_len} by {RULE_TEXT[rule]} at range ratio "
            f"{b.range_ratio:g}: {n.text()} (mean {n.mean_total:,.0f} per request, longest "
            f"{n.max_total:,})")
    asked = getattr(b, "chat_template", False)
    applied = asked if chat_template is None else chat_template
    if applied:
        line += "; prompts in the served model's chat template, its tokens inside the input"
    elif asked:
        line += ("; no chat template (a simulated engine has no tokenizer: prompts are ids, "
                 "the template's tokens counted inside the input)")
    return line
