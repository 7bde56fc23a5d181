#!/usr/bin/env python3
"""Drives a running hamburger-server with lm-eval's own API model classes.

* `local-completions` (`LocalCompletionsAPI`), with token-id requests and
  with text requests: `loglikelihood` on Instance objects built here (a
  context and a continuation each: lm-eval sends `echo: true, logprobs: 1,
  max_tokens: 1` and sums the continuation's prompt log-probabilities), and
  `generate_until`;
* `local-chat-completions` (`LocalChatCompletion`): `generate_until` on
  chat messages.

No dataset and no download: the tokenizer is the model's own tokenizer.json
directory, read with HF_HUB_OFFLINE=1.

Usage: lm_eval_client.py < REQUEST.json, where the request is
  {"url": "http://127.0.0.1:PORT", "tokenizer": DIR,
   "loglikelihood": [[context_ids, continuation_ids], ...],
   "generate": [{"prompt_ids": [...], "max_gen_toks": N}, ...],
   "chat": [{"messages": [...], "max_gen_toks": N}, ...]}
Prints one JSON object: for each of "tokenized" and "text" (the
`tokenized_requests` setting) the loglikelihood results as [ll, is_greedy]
and the generated texts, and "chat", the chat answers. Exits non-zero when
lm-eval's tokenizer does not split a pair into the ids it was given.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.api_models import JsonChatStr  # noqa: E402
from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI  # noqa: E402


def completions(req: dict, tokenized: bool) -> dict:
    lm = LocalCompletionsAPI(
        base_url=f"{req['url']}/v1/completions",
        model="hamburger",
        tokenizer_backend="huggingface",
        tokenizer=req["tokenizer"],
        tokenized_requests=tokenized,
        max_retries=1,
        max_length=512,
    )
    pairs = []
    for ctx_ids, cont_ids in req["loglikelihood"]:
        ctx, cont = lm.tokenizer.decode(ctx_ids), lm.tokenizer.decode(cont_ids)
        got = lm._encode_pair(ctx, cont)
        if (list(got[0]), list(got[1])) != (ctx_ids, cont_ids):
            sys.exit(f"lm-eval splits {ctx!r} + {cont!r} into {got}, not {(ctx_ids, cont_ids)}")
        pairs.append((ctx, cont))
    ll = lm.loglikelihood(
        [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)], disable_tqdm=True
    )
    gens = lm.generate_until(
        [
            Instance("generate_until", {}, (lm.tokenizer.decode(g["prompt_ids"]), {"until": [],
                     "max_gen_toks": g["max_gen_toks"]}), i)
            for i, g in enumerate(req["generate"])
        ],
        disable_tqdm=True,
    )
    return {"loglikelihood": [[l, g] for l, g in ll], "generate": gens}


def chat(req: dict) -> list:
    lm = LocalChatCompletion(
        base_url=f"{req['url']}/v1/chat/completions", model="hamburger", tokenizer_backend=None, max_retries=1
    )
    return lm.generate_until(
        [
            Instance("generate_until", {}, (JsonChatStr(json.dumps(c["messages"])), {"until": [],
                     "max_gen_toks": c["max_gen_toks"]}), i)
            for i, c in enumerate(req["chat"])
        ],
        disable_tqdm=True,
    )


def main() -> None:
    req = json.load(sys.stdin)
    out = {"tokenized": completions(req, True), "text": completions(req, False), "chat": chat(req)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
