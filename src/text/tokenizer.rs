//! Text to tokens and back, from the GGUF alone: the Hugging Face tokenizer
//! embedded as `tokenizer.huggingface.json`, with llama.cpp's BOS rule.

use crate::error::{Error, Result};
use crate::model::Model;

/// The model's tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    /// The JSON it was built from (the byte form of each token comes from it).
    json: std::sync::Arc<str>,
    bos: Option<u32>,
    add_bos: bool,
    /// The model's vocabulary size: ids the tokenizer produces must be below it.
    n_vocab: usize,
}

impl Tokenizer {
    /// Builds the tokenizer embedded in `model`'s file.
    ///
    /// # Errors
    /// When the file has no tokenizer JSON or it does not parse.
    pub fn from_model(model: &Model) -> Result<Tokenizer> {
        let json = model.vocab.tokenizer_json.as_deref().ok_or_else(|| {
            Error::Tokenizer(format!(
                "{} has no tokenizer.huggingface.json: give token ids instead of text",
                model.path.display()
            ))
        })?;
        Tokenizer::from_json(json, model.hp.n_vocab, model.vocab.bos, model.vocab.add_bos)
    }

    /// Builds a tokenizer from its Hugging Face JSON for a model of `n_vocab`
    /// tokens, prepending `bos` to prompts when `add_bos`.
    ///
    /// # Errors
    /// When the JSON does not parse as a tokenizer.
    pub fn from_json(json: &str, n_vocab: usize, bos: Option<u32>, add_bos: bool) -> Result<Tokenizer> {
        // `tokenizers` panics (`expect("Helper")` in its decoder) on JSON that is
        // not well formed: check the syntax first so a hostile file gets an error.
        serde_json::from_str::<serde::de::IgnoredAny>(json)
            .map_err(|e| Error::Tokenizer(format!("the tokenizer JSON is malformed: {e}")))?;
        let hf = tokenizers::Tokenizer::from_bytes(json.as_bytes()).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(Tokenizer { hf, json: json.into(), bos, add_bos, n_vocab })
    }

    /// Tokenizes `text`; special tokens written in the text are recognised. With
    /// `at_start`, BOS is prepended when the model wants it and the text lacks it.
    ///
    /// # Errors
    /// When the tokenizer fails, or produces an id outside the model's
    /// vocabulary (a tokenizer JSON that does not match the weights).
    pub fn encode(&self, text: &str, at_start: bool) -> Result<Vec<u32>> {
        let enc = self.hf.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.n_vocab) {
            return Err(Error::Tokenizer(format!(
                "the embedded tokenizer produced token {bad}, outside the model's vocabulary of {} tokens",
                self.n_vocab
            )));
        }
        if let (true, true, Some(bos)) = (at_start, self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The text of `ids` (special tokens included).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.hf.decode(ids, false).unwrap_or_default()
    }

    /// The ids of the special tokens (BOS, EOS, chat markers...), which a
    /// generated text leaves out.
    pub fn special_ids(&self) -> Vec<u32> {
        self.hf.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special).map(|(id, _)| id).collect()
    }

    /// The vocabulary size of the model this tokenizer serves.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The JSON the tokenizer was built from.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The text of one special token, such as the BOS for chat templates.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }
}

/// Turns a stream of token ids into text pieces, holding back bytes of an
/// incomplete UTF-8 character until the token that completes it arrives.
/// Each push decodes only a short window (the tokens since the last piece,
/// behind the few before it, as Hugging Face's streaming decoders do), so a
/// long generation costs linear, not quadratic, decoding.
pub struct TextStream<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    /// Where the window decoded for context starts.
    prefix: usize,
    /// Tokens already turned into text.
    read: usize,
}

impl<'t> TextStream<'t> {
    /// An empty stream.
    pub fn new(tok: &'t Tokenizer) -> TextStream<'t> {
        TextStream { tok, ids: Vec::new(), prefix: 0, read: 0 }
    }

    /// Appends tokens and returns the new complete text.
    pub fn push(&mut self, ids: &[u32]) -> String {
        self.ids.extend_from_slice(ids);
        // The context tokens decode the same inside both windows, so the
        // difference is exactly the new text, with the spacing the context gives.
        let before = self.tok.decode(&self.ids[self.prefix..self.read]);
        let text = self.tok.decode(&self.ids[self.prefix..]);
        if text.len() <= before.len() || text.ends_with('\u{FFFD}') || !text.is_char_boundary(before.len()) {
            return String::new();
        }
        let new = text[before.len()..].to_string();
        (self.prefix, self.read) = (self.read, self.ids.len());
        new
    }

    /// Ends the stream: the text held back, an incomplete UTF-8 character at
    /// the end as U+FFFD (a generation cut inside a character still returns
    /// the text before it).
    pub fn finish(&mut self) -> String {
        let before = self.tok.decode(&self.ids[self.prefix..self.read]);
        let text = self.tok.decode(&self.ids[self.prefix..]);
        (self.prefix, self.read) = (self.read, self.ids.len());
        match text.get(before.len()..) {
            Some(new) if text.len() > before.len() => new.to_string(),
            _ => String::new(),
        }
    }
}
