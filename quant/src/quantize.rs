//! Quantizing a GGUF: plan every tensor's type with the policy, then stream
//! the tensors (dequantized to f32 when needed, requantized in parallel) into
//! a new file with the same metadata. Works on HAMburger files and on
//! base-only llama files alike.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ggml::gguf::{Gguf, GgufBuilder, TensorInfo, Value};
use ggml::{MappedFile, Type};
use hamburger::arch::{keys, Key, TensorName, ARCH_HAMBURGER, ARCH_LLAMA};

use crate::policy::{self, Overrides, Role, Stacks};
use crate::stream;
use crate::{Mix, QuantError};

/// What `hamburger-quantize` was asked to do.
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    /// The input GGUF.
    pub input: PathBuf,
    /// The output GGUF.
    pub output: PathBuf,
    /// The mix.
    pub mix: Mix,
    /// Overrides of the policy.
    pub overrides: Overrides,
    /// Allow quantizing tensors that are already quantized.
    pub allow_requantize: bool,
    /// Show a progress bar.
    pub progress: bool,
}

/// One tensor of the plan.
#[derive(Debug, Clone)]
pub struct PlanRow {
    /// The tensor.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// Shape (ggml order).
    pub ne: Vec<i64>,
    /// Type in the input.
    pub from: Type,
    /// Type in the output.
    pub to: Type,
    /// Bytes in the output.
    pub bytes: usize,
    /// Why the type fell back, if it did.
    pub fallback: Option<String>,
}

/// A plan and its totals.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Every tensor, in file order.
    pub rows: Vec<PlanRow>,
}

impl Plan {
    /// Bytes of tensor data.
    pub fn bytes(&self) -> usize {
        self.rows.iter().map(|r| r.bytes).sum()
    }

    /// Bits per weight over all tensors.
    pub fn bits_per_weight(&self) -> f64 {
        let n: i64 = self.rows.iter().map(|r| r.ne.iter().product::<i64>()).sum();
        self.bytes() as f64 * 8.0 / n.max(1) as f64
    }
}

fn shape(t: &TensorInfo) -> Vec<i64> {
    let n = t.ne.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    // Keep the matrix rank of [D, 1] rows (the stop head's output).
    let n = if t.name.starts_with("stop_head.out.weight") { 2 } else { n };
    t.ne[..n].to_vec()
}

/// Plans the type of every tensor of `gguf` under `mix` and `overrides`.
///
/// # Errors
/// When the file is neither a HAMburger nor a llama GGUF, or has tensors the format does not know.
pub fn plan(gguf: &Gguf, mix: Mix, overrides: &Overrides) -> Result<Plan, QuantError> {
    let bad = |msg: String| QuantError::Input { path: gguf.path.clone(), msg };
    let arch = gguf.get_str(keys::ARCHITECTURE)?.unwrap_or("");
    if arch != ARCH_HAMBURGER && arch != ARCH_LLAMA {
        return Err(bad(format!("architecture '{arch}' is neither hamburger nor llama")));
    }
    let int = |k: Key| gguf.get(&k.name(arch)).and_then(Value::as_int).unwrap_or(0).max(0) as usize;
    let stacks = Stacks {
        n_layer: int(Key::BlockCount),
        n_micro: int(Key::MicroBlockCount),
        n_gqa: int(Key::HeadCount) / int(Key::HeadCountKv).max(1),
    };
    let tied = gguf.tensor(&TensorName::Output.to_string()).is_none();
    let mut rows = Vec::new();
    for t in &gguf.tensors {
        let name =
            TensorName::parse(&t.name).ok_or_else(|| bad(format!("tensor {} is not part of the format", t.name)))?;
        let ne = shape(t);
        let choice = policy::choose(name, &ne, tied, mix, stacks, overrides);
        let n = t.n_elements() as usize;
        let bytes = choice.ty.nbytes(ne[0] as usize, n).unwrap_or(0);
        rows.push(PlanRow {
            name: t.name.clone(),
            role: Role::of(name, tied),
            ne,
            from: t.ty,
            to: choice.ty,
            bytes,
            fallback: choice.fallback,
        });
    }
    Ok(Plan { rows })
}

/// What a quantization did.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    /// The plan carried out.
    pub plan: Plan,
    /// Seconds taken.
    pub seconds: f64,
}

/// Quantizes `opts.input` into `opts.output`.
///
/// # Errors
/// Bad input, refused requantization, or I/O errors; no partial output remains.
pub fn quantize(opts: &QuantizeOptions) -> Result<QuantizeReport, QuantError> {
    let t0 = Instant::now();
    ggml::gguf::refuse_overwriting_inputs(&opts.output, [opts.input.as_path()])?;
    let gguf = Gguf::open(&opts.input)?;
    let plan = plan(&gguf, opts.mix, &opts.overrides)?;
    if !opts.allow_requantize {
        if let Some(r) =
            plan.rows.iter().find(|r| r.from != r.to && !matches!(r.from, Type::F32 | Type::F16 | Type::BF16))
        {
            return Err(QuantError::Requantize { path: opts.input.clone(), tensor: r.name.clone(), ty: r.from });
        }
    }
    let map = MappedFile::open(&opts.input)?;
    let mut b = GgufBuilder::new(plan.rows.len())?;
    for (k, v) in &gguf.metadata {
        let v = if k == keys::FILE_TYPE { Value::U32(opts.mix.file_type()) } else { v.clone() };
        b.set(k, &v)?;
    }
    for r in &plan.rows {
        b.add_tensor(&r.name, r.to, &r.ne)?;
    }
    let mut out = b.write(&opts.output)?;
    let chunks = stream::chunks(plan.rows.iter().map(|r| {
        let row = r.ne[0] as usize;
        (r.ne.iter().product::<i64>() as usize / row.max(1), row, false)
    }));
    let total: u64 = plan.rows.iter().map(|r| r.ne.iter().product::<i64>() as u64).sum();
    let bar = stream::progress_bar(opts.progress, total, opts.mix.name());
    let convert = |c: &stream::Chunk| convert_chunk(&map, &gguf.tensors[c.tensor], &plan.rows[c.tensor], c);
    stream::write_ordered(&mut out, &chunks, convert, |c| {
        bar.inc(((c.row1 - c.row0) as i64 * plan.rows[c.tensor].ne[0]) as u64)
    })?;
    bar.finish_and_clear();
    out.finish()?;
    Ok(QuantizeReport { plan, seconds: t0.elapsed().as_secs_f64() })
}

/// Rows of one tensor in the output type: copied when the type is unchanged,
/// else dequantized and quantized again.
fn convert_chunk(map: &MappedFile, info: &TensorInfo, row: &PlanRow, c: &stream::Chunk) -> Result<Vec<u8>, QuantError> {
    let row_len = row.ne[0] as usize;
    let in_row = info
        .ty
        .row_size(row_len)
        .ok_or_else(|| QuantError::Tensor { name: row.name.clone(), msg: "rows do not fit the input type".into() })?;
    let start = info.offset as usize + c.row0 * in_row;
    let bytes = &map[start..start + (c.row1 - c.row0) * in_row];
    let out = if row.from == row.to {
        bytes.to_vec()
    } else {
        let values = ggml::dequantize(info.ty, bytes, (c.row1 - c.row0) * row_len)?;
        crate::quantize_rows(row.to, &values, row_len)
            .map_err(|e| QuantError::Tensor { name: row.name.clone(), msg: e.to_string() })?
    };
    map.release(start..start + bytes.len());
    Ok(out)
}

/// Formats the plan for `--dry-run`: one line per tensor, then the totals.
pub fn describe(plan: &Plan, input: &Path) -> String {
    let mut s =
        format!("{:<36} {:<11} {:<16} {:>6} -> {:<7} {:>12}\n", "tensor", "role", "shape", "from", "to", "bytes");
    for r in &plan.rows {
        let shape = format!("{:?}", r.ne);
        s.push_str(&format!(
            "{:<36} {:<11} {:<16} {:>6} -> {:<7} {:>12}",
            r.name,
            r.role.label(),
            shape,
            r.from,
            r.to,
            r.bytes
        ));
        if let Some(f) = &r.fallback {
            s.push_str(&format!("  (fallback: {f})"));
        }
        s.push('\n');
    }
    let n_fallback = plan.rows.iter().filter(|r| r.fallback.is_some()).count();
    s.push_str(&format!(
        "{}: {} tensors, {:.2} MiB, {:.2} bits per weight, {} fallbacks\n",
        input.display(),
        plan.rows.len(),
        plan.bytes() as f64 / ggml::MIB,
        plan.bits_per_weight(),
        n_fallback
    ));
    s
}
