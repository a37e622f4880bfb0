"""Bounded load test of `eaglechat serve` on loopback: N concurrent streaming clients for D seconds.

Every stream is checked for the OpenAI shape (one id, role first, exactly one finish_reason, a usage
chunk whose completion_tokens is positive, `data: [DONE]` last); the server's resident memory is
sampled before, during and after. Prints one JSON object.

    python scripts/load_test.py                      # the default model, 8 clients, 60 s
    python scripts/load_test.py --clients 8 --seconds 60 --max-tokens 32
    python scripts/load_test.py --url http://HOST:PORT   # a server that is already running (RSS not sampled)

The server runs as its own process (`eaglechat serve`), so the RSS figures are the server's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent

PROMPTS = ["Write a haiku about eagles.", "Explain what a KV cache is in two sentences.",
           "List three uses of speculative decoding.", "What is the capital of France? Answer briefly.",
           "Give me a short tip for writing clear Python.", "Describe the sea in one sentence.",
           "Why is the sky blue? One paragraph.", "Name two prime numbers and say why they are prime."]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def check_stream(lines: list[str]) -> tuple[int, str]:
    """-> (completion tokens, "" when well formed else what is wrong)."""
    data = [line[6:] for line in lines if line.startswith("data: ")]
    if not data or data[-1] != "[DONE]":
        return 0, "no [DONE] at the end"
    try:
        chunks = [json.loads(d) for d in data[:-1]]
    except ValueError:
        return 0, "an event is not JSON"
    if any("error" in c for c in chunks):
        return 0, f"error event: {chunks[-1].get('error')}"
    if len({c.get("id") for c in chunks}) != 1:
        return 0, "more than one id"
    if not chunks[0]["choices"] or chunks[0]["choices"][0]["delta"].get("role") != "assistant":
        return 0, "the first delta has no role"
    finishes = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    if len(finishes) != 1 or finishes[0]["choices"][0]["finish_reason"] not in ("stop", "length"):
        return 0, "not exactly one finish_reason"
    usage = chunks[-1].get("usage") if not chunks[-1]["choices"] else None
    if not usage or usage.get("completion_tokens", 0) < 1:
        return 0, "no usage chunk"
    return usage["completion_tokens"], ""


def one_request(http: httpx.Client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}]}
    start = time.perf_counter()
    first = None
    try:
        with http.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            lines = []
            for line in r.iter_lines():
                if first is None and '"content": "' in line and '"content": ""' not in line:
                    first = time.perf_counter()
                lines.append(line)
            status = r.status_code
    except httpx.HTTPError as exc:
        return {"ok": False, "why": f"{type(exc).__name__}: {exc}"}
    tokens, why = check_stream(lines) if status == 200 else (0, f"HTTP {status}")
    return {"ok": not why, "why": why, "tokens": tokens, "latency_s": time.perf_counter() - start,
            "ttft_s": (first - start) if first else None}


def client_loop(url: str, model: str, index: int, deadline: float, max_tokens: int, results: list, lock) -> None:
    with httpx.Client(timeout=httpx.Timeout(300, connect=10)) as http:
        n = 0
        while time.monotonic() < deadline:
            result = one_request(http, url, model, PROMPTS[(index + n) % len(PROMPTS)], max_tokens)
            n += 1
            with lock:
                results.append(result)


def start_server(model: str, max_queue: int) -> tuple[subprocess.Popen, str]:
    """`eaglechat serve` as its own process (so its memory is the server's alone) on a free port."""
    proc = subprocess.Popen([sys.executable, "-m", "eaglechat", "serve", model, "--port", "0", "--device", "cpu",
                             "--quant", "none", "--max-queue", str(max_queue)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    for line in proc.stderr:
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain the rest
            return proc, m.group(1)
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-eagle2")
    p.add_argument("--url", help="an already running server (default: start one in this process)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()

    server, model = None, args.model
    if args.url:
        url = args.url.rstrip("/").removesuffix("/v1")
    else:
        server, url = start_server(args.model, max_queue=max(16, args.clients))
    with httpx.Client(timeout=300) as http:  # every prompt once: caches and allocator have seen each shape
        warm = [one_request(http, url, model, prompt, args.max_tokens) for prompt in PROMPTS]
    if not all(r["ok"] for r in warm):
        raise SystemExit(f"warm-up failed: {[r['why'] for r in warm if not r['ok']]}")
    rss = [rss_mib(server.pid)] if server else []
    results, lock = [], threading.Lock()
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=client_loop, args=(url, model, i, deadline, args.max_tokens, results, lock))
               for i in range(args.clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(5)
        if server:
            rss.append(rss_mib(server.pid))
    wall = time.monotonic() - started
    metrics = httpx.get(f"{url}/metrics").text
    if server:
        rss.append(rss_mib(server.pid))
        server.send_signal(signal.SIGINT)
        server.wait(30)
    ok = [r for r in results if r["ok"]]
    latencies = sorted(r["latency_s"] for r in ok)
    ttfts = sorted(r["ttft_s"] for r in ok if r["ttft_s"] is not None)
    report = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "model": model, "clients": args.clients, "seconds": args.seconds, "max_tokens": args.max_tokens,
        "requests": len(results), "complete_and_well_formed": len(ok),
        "failed": [r["why"] for r in results if not r["ok"]][:10], "wall_s": round(wall, 1),
        "tokens": sum(r["tokens"] for r in ok), "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
        "latency_s_p50": round(statistics.median(latencies), 2) if latencies else None,
        "latency_s_p95": round(latencies[int(0.95 * (len(latencies) - 1))], 2) if latencies else None,
        "ttft_s_p50": round(statistics.median(ttfts), 2) if ttfts else None,
        "rss_mib_before": round(rss[0], 1) if rss else None, "rss_mib_after": round(rss[-1], 1) if rss else None,
        "rss_mib_samples": [round(x) for x in rss],
    }
    if metrics:
        report["server_requests_incl_warmup"] = {line.split('finished_reason="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                                     for line in metrics.splitlines() if line.startswith("eaglechat:request_success")}
    print(json.dumps(report, indent=1))
    return 0 if len(ok) == len(results) and results else 1


if __name__ == "__main__":
    raise SystemExit(main())
