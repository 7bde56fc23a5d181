//! What a forward writes and which cells it writes them to: the KV cache's
//! cells and the sequences that hold them, the batch of inputs that takes
//! cells in one forward, and which rows compute alike so that cached cells
//! can be reused. Plain bookkeeping over ggml buffers, below the graphs that
//! read it and the engine that owns it (llama.cpp's `llama-batch`,
//! `llama-kv-cache` and `llama-memory`).
//!
//! * [`kv_cache`]: a preallocated pool of cells, each the entry of a set of
//!   sequences at one rope position; [`SeqId`](kv_cache::SeqId);
//! * [`batch`]: [`Batch`](batch::Batch), the inputs of one base forward
//!   (tokens, or a macro step's tokens merged), one cell each;
//! * [`row_class`]: which forwards compute a row alike, where a fresh read
//!   cuts a prompt, and how much of a cached prompt a new one may adopt.

pub mod batch;
pub mod kv_cache;
pub mod row_class;
