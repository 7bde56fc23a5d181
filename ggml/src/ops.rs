//! Graph operations: each method records one ggml op in the context and
//! returns its result tensor (nothing is computed until a graph runs).
//!
//! Shapes are in ggml order: `ne[0]` is the contiguous (row) dimension.

use crate::{sys, Context, Tensor, Type};

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self, a: &Tensor) -> Tensor {
            // SAFETY: the context and `a` are live (op() keeps a's context alive).
            self.op(&[a], |ctx| unsafe { sys::$ffi(ctx, a.raw()) })
        }
    )*};
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $ffi:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name(&self, a: &Tensor, b: &Tensor) -> Tensor {
            // SAFETY: the context, `a` and `b` are live (op() keeps their contexts alive).
            self.op(&[a, b], |ctx| unsafe { sys::$ffi(ctx, a.raw(), b.raw()) })
        }
    )*};
}

/// ggml's rope mode that rotates adjacent pairs of each head (llama.cpp's
/// `LLAMA_ROPE_TYPE_NORM`, the layout llama GGUFs store q/k in).
pub const ROPE_MODE_NORMAL: i32 = 0;

/// Rotary-embedding parameters of [`Context::rope`] (ggml's `ggml_rope_ext` arguments).
#[derive(Debug, Clone, Copy)]
pub struct RopeParams {
    /// Rotated dimensions per head.
    pub n_dims: i32,
    /// ggml rope mode ([`ROPE_MODE_NORMAL`] for llama.cpp's llama).
    pub mode: i32,
    /// Original training context (YaRN only).
    pub n_ctx_orig: i32,
    /// Base frequency theta.
    pub freq_base: f32,
    /// Linear position scale (1 = none).
    pub freq_scale: f32,
}

impl Context {
    unary_ops! {
        /// SiLU, elementwise.
        silu => ggml_silu;
        /// Logistic sigmoid, elementwise.
        sigmoid => ggml_sigmoid;
        /// A contiguous copy of `a` (materialises views and permutations).
        cont => ggml_cont;
        /// Swaps the first two dimensions (a view).
        transpose => ggml_transpose;
        /// Mean of each row: `[n, ...] -> [1, ...]`.
        mean => ggml_mean;
        /// Index of the largest value of each row: `[n, m] -> [m]` (i32).
        argmax => ggml_argmax;
    }

    binary_ops! {
        /// Matrix product: `a [k, n]`, `b [k, m]` -> `[n, m]` (a is the weight).
        mul_mat => ggml_mul_mat;
        /// Elementwise sum with broadcasting of `b`.
        add => ggml_add;
        /// Elementwise product with broadcasting of `b`.
        mul => ggml_mul;
        /// Rows of `a` picked by the i32 indices in `b`: `a [n, rows]`, `b [m]` -> `[n, m]` f32.
        get_rows => ggml_get_rows;
        /// SwiGLU of two halves: `silu(a) * b`.
        swiglu_split => ggml_swiglu_split;
        /// `a` tiled to the shape of `b`.
        repeat => ggml_repeat;
    }

    /// RMS normalisation of each row with epsilon `eps`.
    pub fn rms_norm(&self, a: &Tensor, eps: f32) -> Tensor {
        // SAFETY: the context and `a` are live.
        self.op(&[a], |ctx| unsafe { sys::ggml_rms_norm(ctx, a.raw(), eps) })
    }

    /// `a * s`.
    pub fn scale(&self, a: &Tensor, s: f32) -> Tensor {
        // SAFETY: the context and `a` are live.
        self.op(&[a], |ctx| unsafe { sys::ggml_scale(ctx, a.raw(), s) })
    }

    /// Concatenation of `a` and `b` along dimension `dim`.
    pub fn concat(&self, a: &Tensor, b: &Tensor, dim: i32) -> Tensor {
        // SAFETY: the context, `a` and `b` are live.
        self.op(&[a, b], |ctx| unsafe { sys::ggml_concat(ctx, a.raw(), b.raw(), dim) })
    }

    /// Converts `a` to type `ty`.
    pub fn cast(&self, a: &Tensor, ty: Type) -> Tensor {
        // SAFETY: the context and `a` are live.
        self.op(&[a], |ctx| unsafe { sys::ggml_cast(ctx, a.raw(), ty.raw()) })
    }

    /// Writes the rows of `src` into `dst` at the i64 row indices `idx`; returns
    /// a view of `dst` that must be expanded into the graph.
    pub fn set_rows(&self, dst: &Tensor, src: &Tensor, idx: &Tensor) -> Tensor {
        // SAFETY: the context and all three tensors are live.
        self.op(&[dst, src, idx], |ctx| unsafe { sys::ggml_set_rows(ctx, dst.raw(), src.raw(), idx.raw()) })
    }

    /// Rotary position embedding of `a [head_dim, n_head, n_tokens]` at the i32
    /// positions `pos [n_tokens]`, with optional per-frequency divisors `freq_factors`.
    pub fn rope(&self, a: &Tensor, pos: &Tensor, freq_factors: Option<&Tensor>, p: RopeParams) -> Tensor {
        let ff = freq_factors.map_or(std::ptr::null_mut(), |t| t.raw());
        let mut srcs = vec![a, pos];
        srcs.extend(freq_factors);
        // SAFETY: the context and tensors are live; a null freq_factors is allowed.
        self.op(&srcs, |ctx| unsafe {
            sys::ggml_rope_ext(
                ctx,
                a.raw(),
                pos.raw(),
                ff,
                p.n_dims,
                p.mode,
                p.n_ctx_orig,
                p.freq_base,
                p.freq_scale,
                0.0,
                1.0,
                32.0,
                1.0,
            )
        })
    }

    /// `softmax(a * scale + mask)` over rows; `mask` is broadcast over heads.
    pub fn soft_max_ext(&self, a: &Tensor, mask: Option<&Tensor>, scale: f32) -> Tensor {
        let m = mask.map_or(std::ptr::null_mut(), |t| t.raw());
        let mut srcs = vec![a];
        srcs.extend(mask);
        // SAFETY: the context and tensors are live; a null mask is allowed.

        self.op(&srcs, |ctx| unsafe { sys::ggml_soft_max_ext(ctx, a.raw(), m, scale, 0.0) })
    }

    /// Fused attention: `q [d, n_q, h]`, `k [d, n_kv, h_kv]`, `v [d, n_kv, h_kv]`,
    /// `mask [n_kv, n_q]` (f16) -> `[d, h, n_q]`, accumulated in f32.
    pub fn flash_attn_ext(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f32) -> Tensor {
        // SAFETY: the context and tensors are live.
        let t = self.op(&[q, k, v, mask], |ctx| unsafe {
            sys::ggml_flash_attn_ext(ctx, q.raw(), k.raw(), v.raw(), mask.raw(), scale, 0.0, 0.0)
        });
        t.set_f32_accumulation();
        t
    }

    /// Reshapes a contiguous tensor (a view with the same data).
    pub fn reshape(&self, a: &Tensor, ne: &[i64]) -> Tensor {
        // SAFETY: the context and `a` are live; ggml checks the element count.
        self.op(&[a], |ctx| unsafe {
            match *ne {
                [n0] => sys::ggml_reshape_1d(ctx, a.raw(), n0),
                [n0, n1] => sys::ggml_reshape_2d(ctx, a.raw(), n0, n1),
                [n0, n1, n2] => sys::ggml_reshape_3d(ctx, a.raw(), n0, n1, n2),
                [n0, n1, n2, n3] => sys::ggml_reshape_4d(ctx, a.raw(), n0, n1, n2, n3),
                _ => panic!("reshape to rank {}", ne.len()),
            }
        })
    }

    /// A strided view of `a`: shape `ne`, byte strides `nb` of dimensions 1.. and byte `offset`.
    ///
    /// # Panics
    /// When the view reaches outside `a`.
    pub fn view(&self, a: &Tensor, ne: &[i64], nb: &[usize], offset: usize) -> Tensor {
        assert_eq!(nb.len() + 1, ne.len(), "view needs one stride per dimension after the first");
        let elem = a.ty().type_size() as i64 / a.ty().block_size() as i64;
        let last = ne
            .iter()
            .zip(std::iter::once(&(elem as usize)).chain(nb))
            .map(|(&n, &s)| (n.max(1) - 1) as usize * s)
            .sum::<usize>()
            + elem.max(1) as usize;
        assert!(offset + last <= a.nbytes(), "view outside tensor {}", a.name());
        // SAFETY: the context and `a` are live and the view stays inside `a` (checked above).
        self.op(&[a], |ctx| unsafe {
            match (ne, nb) {
                ([n0], []) => sys::ggml_view_1d(ctx, a.raw(), *n0, offset),
                ([n0, n1], [b1]) => sys::ggml_view_2d(ctx, a.raw(), *n0, *n1, *b1, offset),
                ([n0, n1, n2], [b1, b2]) => sys::ggml_view_3d(ctx, a.raw(), *n0, *n1, *n2, *b1, *b2, offset),
                ([n0, n1, n2, n3], [b1, b2, b3]) => {
                    sys::ggml_view_4d(ctx, a.raw(), *n0, *n1, *n2, *n3, *b1, *b2, *b3, offset)
                }
                _ => unreachable!(),
            }
        })
    }

    /// Permutes dimensions: axis `i` of `a` becomes axis `axes[i]` of the result (a view).
    pub fn permute(&self, a: &Tensor, axes: [i32; 4]) -> Tensor {
        // SAFETY: the context and `a` are live; ggml checks the axes form a permutation.
        self.op(&[a], |ctx| unsafe { sys::ggml_permute(ctx, a.raw(), axes[0], axes[1], axes[2], axes[3]) })
    }
}

impl Tensor {
    /// Asks the backend to accumulate this matrix product / attention in f32
    /// (the CPU always does; GPUs otherwise may use f16).
    pub fn set_f32_accumulation(&self) {
        // SAFETY: the tensor header is live.
        unsafe { sys::ggml_prec_set_acc(self.raw(), sys::GGML_PREC_F32) };
    }
}
