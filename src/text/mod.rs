//! Text in and out: the tokenizer embedded in the GGUF and the chat
//! templates that render messages into a prompt. It needs the model's
//! vocabulary facts and nothing of decoding, so front-ends and constraints
//! use it without an engine.
//!
//! * [`tokenizer`]: token ids to text and back, streamed a token at a time;
//! * [`chat`]: chat templates as transformers renders them (in a
//!   memory-limited child process), and the formats models call tools in.

pub mod chat;
pub mod tokenizer;
