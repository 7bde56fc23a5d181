"""``Llama``: llama-cpp-python's class over the runtime's engine.

Each call becomes the request that ``hamburger-server`` answers, with
llama-cpp-python's argument names and defaults, and is answered by the
server's own code inside this process (no socket): the same fields, tool
formats, constraints and answer shapes. Arguments llama-cpp-python has and
this runtime cannot honour raise ``ValueError`` naming them unless they hold
their neutral value.
"""

import json
import os

from . import _native

#: llama-cpp-python's "no seed": a random one for every generation.
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# llama.cpp's ggml type ids, as llama-cpp-python's type_k takes them.
_GGML_TYPES = {0: "f32", 1: "f16", 8: "q8_0"}

# llama-cpp-python's chat_format names of the built-in templates (with
# chatml-function-calling, ChatML calls tools in the generic JSON format).
_CHAT_FORMATS = {
    "chatml": "chatml", "chatml-function-calling": "chatml", "llama-2": "llama2", "llama2": "llama2",
    "llama-3": "llama3", "llama3": "llama3", "command-r": "command-r",
}

# Constructor arguments of llama-cpp-python that change nothing here, with
# why: weights are always memory-mapped, one thread pool serves prompt and
# decode, attention and K/V live with their layers.
_INIT_NO_OP = {
    "use_mmap", "n_ubatch", "n_threads_batch", "offload_kqv", "no_perf", "last_n_tokens_size",
    "numa", "split_mode", "main_gpu", "op_offload", "swa_full", "rpc_servers",
}

# Constructor arguments honoured only at their neutral value, and why.
_INIT_REFUSED = {
    "vocab_only": (False, "a vocabulary alone is not loaded: load the model"),
    "use_mlock": (False, "memory locking is not supported"),
    "kv_overrides": (None, "metadata overrides are not supported"),
    "embedding": (False, "embeddings are not supported"),
    "logits_all": (False, "every position's logits are not kept: use logprobs with echo"),
    "lora_base": (None, "LoRA adapters are not supported"),
    "lora_path": (None, "LoRA adapters are not supported"),
    "lora_scale": (1.0, "LoRA adapters are not supported"),
    "chat_handler": (None, "chat handlers (multimodal) are not supported: chat_format or chat_template"),
    "draft_model": (None, "Python draft models are not supported: spec_type='draft-mtp' drafts with the model's own micro decoder"),
    "tokenizer": (None, "the GGUF's own tokenizer is always used"),
    "tensor_split": (None, "tensor_split is not supported from Python"),
    "pooling_type": (-1, "pooling (embeddings) is not supported"),
    "rope_scaling_type": (-1, "RoPE scaling overrides are not supported"),
    "rope_freq_base": (0.0, "RoPE overrides are not supported"),
    "rope_freq_scale": (0.0, "RoPE overrides are not supported"),
    "yarn_ext_factor": (-1.0, "YaRN overrides are not supported"),
    "yarn_attn_factor": (1.0, "YaRN overrides are not supported"),
    "yarn_beta_fast": (32.0, "YaRN overrides are not supported"),
    "yarn_beta_slow": (1.0, "YaRN overrides are not supported"),
    "yarn_orig_ctx": (0, "YaRN overrides are not supported"),
    "spm_infill": (False, "infill is not supported"),
}

# Sampling arguments of llama-cpp-python honoured only at their neutral value.
_SAMPLING_REFUSED = {
    "typical_p": (1.0, "locally typical sampling is not supported"),
    "tfs_z": (1.0, "tail-free sampling is not supported"),
    "mirostat_mode": (0, "mirostat is not supported"),
    "mirostat_tau": (5.0, "mirostat is not supported"),
    "mirostat_eta": (0.1, "mirostat is not supported"),
    "stopping_criteria": (None, "Python callbacks while decoding are not supported: use stop"),
    "logits_processor": (None, "Python callbacks while decoding are not supported: use grammar or logit_bias"),
}


def _refuse(table, given):
    for name, value in given.items():
        neutral, why = table[name]
        if value != neutral:
            raise ValueError(f"{name}={value!r}: {why}")


class LlamaGrammar:
    """A grammar constraining a generation: llama.cpp's GBNF (or llguidance's
    Lark-like syntax), as llama-cpp-python's ``LlamaGrammar`` makes it."""

    def __init__(self, *, _grammar):
        self._grammar = _grammar

    @classmethod
    def from_string(cls, grammar, verbose=True):
        """The grammar written in ``grammar``."""
        return cls(_grammar=grammar)

    @classmethod
    def from_file(cls, file, verbose=True):
        """The grammar in the file ``file``."""
        with open(file, encoding="utf-8") as f:
            return cls(_grammar=f.read())

    @classmethod
    def from_json_schema(cls, json_schema, verbose=True):
        """JSON following the schema ``json_schema`` (a JSON string or dict)."""
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        return cls(_grammar={"json_schema": schema})


def _error(status, body):
    """The exception of a refused request: its message names the argument."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body
    message = message.replace("speculative.type", "spec_type")
    if status == 501:
        return NotImplementedError(message)
    if 400 <= status < 500:
        return ValueError(message)
    return RuntimeError(message)


class Llama:
    """A model loaded for generation, in this process.

    The arguments are llama-cpp-python's, with its defaults; the runtime's
    own: ``confidence`` (a macro step ends when ``1 - p_stop < confidence``;
    ``None``: the file's recommended value), ``spec_type`` (``"draft-mtp"``:
    self-verified decoding, the base checks every drafted token; ``None`` or
    ``"none"``: macro steps), ``device`` (``auto``, ``cpu``, ``cuda``,
    ``metal``, ``vulkan``), ``n_parallel`` (sequences decoded together, for
    threads calling one ``Llama``) and ``chat_template`` (Jinja source).
    """

    def __init__(
        self,
        model_path,
        *,
        n_gpu_layers=0,
        seed=LLAMA_DEFAULT_SEED,
        n_ctx=512,
        n_batch=512,
        n_threads=None,
        flash_attn=None,
        chat_format=None,
        type_k=None,
        type_v=None,
        verbose=True,
        confidence=None,
        spec_type=None,
        device=None,
        n_parallel=1,
        chat_template=None,
        **kwargs,
    ):
        unknown = [k for k in kwargs if k not in _INIT_NO_OP and k not in _INIT_REFUSED]
        if unknown:
            raise TypeError(f"Llama() got an unexpected keyword argument '{unknown[0]}'")
        _refuse(_INIT_REFUSED, {k: v for k, v in kwargs.items() if k in _INIT_REFUSED})
        model_path = os.fspath(model_path)
        kv = _cache_type("type_k", type_k)
        if type_v is not None and _cache_type("type_v", type_v) != kv:
            raise ValueError("type_v: K and V are cached in one type here; give type_k the same type")
        if chat_format is not None and chat_format not in _CHAT_FORMATS:
            names = ", ".join(sorted(_CHAT_FORMATS))
            raise ValueError(f"chat_format {chat_format!r}: expected one of {names} (or chat_template, Jinja source)")
        for name, value in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_parallel", n_parallel)):
            if not isinstance(value, int) or value < (0 if name == "n_ctx" else 1):
                raise ValueError(f"{name}={value!r}: expected an integer >= {0 if name == 'n_ctx' else 1}")
        if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
            raise ValueError(f"n_threads={n_threads!r}: expected an integer >= 1 (or None)")
        if not isinstance(n_gpu_layers, int):
            raise ValueError(f"n_gpu_layers={n_gpu_layers!r}: expected an integer (-1: every layer)")
        self.model_path = model_path
        self.verbose = verbose
        self.chat_format = chat_format
        self._seed = None if seed in (LLAMA_DEFAULT_SEED, -1, None) else int(seed)
        self._engine = _native.Engine(
            model_path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            n_gpu_layers=999 if n_gpu_layers < 0 else n_gpu_layers,
            device=device or "auto",
            kv_type_name=kv,
            flash_attn=None if flash_attn is None else bool(flash_attn),
            n_parallel=n_parallel,
            seed=self._seed,
            confidence=confidence,
            spec_type=spec_type,
            chat_format=_CHAT_FORMATS.get(chat_format) if chat_format else None,
            chat_template=chat_template,
            verbose=verbose,
        )

    @classmethod
    def from_pretrained(cls, repo_id, filename=None, **kwargs):
        """Refused: this runtime downloads nothing; give ``Llama`` a local GGUF."""
        raise ValueError(f"from_pretrained({repo_id!r}): downloads are not supported: pass a local GGUF's path to Llama()")

    # -- the model ----------------------------------------------------------

    def n_ctx(self):
        """Tokens one generation's context may hold."""
        return self._engine.n_ctx

    def n_vocab(self):
        """The vocabulary's size."""
        return self._engine.n_vocab

    def token_eos(self):
        """The end-of-generation token."""
        return self._engine.eog[0]

    @property
    def max_steps(self):
        """The most tokens one macro step emits (1: a base model alone)."""
        return self._engine.max_steps

    @property
    def confidence(self):
        """The confidence of generations that set none."""
        return self._engine.confidence

    def tokenize(self, text, add_bos=True, special=False):
        """The token ids of ``text`` (bytes or str). Special tokens written
        in the text are always recognised here (llama.cpp's ``special=True``)."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        return self._engine.tokenize(text, bool(add_bos))

    def detokenize(self, tokens, prev_tokens=None, special=False):
        """The UTF-8 bytes of ``tokens``; after ``prev_tokens`` when given
        (so that a word's leading space is right)."""
        if prev_tokens:
            whole = self._engine.detokenize(list(prev_tokens) + list(tokens), special)
            return whole[len(self._engine.detokenize(list(prev_tokens), special)):]
        return self._engine.detokenize(list(tokens), special)

    def close(self):
        """Stops the engine: the model's memory is freed and no call is answered."""
        self._engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- generation ---------------------------------------------------------

    def __call__(self, prompt, *args, **kwargs):
        """``create_completion``."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_completion(
        self,
        prompt,
        suffix=None,
        max_tokens=16,
        temperature=0.8,
        top_p=0.95,
        min_p=0.05,
        typical_p=1.0,
        logprobs=None,
        echo=False,
        stop=None,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        repeat_penalty=1.0,
        top_k=40,
        stream=False,
        seed=None,
        tfs_z=1.0,
        mirostat_mode=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        model=None,
        stopping_criteria=None,
        logits_processor=None,
        grammar=None,
        logit_bias=None,
        *,
        confidence=None,
        spec_type=None,
    ):
        """A completion of ``prompt`` (text or token ids), as an OpenAI
        ``text_completion`` dict, or with ``stream`` an iterator of its chunks.
        ``max_tokens`` None or <= 0: until the context is full."""
        return self._generate("/v1/completions", locals())

    def create_chat_completion(
        self,
        messages,
        functions=None,
        function_call=None,
        tools=None,
        tool_choice=None,
        temperature=0.2,
        top_p=0.95,
        top_k=40,
        min_p=0.05,
        typical_p=1.0,
        stream=False,
        stop=None,
        seed=None,
        response_format=None,
        max_tokens=None,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repeat_penalty=1.0,
        tfs_z=1.0,
        mirostat_mode=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        model=None,
        logits_processor=None,
        grammar=None,
        logit_bias=None,
        logprobs=None,
        top_logprobs=None,
        *,
        confidence=None,
        spec_type=None,
    ):
        """The assistant's answer to ``messages`` (OpenAI's chat messages)
        through the model's chat template, as an OpenAI ``chat.completion``
        dict, or with ``stream`` an iterator of its chunks. ``tools`` and
        ``tool_choice`` answer with calls in the template's format;
        ``response_format`` (``{"type": "json_object", "schema": ...}``)
        constrains the answer to JSON."""
        return self._generate("/v1/chat/completions", locals())

    def _generate(self, path, args):
        """Answers a call's arguments ``args`` (each named as its request
        field) at ``path``: a dict, or an iterator of chunk dicts."""
        args = {k: v for k, v in args.items() if k != "self"}
        _refuse(_SAMPLING_REFUSED, {k: args.pop(k) for k in list(args) if k in _SAMPLING_REFUSED})
        stream, model, grammar = args.pop("stream"), args.pop("model"), args.pop("grammar")
        body = dict(args, stop=args["stop"] or None, max_tokens=None, seed=None)
        body["speculative.type"] = body.pop("spec_type")
        if isinstance(grammar, LlamaGrammar):
            grammar = grammar._grammar
        if isinstance(grammar, dict):
            body["json_schema"] = grammar["json_schema"]
        else:
            body["grammar"] = grammar
        if isinstance(args["logit_bias"], dict):
            body["logit_bias"] = {str(k): v for k, v in args["logit_bias"].items()}
        max_tokens = args["max_tokens"]
        if max_tokens is not None and not (isinstance(max_tokens, int) and max_tokens <= 0):
            body["max_tokens"] = max_tokens
        seed = self._seed if args["seed"] is None else args["seed"]
        if seed not in (LLAMA_DEFAULT_SEED, -1):
            body["seed"] = seed
        body = {k: v for k, v in body.items() if v is not None}
        name = model if model is not None else self.model_path
        if stream:
            body["stream"] = True
            events = self._engine.stream(path, json.dumps(body))
            if events.status != 200:
                raise _error(events.status, next(events, ""))
            return _chunks(events, name)
        status, answer = self._engine.request("POST", path, json.dumps(body))
        if status != 200:
            raise _error(status, answer)
        answer = json.loads(answer)
        answer["model"] = name
        return answer


def _chunks(events, name):
    """The chunks of a streamed answer, until ``[DONE]``; closing the
    iterator (or an exception in it) cancels the generation."""
    try:
        for data in events:
            if data == "[DONE]":
                return
            chunk = json.loads(data)
            if "error" in chunk and "choices" not in chunk:
                raise _error(chunk["error"].get("code", 500), data)
            chunk["model"] = name
            yield chunk
    finally:
        events.close()


def _cache_type(name, value):
    """The KV cache type ``value`` names: a ggml type id or a name."""
    if value is None:
        return "f16"
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in _GGML_TYPES:
            raise ValueError(f"{name}={value}: expected a ggml type id of f32 (0), f16 (1) or q8_0 (8)")
        return _GGML_TYPES[value]
    if isinstance(value, str) and value.lower() in _GGML_TYPES.values():
        return value.lower()
    raise ValueError(f"{name}={value!r}: expected f32, f16 or q8_0 (or their ggml type ids 0, 1, 8)")
