//! The sweep's plot: quality and speed against bits per weight, as SVG.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::sweep_table::SweepRow;

fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.1).max(1e-3);
    (lo - pad).max(0.0)..hi + pad
}

/// Draws two panels: KL divergence and token agreement vs bits per weight
/// (left), prompt and generation tok/s vs bits per weight (right).
///
/// # Errors
/// When the file cannot be written.
pub fn write_svg(path: &Path, rows: &[SweepRow]) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(550);
    let bpw = range(rows.iter().map(|r| r.bpw));

    let mut q = ChartBuilder::on(&left)
        .caption("quality vs bits per weight", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .right_y_label_area_size(55)
        .build_cartesian_2d(bpw.clone(), range(rows.iter().map(|r| r.kl_mean)))
        .map_err(|e| err(&e))?
        .set_secondary_coord(bpw.clone(), 0f64..1.05f64);
    q.configure_mesh().x_desc("bits per weight").y_desc("mean KL vs input").draw().map_err(|e| err(&e))?;
    q.configure_secondary_axes().y_desc("agreement").draw().map_err(|e| err(&e))?;
    let mut pts: Vec<(f64, &SweepRow)> = rows.iter().map(|r| (r.bpw, r)).collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    q.draw_series(LineSeries::new(pts.iter().map(|(x, r)| (*x, r.kl_mean)), &RED))
        .map_err(|e| err(&e))?
        .label("mean KL")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    q.draw_series(pts.iter().map(|(x, r)| Circle::new((*x, r.kl_mean), 4, RED.filled()))).map_err(|e| err(&e))?;
    q.draw_series(pts.iter().map(|(x, r)| Text::new(r.name.clone(), (*x, r.kl_mean), ("sans-serif", 12))))
        .map_err(|e| err(&e))?;
    q.draw_secondary_series(LineSeries::new(pts.iter().map(|(x, r)| (*x, r.token_match)), &BLUE))
        .map_err(|e| err(&e))?
        .label("token match")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    q.draw_secondary_series(LineSeries::new(pts.iter().map(|(x, r)| (*x, r.top1_agree)), &GREEN))
        .map_err(|e| err(&e))?
        .label("top-1 agree")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
    q.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|e| err(&e))?;

    let mut s = ChartBuilder::on(&right)
        .caption("speed vs bits per weight", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(bpw, range(rows.iter().flat_map(|r| [r.pp_ts, r.tg_ts])))
        .map_err(|e| err(&e))?;
    s.configure_mesh().x_desc("bits per weight").y_desc("tokens / s").draw().map_err(|e| err(&e))?;
    for (label, color, f) in [
        ("prompt", MAGENTA, (|r: &SweepRow| r.pp_ts) as fn(&SweepRow) -> f64),
        ("generation", CYAN, |r: &SweepRow| r.tg_ts),
    ] {
        s.draw_series(LineSeries::new(pts.iter().map(|(x, r)| (*x, f(r))), &color))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        s.draw_series(pts.iter().map(|(x, r)| Circle::new((*x, f(r)), 4, color.filled()))).map_err(|e| err(&e))?;
    }
    s.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
