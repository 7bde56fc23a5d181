"""Bad arguments raise the exception a Python user expects, with the
runtime's one-line message naming the argument, and the model stays usable."""

import _thread
import signal
import threading

import pytest

import hamburger
from hamburger import Llama


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="model_path"):
        Llama(str(tmp_path / "missing.gguf"), verbose=False)


def test_a_file_that_is_not_a_gguf_is_a_load_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(hamburger.LoadError, match="bad.gguf"):
        Llama(str(bad), verbose=False)
    assert issubclass(hamburger.LoadError, RuntimeError)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_ctx": -1}, "n_ctx"),
        ({"n_batch": 0}, "n_batch"),
        ({"type_k": "q3_k"}, "type_k"),
        ({"type_k": 8, "flash_attn": False}, "type_k"),
        ({"chat_format": "alpaca-9"}, "chat_format"),
        ({"embedding": True}, "embedding"),
        ({"spec_type": "ngram-9"}, "spec_type"),
        ({"confidence": -0.5}, "confidence"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_constructor_arguments_are_value_errors_naming_them(tiny_gguf, kwargs, name):
    with pytest.raises(ValueError, match=name):
        Llama(str(tiny_gguf), verbose=False, **kwargs)


def test_an_unknown_keyword_is_a_type_error(tiny_gguf):
    with pytest.raises(TypeError, match="n_ctxx"):
        Llama(str(tiny_gguf), n_ctxx=8, verbose=False)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"mirostat_mode": 2}, "mirostat_mode"),
        ({"suffix": "end"}, "suffix"),
        ({"grammar": "root ::= (("}, "grammar"),
        ({"spec_type": "draft-simple"}, "spec_type"),
        ({"confidence": "high"}, "confidence"),
    ],
)
def test_bad_completion_arguments_are_value_errors_naming_them(tiny, kwargs, name):
    with pytest.raises(ValueError, match=name):
        tiny("Hello", **kwargs)
    assert tiny("Hello", max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4


def test_bad_messages_are_a_value_error(tiny):
    with pytest.raises(ValueError, match="messages"):
        tiny.create_chat_completion([{"role": "user"}])
    with pytest.raises(ValueError, match="functions"):
        tiny.create_chat_completion([{"role": "user", "content": "hi"}], functions=[{"name": "f"}])


def test_a_prompt_past_the_context_is_a_value_error(tiny):
    with pytest.raises(ValueError, match="context"):
        tiny([5] * 600, max_tokens=4)


def test_detokenize_rejects_ids_outside_the_vocabulary(tiny):
    with pytest.raises(ValueError, match="tokens"):
        tiny.detokenize([tiny.n_vocab()])


def test_tokenize_and_detokenize_round_trip(smollm2):
    ids = smollm2.tokenize(b"Hello, world!")
    assert smollm2.detokenize(ids) == b"Hello, world!"
    assert smollm2.detokenize(smollm2.tokenize(b" world"), prev_tokens=smollm2.tokenize(b"Hello,")) == b" world"
    assert smollm2.n_ctx() == 2048 and smollm2.n_vocab() == 49152


def _no_end(llm):
    """A logit bias that keeps a generation from ending before its budget."""
    return {t: -100 for t in llm._engine.eog}


def _processing(llm):
    status, text = llm._engine.request("GET", "/metrics")
    assert status == 200
    line = next(l for l in text.splitlines() if l.startswith("hamburger_requests_processing "))
    return float(line.split()[1])


def _idle(llm):
    """Waits (a bounded while) until no request is being decoded."""
    for _ in range(600):
        if _processing(llm) == 0:
            return True
        threading.Event().wait(0.05)
    return False


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises KeyboardInterrupt, as in a terminal: a run started in
    the background (`nohup ... &`, some CI runners) inherits SIGINT
    ignored, and then `_thread.interrupt_main` does nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_keyboard_interrupt_stops_a_generation_and_the_model_stays_usable(smollm2, ctrl_c):
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        smollm2("Write a long story about a dragon.", max_tokens=1500, confidence=1.01, logit_bias=_no_end(smollm2))
    timer.cancel()
    assert _idle(smollm2), "the interrupted generation went on"
    assert smollm2("Hello", max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4


def test_keyboard_interrupt_stops_a_stream_and_the_model_stays_usable(smollm2, ctrl_c):
    chunks = 0
    with pytest.raises(KeyboardInterrupt):
        for _ in smollm2("Write a long story about a dragon.", max_tokens=1500, confidence=1.01,
                         logit_bias=_no_end(smollm2), stream=True):
            chunks += 1
            if chunks == 3:
                _thread.interrupt_main()
    assert _idle(smollm2), "the interrupted stream went on"
    assert smollm2("Hello", max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4


def test_from_pretrained_is_refused_in_one_line():
    with pytest.raises(ValueError, match="local GGUF"):
        Llama.from_pretrained(repo_id="lmstudio-community/Qwen3.5-0.8B-GGUF", filename="*Q8_0.gguf")
