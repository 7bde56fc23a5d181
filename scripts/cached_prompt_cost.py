#!/usr/bin/env python3
"""What reading a cached prompt's tail in its fresh size class costs
(docs/server.md, "Cached prompts and what stays exact"), against a running
hamburger-server with one slot.

For each repeat: a request whose prompt is a long system prompt plus a
question, read fresh (`cache_prompt: false`), then the same request again,
which reuses the slot's cells and re-reads only the tail of the prompt's
chunk (up to 64 tokens). The server's own timings give the prompt time of
both, the tokens the repeat re-read, and one decode step's time (what
re-reading a single token, the rule before, costs). Medians are printed.
Standard library only.

    python3 scripts/cached_prompt_cost.py http://127.0.0.1:8080 [--repeats 5] [--words 1100]
"""

import argparse
import json
import statistics
import urllib.request

SENTENCE = "The engineers measured the river, the wind and the ground under each pier before they drew the bridge. "


def complete(url, prompt, cache):
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "cache_prompt": cache, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["timings"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--words", type=int, default=1100, help="words of system prompt (about 1.4 tokens each)")
    a = p.parse_args()
    words = SENTENCE.split()
    system = " ".join(words[i % len(words)] for i in range(a.words))
    rows = []
    for r in range(a.repeats):
        prompt = f"{system}\nQuestion {r}: what did the engineers measure?\nAnswer:"
        fresh = complete(a.url, prompt, False)
        cached = complete(a.url, prompt, True)
        step_ms = cached["predicted_ms"] / max(cached["predicted_n"], 1)
        rows.append((fresh["prompt_n"], fresh["prompt_ms"], cached["cache_n"], cached["prompt_n"], cached["prompt_ms"], step_ms))
    med = [statistics.median(col) for col in zip(*rows)]
    print("| prompt tokens | fresh prompt ms | reused | re-read | re-read ms | one decode step ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} | {med[3]:.0f} | {med[4]:.1f} | {med[5]:.1f} |")


if __name__ == "__main__":
    main()
