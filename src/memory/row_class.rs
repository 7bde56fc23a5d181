//! Which base forwards compute a row alike, and so how much of a cached
//! prompt can be reused without changing the answer.
//!
//! ggml's CPU kernels pick their summation order by the number of rows an
//! operation has (read from ggml-cpu's sources and measured on SmolLM2): one
//! row takes ggml's `vec_dot` path, two or more llamafile's tinyBLAS (F32
//! and F16 weights); K-quant weights take a tiled matrix product from 8
//! rows; flash attention takes a tiled path from 64 query rows. The matrix
//! products by the weights hold all the rows of a forward; attention holds
//! one sequence's rows (each sequence attends in its own group,
//! [`crate::graph::layer::AttnGroup`]). So a row's class is the forward's
//! row count for the products and its sequence's row count for attention;
//! within one class, each row comes out as the same bits whatever else its
//! forward holds (other sequences' rows, a prompt cut elsewhere); across
//! classes the last places differ (F32 SmolLM2: logits by 3e-3 between one
//! row and two; Q8_0: by 0.5 between the flash-attention paths), which is
//! enough to flip a near-tie at temperature 0.
//!
//! So a prompt read in pieces gives the answer the whole prompt gives when
//! every piece is read in a forward of the class the whole prompt's forward
//! has. The decode loop cuts prompts into chunks that end at multiples of
//! `n_batch` positions, as a fresh prompt is cut, and records whether each
//! chunk's forward had its fresh class ([`crate::decode::generate::SeqGen::prompt_read_alike`]);
//! [`reusable_prefix`] says how much of a sequence's cached prompt a new
//! prompt can keep so that the rest is read as a fresh prompt reads it.

/// The row-count classes of an engine's forwards: within one class a row's
/// result does not depend on the forward's other rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowClasses {
    /// ggml's CPU backend with flash attention: products of 1, 2..=7, 8 and
    /// more rows; attention of 1, 2..=63, 64 and more.
    CpuFlashAttention,
    /// ggml's CPU backend with plain attention: 1, 2..=7, 8 and more rows,
    /// in the products and in attention.
    Cpu,
    /// Some layers on a GPU or a remote device, whose kernels follow other
    /// rules: no two row counts are promised to compute alike.
    Unknown,
}

/// The first row count of each class of ggml's CPU matrix products.
const PRODUCT_CLASSES: [usize; 3] = [1, 2, 8];

/// The first row count of each class of ggml's CPU flash attention.
const FLASH_ATTENTION_CLASSES: [usize; 3] = [1, 2, 64];

/// The class (its smallest row count) `rows` falls in among `bounds`.
fn class_in(bounds: &[usize], rows: usize) -> usize {
    bounds.iter().rev().find(|&&b| rows >= b).copied().unwrap_or(1)
}

impl RowClasses {
    /// The smallest row count of the class of a forward of `rows` rows of
    /// one sequence (`None` when the classes are unknown).
    pub fn class_of(self, rows: usize) -> Option<usize> {
        let bounds: &[usize] = match self {
            RowClasses::CpuFlashAttention => &[1, 2, 8, 64],
            RowClasses::Cpu => &PRODUCT_CLASSES,
            RowClasses::Unknown => return None,
        };
        Some(class_in(bounds, rows))
    }

    /// Whether forwards of `a` and `b` rows of one sequence compute a row alike.
    pub fn alike(self, a: usize, b: usize) -> bool {
        self.alike_within(a, a, b)
    }

    /// Whether a sequence's `own` rows in a forward of `total` rows compute
    /// as a forward of `alone` rows of that sequence by itself does: the
    /// products' classes by the forwards' rows, attention's by the sequence's.
    pub fn alike_within(self, total: usize, own: usize, alone: usize) -> bool {
        let attention: &[usize] = match self {
            RowClasses::CpuFlashAttention => &FLASH_ATTENTION_CLASSES,
            RowClasses::Cpu => &PRODUCT_CLASSES,
            RowClasses::Unknown => return false,
        };
        class_in(&PRODUCT_CLASSES, total) == class_in(&PRODUCT_CLASSES, alone)
            && class_in(attention, own) == class_in(attention, alone)
    }
}

/// The chunk a fresh read of a prompt of `n` tokens, `n_batch` per forward,
/// puts position `pos` in: `[start, end)`, cut at multiples of `n_batch`.
pub fn fresh_chunk(pos: usize, n: usize, n_batch: usize) -> (usize, usize) {
    let start = pos / n_batch * n_batch;
    (start, (start + n_batch).min(n))
}

/// How much of a sequence's cells a new prompt keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// Leading tokens whose cells are kept; the prompt is fed from here.
    pub keep: usize,
    /// Whether the answer is the one a fresh read of the prompt gives: the
    /// kept cells are what it would compute, and the rest is read in
    /// forwards of its classes.
    pub exact: bool,
}

/// How much of a sequence's cells a new prompt of `prompt_len` tokens keeps,
/// given that its first `common` tokens are the tokens the cells hold, and
/// that the cells of the first `alike` tokens are what a fresh read of an
/// earlier prompt of that length computed (0: none are known to be; cells
/// written by generation never are: each was one row of a decode step).
///
/// Within the cells a fresh read would compute alike, the kept part ends so
/// that the rest of its chunk is read in a forward of the class the fresh
/// read's chunk has (at most 63 rows more than the bare common start; a
/// chunk whose class differs between the earlier prompt and this one is
/// read again whole). Past them (a chat's next turn, whose cached cells hold
/// the last answer), everything in common is kept but the last prompt token,
/// whose forward gives the first output: faster, but not the fresh answer.
pub fn reusable_prefix(classes: RowClasses, n_batch: usize, common: usize, prompt_len: usize, alike: usize) -> Reuse {
    let common = common.min(prompt_len.saturating_sub(1));
    if classes == RowClasses::Unknown || common > alike {
        return Reuse { keep: common, exact: false };
    }
    let n_batch = n_batch.max(1);
    let (start, end) = fresh_chunk(common, prompt_len, n_batch);
    if common == start {
        return Reuse { keep: common, exact: true };
    }
    let (_, earlier_end) = fresh_chunk(start, alike, n_batch);
    if !classes.alike(earlier_end - start, end - start) {
        return Reuse { keep: start, exact: true };
    }
    let class = classes.class_of(end - start).unwrap_or(1);
    Reuse { keep: common.min(end - class), exact: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_ggml_cpu_paths() {
        let f = RowClasses::CpuFlashAttention;
        assert_eq!([1, 2, 7, 8, 63, 64, 4096].map(|n| f.class_of(n)), [1, 2, 2, 8, 8, 64, 64].map(Some));
        assert!(f.alike(2, 7) && f.alike(64, 2048) && !f.alike(1, 2) && !f.alike(63, 64));
        assert!(RowClasses::Cpu.alike(8, 2048) && !RowClasses::Cpu.alike(7, 8));
        assert!(!RowClasses::Unknown.alike(3, 3));
    }

    #[test]
    fn a_sequences_rows_among_others_take_the_products_class_of_the_forward_and_attentions_of_their_own() {
        let f = RowClasses::CpuFlashAttention;
        // 40 prompt rows beside 30 other rows: products of 70 (class 8..), attention of 40 (2..=63).
        assert!(f.alike_within(70, 40, 40));
        // 60 rows beside 8: products alike with 64, attention not (tiled from 64).
        assert!(!f.alike_within(68, 60, 64));
        // One row beside seven: attention of one, products of eight.
        assert!(!f.alike_within(8, 1, 1), "products of eight rows are not one row's");
        assert!(RowClasses::Cpu.alike_within(70, 40, 40) && !RowClasses::Cpu.alike_within(9, 7, 8));
        assert!(!RowClasses::Unknown.alike_within(3, 3, 3));
    }

    #[test]
    fn a_repeated_prompt_rereads_its_tail_in_the_class_of_its_fresh_read() {
        let f = RowClasses::CpuFlashAttention;
        // 34 tokens read fresh in one forward of 34 rows: keep 26, read 8.
        assert_eq!(reusable_prefix(f, 512, 34, 34, 34), Reuse { keep: 26, exact: true });
        // 5 tokens (class 2..=7): keep 3, read 2; 300 tokens: read the last 64.
        assert_eq!(reusable_prefix(f, 512, 5, 5, 5).keep, 3);
        assert_eq!(reusable_prefix(f, 512, 300, 300, 300).keep, 236);
        // A longer prompt sharing 200 tokens of an earlier one's 250.
        assert_eq!(reusable_prefix(f, 512, 200, 900, 250), Reuse { keep: 200, exact: true });
        // Chunks of 128: the 300-token prompt's last chunk is 256..300 (44 rows, class 8..=63).
        assert_eq!(reusable_prefix(f, 128, 299, 300, 300).keep, 292);
        // A common start ending on a chunk boundary is kept whole.
        assert_eq!(reusable_prefix(f, 128, 256, 300, 300).keep, 256);
    }

    #[test]
    fn cells_read_in_another_class_are_read_again() {
        let f = RowClasses::CpuFlashAttention;
        // The earlier prompt had 40 tokens (one forward of class 8..=63);
        // this one has 100 (class 64..): its 40 common cells are not what it computes.
        assert_eq!(reusable_prefix(f, 512, 40, 100, 40), Reuse { keep: 0, exact: true });
        // Plain attention puts both in one class.
        assert_eq!(reusable_prefix(RowClasses::Cpu, 512, 40, 100, 40), Reuse { keep: 40, exact: true });
    }

    #[test]
    fn cells_past_the_prompt_or_on_a_gpu_are_kept_but_not_exact() {
        let f = RowClasses::CpuFlashAttention;
        // A chat's next turn: the cells past the earlier prompt hold its answer.
        assert_eq!(reusable_prefix(f, 512, 60, 80, 30), Reuse { keep: 60, exact: false });
        assert_eq!(reusable_prefix(RowClasses::Unknown, 512, 34, 34, 34), Reuse { keep: 33, exact: false });
        assert_eq!(reusable_prefix(f, 512, 0, 10, 0), Reuse { keep: 0, exact: true });
    }
}
