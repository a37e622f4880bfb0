"""`eaglechat run MODEL [PROMPT]`: one reply to stdout (PROMPT `-` or absent: read stdin).

A reasoning model's thinking (a `<think>` block, gpt-oss's harmony analysis channel) streams to stderr
between "Thinking..." and "...done thinking." as `ollama run` frames it (cmd/cmd.go), dimmed on a terminal;
stdout gets only the answer, so `eaglechat run ... > file` keeps the answer alone. Ollama prints both to
stdout; stderr here is what lets a redirect or a pipe take the answer without the reasoning."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from eaglechat.commands.common import (
    add_model_flags,
    add_remote_flags,
    add_sampling_flags,
    add_tree_flags,
    api_key,
    load_request,
    sampling_given,
)
from eaglechat.engine.protocol import Speculate
from eaglechat.fit.exactness import exactness, is_token_exact
from eaglechat.fit.memory import format_for
from eaglechat.models import sampling as sampling_defaults


def register(sub) -> None:
    p = sub.add_parser("run", help="one-shot reply to stdout", description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="catalog alias, or a local Hugging Face folder; with --remote the server's model id "
                        "(optional: its first model; a single argument that is not one of its models is the prompt)")
    p.add_argument("prompt", nargs="?", default="-", help="the prompt; '-' (default) reads stdin")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--no-speculate", action="store_true", help="plain decoding, one token per forward (the baseline)")
    p.add_argument("--speculate", choices=("on", "off", "auto"), default="auto",
                   help="auto (default, as in the chat and the server): step by step, whichever of plain decoding "
                        "and a few tree budgets this machine measures faster; on: EAGLE draft trees at every step; "
                        "off: as --no-speculate (all emit the same tokens)")
    add_sampling_flags(p, max_new_tokens=256, model_defaults=True)
    p.add_argument("--verbose", action="store_true", help="statistics to stderr")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout (a reasoning model's thinking in its own `reasoning` field)")
    p.add_argument("--hide-thinking", action="store_true",
                   help="drop a reasoning model's thinking (printed to stderr by default; --json's `reasoning`)")
    add_model_flags(p)
    add_tree_flags(p)
    add_remote_flags(p)
    p.add_argument("--no-resident", action="store_true",
                   help="load the model here even when a local `eaglechat serve` of it is running (by default "
                        "such a resident engine answers, when it was started with the same load options)")
    p.set_defaults(func=run)


def read_prompt(prompt: str) -> str:
    from eaglechat.errors import UsageError

    if prompt == "-":
        if sys.stdin.isatty():
            raise UsageError("no prompt: pass PROMPT or pipe it on stdin")
        prompt = read_stdin()
    if not prompt.strip():
        raise UsageError("empty prompt")
    return prompt


def read_stdin() -> str:
    """All of stdin as UTF-8 text; bytes that are not UTF-8 are one line, not a traceback."""
    from eaglechat.errors import UsageError

    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 4]!r})") from None


def stats_line(stats, info) -> str:
    from eaglechat.units import fmt_bytes

    budget = f"tree {stats.budget.label()}" if stats.tree else "no speculation"
    if stats.speculation:
        budget += f" ({stats.speculation})"
    return (
        f"{stats.new_tokens} tokens in {stats.elapsed_s:.2f} s ({stats.tokens_per_s:.1f} tok/s, "
        f"decode {stats.decode_tokens_per_s:.1f} tok/s) | tau {stats.mean_accepted:.2f} over "
        f"{stats.target_forwards} target forwards | {budget} | prefill {stats.prefill_tokens} tokens "
        f"{stats.prefill_s:.2f} s | {info.device} {info.dtype} quant {info.quant} | "
        f"{fmt_bytes(info.memory_bytes)}" + (f" | {stats.steps_note()}" if stats.steps_note() else "")
    )


def remote_stats_line(stats, info) -> str:
    spec = "no speculation reported"
    if stats.speculate and stats.mean_accepted:
        scope = "server-wide" if stats.server_wide else "this request"
        rate = f", {stats.draft_acceptance_rate:.0%} of draft tokens accepted" if stats.draft_acceptance_rate else ""
        spec = f"tau {stats.mean_accepted:.2f}{rate} ({scope})"
    first = f", time to first token {stats.ttft_s:.2f} s" if stats.ttft_s else ""
    return (f"{stats.new_tokens} tokens in {stats.elapsed_s:.2f} s ({stats.tokens_per_s:.1f} tok/s{first}; measured here) | "
            f"{spec} | {info.server} at {info.endpoint}")


def open_remote(args):
    """--remote: the engine, and the prompt (a lone positional that is not a served model is the prompt)."""
    from eaglechat.engine.remote import RemoteEngine

    engine = RemoteEngine(args.remote, api_key=api_key(args), stream=not args.json)
    model, prompt = args.model, args.prompt
    if model is not None and prompt == "-" and model not in engine.model_ids:
        model, prompt = None, model
    engine.use(model)
    return engine, prompt


def resident_engine(args):
    """A RemoteEngine on the local `eaglechat serve` that holds this model as this run would load it, saying so
    on stderr; None when there is none (commands/resident.py). Nothing here imports torch."""
    from eaglechat import resident
    from eaglechat.commands.common import resident_options

    found = resident.find(args.model, resident_options(args, speculate=not args.no_speculate), api_key(args))
    if found is None:
        return None
    from eaglechat.engine.remote import RemoteEngine

    engine = RemoteEngine(found.url, model=found.served, api_key=found.api_key, stream=not args.json)
    print(f"eaglechat: answered by {found.describe()}; --no-resident loads the model here", file=sys.stderr,
          flush=True)
    return engine


def progress_printer(verbose: bool, stream):
    """What `run` says while it loads: every phase with --verbose; otherwise, on a terminal, only the one-off
    steps that come without a fraction (fetching and converting the default model on a first run: a minute
    or two that would otherwise pass under a bare progress bar). A pipe gets nothing."""

    def progress(phase, fraction=None):
        if verbose or (fraction is None and stream.isatty()):
            print(f"[{phase}]" if verbose else f"eaglechat: {phase}", file=stream, flush=True)

    return progress


def run(args: argparse.Namespace) -> int:
    from eaglechat.engine.protocol import GenerationParams
    from eaglechat.errors import UsageError
    from eaglechat.loader import load_engine

    engine = None
    if args.remote:
        engine, prompt = open_remote(args)
        prompt = read_prompt(prompt)
    elif args.model is None:
        raise UsageError("MODEL is required (or --remote URL)")
    else:
        prompt = read_prompt(args.prompt)
    if args.no_speculate:
        args.speculate = "off"
    args.no_speculate = args.speculate == "off"

    progress = progress_printer(args.verbose, sys.stderr)
    if engine is None and not args.no_resident:
        engine = resident_engine(args)
    if engine is None:
        engine = load_engine(args.model, load_request(args), progress=progress)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": prompt}
    ]
    # --speculate on speculates at every step whatever the profile or tune says (auto, the default, decides
    # by measurement); --verbose says when they differ
    forced = args.verbose and args.speculate == "on" and engine.info.head
    if forced and engine.info.speculate_by_default is Speculate.OFF:
        print("[note: the profile sets speculate: false (the chat and the server decode plainly); "
              "--no-speculate decodes plainly]", file=sys.stderr, flush=True)
    elif forced and engine.info.tuned_speculate is False:
        print("[note: `eaglechat tune` measured plain decoding faster than speculation on this machine; "
              "--speculate auto measures both while decoding and keeps the faster, --no-speculate decodes "
              "plainly]", file=sys.stderr, flush=True)
    fmt = format_for(engine.info.quant, engine.info.dtype)
    if args.verbose and not args.no_speculate and engine.info.head and not engine.info.server and not is_token_exact(fmt):
        print(f"[exact: {fmt}: {exactness(fmt)}]", file=sys.stderr, flush=True)
    given = sampling_given(args)
    params = sampling_defaults.fill(GenerationParams(
        **given, max_new_tokens=args.max_new_tokens, seed=args.seed,
        speculate=Speculate(args.speculate),
    ), engine.info.sampling, given)
    if args.verbose and engine.info.sampling_source and params.temperature > 0:
        print(f"[sampling: {sampling_defaults.describe(dataclasses.asdict(params))}; the model's own "
              f"({engine.info.sampling_source}) where not given; --temperature 0 is greedy]", file=sys.stderr, flush=True)
    opened = prompt_opens_thinking(engine, messages)
    final = stream_reply(engine, messages, params, args, opened)
    if args.json:
        print(json.dumps(json_reply(engine, final, opened, args.hide_thinking)))
    if final.message:
        print(f"eaglechat: {final.message}", file=sys.stderr)
    if args.verbose:
        line = remote_stats_line if engine.info.server else stats_line
        print(line(final.stats, engine.info), file=sys.stderr)
    return 0


def prompt_opens_thinking(engine, messages: list[dict]) -> bool:
    """The rendered prompt ends inside an opened `<think>` block (DeepSeek-R1's template), so the reply
    carries only the close; as the server reads it (server/core.py). A remote engine renders its own: an
    eaglechat server's card says whether its template opens the block (server/thinking.py)."""
    from eaglechat.chat.reasoning import OPEN

    encode, tokenizer = getattr(engine, "encode", None), getattr(engine, "tokenizer", None)
    if encode is None or tokenizer is None:
        return getattr(engine, "reasoning_opened", False)
    return tokenizer.decode(encode(messages)[-16:]).rstrip().endswith(OPEN)


def stream_reply(engine, messages: list[dict], params, args, opened: bool):
    """Generates, streaming the answer to stdout and the reasoning to stderr (unless --json); the Finished event."""
    from eaglechat.engine.protocol import Finished, TextDelta

    printer = None if args.json else ReplyPrinter(opened, show=not args.hide_thinking)
    final, start, first_text_s = None, time.perf_counter(), 0.0
    for event in engine.generate(messages, params):
        if isinstance(event, TextDelta):
            first_text_s = first_text_s or (time.perf_counter() - start if event.text else 0.0)
            if printer is not None:
                printer.feed(event.text)
        elif isinstance(event, Finished):
            final = event
    if printer is not None:
        printer.close()
    if not final.stats.ttft_s:  # a local engine: what this command waited for its first text (prefill included)
        final.stats.ttft_s = round(first_text_s, 4)
    return final


def json_reply(engine, final, opened: bool, hide_thinking: bool) -> dict:
    """--json's object: `text` is the answer; a reasoning model's thinking is `reasoning` (absent when there
    was none or --hide-thinking, as Ollama's `thinking`); `token_ids` are the whole reply's."""
    from eaglechat.chat.reasoning import ReasoningStream

    stream = ReasoningStream(opened)
    parts = [stream.feed(final.text), stream.flush()]
    reasoning, answer = ("".join(part[k] for part in parts) for k in (0, 1))
    out = {"model": engine.info.model, "text": answer}
    if reasoning and not hide_thinking:
        out["reasoning"] = reasoning
    return out | {"token_ids": final.token_ids, "stop_reason": final.stop_reason, "stats": final.stats.to_dict()}


class ReplyPrinter:
    """A reply as it streams: the answer to stdout, the reasoning to stderr framed as `ollama run` frames it
    ("Thinking...", the reasoning, "...done thinking.", cmd/cmd.go), dimmed when stderr is a terminal
    (NO_COLOR turns that off); `show=False` (--hide-thinking) drops the reasoning."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, opened: bool, show: bool = True, out=None, err=None):
        from eaglechat.chat.reasoning import ReasoningStream

        self.stream, self.show = ReasoningStream(opened), show
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.dim = self.err.isatty() and not os.environ.get("NO_COLOR")
        self.thinking = False  # the "Thinking..." block is open on stderr
        self.ends_line = True  # the reasoning printed so far ends with a newline

    def feed(self, delta: str) -> None:
        self.write(*self.stream.feed(delta))

    def close(self) -> None:
        self.write(*self.stream.flush())
        self.end_thinking(done=False)  # a reply cut off mid-thought: close the block, but it was not done
        self.out.write("\n")
        self.out.flush()

    def write(self, reasoning: str, answer: str) -> None:
        if reasoning and self.show:
            if not self.thinking:
                self.thinking = True
                self.err.write((self.DIM if self.dim else "") + "Thinking...\n")
            self.err.write(reasoning)
            self.ends_line = reasoning.endswith("\n")
            self.err.flush()
        if answer:
            self.end_thinking(done=True)
            self.out.write(answer)
            self.out.flush()

    def end_thinking(self, done: bool) -> None:
        if not self.thinking:
            return
        self.thinking = False
        end = ("" if self.ends_line else "\n") + ("...done thinking.\n\n" if done else "")
        self.err.write(end + (self.RESET if self.dim else ""))
        self.err.flush()
