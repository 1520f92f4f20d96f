//! Sections of a tune report: the configurations, the winner (its command ready to copy and
//! its comparison with the runner-up), capacity per configuration, throughput against
//! interactivity with the Pareto front, and the capacity plan from the winner.

use super::svg::{self, Chart, Series, Style};
use super::sweep::plan_section;
use super::{fmt_ms, Plot, Section, Table};
use crate::tune::{ConfigStatus, Configuration, Knobs, Separation, TuneFile};

pub(super) fn sections(file: &TuneFile) -> Vec<Section> {
    let mut out = vec![configurations_section(file)];
    if !file.steps.is_empty() {
        out.push(steps_section(file));
    }
    out.push(winner_section(file));
    if let Some(plan) = &file.plan {
        let mut plan = plan_section(plan);
        plan.heading = "Capacity plan (the winner)".into();
        out.push(plan);
    }
    out.push(Section {
        heading: "Plots".into(),
        paragraphs: vec![
            "Capacity: the sustained rate of the highest level that met the SLO; the bars, the \
             search's final bracket, where the SLO crossing lies."
                .into(),
        ],
        plots: vec![capacity_plot(file), interactivity_plot(file)],
        ..Section::default()
    });
    out
}

/// A guided tune's walk: each step's regime, the move it made and whether it was kept.
fn steps_section(file: &TuneFile) -> Section {
    let rows = file
        .steps
        .iter()
        .enumerate()
        .map(|(i, step)| {
            vec![
                (i + 1).to_string(),
                format!("{} ({})", step.base, knobs_text(&step.knobs, &file.knobs)),
                step.regime
                    .map_or("–".to_string(), |r| format!("{r}: {}", step.evidence)),
                match (&step.knob, &step.from, &step.to) {
                    (Some(knob), Some(from), Some(to)) => format!("{knob} {from} → {to}"),
                    _ => "–".to_string(),
                },
                match step.kept {
                    Some(true) => "kept".to_string(),
                    Some(false) => "not kept".to_string(),
                    None => "–".to_string(),
                },
                step.why.clone(),
            ]
        })
        .collect();
    Section {
        heading: "The guided walk".into(),
        paragraphs: vec![
            "Each step reads the regime at the failing end of a configuration's knee search \
             (the lowest rate that broke the SLO), moves the knob that regime names one value \
             in its direction, and keeps the move only when the capacity improves beyond its \
             interval."
                .into(),
        ],
        tables: vec![Table {
            header: vec![
                "step".into(),
                "from".into(),
                "regime at the failing end".into(),
                "move".into(),
                "kept".into(),
                "why".into(),
            ],
            rows,
        }],
        ..Section::default()
    }
}

fn knobs_text(knobs: &Knobs, order: &[(String, Vec<String>)]) -> String {
    order
        .iter()
        .filter_map(|(name, _)| knobs.get(name).map(|v| format!("{name}={v}")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn status_text(status: ConfigStatus) -> &'static str {
    match status {
        ConfigStatus::Ok => "ok",
        ConfigStatus::FailedToStart => "failed to start",
        ConfigStatus::Died => "died",
        ConfigStatus::SearchFailed => "search failed",
        ConfigStatus::Interrupted => "interrupted",
    }
}

fn rate(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{v:.3}"))
}

fn configurations_section(file: &TuneFile) -> Section {
    let percentile = file
        .configurations
        .first()
        .map_or(99.0, |c| c.latency_percentile);
    let header = [
        "#".to_string(),
        "knobs".into(),
        "status".into(),
        "capacity (req/s)".into(),
        "bracket (req/s)".into(),
        "interpolated crossing (req/s)".into(),
        "crossing between runs (req/s)".into(),
        format!("TTFT p{percentile} (ms)"),
        format!("TPOT p{percentile} (ms)"),
        "output (tok/s)".into(),
        "server running (mean)".into(),
        "server KV usage (max)".into(),
        "search".into(),
    ]
    .to_vec();
    let rows = file
        .configurations
        .iter()
        .enumerate()
        .map(|(i, c)| {
            vec![
                (i + 1).to_string(),
                knobs_text(&c.knobs, &file.knobs),
                status_text(c.status).into(),
                rate(c.capacity),
                match (c.capacity_low, c.capacity_high) {
                    (Some(low), Some(high)) => format!("{low:.3}–{high:.3}"),
                    _ => "–".into(),
                },
                c.crossing.map_or("–".into(), |x| {
                    format!("{:.3} ({:.3}–{:.3})", x.estimate, x.lower, x.upper)
                }),
                c.crossing_between_runs.map_or("–".into(), |x| {
                    format!("{:.3} ({:.3}–{:.3})", x.estimate, x.lower, x.upper)
                }),
                fmt_ms(c.ttft_ms),
                fmt_ms(c.tpot_ms),
                c.output_tok_per_s.map_or("–".into(), |t| format!("{t:.1}")),
                c.server_running_mean
                    .map_or("–".into(), |v| format!("{v:.2}")),
                c.server_kv_usage_max
                    .map_or("–".into(), |v| format!("{v:.2}")),
                c.search_end.clone().unwrap_or_else(|| "–".into()),
            ]
        })
        .collect();
    let mut paragraphs = vec![format!(
        "SLO {}; strategy {}; server command template `{}`. Each configuration got a fresh \
         server and a knee search (`sweep --rates search`).",
        file.slo, file.strategy, file.template
    )];
    for (i, c) in file.configurations.iter().enumerate() {
        if let Some(tail) = &c.log_tail {
            paragraphs.push(format!(
                "Configuration {} ({}) {}; the end of its log:\n\n```\n{}\n```",
                i + 1,
                knobs_text(&c.knobs, &file.knobs),
                status_text(c.status),
                tail
            ));
        }
    }
    if let Some(reason) = &file.stop_reason {
        paragraphs.push(format!("The tune ended early: {reason}."));
    }
    Section {
        heading: "Configurations".into(),
        paragraphs,
        tables: vec![Table { header, rows }],
        ..Section::default()
    }
}

fn winner_section(file: &TuneFile) -> Section {
    let mut paragraphs = Vec::new();
    let mut tables = Vec::new();
    match &file.winner {
        None => paragraphs
            .push("No configuration met the SLO: there is no winner and no capacity plan.".into()),
        Some(winner) => {
            paragraphs.push(format!(
                "The winner: {}. Its command, ready to copy (`{{port}}` is yours to fill):\n\n\
                 ```\n{}\n```",
                knobs_text(&winner.knobs, &file.knobs),
                winner.command
            ));
            paragraphs.push(match (file.winner_vs_runner_up, &file.runner_up) {
                (Separation::Better, Some(r)) => format!(
                    "Better than the runner-up ({}): at the runner-up's capacity an SLO metric \
                     is significantly better for the winner beyond the smallest effect that \
                     matters, and none is worse.",
                    knobs_text(&r.knobs, &file.knobs)
                ),
                (Separation::Indistinguishable, Some(r)) => format!(
                    "Indistinguishable from the runner-up ({}) at this precision: no SLO \
                     metric differed significantly in the higher-capacity configuration's \
                     favour, or (with --repeats) its runs' crossings did not exceed the \
                     runner-up's beyond their spread, so the one whose values come first in \
                     the knob lists is kept.",
                    knobs_text(&r.knobs, &file.knobs)
                ),
                _ => "Not compared with a runner-up (fewer than two configurations met the SLO, \
                      or the comparison could not run)."
                    .into(),
            });
            if let Some(why) = &file.between_runs {
                paragraphs.push(format!(
                    "Between runs (--repeats; \"better\" needs the winner's crossings above the \
                     runner-up's beyond their spread): {why}."
                ));
            }
        }
    }
    if let Some(duel) = &file.duel {
        if let Some(error) = &duel.error {
            paragraphs.push(format!("The comparison failed: {error}"));
        } else {
            paragraphs.push(format!(
                "Paired comparison at {:.3} req/s offered (folder `{}`; A = the higher-capacity \
                 configuration, B = the other):",
                duel.offered_rate, duel.dir
            ));
            tables.push(Table {
                header: vec!["SLO metric".into(), "B against A".into()],
                rows: duel
                    .verdicts
                    .iter()
                    .map(|(m, v)| vec![m.clone(), v.clone()])
                    .collect(),
            });
        }
    }
    Section {
        heading: "Winner".into(),
        paragraphs,
        tables,
        ..Section::default()
    }
}

fn label(i: usize, c: &Configuration, file: &TuneFile) -> String {
    format!("#{} {}", i + 1, knobs_text(&c.knobs, &file.knobs))
}

fn capacity_plot(file: &TuneFile) -> Plot {
    let measured: Vec<(usize, &Configuration)> = file
        .configurations
        .iter()
        .enumerate()
        .filter(|(_, c)| c.capacity.is_some())
        .collect();
    let series = vec![Series {
        name: "capacity".into(),
        points: measured
            .iter()
            .map(|(i, c)| ((i + 1) as f64, c.capacity.unwrap_or_default()))
            .collect(),
        style: Style::Points,
        error_bars: measured
            .iter()
            .map(|(i, c)| ((i + 1) as f64, c.capacity_low, c.capacity_high))
            .collect(),
    }];
    let names: Vec<String> = measured.iter().map(|(i, c)| label(*i, c, file)).collect();
    Plot {
        name: "tune-capacity".into(),
        svg: svg::chart(&Chart {
            title: format!(
                "Capacity per configuration (bars: the final bracket): {}",
                names.join("; ")
            ),
            x_label: "configuration #".into(),
            y_label: "capacity (req/s sustained)".into(),
            series,
            ..Chart::default()
        }),
    }
}

/// The levels no other level beats on both axes, by per-user tok/s.
fn pareto_front(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut front: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|&(x, y)| {
            !points
                .iter()
                .any(|&(ox, oy)| ox >= x && oy >= y && (ox > x || oy > y))
        })
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0));
    front.dedup();
    front
}

fn interactivity_plot(file: &TuneFile) -> Plot {
    let mut series: Vec<Series> = file
        .configurations
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.levels.is_empty())
        .map(|(i, c)| Series {
            name: label(i, c, file),
            points: c
                .levels
                .iter()
                .filter_map(|l| Some((l.per_user_tok_per_s?, l.output_tok_per_s)))
                .collect(),
            style: Style::Points,
            error_bars: Vec::new(),
        })
        .collect();
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.clone()).collect();
    series.push(Series {
        name: "Pareto front".into(),
        points: pareto_front(&all),
        style: Style::DashedLine,
        error_bars: Vec::new(),
    });
    Plot {
        name: "tune-throughput-vs-interactivity".into(),
        svg: svg::chart(&Chart {
            title: "Total output tok/s against one request's tok/s, every level of every \
                    configuration"
                .into(),
            x_label: "per-request output tok/s (1000 / median TPOT)".into(),
            y_label: "output tok/s, all requests".into(),
            series,
            ..Chart::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pareto_front_keeps_what_nothing_beats_on_both_axes() {
        let points = [
            (10.0, 100.0),
            (20.0, 90.0),
            (15.0, 80.0),
            (5.0, 120.0),
            (20.0, 90.0),
        ];
        assert_eq!(
            pareto_front(&points),
            vec![(5.0, 120.0), (10.0, 100.0), (20.0, 90.0)]
        );
    }
}
