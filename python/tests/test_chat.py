"""Chat through the model's template: a JSON schema the answer follows,
tools called in the template's format, streaming that yields the text of
the answer not streamed."""

import json

import jsonschema

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
ASK = [{"role": "user", "content": "Jason is 25 years old. Who is he? Answer in JSON."}]


def test_chat_answer_follows_the_json_schema(smollm2):
    out = smollm2.create_chat_completion(
        ASK, response_format={"type": "json_object", "schema": PERSON}, temperature=0, max_tokens=64
    )
    assert out["object"] == "chat.completion"
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant"
    jsonschema.validate(json.loads(message["content"]), PERSON)
    assert out["usage"]["completion_tokens"] > 0


def test_openai_json_schema_response_format_is_taken_too(smollm2):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = smollm2.create_chat_completion(ASK, response_format=fmt, temperature=0, max_tokens=64)
    jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), PERSON)


def test_a_forced_tool_is_called_with_arguments_of_its_schema(smollm2):
    tools = [{"type": "function", "function": {"name": "UserDetail", "parameters": PERSON}}]
    out = smollm2.create_chat_completion(
        ASK, tools=tools, tool_choice={"type": "function", "function": {"name": "UserDetail"}},
        temperature=0, max_tokens=96,
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["function"]["name"] == "UserDetail"
    jsonschema.validate(json.loads(call["function"]["arguments"]), PERSON)


def test_streamed_chat_yields_the_text_of_the_answer_not_streamed(smollm2):
    ask = [{"role": "user", "content": "Give me three tips for sleeping better."}]
    whole = smollm2.create_chat_completion(ask, temperature=0, max_tokens=48)
    chunks = list(smollm2.create_chat_completion(ask, temperature=0, max_tokens=48, stream=True))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"] and text
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == [whole["choices"][0]["finish_reason"]]


def test_streamed_completion_yields_the_text_of_the_completion_not_streamed(smollm2):
    prompt = "The three primary colours are"
    whole = smollm2(prompt, temperature=0, max_tokens=40)
    chunks = list(smollm2(prompt, temperature=0, max_tokens=40, stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == whole["choices"][0]["text"]
    # The runtime's own: each chunk's tokens and macro steps, and the steps' tokens/step.
    steps = sum(c["hamburger"]["macro_steps"] for c in chunks if "hamburger" in c)
    assert steps == whole["timings"]["macro_steps"]
    assert whole["timings"]["tokens_per_step"] >= 1.0


def test_self_verified_greedy_text_is_the_base_models(smollm2, smollm2_gguf):
    """spec_type='draft-mtp' checks every drafted token with the base: the
    text is one-token-per-step greedy decoding's (confidence above 1)."""
    prompt = "Explain recursion to a ten-year-old."
    plain = smollm2(prompt, temperature=0, max_tokens=32, confidence=1.01)
    verified = smollm2(prompt, temperature=0, max_tokens=32, spec_type="draft-mtp")
    assert plain["timings"]["tokens_per_step"] == 1.0
    assert verified["choices"][0]["text"] == plain["choices"][0]["text"]
    # The context drafting first (llama.cpp's ngram-simple before the micro decoder): the same text.
    chained = smollm2(prompt, temperature=0, max_tokens=32, spec_type="ngram-simple,draft-mtp")
    assert chained["choices"][0]["text"] == plain["choices"][0]["text"]


def test_a_gbnf_grammar_constrains_a_completion(smollm2):
    from hamburger import LlamaGrammar

    grammar = LlamaGrammar.from_string('root ::= ("yes" | "no") "."')
    out = smollm2("Is the sky blue? Answer yes or no:", grammar=grammar, temperature=0, max_tokens=8)
    assert out["choices"][0]["text"] in ("yes.", "no.")
    schema = LlamaGrammar.from_json_schema(json.dumps(PERSON))
    out = smollm2("A person as JSON:", grammar=schema, temperature=0, max_tokens=64)
    jsonschema.validate(json.loads(out["choices"][0]["text"]), PERSON)


def test_completion_logprobs_have_llama_cpp_pythons_shape(smollm2):
    out = smollm2("The capital of France is", max_tokens=6, temperature=0, logprobs=2)
    lp = out["choices"][0]["logprobs"]
    n = out["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert all(len(top) == 2 and max(top.values()) >= lp_ - 1e-4 for top, lp_ in zip(lp["top_logprobs"], lp["token_logprobs"]))
