//! llama.cpp's random numbers: `std::mt19937` seeded with the request's
//! 32-bit seed, and libstdc++'s `std::uniform_real_distribution<double>(0, 1)`
//! over it, what llama.cpp's `dist` sampler draws one of per sampled token.
//! With them a seed draws what it draws in llama-server, so a sampled answer
//! is llama-server's own wherever the two engines' logits agree (they differ
//! in rounding only, so a draw can part at a near-tie of the cumulative
//! probabilities).

/// The Mersenne Twister llama.cpp samples with.
#[derive(Clone)]
pub struct LlamaRng(rand_mt::Mt);

impl LlamaRng {
    /// Seeded as llama.cpp seeds it: with the low 32 bits of `seed`
    /// (llama.cpp's seeds are `uint32_t`).
    pub fn new(seed: u64) -> LlamaRng {
        LlamaRng(rand_mt::Mt::new(seed as u32))
    }

    /// A number in `[0, 1)` as libstdc++'s `generate_canonical<double, 53>`
    /// makes it: two 32-bit outputs, the first the low half, scaled by 2^-64
    /// and kept below 1.
    pub fn uniform(&mut self) -> f64 {
        let lo = f64::from(self.0.next_u32());
        let hi = f64::from(self.0.next_u32());
        let r = (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }
}

impl rand::RngCore for LlamaRng {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.0.fill_bytes(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_mt19937_and_canonical_doubles() {
        // C++11 [rand.predef]: the 10000th output of a default-seeded mt19937.
        let mut r = LlamaRng::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = rand::RngCore::next_u32(&mut r);
        }
        assert_eq!(last, 4_123_659_995);
        // The seed is taken modulo 2^32, as llama.cpp's uint32_t seed.
        let (mut a, mut b) = (LlamaRng::new(42), LlamaRng::new(42 + (1 << 32)));
        assert_eq!(a.uniform(), b.uniform());
        // Two outputs make one double, the first the low half.
        let mut c = LlamaRng::new(42);
        let (lo, hi) = (rand::RngCore::next_u32(&mut c), rand::RngCore::next_u32(&mut c));
        let want = (lo as f64 + hi as f64 * 2f64.powi(32)) / 2f64.powi(64);
        assert_eq!(LlamaRng::new(42).uniform(), want);
        assert!((0..1000).map(|_| c.uniform()).all(|x| (0.0..1.0).contains(&x)));
    }
}
