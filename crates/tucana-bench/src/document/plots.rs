//! The PNG plots of BENCHMARKS.md (with the `plots` feature): for each data set and group
//! of workloads (YCSB, micro), grouped bars per engine on a log scale of throughput, CPU
//! per operation and write amplification. Without the feature nothing is drawn and the
//! document says so.
//!
//! Owns the plots' files and looks; reads only the JSON document. Single-threaded (plotters
//! keeps the registered font for the life of the process).

use std::path::{Path, PathBuf};

use serde_json::Value;

#[cfg(feature = "plots")]
use super::records::{dataset, distinct, find, records, row_name, CPU, THROUGHPUT, WRITE_AMP};
#[cfg(feature = "plots")]
use crate::format::number;
use crate::Result;

#[cfg(not(feature = "plots"))]
pub(super) fn draw(_doc: &Value, _dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    Ok(Vec::new())
}

#[cfg(feature = "plots")]
pub(super) fn draw(doc: &Value, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    register_font()?;
    let records = &records(doc)[..];
    let engines = distinct(records, |r| r["engine"].as_str().unwrap_or("?").to_string());
    let mut plots = Vec::new();
    for dataset_name in distinct(records, dataset) {
        let in_set: Vec<Value> = records
            .iter()
            .filter(|r| dataset(r) == dataset_name)
            .cloned()
            .collect();
        let all_rows = distinct(&in_set, row_name);
        let (ycsb_rows, micro_rows): (Vec<String>, Vec<String>) =
            all_rows.into_iter().partition(|r| r.starts_with("ycsb_"));
        for (group, rows) in [("ycsb", ycsb_rows), ("micro", micro_rows)] {
            if rows.is_empty() {
                continue;
            }
            for (metric, file) in [
                (THROUGHPUT, "throughput"),
                (CPU, "cpu"),
                (WRITE_AMP, "write-amp"),
            ] {
                let values: Vec<Vec<Option<f64>>> = rows
                    .iter()
                    .map(|row| {
                        engines
                            .iter()
                            .map(|e| {
                                find(&in_set, &dataset_name, row, e)
                                    .and_then(|r| number(&r[metric.field]))
                                    .filter(|v| *v > 0.0)
                            })
                            .collect()
                    })
                    .collect();
                if values.iter().flatten().all(Option::is_none) {
                    continue;
                }
                // File names without spaces or commas ("in-memory, sync per write").
                let slug: String = dataset_name
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect::<String>()
                    .split('-')
                    .filter(|part| !part.is_empty())
                    .collect::<Vec<_>>()
                    .join("-");
                let path = dir.join(format!("{slug}-{group}-{file}.png"));
                let title = format!("{dataset_name}, {group}: {}", metric.title);
                bar_chart(&path, &title, &rows, &engines, &values)?;
                plots.push((title, path));
            }
        }
    }
    Ok(plots)
}

#[cfg(feature = "plots")]
fn register_font() -> Result<()> {
    use plotters::style::{register_font, FontStyle};
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no DejaVuSans.ttf found: run scripts/bench-deps.sh (fonts-dejavu-core)")?;
    // plotters keeps fonts for the life of the process; one small leak per run.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the DejaVu font is not a valid TrueType font")?;
    Ok(())
}

/// 1.5M, 20k, 3.2, 0.05: short labels for a log axis.
#[cfg(feature = "plots")]
fn human(value: f64) -> String {
    if value >= 1e6 {
        format!("{}M", trim(value / 1e6))
    } else if value >= 1e3 {
        format!("{}k", trim(value / 1e3))
    } else {
        trim(value)
    }
}

#[cfg(feature = "plots")]
fn trim(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Grouped bars on a log scale: one group per row, one bar per engine.
#[cfg(feature = "plots")]
fn bar_chart(
    path: &Path,
    title: &str,
    rows: &[String],
    engines: &[String],
    values: &[Vec<Option<f64>>],
) -> Result<()> {
    use plotters::prelude::*;
    const COLORS: [RGBColor; 6] = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    let positive: Vec<f64> = values.iter().flatten().flatten().copied().collect();
    let max = positive.iter().copied().fold(f64::MIN, f64::max);
    let min = positive.iter().copied().fold(f64::MAX, f64::min);
    // Headroom above the tallest bar for the legend.
    let (low, high) = (min / 2.0, max * 30.0);
    let width = (160 + rows.len() * 28 * (engines.len() + 1)).clamp(900, 2400) as u32;
    let root = BitMapBackend::new(path, (width, 560)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..rows.len() as f64, (low..high).log_scale())
        .map_err(|e| fail(&e))?;
    let labels = rows.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            // Labels at group centres only.
            let centre = x - x.floor();
            if (centre - 0.5).abs() < 0.01 {
                labels.get(x.floor() as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 12))
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|y| human(*y))
        .draw()
        .map_err(|e| fail(&e))?;
    let bar_width = 0.8 / engines.len() as f64;
    for (e, engine) in engines.iter().enumerate() {
        let color = COLORS[e % COLORS.len()];
        let bars = values.iter().enumerate().filter_map(|(row, per_engine)| {
            let value = per_engine[e]?;
            let x0 = row as f64 + 0.1 + e as f64 * bar_width;
            Some(Rectangle::new(
                [(x0, low), (x0 + bar_width * 0.9, value)],
                color.filled(),
            ))
        });
        chart
            .draw_series(bars)
            .map_err(|e| fail(&e))?
            .label(engine.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}
