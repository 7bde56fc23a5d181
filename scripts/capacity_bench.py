#!/usr/bin/env python3
"""KV cache as capacity: how many concurrent answers of N tokens a server
holds at a given context size (`-c`), and its aggregate tokens/s at that load.

Each configuration is a server command line (with `{port}`) and a slot count:
the script starts the server, sends one request per slot at the same moment
(`ignore_eos`, greedy, N tokens each; `server_bench.run`), counts the answers
that came back whole (N tokens; a 200 with fewer was cut by its slot's
context) and the failed ones (no answer), repeats, and stops the server.
Configurations run one at a time on the machine's cores. Prints a Markdown
table, or JSON with `--json` (docs/performance.md, "KV as capacity").

Usage: capacity_bench.py --config 'LABEL|SLOTS|COMMAND {port} ...' [...] [--n 256] [--reps 2]
"""
import argparse
import json
import shlex
import statistics
import subprocess
import time
import urllib.error
import urllib.request

from server_bench import run


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 300) -> None:
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready in {seconds} s")


def slot_context(url: str) -> int | None:
    """Each slot's context as the server reports it (llama-server's /props)."""
    try:
        with urllib.request.urlopen(f"{url}/props", timeout=10) as r:
            return json.load(r).get("default_generation_settings", {}).get("n_ctx")
    except (urllib.error.URLError, ValueError):
        return None


def measure(label: str, slots: int, command: str, n: int, reps: int, port: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(shlex.split(command.format(port=port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        run(url, 1, 8)  # warm-up
        rates, whole, failed, kv = [], [], [], []
        for _ in range(reps):
            try:
                rate, answers = run(url, slots, n)
            except SystemExit:
                rates.append(0.0)
                whole.append(0)
                failed.append(slots)
                continue
            rates.append(rate)
            whole.append(sum(a["usage"]["completion_tokens"] == n for a in answers))
            failed.append(0)
            kv += [a["timings"]["kv_entries"] for a in answers if "kv_entries" in a.get("timings", {})]
        return {
            "server": label,
            "slots": slots,
            "slot_ctx": slot_context(url),
            "whole": min(whole),
            "failed": max(failed),
            "tok_s": statistics.median(rates),
            "kv_per_answer": statistics.mean(kv) if kv else None,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True, metavar="LABEL|SLOTS|COMMAND")
    ap.add_argument("--n", type=int, default=256, help="tokens per answer")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--port", type=int, default=18480)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for c in a.config:
        label, slots, command = c.split("|", 2)
        rows.append(measure(label, int(slots), command, a.n, a.reps, a.port))
        print(json.dumps(rows[-1]), flush=True)
    if a.json:
        return
    print(f"| server | slots (-np) | cells per slot | answers of {a.n} tokens whole | failed | KV cells per answer | tok/s (median) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        kv = "prompt + tokens" if r["kv_per_answer"] is None else f"{r['kv_per_answer']:.0f}"
        print(
            f"| {r['server']} | {r['slots']} | {r['slot_ctx']} | {r['whole']} of {r['slots']} | {r['failed']} | {kv} | {r['tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
