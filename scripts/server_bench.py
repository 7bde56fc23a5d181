#!/usr/bin/env python3
"""Aggregate generation throughput of an OpenAI-compatible server.

C clients each send one `/v1/completions` request for N tokens at the same
moment (`ignore_eos`, greedy); a run's throughput is the completion tokens
of all clients divided by the wall time from the first send to the last
answer. Repetitions interleave the servers given (run one server at a time
on the machine's cores: idle servers do not spin). Prints a Markdown table
(median, min-max range, ratio to the FIRST server, KV entries per generated
token where the server reports them), or JSON with `--json`.

hamburger-server and llama.cpp's llama-server take the same request, so the
same script measures both (docs/performance.md, "Server throughput").

Usage: server_bench.py LABEL=URL [LABEL=URL ...] [--clients 1,4,8] [--n 128] [--reps 3] [--text-prompt | --long-prompt]
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request


def prompt_of(kind: str, i: int, burst: str):
    """Client `i`'s prompt: one token (llama-bench's tg), a short text (~25
    tokens) or a long one (~750 tokens, each client's and each burst's its
    own, so that no server reuses a cached prompt)."""
    if kind == "long":
        items = " ".join(f"item{i}_{j} is number {j * i + 7} in the long list of request {i};" for j in range(40))
        return f"Burst {burst}. {items}\nSummary:"
    return f"Request {i}: the history of the number {i * 7 + 3} is" if kind == "text" else [100 + i]


def one_request(url: str, n: int, i: int, out: list, kind: str, burst: str) -> None:
    body = {
        "prompt": prompt_of(kind, i, burst),
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=3600) as r:
        v = json.load(r)
    out[i] = v


def run(url: str, clients: int, n: int, kind: str = "token", burst: str = "warm-up") -> tuple[float, list]:
    answers: list = [None] * clients
    threads = [threading.Thread(target=one_request, args=(url, n, i, answers, kind, burst)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - t
    if any(a is None for a in answers):
        raise SystemExit("a request failed")
    tokens = sum(a["usage"]["completion_tokens"] for a in answers)
    return tokens / seconds, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("servers", nargs="+", metavar="LABEL=URL")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--text-prompt", action="store_true", help="a short text prompt instead of one token")
    ap.add_argument("--long-prompt", action="store_true", help="a prompt of about 750 tokens instead of one token")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    kind = "long" if a.long_prompt else "text" if a.text_prompt else "token"
    servers = [tuple(s.rsplit("=", 1)) for s in a.servers]
    for _, url in servers:
        run(url, 1, 8)  # warm-up
    rows = []
    for c in [int(x) for x in a.clients.split(",")]:
        rates: dict = {label: [] for label, _ in servers}
        kv: dict = {}
        # Repetitions interleave the servers, so the machine's drift hits each alike.
        for rep in range(a.reps):
            for label, url in servers:
                # Each burst its own prompts: a client count's bursts never repeat another's.
                rate, answers = run(url, c, a.n, kind, f"{c}.{rep}")
                rates[label].append(rate)
                if "kv_entries" in answers[0].get("timings", {}):
                    # Entries written for generated tokens (the prompt's are one per token in both).
                    kv[label] = sum(x["timings"]["kv_entries"] - x["usage"]["prompt_tokens"] for x in answers) / sum(
                        x["usage"]["completion_tokens"] for x in answers
                    )
        base = statistics.median(rates[servers[0][0]])
        for label, _ in servers:
            r = rates[label]
            rows.append(
                {
                    "server": label,
                    "clients": c,
                    "tok_s": statistics.median(r),
                    "min": min(r),
                    "max": max(r),
                    "ratio": statistics.median(r) / base,
                    "kv_entries_per_generated_token": kv.get(label),
                }
            )
    if a.json:
        print(json.dumps(rows))
        return
    print("| server | clients | tok/s (median) | range | ratio | KV entries per generated token |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        kv = "1 (one per token)" if r["kv_entries_per_generated_token"] is None else f"{r['kv_entries_per_generated_token']:.3f}"
        print(
            f"| {r['server']} | {r['clients']} | {r['tok_s']:.2f} | {r['min']:.2f}-{r['max']:.2f} | {r['ratio']:.2f} | {kv} |"
        )


if __name__ == "__main__":
    main()
