//! Key/value caches: preallocated per-layer tensors with slot writes
//! (`set_rows` at slot indices given as graph inputs) and views for attention.
//! The base model's cache has one slot per macro step (a merged input writes
//! ONE entry); the micro decoder's tiny cache is rewritten every macro step.

use ggml::{Buffer, BufferType, Context, Tensor, Type};

use crate::Result;

/// A preallocated cache of `n_slots` entries for each of `n_layer` layers.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    n_slots: usize,
    n_embd_kv: usize,
    head_dim: usize,
    /// V is stored transposed (`[n_slots, E]`), as plain attention's matrix
    /// product wants it; flash attention reads it untransposed.
    v_trans: bool,
    ty: Type,
    buffers: Vec<Buffer>,
}

impl KvCache {
    /// Allocates and zeroes a cache whose layer `il` lives in a buffer of type
    /// `bufts[il]` (the device of that layer's weights).
    ///
    /// # Errors
    /// When a buffer cannot be allocated.
    pub fn new(
        bufts: &[BufferType],
        n_slots: usize,
        n_embd_kv: usize,
        head_dim: usize,
        ty: Type,
        v_trans: bool,
    ) -> Result<KvCache> {
        let mut groups: Vec<(BufferType, Context)> = Vec::new();
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for (il, buft) in bufts.iter().enumerate() {
            let ctx = match groups.iter().find(|(b, _)| b == buft) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = Context::new(2 * bufts.len(), 0)?;
                    groups.push((*buft, c.clone()));
                    c
                }
            };
            k.push(ctx.new_tensor(ty, &[n_embd_kv as i64, n_slots as i64]).named(&format!("cache_k_l{il}")));
            let v_shape = if v_trans { [n_slots as i64, n_embd_kv as i64] } else { [n_embd_kv as i64, n_slots as i64] };
            v.push(ctx.new_tensor(ty, &v_shape).named(&format!("cache_v_l{il}")));
        }
        let buffers = groups
            .iter()
            .map(|(buft, ctx)| {
                let b = Buffer::alloc_context(ctx, *buft)?;
                // Masked slots are multiplied by zero weights: they must hold finite values.
                b.clear(0);
                Ok(b)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { k, v, n_slots, n_embd_kv, head_dim, v_trans, ty, buffers })
    }

    /// Slots per layer.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Whether V is stored transposed.
    pub fn v_trans(&self) -> bool {
        self.v_trans
    }

    /// Element type.
    pub fn ty(&self) -> Type {
        self.ty
    }

    /// Bytes of the whole cache.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::size).sum()
    }

    /// Bytes one slot takes over all layers (K and V).
    pub fn bytes_per_slot(&self) -> usize {
        2 * self.k.len() * self.ty.row_size(self.n_embd_kv).unwrap_or(0)
    }

    /// The writes of `k_cur`/`v_cur` (`[E, n]`) of layer `il` into the slots
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
            let dst = g.reshape(&self.v[il], &[1, e * self.n_slots as i64]);
            let src = g.reshape(v_cur, &[1, e * n]);
            g.set_rows(&dst, &src, v_idx)
        } else {
            g.set_rows(&self.v[il], v_cur, k_idx)
        };
        [k, v]
    }

    /// Keys of the first `n_kv` slots of layer `il` as `[head_dim, n_kv, n_head_kv]`.
    pub fn k_view(&self, g: &Context, il: usize, n_kv: usize) -> Tensor {
        let k = &self.k[il];
        let (hd, row) = (self.head_dim, k.nb()[1]);
        let esize = self.ty.row_size(hd).expect("head fits the cache type");
        g.view(k, &[hd as i64, n_kv as i64, (self.n_embd_kv / hd) as i64], &[row, esize], 0)
    }

    /// Values of the first `n_kv` slots of layer `il`: `[n_kv, head_dim, n_head_kv]`
    /// when transposed, else `[head_dim, n_kv, n_head_kv]`.
    pub fn v_view(&self, g: &Context, il: usize, n_kv: usize) -> Tensor {
        let v = &self.v[il];
        let hd = self.head_dim;
        let n_head_kv = (self.n_embd_kv / hd) as i64;
        if self.v_trans {
            let row = v.nb()[1];
            g.view(v, &[n_kv as i64, hd as i64, n_head_kv], &[row, row * hd], 0)
        } else {
            let esize = self.ty.row_size(hd).expect("head fits the cache type");
            g.view(v, &[hd as i64, n_kv as i64, n_head_kv], &[v.nb()[1], esize], 0)
        }
    }

    /// The element indices of a transposed-V write of `slots` (see [`KvCache::store`]).
    pub fn v_trans_indices(&self, slots: &[i64]) -> Vec<i64> {
        let e = self.n_embd_kv as i64;
        slots.iter().flat_map(|&s| (0..e).map(move |i| i * self.n_slots as i64 + s)).collect()
    }
}
