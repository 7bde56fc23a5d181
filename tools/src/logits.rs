//! Next-token distributions from logits, in f64: what the sweep compares
//! models with and the evaluation scores outputs with.

/// `ln softmax(l)` in f64.
pub fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z = l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
    l.iter().map(|&x| x as f64 - z).collect()
}

/// KL(p || q) of two logit vectors.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>().max(0.0)
}
