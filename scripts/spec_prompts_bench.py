#!/usr/bin/env python3
"""Greedy answers of OpenAI-compatible servers to the same chat prompts, one at a time.

For each prompt of a JSON-lines file (a `prompt` field, a user message), each
server in turn answers `/v1/chat/completions` greedily with `max_tokens` N
(prompts interleave the servers, so the machine's drift hits each alike).
Prints, per server: answers, completion tokens, tokens/s of generation (the
server's own `timings.predicted_per_second` when it reports it, weighted by
tokens; else wall time), its ratio to the FIRST server, drafted and accepted
tokens (llama-server's and hamburger-server's `timings.draft_n`,
`draft_n_accepted`), base forwards per token where reported, and how many
answers are identical to the first server's text.

Measures self-verified decoding (`hamburger-server --spec-type draft-mtp`)
against llama-server, plain and with `--spec-type ngram-mod`, on the same
prompts (docs/performance.md, "Self-verified decoding").

Usage: spec_prompts_bench.py LABEL=URL [LABEL=URL ...] --prompts P.jsonl [--n 128] [--limit K]
"""
import argparse
import json
import time
import urllib.request


def answer(url: str, prompt: str, n: int) -> tuple[dict, float]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0}
    req = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        v = json.load(r)
    return v, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("servers", nargs="+", metavar="LABEL=URL")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    servers = [s.split("=", 1) for s in args.servers]
    prompts = [json.loads(l)["prompt"] for l in open(args.prompts) if l.strip()][: args.limit]
    stats = {label: {"answers": 0, "tokens": 0, "gen_s": 0.0, "wall_s": 0.0, "draft_n": 0, "accepted": 0,
                     "forwards": 0, "identical": 0, "texts": []} for label, _ in servers}
    for p in prompts:
        for label, url in servers:
            v, wall = answer(url.rstrip("/"), p, args.n)
            s = stats[label]
            tokens = v["usage"]["completion_tokens"]
            t = v.get("timings", {})
            s["answers"] += 1
            s["tokens"] += tokens
            s["wall_s"] += wall
            s["gen_s"] += t["predicted_ms"] / 1e3 if "predicted_ms" in t else wall
            s["draft_n"] += t.get("draft_n", 0)
            s["accepted"] += t.get("draft_n_accepted", 0)
            s["forwards"] += t.get("macro_steps", 0)
            s["texts"].append(v["choices"][0]["message"]["content"])
    first = stats[servers[0][0]]
    rows = []
    for label, _ in servers:
        s = stats[label]
        s["identical"] = sum(a == b for a, b in zip(s["texts"], first["texts"]))
        tps = s["tokens"] / s["gen_s"] if s["gen_s"] else 0.0
        rows.append({
            "server": label,
            "answers": s["answers"],
            "tokens": s["tokens"],
            "tokens_per_s": tps,
            "ratio": tps / (first["tokens"] / first["gen_s"]) if first["gen_s"] else 0.0,
            "draft_n": s["draft_n"],
            "draft_n_accepted": s["accepted"],
            "forwards_per_token": s["forwards"] / s["tokens"] if s["forwards"] and s["tokens"] else None,
            "identical_to_first": s["identical"],
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| server | answers | tokens | tok/s | ratio | drafted | accepted | base forwards/token | identical text |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        fpt = "-" if r["forwards_per_token"] is None else f"{r['forwards_per_token']:.3f}"
        print(f"| {r['server']} | {r['answers']} | {r['tokens']} | {r['tokens_per_s']:.2f} | {r['ratio']:.2f} | "
              f"{r['draft_n']} | {r['draft_n_accepted']} | {fpt} | {r['identical_to_first']}/{r['answers']} |")


if __name__ == "__main__":
    main()
