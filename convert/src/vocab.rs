//! The tokenizer: a Hugging Face `tokenizer.json` (byte-level BPE) and
//! `tokenizer_config.json` turned into llama.cpp's `tokenizer.ggml.*` keys,
//! plus the verbatim JSON and the chat template, so a GGUF alone can run.

use std::collections::HashMap;
use std::path::Path;

use ggml::gguf::{Array, Value};
use hamburger::arch::{keys, token_type, END_OF_GENERATION_TEXTS};
use serde_json::Value as Json;

use crate::ConvertError;

/// The tokenizer metadata of a GGUF.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Key/value pairs to write.
    pub metadata: Vec<(String, Value)>,
}

fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// Names llama.cpp's pre-tokenizer (regex set) for a `pre_tokenizer` JSON.
fn detect_pre(pre: &Json) -> Option<&'static str> {
    let ty = |v: &Json| v.get("type").and_then(Json::as_str).map(str::to_string);
    match ty(pre)?.as_str() {
        "ByteLevel" if pre.get("use_regex").and_then(Json::as_bool) != Some(false) => Some("gpt-2"),
        "Sequence" => {
            let items = pre.get("pretokenizers")?.as_array()?;
            let kinds: Vec<String> = items.iter().filter_map(ty).collect();
            match kinds.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                ["Digits", "ByteLevel"]
                    if items[0].get("individual_digits").and_then(Json::as_bool) == Some(true)
                        && items[1].get("use_regex").and_then(Json::as_bool) != Some(false) =>
                {
                    Some("smollm")
                }
                ["Split", "ByteLevel"] => {
                    let re = items[0].get("pattern")?.get("Regex")?.as_str()?;
                    (re.contains("\\p{N}{1,3}") && re.contains("(?i:'s|'t|'re|'ve|'m|'ll|'d)")).then_some("llama-bpe")
                }
                _ => None,
            }
        }
        _ => None,
    }
}

impl Vocab {
    /// Builds the metadata from `tokenizer.json` and `tokenizer_config.json`
    /// (optional) for a model of `n_vocab` tokens. `pre_override` names the
    /// pre-tokenizer when it cannot be recognised.
    ///
    /// # Errors
    /// On a non-BPE tokenizer, an unrecognised pre-tokenizer, or ids beyond `n_vocab`.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config: Option<&Path>,
        config_bos: Option<i64>,
        config_eos: Option<i64>,
        n_vocab: usize,
        pre_override: Option<&str>,
    ) -> Result<Vocab, ConvertError> {
        let raw = std::fs::read_to_string(tokenizer_json).map_err(|e| ConvertError::io(tokenizer_json, e))?;
        let bad = |msg: String| ConvertError::Tokenizer { path: tokenizer_json.into(), msg };
        let tj: Json = serde_json::from_str(&raw).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let tc: Json = match tokenizer_config {
            Some(p) if p.exists() => {
                let text = std::fs::read_to_string(p).map_err(|e| ConvertError::io(p, e))?;
                serde_json::from_str(&text)
                    .map_err(|e| ConvertError::Tokenizer { path: p.into(), msg: format!("invalid JSON: {e}") })?
            }
            _ => Json::Null,
        };
        let model = tj.get("model").ok_or_else(|| bad("no model section".into()))?;
        if model.get("type").and_then(Json::as_str) != Some("BPE") {
            return Err(bad("only byte-level BPE tokenizers are supported".into()));
        }
        let vocab = model.get("vocab").and_then(Json::as_object).ok_or_else(|| bad("no vocab".into()))?;
        let mut tokens: Vec<Option<(String, i32)>> = vec![None; n_vocab];
        let mut put = |id: i64, text: String, ty: i32| -> Result<(), ConvertError> {
            let slot = usize::try_from(id).ok().and_then(|i| tokens.get_mut(i)).ok_or_else(|| {
                bad(format!("token id {id} ({text:?}) is beyond the model's vocabulary of {n_vocab}"))
            })?;
            *slot = Some((text, ty));
            Ok(())
        };
        for (text, id) in vocab {
            put(id.as_i64().ok_or_else(|| bad(format!("bad id of {text:?}")))?, text.clone(), token_type::NORMAL)?;
        }
        let mut specials: HashMap<String, i64> = HashMap::new();
        for t in tj.get("added_tokens").and_then(Json::as_array).into_iter().flatten() {
            let (Some(id), Some(text)) = (t.get("id").and_then(Json::as_i64), t.get("content").and_then(Json::as_str))
            else {
                return Err(bad("malformed added token".into()));
            };
            let special = t.get("special").and_then(Json::as_bool).unwrap_or(false);
            put(id, text.to_string(), if special { token_type::CONTROL } else { token_type::USER_DEFINED })?;
            specials.insert(text.to_string(), id);
        }
        let (texts, types): (Vec<String>, Vec<i32>) = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), token_type::UNUSED)))
            .unzip();
        let merges: Vec<String> = model
            .get("merges")
            .and_then(Json::as_array)
            .ok_or_else(|| bad("no merges".into()))?
            .iter()
            .map(|m| match m {
                Json::String(s) => Ok(s.clone()),
                Json::Array(p) if p.len() == 2 => {
                    Ok(format!("{} {}", p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or("")))
                }
                _ => Err(bad("malformed merge".into())),
            })
            .collect::<Result<_, _>>()?;
        let pre = match pre_override {
            Some(p) => p.to_string(),
            None => detect_pre(tj.get("pre_tokenizer").unwrap_or(&Json::Null))
                .ok_or_else(|| {
                    bad("unrecognised pre-tokenizer; name llama.cpp's with --vocab-pre (gpt-2, llama-bpe, smollm, ...)"
                        .into())
                })?
                .to_string(),
        };
        let lookup = |key: &str| -> Option<i64> {
            let text = token_text(tc.get(key)?)?;
            specials.get(&text).copied().or_else(|| vocab.get(&text).and_then(Json::as_i64))
        };
        let bos = lookup("bos_token").or(config_bos);
        let eos = lookup("eos_token").or(config_eos);
        let eot = END_OF_GENERATION_TEXTS.iter().find_map(|t| specials.get(*t).copied());
        let eom = specials.get("<|eom_id|>").copied();
        let pad = lookup("pad_token");
        let unk = lookup("unk_token");
        let add_bos = tc.get("add_bos_token").and_then(Json::as_bool).unwrap_or_else(|| {
            // A TemplateProcessing post-processor that starts with the BOS token adds it.
            let first = tj.pointer("/post_processor/single/0/SpecialToken/id").and_then(Json::as_str);
            first.is_some() && first.map(str::to_string) == tc.get("bos_token").and_then(token_text)
        });
        let add_eos = tc.get("add_eos_token").and_then(Json::as_bool).unwrap_or(false);

        let mut md: Vec<(String, Value)> = vec![
            (keys::TOKENIZER_MODEL.into(), Value::Str("gpt2".into())),
            (keys::TOKENIZER_PRE.into(), Value::Str(pre)),
            (keys::TOKENIZER_TOKENS.into(), Value::Array(Array::Str(texts))),
            (keys::TOKENIZER_TOKEN_TYPE.into(), Value::Array(Array::I32(types))),
            (keys::TOKENIZER_MERGES.into(), Value::Array(Array::Str(merges))),
        ];
        for (key, id) in [
            (keys::TOKENIZER_BOS_ID, bos),
            (keys::TOKENIZER_EOS_ID, eos),
            (keys::TOKENIZER_EOT_ID, eot),
            (keys::TOKENIZER_EOM_ID, eom),
            (keys::TOKENIZER_PAD_ID, pad),
            (keys::TOKENIZER_UNK_ID, unk),
        ] {
            if let Some(id) = id.filter(|&i| i >= 0 && (i as usize) < n_vocab) {
                md.push((key.into(), Value::U32(id as u32)));
            }
        }
        md.push((keys::TOKENIZER_ADD_BOS.into(), Value::Bool(add_bos)));
        md.push((keys::TOKENIZER_ADD_EOS.into(), Value::Bool(add_eos)));
        md.push((keys::TOKENIZER_HF_JSON.into(), Value::Str(raw)));
        let template = match tc.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        if let Some(t) = template {
            md.push((keys::CHAT_TEMPLATE.into(), Value::Str(t)));
        }
        Ok(Vocab { metadata: md })
    }
}
