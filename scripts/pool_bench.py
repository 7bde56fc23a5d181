#!/usr/bin/env python3
"""The KV pool against OpenAI-compatible servers (hamburger-server,
llama-server), in the same run. Standard library only.

shared-prefix: CLIENTS clients send a streamed chat at the same moment, each
with one shared system prompt of about PREFIX tokens and a question of its
own (greedy, MAX_TOKENS tokens); a client's time to first token (TTFT) is
the time from sending to its first content chunk, and a burst's figure is
the median of its clients'. `--warm` sends one request with the burst's
system prompt first (its answer awaited), so the prefix is cached before
the burst; otherwise every burst's system prompt carries its own number, so
no burst reuses another's cells. Bursts interleave the servers (one burst
of each, in turn, REPS times) so that the shared machine's drift weighs on
all alike; the table gives the median over bursts, and the prompt tokens
each server reports it processed (`timings.prompt_n`, summed over the
burst's clients: what was computed) and reused (`cache_n`).

    python3 scripts/pool_bench.py shared-prefix --server 'ours=http://127.0.0.1:8080' \\
        --server 'llama-server=http://127.0.0.1:8081' [--clients 8] [--prefix 1500] [--reps 3] [--warm]

mixed: LONG answers of LONG_N tokens beside SHORT answers of SHORT_N tokens,
all sent at the same moment (one-word prompts, greedy, `ignore_eos`):
whole answers (as many tokens as asked), answers cut short (fewer, a
context that filled) and failed requests (an error status), with the
aggregate tokens/s (all answers' tokens over the wall time of the burst).

    python3 scripts/pool_bench.py mixed --server 'ours=http://127.0.0.1:8080' ... \\
        [--long 4 --long-n 1500 --short 24 --short-n 100] [--reps 1]

sustained: CLIENTS clients each send chats back to back for SECONDS (a
prompt of its own, of MIN_WORDS to MAX_WORDS words, greedy, MAX_TOKENS
tokens), one server after the other, as a long answering run does once
cached prompts fill the pool: requests and prompt plus answer tokens each
minute, and the whole run's tokens/s.

    python3 scripts/pool_bench.py sustained --server 'ours=http://127.0.0.1:8080' ... \\
        [--clients 16] [--seconds 480] [--min-words 200 --max-words 1000] [--max-tokens 64]
"""

import argparse
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request

from streamed_chat import stream_chat


def post(url, path, body, timeout=3600):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


# Plain words for the system prompt (SmolLM2's tokenizer takes about 1.25
# tokens per word of this text; words_for asks the server).
WORDS = (
    "river bridge stone arch load steel cable tower span deck pier ground water flood wind traffic "
    "design engineer century iron concrete truss beam weight force tension compression support road "
    "valley city harbor ship canal lock gate wall tunnel mountain rail train station signal track"
).split()


def words_for(url, n_tokens):
    """How many words of the system prompt make about `n_tokens` tokens in
    the tokenizer of the server at `url` (its /tokenize)."""
    sample = system_prompt("sample", 400)
    with post(url, "/tokenize", {"content": sample}) as r:
        per_word = len(json.loads(r.read())["tokens"]) / 400
    return max(1, round(n_tokens / per_word))


def system_prompt(tag, n_words):
    rng = random.Random(12345)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    lines = [" ".join(words[i : i + 12]) + "." for i in range(0, len(words), 12)]
    return f"You are assistant number {tag}. Read these notes carefully.\n" + "\n".join(lines)


QUESTIONS = [
    "Name one material.",
    "Name one place.",
    "What carries the load?",
    "Name a kind of bridge.",
    "What moves on the road?",
    "Name something made of iron.",
    "What does the wind do?",
    "Name a part of a bridge.",
    "What is under the pier?",
    "Name a way to cross water.",
    "What can a flood do?",
    "Name a tall thing.",
]


def stream_into(url, messages, max_tokens, out, i):
    """Streams one greedy chat; stores (TTFT ms, prompt_n, cache_n) in out[i]."""
    try:
        ttft, _, prompt_n, cache_n = stream_chat(url, messages, max_tokens)
        out[i] = (ttft, prompt_n, cache_n)
    except (urllib.error.URLError, OSError) as e:
        out[i] = (None, None, f"failed: {e}")


def burst(url, system, clients, max_tokens):
    out = [None] * clients
    threads = []
    for i in range(clients):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
        ]
        threads.append(threading.Thread(target=stream_into, args=(url, messages, max_tokens, out, i)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def shared_prefix(args):
    servers = [s.split("=", 1) for s in args.server]
    n_words = words_for(servers[0][1], args.prefix)
    rows = {label: {"ttft": [], "prompt_n": [], "cache_n": []} for label, _ in servers}
    for rep in range(args.reps):
        for label, url in servers:
            tag = f"{rep}" if args.warm else f"{label}-{rep}-{time.time_ns()}"
            system = system_prompt(tag, n_words)
            if args.warm:
                warm = [None]
                stream_into(url, [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}], args.max_tokens, warm, 0)
            out = burst(url, system, args.clients, args.max_tokens)
            ttfts = [o[0] for o in out if o[0] is not None]
            failed = sum(1 for o in out if o[0] is None)
            med = statistics.median(ttfts) if ttfts else float("nan")
            prompt_n = sum(o[1] or 0 for o in out)
            cache_n = sum(o[2] for o in out if isinstance(o[2], int))
            rows[label]["ttft"].append(med)
            rows[label]["prompt_n"].append(prompt_n)
            rows[label]["cache_n"].append(cache_n)
            print(f"rep {rep} {label}: median TTFT {med:.0f} ms, prompt_n {prompt_n}, cache_n {cache_n}, failed {failed}", flush=True)
    base = statistics.median(rows[servers[-1][0]]["ttft"])
    print(f"\n| server | clients | median TTFT (ms, median of {args.reps} bursts) | ratio to {servers[-1][0]} | prompt tokens processed per burst | reused per burst |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, _ in servers:
        r = rows[label]
        m = statistics.median(r["ttft"])
        print(f"| {label} | {args.clients} | {m:.0f} | {m / base:.2f} | {statistics.median(r['prompt_n']):.0f} | {statistics.median(r['cache_n']):.0f} |")
    if args.json:
        print(json.dumps(rows))


def complete(url, n, out, i):
    body = {"prompt": "Once", "max_tokens": n, "temperature": 0, "ignore_eos": True}
    try:
        with post(url, "/v1/completions", body) as r:
            v = json.loads(r.read())
            out[i] = (v["usage"]["completion_tokens"], v["choices"][0]["finish_reason"])
    except urllib.error.HTTPError as e:
        out[i] = (None, f"HTTP {e.code}")
    except (urllib.error.URLError, OSError) as e:
        out[i] = (None, f"failed: {e}")


def mixed(args):
    servers = [s.split("=", 1) for s in args.server]
    asked = [args.long_n] * args.long + [args.short_n] * args.short
    print(f"| server | answers | whole | cut short | failed | tokens | wall s | tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rep in range(args.reps):
        for label, url in servers:
            out = [None] * len(asked)
            threads = [threading.Thread(target=complete, args=(url, n, out, i)) for i, n in enumerate(asked)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            whole = sum(1 for o, n in zip(out, asked) if o[0] == n)
            failed = sum(1 for o in out if o[0] is None)
            cut = len(asked) - whole - failed
            tokens = sum(o[0] or 0 for o in out)
            long_got = [o[0] for o in out[: args.long]]
            print(f"| {label} | {len(asked)} | {whole} | {cut} | {failed} | {tokens} | {wall:.1f} | {tokens / wall:.1f} |  <!-- rep {rep}; long answers' tokens {long_got} -->", flush=True)


def sustained(args):
    """Requests back to back against each server in turn for `args.seconds`."""
    print("| server | clients | requests | tokens/s (prompt + answer) |\n| --- | ---: | ---: | ---: |")
    for label, url in (s.split("=", 1) for s in args.server):
        lock, done, start = threading.Lock(), [0, 0], time.perf_counter()
        stop = start + args.seconds

        def client(k):
            rng, i = random.Random(k), 0
            while time.perf_counter() < stop:
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(args.min_words, args.max_words)))
                body = {"messages": [{"role": "user", "content": f"Note {k}-{i}: {words}"}],
                        "max_tokens": args.max_tokens, "temperature": 0}
                i += 1
                with post(url, "/v1/chat/completions", body) as r:
                    usage = json.loads(r.read())["usage"]
                with lock:
                    if time.perf_counter() < stop:
                        done[0] += 1
                        done[1] += usage["prompt_tokens"] + usage["completion_tokens"]

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
        for t in threads:
            t.start()
        while (left := stop - time.perf_counter()) > 0:
            time.sleep(min(60, left))
            with lock:
                print(f"{label}, {time.perf_counter() - start:.0f} s: {done[0]} requests, {done[1]} tokens", flush=True)
        print(f"| {label} | {args.clients} | {done[0]} | {done[1] / args.seconds:.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def command(name, **ints):
        """A subcommand: --server, then integer flags with their defaults."""
        c = sub.add_parser(name)
        c.add_argument("--server", action="append", required=True, metavar="LABEL=URL")
        for flag, default in ints.items():
            c.add_argument("--" + flag.replace("_", "-"), type=int, default=default)
        return c

    s = command("shared-prefix", clients=8, max_tokens=8, reps=3)
    s.add_argument("--prefix", type=int, default=1500, help="tokens of the shared system prompt (about)")
    s.add_argument("--warm", action="store_true", help="a request with the burst's system prompt first")
    s.add_argument("--json", action="store_true")
    command("mixed", long=4, long_n=1500, short=24, short_n=100, reps=1)
    command("sustained", clients=16, seconds=480, min_words=200, max_words=1000, max_tokens=64)
    args = ap.parse_args()
    {"shared-prefix": shared_prefix, "mixed": mixed, "sustained": sustained}[args.cmd](args)


if __name__ == "__main__":
    main()
