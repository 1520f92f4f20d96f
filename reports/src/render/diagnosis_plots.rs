//! The plots of what limited a run: the engine's time in steps by kind as stacked bars, and
//! observed TPOT and output tok/s beside both sides of the roofline at each observed batch.

use super::svg::{self, Chart, Series, Style};
use super::Plot;
use crate::bound::DecodeBound;
use crate::server_metrics::StepBreakdown;

/// Seconds in decode-only, mixed and prefill-only steps, a bar per labelled span.
pub(super) fn steps_plot(name: &str, rows: &[(String, StepBreakdown)]) -> Plot {
    let bars: Vec<(String, Vec<f64>)> = rows
        .iter()
        .map(|(label, s)| {
            (
                label.clone(),
                vec![
                    s.decode_only.seconds,
                    s.mixed.seconds,
                    s.prefill_only.seconds,
                ],
            )
        })
        .collect();
    Plot {
        name: name.into(),
        svg: svg::stacked_bars(
            "The engine's time in steps, by kind",
            "seconds in steps over the scraped span",
            &["decode-only", "mixed (prefill chunks)", "prefill-only"],
            &bars,
        ),
    }
}

/// One observation beside the roofline: the TPOT median and output tok/s at its bound's
/// batch.
pub(super) struct Observed<'a> {
    pub tpot_ms: f64,
    pub output_tok_per_s: f64,
    pub bound: &'a DecodeBound,
}

/// Observed TPOT, and observed output tok/s, against the memory side (bytes / bandwidth)
/// and the compute side (FLOPs / compute) at each observation's batch (sorted by batch).
pub(super) fn roofline_plots(prefix: &str, observed: &[Observed]) -> Vec<Plot> {
    let mut sorted: Vec<&Observed> = observed.iter().collect();
    sorted.sort_by(|a, b| a.bound.batch.total_cmp(&b.bound.batch));
    let series = |name: &str, style: Style, f: &dyn Fn(&Observed) -> Option<f64>| Series {
        name: name.into(),
        points: sorted
            .iter()
            .filter_map(|o| Some((o.bound.batch, f(o)?)))
            .collect(),
        style,
        error_bars: Vec::new(),
    };
    let tpot = vec![
        series("observed (median)", Style::Points, &|o| Some(o.tpot_ms)),
        series("memory side", Style::LinePoints, &|o| {
            Some(o.bound.memory_side_ms())
        }),
        series("compute side", Style::LinePoints, &|o| o.bound.compute_ms),
    ];
    let per_second =
        |ms: Option<f64>, batch: f64| ms.filter(|m| *m > 0.0).map(|m| batch * 1000.0 / m);
    let throughput = vec![
        series("observed", Style::Points, &|o| Some(o.output_tok_per_s)),
        series("memory side", Style::LinePoints, &|o| {
            per_second(Some(o.bound.memory_side_ms()), o.bound.batch)
        }),
        series("compute side", Style::LinePoints, &|o| {
            per_second(o.bound.compute_ms, o.bound.batch)
        }),
    ];
    vec![
        Plot {
            name: format!("{prefix}-roofline-tpot"),
            svg: svg::chart(&Chart {
                title: "TPOT against the roofline".into(),
                x_label: "batch (running requests)".into(),
                y_label: "ms per output token".into(),
                series: tpot,
                ..Chart::default()
            }),
        },
        Plot {
            name: format!("{prefix}-roofline-throughput"),
            svg: svg::chart(&Chart {
                title: "Output tok/s against the roofline".into(),
                x_label: "batch (running requests)".into(),
                y_label: "output tokens/s".into(),
                series: throughput,
                ..Chart::default()
            }),
        },
    ]
}
