//! The engine, the layer that runs the graphs over the caches: it owns the
//! memory of many sequences and the graphs built for them, and answers
//! forwards and micro steps; it knows neither stop rules nor sessions, which
//! `decode/` builds on top.
//!
//! * `attention_groups`: whether a forward's rows attend by sequence or
//!   all over the union of their windows, whichever costs less;
//! * [`budget`]: [`EngineParams`], an engine's settings, and what they will
//!   allocate, checked before anything is (the memory plan);
//! * [`forward_cost`]: the measured times of its forwards and micro steps,
//!   and what a draft costs at those prices;
//! * [`calibration`]: the gate's prices fixed once per engine (timed, or
//!   read from the price cache), so that drafting does not follow the clock;
//! * [`counters`]: what it did, counted (graphs built and computed, host reads);
//! * `context`: a sequence's context in the caches (keep a prefix, rewind,
//!   adopt cached cells, drop rejected drafts);
//! * here, [`Engine`] (llama.cpp's `llama_context`): for up to `n_seq`
//!   sequences of one model, the base KV cache they share, each one's micro
//!   cache range and feature columns, the graphs built for them, and each
//!   one's next token position. It runs base forwards over batches of inputs
//!   of several sequences, and micro steps over several sequences at once;
//!   the decode loop ([`crate::decode::generate`]) and the single-sequence
//!   [`crate::decode::session::Session`] sit on top.

mod attention_groups;
pub mod budget;
pub mod calibration;
mod context;
pub mod counters;
pub mod forward_cost;

use std::rc::Rc;
use std::time::Instant;

use ggml::{Backend, Buffer, Context, Tensor, Type};

use crate::engine::attention_groups::{attend_by_seq, SeqWindow};
use crate::engine::budget::EngineParams;
use crate::engine::counters::EngineCounters;
use crate::engine::forward_cost::ForwardCosts;
use crate::error::{Error, Result};
use crate::error::{Param, ParamError};
use crate::graph::base::{self, BaseInputs, BaseLayout, BaseShape, OutRow, OutputRows, Wants};
use crate::graph::cache::GraphCache;
use crate::graph::layer::{attn_groups, Row};
use crate::graph::micro::{self, MicroInputs, MicroLayout, MicroShape, MicroWants};
use crate::graph::{StepGraph, StepOut};
use crate::memory::batch::Batch;
use crate::memory::kv_cache::{KvCache, SeqId, Window, KV_TILE};
use crate::memory::row_class::RowClasses;
use crate::model::Model;
use crate::sampling::TokenLogprob;

/// Attention windows start at a multiple of this many cells: ggml's CPU
/// flash attention sums in tiles of 64 cells from the window's start, so
/// a row sums over the same tiles wherever its sequence's window starts.
const KV_ALIGN: usize = 4 * KV_TILE;

/// Attention windows grow in steps of this many cells, so that decode
/// graphs are rebuilt every so many steps, and a window holds few masked
/// cells at its end (one query row's attention is split evenly across the
/// threads by cells, so masked cells leave a thread idle).
const KV_PAD: usize = 64;
// A window padded so always ends within the cache's whole last tile
// (`KvCache::window_of`), never cut at its last usable cell.
const _: () = assert!(KV_TILE.is_multiple_of(KV_PAD));

/// Caches, graphs and positions of several sequences over a borrowed model.
pub struct Engine<'m> {
    model: &'m Model,
    flash: bool,
    /// CPU threads and the KV element type (the price cache's key).
    n_threads: usize,
    kv_type: Type,
    backends: Vec<Rc<Backend>>,
    kv: KvCache,
    micro: KvCache,
    /// Each sequence's features `[D, F * R * n_seq]`, R slots per sequence
    /// ([`base::feature_rows_per_seq`]), one per output row of its last base
    /// forward: the base forward writes them, micro step 0 reads one slot.
    features: Tensor,
    _features_buf: Buffer,
    base_graphs: GraphCache<BaseShape, StepGraph<BaseInputs>>,
    micro_graphs: GraphCache<MicroShape, StepGraph<MicroInputs>>,
    next_pos: Vec<usize>,
    /// The feature slot of each sequence that micro step 0 reads (its last
    /// base forward's last output row, or the row [`Engine::keep_through_output`]
    /// kept); `None` when that forward stored no features.
    feature_row: Vec<Option<usize>>,
    /// Each sequence's output rows in its last base forward.
    out_rows: Vec<Vec<OutRow>>,
    /// Per sequence: inputs at positions below this one rewrite, in place,
    /// the entry the sequence already holds there ([`Engine::rewind`]).
    rewrite_below: Vec<usize>,
    forwards: usize,
    /// Whether the last base forward's sequences attended in a group each.
    attended_by_seq: bool,
    /// The times of its forwards and micro steps (the draft gate's prices).
    costs: ForwardCosts,
    counters: EngineCounters,
}

impl<'m> Engine<'m> {
    /// An engine with empty caches, placed as the model's plan says.
    ///
    /// # Errors
    /// On invalid settings or failed allocations.
    pub fn new(model: &'m Model, p: &EngineParams) -> Result<Engine<'m>> {
        let hp = &model.hp;
        p.check(model)?;
        let plan = &model.plan;
        let flash = p.fused_attention(model);
        let v_trans = !flash;
        let base_bufts: Vec<_> = (0..hp.n_layer).map(|il| plan.cache_layer(il)).collect();
        let kv = KvCache::new(&base_bufts, p.n_ctx, hp.n_embd_kv(), hp.head_dim, p.kv_type, v_trans)
            .map_err(|e| {
                let message =
                    format!("cannot allocate a KV cache of {} entries ({e}): use a smaller {}", p.n_ctx, Param::NCtx);
                ParamError::new(&[Param::NCtx], message)
            })?
            .with_homes(p.n_seq);
        let micro_bufts = vec![plan.tail(); hp.n_micro_layer];
        let micro_cells = micro::cells_per_seq(hp) * p.n_seq;
        let micro = KvCache::new(&micro_bufts, micro_cells, hp.n_embd_kv(), hp.head_dim, p.kv_type, v_trans)?;
        let fctx = Context::new(1, 0)?;
        let n_cols = (hp.n_features() * base::feature_rows_per_seq(hp) * p.n_seq) as i64;
        let features = fctx.new_tensor(Type::F32, &[hp.n_embd as i64, n_cols]).named("features");
        let features_buf = Buffer::alloc_context(&fctx, plan.tail())?;
        Ok(Engine {
            model,
            flash,
            n_threads: p.n_threads,
            kv_type: p.kv_type,
            backends: plan.backends(p.n_threads)?,
            kv,
            micro,
            features,
            _features_buf: features_buf,
            base_graphs: GraphCache::new(),
            micro_graphs: GraphCache::new(),
            next_pos: vec![0; p.n_seq],
            feature_row: vec![None; p.n_seq],
            out_rows: vec![Vec::new(); p.n_seq],
            rewrite_below: vec![0; p.n_seq],
            forwards: 0,
            attended_by_seq: true,
            costs: ForwardCosts::new(hp),
            counters: EngineCounters::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The base KV cache (sizes, cells in use).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Sequences this engine holds.
    pub fn n_seq(&self) -> usize {
        self.next_pos.len()
    }

    /// Tokens in `seq`'s context (the next token position).
    pub fn next_pos(&self, seq: SeqId) -> usize {
        self.next_pos[seq]
    }

    /// Whether it fuses attention (flash attention): as its settings gave,
    /// or as [`EngineParams::fused_attention`] chose.
    pub fn fuses_attention(&self) -> bool {
        self.flash
    }

    /// Which of its base forwards compute a row alike ([`crate::memory::row_class`]):
    /// known for ggml's CPU backend alone.
    pub fn row_classes(&self) -> RowClasses {
        if !self.model.plan.cpu_only() {
            RowClasses::Unknown
        } else if self.flash {
            RowClasses::CpuFlashAttention
        } else {
            RowClasses::Cpu
        }
    }

    /// What its forwards and micro steps have cost so far ([`ForwardCosts`]).
    pub fn costs(&self) -> &ForwardCosts {
        &self.costs
    }

    /// What it has done so far, counted ([`EngineCounters`]).
    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Whether the last base forward's sequences each attended their own
    /// window in a group of their own rows, rather than all rows the union
    /// of the windows (when a sequence's cells lie scattered in the pool):
    /// which rows a row's attention class counts ([`RowClasses::alike_within`]).
    pub fn attended_by_seq(&self) -> bool {
        self.attended_by_seq
    }

    /// Base forwards (macro steps of all sequences together) run so far.
    pub fn n_forwards(&self) -> usize {
        self.forwards
    }

    /// Puts the CPU workers to sleep until the next graph instead of letting
    /// them spin (see [`ggml::ThreadPool::pause`]): for a caller about to
    /// idle or to let other work have the cores, such as a benchmark timing
    /// another engine.
    pub fn pause_threads(&self) {
        self.backends.iter().for_each(|b| b.pause_threads());
    }

    fn check_tokens<'a>(&self, tokens: impl IntoIterator<Item = &'a u32>) -> Result<()> {
        let n_vocab = self.model.hp.n_vocab;
        match tokens.into_iter().find(|&&t| t as usize >= n_vocab) {
            Some(t) => Err(Error::Invalid(format!("token id {t} is outside the vocabulary of {n_vocab}"))),
            None => Ok(()),
        }
    }

    /// One base forward over `batch`: each input takes a free cell of its
    /// sequence. Returns, for each sequence of the batch in order of first
    /// appearance, the outputs of its output rows (its last input, and the
    /// inputs pushed as output rows before it, in batch order) as
    /// `(sequence, outputs)` (the logits and the stop probability only if
    /// `want` asks; the features for micro step 0 are stored only if it asks,
    /// and micro step 0 refuses a sequence without; it reads the last output
    /// row's unless [`Engine::keep_through_output`] keeps an earlier one).
    ///
    /// # Errors
    /// On an unknown sequence or token, a full cache, or a failed computation
    /// (the batch's cells are freed again then).
    pub fn decode(&mut self, batch: &Batch, want: Wants) -> Result<Vec<(SeqId, StepOut)>> {
        self.forward(batch, want, OutputRows::LastOfEachSequence)
    }

    /// One base forward over `batch` (single-token inputs) with outputs at
    /// every input, in batch order, and no features stored: a verify
    /// forward of speculative decoding, which reads the distribution after
    /// the last committed token and after each drafted one ([`crate::decode::draft_model`]).
    ///
    /// # Errors
    /// As [`Engine::decode`].
    pub fn decode_every(&mut self, batch: &Batch, want: Wants) -> Result<Vec<(SeqId, StepOut)>> {
        self.forward(batch, Wants { features: false, ..want }, OutputRows::Every)
    }

    /// Scores `tokens` in sequence `seq` with the base alone, as a plain
    /// Llama reads a prompt: feeds all but the last token as single-token
    /// inputs after `seq`'s context, at most `n_batch` per forward, reading
    /// the logits at every input, and returns each later token's
    /// log-probability given everything before it, with the `top` most
    /// likely alternatives (`tokens.len() - 1` entries: nothing in `tokens`
    /// predicts the first). The last token is left for the caller to feed: a
    /// generation that follows needs its forward's outputs (the next token's
    /// logits, the features of micro step 0). This is what it costs to know
    /// a prompt's log-probabilities (an lm-eval log-likelihood request, a
    /// completion's `echo` with `logprobs`), so it is run only when asked.
    ///
    /// # Errors
    /// As [`Engine::decode`]; the entries of the chunks already fed stay in `seq`.
    pub fn score(&mut self, seq: SeqId, tokens: &[u32], n_batch: usize, top: usize) -> Result<Vec<TokenLogprob>> {
        let Some((_, fed)) = tokens.split_last() else { return Ok(Vec::new()) };
        let want = Wants { stop_head: false, logits: true, features: false, draft_stop: false };
        let n_batch = n_batch.max(1);
        let mut scored = Vec::with_capacity(fed.len());
        for (c, chunk) in fed.chunks(n_batch).enumerate() {
            let mut batch = Batch::new();
            batch.push_tokens(seq, chunk);
            let outs = self.forward(&batch, want, OutputRows::Every)?;
            let next = &tokens[c * n_batch + 1..];
            for ((_, out), &token) in outs.iter().zip(next) {
                let logits = out.logits.as_deref().expect("a scoring forward reads the logits");
                scored.push(TokenLogprob::new(logits, token, top));
            }
        }
        Ok(scored)
    }

    /// One base forward over `batch` with outputs at `rows` (see [`Engine::decode`]).
    fn forward(&mut self, batch: &Batch, want: Wants, rows: OutputRows) -> Result<Vec<(SeqId, StepOut)>> {
        if batch.is_empty() {
            return Err(Error::Invalid("nothing to decode: the batch is empty".into()));
        }
        if let Some(i) = batch.inputs().iter().find(|i| i.seq >= self.n_seq()) {
            return Err(Error::Invalid(format!("sequence {} is beyond the engine's {}", i.seq, self.n_seq())));
        }
        self.check_tokens(batch.tokens())?;
        // The draft head's stop probability only where there is a draft head
        // (one graph for both values otherwise).
        let want = Wants { draft_stop: want.draft_stop && self.model.weights.has_draft_head(), ..want };
        let (pos, next_pos) = base::positions(batch, &self.next_pos);
        // Inputs that rewrite an entry in place keep its cell; the others take free ones.
        let rewrites: Vec<Option<usize>> = batch
            .inputs()
            .iter()
            .zip(&pos)
            .map(|(i, &p)| {
                let rewrite = i.n_tokens == 1 && (p as usize) < self.rewrite_below[i.seq];
                rewrite.then(|| self.kv.cell_of(i.seq, p)).flatten()
            })
            .collect();
        let new_seqs: Vec<SeqId> =
            batch.inputs().iter().zip(&rewrites).filter(|(_, r)| r.is_none()).map(|(i, _)| i.seq).collect();
        let n = new_seqs.len();
        let new_cells = self.kv.find_free_for(&new_seqs).ok_or_else(|| {
            let message = format!(
                "the KV cache is full: {n} more entries do not fit in {} (use a larger {})",
                self.kv.n_cells(),
                Param::NCtx
            );
            ParamError::new(&[Param::NCtx], message)
        })?;
        let mut free = new_cells.iter().copied();
        let cells: Vec<usize> = rewrites.iter().map(|r| r.or_else(|| free.next()).expect("a cell each")).collect();
        for (((i, &c), &p), r) in batch.inputs().iter().zip(&cells).zip(&pos).zip(&rewrites) {
            if r.is_none() {
                self.kv.occupy(c, i.seq, p);
            }
        }
        let kv = &self.kv;
        // Each sequence's window, once per forward (each is a scan of the cells).
        let windows: Vec<(SeqId, Window)> = batch
            .seqs()
            .into_iter()
            .map(|seq| (seq, kv.window_of(seq, KV_ALIGN, KV_PAD).expect("a sequence of the batch holds its cells")))
            .collect();
        let window = |seq| windows.iter().find(|&&(s, _)| s == seq).map(|&(_, w)| w).expect("a sequence of the batch");
        let seq_windows: Vec<SeqWindow> = windows
            .iter()
            .map(|&(seq, window)| {
                let rows = batch.inputs().iter().filter(|i| i.seq == seq).count();
                SeqWindow { rows, window, held: kv.n_cells_of(seq) }
            })
            .collect();
        let by_seq = attend_by_seq(&seq_windows, self.flash, self.n_threads);
        if !by_seq {
            log::debug!("forward {}: every row attends the union of {} windows", self.forwards, windows.len());
        }
        let groups = |r: &[Row]| attn_groups(r, window, by_seq);
        let layout = BaseLayout::new(&self.model.hp, batch, &pos, &cells, groups, want, rows);
        let per_seq = base::feature_rows_per_seq(&self.model.hp);
        if let Some(r) = layout.out_rank.iter().find(|&&r| want.features && r >= per_seq) {
            new_cells.iter().for_each(|&c| self.kv.release(c));
            return Err(Error::Invalid(format!(
                "{} output rows of one sequence in a base forward: features are kept for {per_seq}",
                r + 1
            )));
        }
        let (model, kv, features, flash, backends) = (self.model, &self.kv, &self.features, self.flash, &self.backends);
        let (costs, counters) = (&mut self.costs, &mut self.counters);
        let mut run = || -> Result<Vec<StepOut>> {
            let (sg, run) =
                self.base_graphs.get(layout.shape.clone(), |s| base::build(model, kv, features, s, flash, backends))?;
            let started = Instant::now();
            sg.inputs.set(kv, &layout)?;
            sg.sched.compute(&sg.graph)?;
            let outs = sg.outputs.read(want.logits)?;
            counters.computed(run.built, sg.outputs.host_reads(want.logits));
            if run.warm {
                costs.record_forward(batch.inputs().len(), started.elapsed());
            }
            Ok(outs)
        };
        match run() {
            Ok(outs) => {
                for s in batch.seqs() {
                    self.out_rows[s].clear();
                }
                for ((&s, &row), &r) in layout.out_seqs.iter().zip(&layout.out_rows).zip(&layout.out_rank) {
                    self.out_rows[s].push(row);
                    self.feature_row[s] = want.features.then_some(r);
                }
                self.next_pos = next_pos;
                self.forwards += 1;
                self.attended_by_seq = by_seq;
                Ok(layout.out_seqs.into_iter().zip(outs).collect())
            }
            Err(e) => {
                new_cells.iter().for_each(|&c| self.kv.release(c));
                Err(e)
            }
        }
    }

    /// Micro step `s` of the current macro step of each `(seq, token)`:
    /// feeds `token` (t_s) to the micro decoder and returns out_{s+1}'s
    /// outputs (what `want` asks for), in order. Step 0 first feeds the
    /// features of the sequence's last base forward. With `want.drafts`, the
    /// model's draft head runs where it has one; with `want.draft_vocab` and
    /// a draft vocabulary the next token is drawn from it alone: the argmax
    /// is mapped back to its token id, and the logits are the full
    /// vocabulary's, minus infinity outside it. A draft head that copies
    /// reads `copies`: its M candidates per input, longest n-gram first
    /// ([`crate::model::hparams::HParams::draft_copy_ngram`]), or none at
    /// all (empty: every candidate missing); other steps ignore them.
    ///
    /// # Errors
    /// When `s` is beyond the micro cache, a sequence or token is unknown or
    /// repeated, `copies` holds neither none nor M per input, or a
    /// computation fails.
    pub fn micro_step(
        &mut self,
        s: usize,
        inputs: &[(SeqId, u32)],
        copies: &[Option<u32>],
        want: MicroWants,
    ) -> Result<Vec<StepOut>> {
        let hp = &self.model.hp;
        if s + 1 >= hp.max_steps {
            return Err(Error::Invalid(format!("micro step {s} is beyond max_steps {}", hp.max_steps)));
        }
        let n_seq = self.n_seq();
        if inputs.iter().enumerate().any(|(j, &(q, _))| q >= n_seq || inputs[..j].iter().any(|&(p, _)| p == q)) {
            return Err(Error::Invalid(format!("micro step: sequences must be distinct and below {n_seq}")));
        }
        self.check_tokens(inputs.iter().map(|(_, t)| t).chain(copies.iter().flatten()))?;
        if let Some(&(seq, _)) = inputs.iter().find(|&&(q, _)| self.feature_row[q].is_none()).filter(|_| s == 0) {
            return Err(Error::Invalid(format!(
                "micro step 0 of sequence {seq}: its last base forward stored no features (one token per step)"
            )));
        }
        let per_seq = base::feature_rows_per_seq(hp);
        let slots: Vec<usize> =
            inputs.iter().map(|&(q, _)| q * per_seq + self.feature_row[q].unwrap_or_default()).collect();
        let (n_cols, n_cells) = (self.features.ne()[1] as usize, self.micro.n_cells());
        let draft_vocab = self.model.draft_vocab.as_ref();
        // (One graph for both values of each where it changes nothing.)
        let want = MicroWants {
            drafts: want.drafts && self.model.weights.has_draft_head(),
            draft_vocab: want.draft_vocab && draft_vocab.is_some(),
            ..want
        };
        let n_copies = if want.drafts { hp.draft_copy_ngram } else { 0 };
        if !copies.is_empty() && copies.len() != inputs.len() * n_copies {
            return Err(Error::Invalid(format!(
                "micro step: {} copy candidates for {} inputs of a head that reads {n_copies} each",
                copies.len(),
                inputs.len()
            )));
        }
        let layout = MicroLayout::new(hp, s, inputs, copies, &slots, n_cols, n_cells, want);
        if s == 0 {
            inputs.iter().for_each(|&(seq, _)| self.micro.clear_seq(seq));
        }
        for r in &layout.rows {
            self.micro.occupy(r.cell, r.seq, r.pos);
        }
        let (model, cache, features, flash, backends) =
            (self.model, &self.micro, &self.features, self.flash, &self.backends);
        let (sg, run) = self
            .micro_graphs
            .get(layout.shape.clone(), |s| micro::build(model, cache, features, s, flash, backends))?;
        let started = Instant::now();
        sg.inputs.set(cache, &layout)?;
        sg.sched.compute(&sg.graph)?;
        let mut outs = sg.outputs.read(want.logits)?;
        self.counters.computed(run.built, sg.outputs.host_reads(want.logits));
        if run.warm {
            self.costs.record_micro(inputs.len(), started.elapsed());
        }
        if let Some(d) = draft_vocab.filter(|_| layout.shape.draft_vocab) {
            for out in &mut outs {
                out.argmax = d.ids[out.argmax as usize];
                out.logits = out.logits.take().map(|l| d.scatter(&l, hp.n_vocab));
            }
        }
        Ok(outs)
    }
}
