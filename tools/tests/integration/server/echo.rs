//! A completion's `echo` and the prompt's log-probabilities, as lm-eval's
//! log-likelihood requests use them, checked against `hamburger-eval score`
//! (libllama on the fixture's base-only export: another implementation of
//! the same base); `max_tokens: 0`; and lm-eval's own API model classes
//! (`lm_eval_client.py` in `.venv-lm-eval`, which `scripts/install-deps.sh`
//! installs) against the binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use testing::testmodel::tiny_fixture;

use super::{assert_text_up_to_a_tie, post, start_with, tiny, Killed};

/// How far the server's log-probabilities may be from libllama's: both run
/// the F32 base with an F16 cache, in different orders of summation (they
/// differ by about 1e-6 per token).
const TOLERANCE: f64 = 1e-4;

/// What `hamburger-eval score` says of one prompt and response: the ids
/// (the user turn rendered by the chat template, then the response and the
/// end of turn), where the response starts, and for each response token its
/// log-probability under the base, the base's most likely token there and
/// that token's margin over the runner-up.
struct Scored {
    ids: Vec<u32>,
    n_prompt: usize,
    logprob: Vec<f64>,
    best: Vec<(u32, f64)>,
    margin: Vec<f64>,
}

/// Where the server and libllama may disagree on the most likely token: a
/// margin within twice [`TOLERANCE`] (each side's log-probabilities may be
/// off by it; they sum in other orders).
const NEAR_TIE: f64 = 2.0 * TOLERANCE;

/// The fixture's base alone in F32, as libllama loads it.
fn base_only(dir: &Path) -> PathBuf {
    let base = dir.join("tiny-base.gguf");
    let st = Command::new(env!("CARGO_BIN_EXE_hamburger-convert"))
        .arg(tiny_fixture())
        .arg("--outfile")
        .arg(&base)
        .args(["--outtype", "f32", "--no-progress", "--base-only"])
        .status()
        .unwrap();
    assert!(st.success());
    base
}

/// `hamburger-eval score --top 2` of `(prompt, response)` pairs.
fn eval_score(base: &Path, pairs: &[(&str, &str)]) -> Vec<Scored> {
    let mut child = testing::process::limited(env!("CARGO_BIN_EXE_hamburger-eval"))
        .args(["score", "-t", "1", "--top", "2", "-m"])
        .arg(tiny())
        .arg("--baseline")
        .arg(base)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let input: String = pairs.iter().map(|(p, r)| format!("{}\n", json!({"prompt": p, "response": r}))).collect();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<_>>();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let top = v["top"].as_array().unwrap();
            let best = top.iter().map(|t| (t[0][0].as_u64().unwrap() as u32, t[0][1].as_f64().unwrap()));
            let margin = top.iter().map(|t| t[0][1].as_f64().unwrap() - t[1][1].as_f64().unwrap());
            Scored {
                ids: ids(&v["ids"]),
                n_prompt: v["n_prompt"].as_u64().unwrap() as usize,
                logprob: v["logprob"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
                best: best.collect(),
                margin: margin.collect(),
            }
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < TOLERANCE
}

/// `echo` with `logprobs`: the text starts with the prompt's, the first
/// prompt token has no log-probability, the others have the base's (equal to
/// libllama's, with its most likely token first among the alternatives), and
/// the generated tokens follow as without `echo`; `max_tokens: 0` answers
/// the prompt alone; a stream starts with the prompt; a second identical
/// request (whose slot holds the prompt) scores it again.
#[test]
fn echo_returns_the_prompt_with_the_bases_log_probabilities() {
    let dir = tempfile::tempdir().unwrap();
    let scored = eval_score(&base_only(dir.path()), &[("Once upon a time", "there was a license")]);
    let s = &scored[0];
    let (child, addr) = start_with(&tiny(), &["-np", "1", "-c", "512"]);
    let _server = Killed(child);
    let body = json!({"prompt": s.ids, "max_tokens": 4, "temperature": 0, "logprobs": 2, "echo": true});
    let (status, v) = post(&addr, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let mut plain = body.clone();
    plain["echo"] = json!(false);
    let (_, p) = post(&addr, "/v1/completions", &plain);
    let (_, detok) = post(&addr, "/detokenize", &json!({"tokens": s.ids}));
    let prompt_text = detok["content"].as_str().unwrap();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, format!("{prompt_text}{}", p["choices"][0]["text"].as_str().unwrap()));
    let lp = &v["choices"][0]["logprobs"];
    let n = s.ids.len();
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n + 4);
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null(), "{lp}");
    for (i, (&want, &(best, best_lp))) in s.logprob.iter().zip(&s.best).enumerate() {
        let at = s.n_prompt + i;
        let got = lp["token_logprobs"][at].as_f64().unwrap();
        assert!(close(got, want), "prompt token {at}: {got} here, {want} in hamburger-eval score");
        // The alternatives are keyed by text (byte tokens share one): their
        // best is the base's most likely token's log-probability.
        let top = lp["top_logprobs"][at].as_object().unwrap();
        let top_lp = top.values().map(|x| x.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!(
            close(top_lp, best_lp),
            "prompt token {at}: best {top_lp} here, {best_lp} (token {best}) in hamburger-eval"
        );
    }
    // The generated tokens' part is the answer without echo (the prompt fed
    // in other forwards: equal up to rounding).
    let generated = &p["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap()[n..], generated["tokens"].as_array().unwrap()[..]);
    for (a, b) in
        lp["token_logprobs"].as_array().unwrap()[n..].iter().zip(generated["token_logprobs"].as_array().unwrap())
    {
        assert!(close(a.as_f64().unwrap(), b.as_f64().unwrap()), "{a} with echo, {b} without");
    }
    for count in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(v["usage"][count], p["usage"][count], "the same prompt and completion tokens");
    }
    let (_, again) = post(&addr, "/v1/completions", &body);
    assert_eq!(again["choices"][0]["logprobs"], v["choices"][0]["logprobs"], "a held prompt is scored again");

    // Streamed without log-probabilities: it keeps the scored cells and
    // feeds the last prompt token alone, as the scored request did, so its
    // answer is the same bits.
    let mut streamed = plain.clone();
    streamed.as_object_mut().unwrap().remove("logprobs");
    streamed["echo"] = json!(true);
    streamed["stream"] = json!(true);
    let sse = reqwest::blocking::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .json(&streamed)
        .send()
        .unwrap()
        .text()
        .unwrap();
    let chunks: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["text"], prompt_text, "the prompt comes first");
    let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(joined, text);

    let mut prompt_only = body.clone();
    prompt_only["max_tokens"] = json!(0);
    let (status, z) = post(&addr, "/v1/completions", &prompt_only);
    assert_eq!(status, 200, "{z}");
    assert_eq!(z["choices"][0]["text"], prompt_text);
    assert_eq!(z["choices"][0]["finish_reason"], "length");
    let usage = json!({"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n, "prompt_tokens_details": {"cached_tokens": 0}});
    assert_eq!(z["usage"], usage);
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(z["choices"][0]["logprobs"][key].as_array().unwrap()[..], lp[key].as_array().unwrap()[..n], "{key}");
    }
    let text_only = json!({"prompt": "Once upon a time", "max_tokens": 0, "echo": true});
    let (status, t) = post(&addr, "/v1/completions", &text_only);
    assert_eq!((status, &t["choices"][0]["text"]), (200, &json!("Once upon a time")), "{t}");
    assert!(t["choices"][0]["logprobs"].is_null());

    for (path, bad, param) in [
        ("/v1/completions", json!({"prompt": "a", "max_tokens": 0}), "max_tokens"),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "a"}], "echo": true}), "echo"),
    ] {
        let (status, e) = post(&addr, path, &bad);
        assert_eq!((status, &e["error"]["param"]), (400, &json!(param)), "{bad}: {e}");
    }
}

/// lm-eval's `local-completions` (token-id and text requests) and
/// `local-chat-completions` against the server: each log-likelihood equals
/// the sum of `hamburger-eval score`'s over the same continuation tokens,
/// `is_greedy` holds exactly when every continuation token is the base's
/// most likely one, and the generations equal the server's own answers to
/// the same greedy requests.
#[test]
fn lm_eval_api_models_get_the_bases_log_likelihoods_and_the_servers_answers() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv-lm-eval/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/install-deps.sh", python.display());
    let dir = tempfile::tempdir().unwrap();
    let scored = eval_score(&base_only(dir.path()), &[("Once upon a time", "there was a license"), ("Hello", "world")]);
    let (child, addr) = start_with(&tiny(), &["-np", "2", "-c", "1024"]);
    let _server = Killed(child);
    let text =
        |ids: &[u32]| post(&addr, "/detokenize", &json!({"tokens": ids})).1["content"].as_str().unwrap().to_string();
    // The pairs lm-eval scores: each response after its first token (a
    // context ending in the template's "\n" would lose it to the
    // continuation: lm-eval moves a context's trailing whitespace there), and
    // a greedy continuation: the base's most likely token after a start of
    // a response, one whose text is whole characters (so that it tokenizes back).
    let split = |s: &Scored| s.n_prompt + 1;
    // Each pair: context, continuation, log-likelihood, is_greedy (None
    // where a continuation token's best is a near-tie: either answer is right).
    type Pair = (Vec<u32>, Vec<u32>, f64, Option<bool>);
    let mut pairs: Vec<Pair> = scored
        .iter()
        .map(|s| {
            let greedy = s.ids[split(s)..].iter().zip(&s.best[1..]).all(|(&t, b)| t == b.0);
            let tie = s.margin[1..].iter().any(|&m| m < NEAR_TIE);
            let ll = s.logprob[1..].iter().sum();
            (s.ids[..split(s)].to_vec(), s.ids[split(s)..].to_vec(), ll, (!tie).then_some(greedy))
        })
        .collect();
    let greedy = scored
        .iter()
        .flat_map(|s| (1..s.best.len()).map(move |j| (s, j)))
        .find(|&(s, j)| {
            let (context, next) = (text(&s.ids[..s.n_prompt + j]), text(&[s.best[j].0]));
            let whole = !context.ends_with(char::is_whitespace) && !next.contains('\u{fffd}') && !next.starts_with('<');
            whole && s.margin[j] >= NEAR_TIE
        })
        .map(|(s, j)| (s.ids[..s.n_prompt + j].to_vec(), vec![s.best[j].0], s.best[j].1, Some(true)))
        .expect("a response with a greedy continuation that is text and no near-tie");
    pairs.push(greedy);
    assert!(
        pairs.iter().any(|p| p.3 == Some(false)),
        "a pair that is not greedy, so that is_greedy is tested both ways"
    );
    let generate: Vec<Value> =
        scored.iter().map(|s| json!({"prompt_ids": s.ids[..s.n_prompt], "max_gen_toks": 6})).collect();
    let messages = json!([{"role": "user", "content": "Once upon a time"}]);
    let request = json!({
        "url": format!("http://{addr}"),
        "tokenizer": tiny_fixture(),
        "loglikelihood": pairs.iter().map(|p| json!([p.0, p.1])).collect::<Vec<_>>(),
        "generate": generate,
        "chat": [{"messages": messages, "max_gen_toks": 6}],
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lm_eval_client.py");
    let mut child = Command::new(&python)
        .arg(script)
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lm_eval_client.py failed:\n{stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();

    for mode in ["tokenized", "text"] {
        let results = got[mode]["loglikelihood"].as_array().unwrap();
        assert_eq!(results.len(), pairs.len());
        for ((ctx, cont, want, greedy), r) in pairs.iter().zip(results) {
            let ll = r[0].as_f64().unwrap();
            assert!(close(ll, *want), "{mode}: {ctx:?} + {cont:?}: {ll} from lm-eval, {want} from hamburger-eval");
            if let Some(greedy) = greedy {
                assert_eq!(r[1].as_bool().unwrap(), *greedy, "{mode}: is_greedy of {ctx:?} + {cont:?}");
            }
        }
        // lm-eval's requests and these found the server's cells in other
        // states (what each reused was computed in other forwards), so the
        // answers agree up to a near-tie.
        for (s, text) in scored.iter().zip(got[mode]["generate"].as_array().unwrap()) {
            let body = json!({"prompt": s.ids[..s.n_prompt], "max_tokens": 6, "temperature": 0, "logprobs": 2});
            let (_, v) = post(&addr, "/v1/completions", &body);
            assert_text_up_to_a_tie(
                text.as_str().unwrap(),
                &v["choices"][0],
                NEAR_TIE,
                &format!("{mode}: generate_until"),
            );
        }
    }
    let body = json!({"messages": messages, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2});
    let (_, v) = post(&addr, "/v1/chat/completions", &body);
    assert_text_up_to_a_tie(got["chat"][0].as_str().unwrap(), &v["choices"][0], NEAR_TIE, "local-chat-completions");
}
