//! The sale's timeline as an SVG chart (plotters, SVG backend only).
//!
//! One panel per variant, on the same time axis so their durations compare at a glance.
//! Time runs on a log scale (a sale sells out in milliseconds and then answers for a
//! minute); attempts/s and admitted/s too (admissions are a thousand times rarer than
//! attempts); p99 latency in ms on the right axis; the sell-out moment marked. Each bin
//! is drawn as a flat step over its time span.

use std::path::Path;

use anyhow::anyhow;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::record::RunResult;

const ATTEMPTS: RGBColor = RGBColor(31, 119, 180);
const ADMITTED: RGBColor = RGBColor(44, 160, 44);
const P99: RGBColor = RGBColor(214, 39, 40);

/// Draws the sale's timeline of `results` into `path`; `false` when no sale ran.
pub fn sale_chart(results: &crate::report::Results, path: &Path) -> anyhow::Result<bool> {
    let Some(s) = &results.sale else {
        return Ok(false);
    };
    let mut runs = vec![("ours (in-process handler)", &s.ours)];
    if s.ours.target == "url" {
        runs[0].0 = "ours (HTTP)";
    }
    if let Some(t) = &s.tutorial {
        runs.push(("tutorial admission", t));
    }
    let title = format!(
        "flash sale: stock {}, {} attempts by {} users, {} callers",
        s.options.stock, s.options.attempts, s.options.users, s.options.callers
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    timeline(path, &title, &runs)?;
    Ok(true)
}

/// Draws the timelines of `runs` (labelled) into `path`.
pub fn timeline(path: &Path, title: &str, runs: &[(&str, &RunResult)]) -> anyhow::Result<()> {
    anyhow::ensure!(!runs.is_empty(), "nothing to draw");
    let height = 60 + 330 * runs.len() as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| anyhow!("{e}"))?;
    let t_max = runs
        .iter()
        .map(|(_, r)| r.elapsed_s)
        .fold(0.0f64, f64::max)
        .max(0.01)
        * 1.05;
    let panels = root.split_evenly((runs.len(), 1));
    for ((label, run), area) in runs.iter().zip(panels.iter()) {
        panel(area, label, run, t_max)?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    label: &str,
    run: &RunResult,
    t_max: f64,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
    let rate_max = run
        .timeline
        .iter()
        .map(|p| p.attempts_per_s.max(p.admitted_per_s))
        .fold(10.0f64, f64::max)
        * 2.0;
    let p99_max = run.timeline.iter().map(|p| p.p99_ms).fold(0.1f64, f64::max) * 1.15;
    let caption = format!(
        "{label}: {} attempts in {:.2} s ({:.0}/s), {} admitted, p99 {:.2} ms",
        run.completed,
        run.elapsed_s,
        run.attempts_per_s,
        run.admitted,
        run.latency.p99_us as f64 / 1000.0
    );
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .right_y_label_area_size(60)
        .build_cartesian_2d((T_MIN..t_max).log_scale(), (1f64..rate_max).log_scale())
        .map_err(err)?
        .set_secondary_coord((T_MIN..t_max).log_scale(), 0f64..p99_max);
    chart
        .configure_mesh()
        .x_desc("seconds since the start (log)")
        .x_label_formatter(&|v| seconds(*v))
        .y_desc("per second (log)")
        .y_label_formatter(&|v| human(*v))
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .y_desc("p99 latency (ms)")
        .draw()
        .map_err(err)?;
    let steps = |f: fn(&crate::record::TimelinePoint) -> f64, floor: f64| {
        run.timeline
            .iter()
            .flat_map(move |p| {
                let v = f(p).max(floor);
                [(p.from_s.max(T_MIN), v), (p.to_s.max(T_MIN), v)]
            })
            .collect::<Vec<_>>()
    };
    let pts = |f| steps(f, 1.0);
    chart
        .draw_series(LineSeries::new(
            pts(|p| p.attempts_per_s),
            ATTEMPTS.stroke_width(2),
        ))
        .map_err(err)?
        .label("attempts/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ATTEMPTS.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            pts(|p| p.admitted_per_s),
            ADMITTED.stroke_width(2),
        ))
        .map_err(err)?
        .label("admitted/s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], ADMITTED.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(
            steps(|p| p.p99_ms, 0.0),
            P99.stroke_width(1),
        ))
        .map_err(err)?
        .label("p99 latency (ms, right axis)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], P99.stroke_width(1)));
    if let Some(t) = run.sell_out_s {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(t, 1.0), (t, rate_max)],
                BLACK.stroke_width(1),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!(" sold out at {t:.3} s"),
                (t, rate_max / 1.6),
                ("sans-serif", 13).into_font(),
            )))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The left end of the time axis (the first bin ends at 1 ms).
const T_MIN: f64 = 0.0005;

fn seconds(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0} s")
    } else if v >= 0.001 {
        format!("{:.0} ms", v * 1000.0)
    } else {
        format!("{:.1} ms", v * 1000.0)
    }
}

fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}
