//! The cache's tensors: what graphs write into and read from its cells,
//! and copies of cells' entries.

use ggml::{Context, Tensor};

use super::{KvCache, Window};
use crate::error::Result;

impl KvCache {
    /// The writes of `k_cur`/`v_cur` (`[E, n]`) of layer `il` into the cells
    /// given by `k_idx` (`[n]` i64; for a transposed V, `v_idx` holds `[n*E]`
    /// element indices). The caller expands them into the graph before
    /// anything reads the cache.
    pub fn store(
        &self,
        g: &Context,
        il: usize,
        k_cur: &Tensor,
        v_cur: &Tensor,
        k_idx: &Tensor,
        v_idx: &Tensor,
    ) -> [Tensor; 2] {
        let n = k_cur.ne()[1];
        let k = g.set_rows(&self.k[il], k_cur, k_idx);
        let v = if self.v_trans {
            let e = self.n_embd_kv as i64;
            let dst = g.reshape(&self.v[il], &[1, e * self.n_columns() as i64]);
            let src = g.reshape(v_cur, &[1, e * n]);
            g.set_rows(&dst, &src, v_idx)
        } else {
            g.set_rows(&self.v[il], v_cur, k_idx)
        };
        [k, v]
    }

    /// Keys of the window's cells in layer `il` as `[head_dim, n_kv, n_head_kv]`.
    pub fn k_view(&self, g: &Context, il: usize, w: Window) -> Tensor {
        let k = &self.k[il];
        let n_head_kv = (self.n_embd_kv / self.head_dim) as i64;
        let ne = [self.head_dim as i64, w.n_kv as i64, n_head_kv];
        g.view(k, &ne, &[k.nb()[1], self.head_bytes], w.first * k.nb()[1])
    }

    /// Values of the window's cells in layer `il`: `[n_kv, head_dim, n_head_kv]`
    /// when transposed, else `[head_dim, n_kv, n_head_kv]`.
    pub fn v_view(&self, g: &Context, il: usize, w: Window) -> Tensor {
        let v = &self.v[il];
        let hd = self.head_dim;
        let n_head_kv = (self.n_embd_kv / hd) as i64;
        if self.v_trans {
            let row = v.nb()[1];
            g.view(v, &[w.n_kv as i64, hd as i64, n_head_kv], &[row, row * hd], w.first * v.nb()[0])
        } else {
            g.view(v, &[hd as i64, w.n_kv as i64, n_head_kv], &[v.nb()[1], self.head_bytes], w.first * v.nb()[1])
        }
    }

    /// The element indices of a transposed-V write of `cells` (see [`KvCache::store`]).
    pub fn v_trans_indices(&self, cells: &[i64]) -> Vec<i64> {
        let (e, n) = (self.n_embd_kv as i64, self.n_columns() as i64);
        cells.iter().flat_map(|&c| (0..e).map(move |i| i * n + c)).collect()
    }

    /// Copies the keys and values of the `len` cells from `from` to the
    /// cells from `to` in every layer (the cells' bookkeeping is the caller's).
    ///
    /// # Errors
    /// When a read or write of a cache tensor fails.
    pub(super) fn copy_cells(&self, from: usize, to: usize, len: usize) -> Result<()> {
        let mut bytes = vec![0u8; len * self.row_bytes];
        for t in self.k.iter().chain(if self.v_trans { &[][..] } else { &self.v[..] }) {
            let row = t.nb()[1];
            t.read_bytes(from * row, &mut bytes)?;
            t.write_bytes(to * row, &bytes)?;
        }
        if self.v_trans {
            // One row of `n_cells` values per element: each row's run moves.
            for t in &self.v {
                let (elt, row) = (t.nb()[0], t.nb()[1]);
                let run = &mut bytes[..len * elt];
                for e in 0..self.n_embd_kv {
                    t.read_bytes(e * row + from * elt, run)?;
                    t.write_bytes(e * row + to * elt, run)?;
                }
            }
        }
        Ok(())
    }
}
