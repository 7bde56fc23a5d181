#!/usr/bin/env python3
"""Drives a running hamburger-server the way HAMburger's own evaluation does.

* the official `openai` Python client: chat and text completions, streamed
  and not (what evalplus's `openai` backend uses: `chat.completions.create`
  with one user message, `max_tokens`, `temperature=0`, `n=1`);
* `n` choices over a list of prompts, and log-probabilities in a stream,
  through the client's own types;
* lm-eval's `local-chat-completions` model: a plain POST of
  {messages, model, max_tokens, temperature, stop, seed} to
  `.../v1/chat/completions`, reading `choices[0].message.content`.

Usage: openai_compat.py BASE_URL (e.g. http://127.0.0.1:8080). Exits non-zero
on the first mismatch; prints one line per check.
"""
import json
import sys
import urllib.request

import openai


def main(base: str) -> None:
    client = openai.OpenAI(api_key="none", base_url=f"{base}/v1")
    models = client.models.list()
    model = models.data[0].id
    print(f"models: {model}")

    # evalplus --backend openai --greedy
    prompt = "Write a Python function that returns the sum of two numbers."
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0, n=1
    )
    text = chat.choices[0].message.content
    assert isinstance(text, str) and text, chat
    assert chat.usage.completion_tokens > 0, chat.usage
    print(f"chat (evalplus shape): {chat.choices[0].finish_reason}, {chat.usage.completion_tokens} tokens")

    pieces = []
    for chunk in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == text, ("stream differs", "".join(pieces), text)
    print(f"chat stream: {len(pieces)} chunks, same text")

    comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert comp.choices[0].text, comp
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == comp.choices[0].text, (streamed, comp.choices[0].text)
    print("completions: plain and streamed agree")

    # lm-eval --model local-chat-completions --gen_kwargs temperature=0
    payload = {
        "messages": [{"role": "user", "content": "Question: What is 2 + 3?\nAnswer:"}],
        "model": "m2d",
        "max_tokens": 16,
        "temperature": 0,
        "stop": ["Question:", "</s>", "<|im_end|>"],
        "seed": 1234,
    }
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        out = json.load(r)
    content = out["choices"][0]["message"]["content"]
    assert isinstance(content, str), out
    assert "Question:" not in content, content
    print(f"lm-eval local-chat-completions: {out['choices'][0]['finish_reason']}")

    # n choices and a list of prompts, read through the client's own types;
    # both read fresh (no cached cells), so that they compute alike
    fresh = {"cache_prompt": False}
    many = client.completions.create(
        model=model, prompt=["The sky is", "Grass is"], n=2, max_tokens=6, temperature=0.9, seed=5, extra_body=fresh
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3], many
    again = client.completions.create(
        model=model, prompt=["The sky is", "Grass is"], n=2, max_tokens=6, temperature=0.9, seed=5, extra_body=fresh
    )
    assert [c.text for c in again.choices] == [c.text for c in many.choices], (again, many)
    print(f"completions n=2 over 2 prompts: {len(many.choices)} choices, reproduced with a seed")

    # log-probabilities streamed: the chunks' together are the unstreamed answer's tokens
    asked = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0)
    whole = client.chat.completions.create(logprobs=True, top_logprobs=2, **asked)
    streamed = []
    for chunk in client.chat.completions.create(logprobs=True, top_logprobs=2, stream=True, **asked):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(chunk.choices[0].logprobs.content)
    want = whole.choices[0].logprobs.content
    # The same tokens; their values agree up to float rounding (another slot,
    # or the prompt's entries reused, sums in another order).
    assert [t.token for t in streamed] == [t.token for t in want], (streamed, want)
    assert all(abs(a.logprob - b.logprob) < 1e-3 for a, b in zip(streamed, want)), (streamed, want)
    print(f"chat logprobs streamed: {len(streamed)} tokens, the unstreamed ones")

    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
        raise AssertionError("empty messages were accepted")
    except openai.BadRequestError as e:
        print(f"errors: {e.status_code} as openai.BadRequestError")
    print("openai compatibility: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"))
