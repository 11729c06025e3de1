//! The loss curve of a run as an SVG picture (`loss.svg` in each checkpoint).

use crate::error::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

/// Draws `losses` (step 1, 2, …) to an SVG file at `path`.
pub fn loss_curve(path: &Path, losses: &[f32], title: &str) -> Result<()> {
    let err = |e: String| Error::io(path, std::io::Error::other(e));
    let finite: Vec<(usize, f32)> =
        losses.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i + 1, l)).collect();
    let (lo, hi) = finite.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &(_, l)| (a.min(l), b.max(l)));
    let (lo, hi) = if lo < hi { (lo, hi) } else { (lo - 1.0, lo + 1.0) };
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(1usize..losses.len().max(2), lo..hi + 0.02 * (hi - lo))
        .map_err(|e| err(e.to_string()))?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw().map_err(|e| err(e.to_string()))?;
    chart.draw_series(LineSeries::new(finite, &BLUE)).map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_curve_is_an_svg_with_one_line_through_every_step() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("loss.svg");
        let losses: Vec<f32> = (0..50).map(|i| 5.0 / (1.0 + i as f32)).collect();
        super::loss_curve(&p, &losses, "run").unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{}", &svg[..100.min(svg.len())]);
        // the line series is one polyline with a point per step
        let line = svg.lines().find(|l| l.contains("<polyline") && l.contains("#0000FF")).expect("a blue polyline");
        let points = line.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(points.split_whitespace().count(), 50, "{line}");
        assert!(svg.contains("step") && svg.contains("loss"), "axis labels: {svg}");
        // a single or non-finite loss still draws
        super::loss_curve(&p, &[f32::NAN, 2.0], "run").unwrap();
        super::loss_curve(&p, &[], "run").unwrap();
    }
}
