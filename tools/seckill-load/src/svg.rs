//! The sale's timeline as an SVG chart (plotters, SVG backend only): one panel per
//! variant on the same time axis, time and rates on log scales (a sale sells out in
//! milliseconds, then answers for a minute; admissions are far rarer than attempts), p99
//! latency in ms on the right axis, the sell-out moment marked, each bin a flat step.

use std::path::Path;

use plotters::coord::Shift;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::record::{RunResult, TimelinePoint};

const ATTEMPTS: RGBColor = RGBColor(31, 119, 180);
const ADMITTED: RGBColor = RGBColor(44, 160, 44);
const P99: RGBColor = RGBColor(214, 39, 40);
/// A figure of a timeline bin.
type Field = fn(&TimelinePoint) -> f64;
/// The left end of the time axis (the first bin ends at 1 ms).
const T_MIN: f64 = 0.0005;

/// Draws the sale's timeline of `results` into `path`; `false` when no sale ran.
pub fn sale_chart(results: &crate::report::Results, path: &Path) -> anyhow::Result<bool> {
    let Some(s) = &results.sale else {
        return Ok(false);
    };
    let ours = match s.ours.target.as_str() {
        "url" => "ours (HTTP)",
        _ => "ours (in-process handler)",
    };
    let mut runs = vec![(ours, &s.ours)];
    runs.extend(s.tutorial.iter().map(|t| ("tutorial admission", t)));
    let o = &s.options;
    let title = format!(
        "flash sale: stock {}, {} attempts by {} users, {} callers",
        o.stock, o.attempts, o.users, o.callers
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let height = 60 + 330 * runs.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(&title, ("sans-serif", 22))?;
    let t_max = runs.iter().map(|(_, r)| r.elapsed_s).fold(0.0f64, f64::max);
    let t_max = t_max.max(0.01) * 1.05;
    for ((label, run), area) in runs.iter().zip(root.split_evenly((runs.len(), 1))) {
        panel(&area, label, run, t_max)?;
    }
    root.present()?;
    Ok(true)
}

fn panel(
    area: &DrawingArea<SVGBackend, Shift>,
    label: &str,
    run: &RunResult,
    t_max: f64,
) -> anyhow::Result<()> {
    let tl = &run.timeline;
    let rate_max = tl.iter().map(|p| p.attempts_per_s.max(p.admitted_per_s));
    let rate_max = rate_max.fold(10.0f64, f64::max) * 2.0;
    let p99_max = tl.iter().map(|p| p.p99_ms).fold(0.1f64, f64::max) * 1.15;
    let p99_ms = run.latency.p99_us as f64 / 1000.0;
    let caption = format!(
        "{label}: {} attempts in {:.2} s ({:.0}/s), {} admitted, p99 {p99_ms:.2} ms",
        run.completed, run.elapsed_s, run.attempts_per_s, run.admitted
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .right_y_label_area_size(60)
        .build_cartesian_2d((T_MIN..t_max).log_scale(), (1f64..rate_max).log_scale())?
        .set_secondary_coord((T_MIN..t_max).log_scale(), 0f64..p99_max);
    chart
        .configure_mesh()
        .x_desc("seconds since the start (log)")
        .x_label_formatter(&|v| seconds(*v))
        .y_desc("per second (log)")
        .y_label_formatter(&|v| human(*v))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("p99 latency (ms)")
        .draw()?;
    // Each bin as a flat step over its time span, at least `floor`.
    let steps = |f: Field, floor: f64| -> Vec<(f64, f64)> {
        let step = |p: &TimelinePoint| {
            let v = f(p).max(floor);
            [(p.from_s.max(T_MIN), v), (p.to_s.max(T_MIN), v)]
        };
        tl.iter().flat_map(step).collect()
    };
    let rates: [(_, _, Field); 2] = [
        ("attempts/s", ATTEMPTS, |p| p.attempts_per_s),
        ("admitted/s", ADMITTED, |p| p.admitted_per_s),
    ];
    for (name, color, f) in rates {
        let line = LineSeries::new(steps(f, 1.0), color.stroke_width(2));
        chart
            .draw_series(line)?
            .label(name)
            .legend(legend(color, 2));
    }
    let p99 = LineSeries::new(steps(|p| p.p99_ms, 0.0), P99.stroke_width(1));
    let p99 = chart.draw_secondary_series(p99)?;
    p99.label("p99 latency (ms, right axis)")
        .legend(legend(P99, 1));
    if let Some(t) = run.sell_out_s {
        let line = PathElement::new(vec![(t, 1.0), (t, rate_max)], BLACK.stroke_width(1));
        chart.plotting_area().draw(&line)?;
        let font = ("sans-serif", 13).into_font();
        let text = Text::new(format!(" sold out at {t:.3} s"), (t, rate_max / 1.6), font);
        chart.plotting_area().draw(&text)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A legend's short line in `color`, `width` wide.
fn legend(color: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(width))
}

fn seconds(v: f64) -> String {
    match v {
        1.0.. => format!("{v:.0} s"),
        0.001.. => format!("{:.0} ms", v * 1000.0),
        _ => format!("{:.1} ms", v * 1000.0),
    }
}

fn human(v: f64) -> String {
    match v {
        1e6.. => format!("{:.0}M", v / 1e6),
        1e3.. => format!("{:.0}k", v / 1e3),
        _ => format!("{v:.0}"),
    }
}
