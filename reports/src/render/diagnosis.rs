//! The "what limited this run" section: the regime and its evidence, the roofline beside the
//! measurement (both sides, and which binds), and the telemetry that was missing.

use super::{Section, Table};
use crate::diagnosis::Diagnosis;

pub(super) fn section(d: &Diagnosis) -> Section {
    let mut paragraphs = vec![format!("**{}**: {}.", d.regime, d.evidence)];
    let mut tables = Vec::new();
    if let Some(b) = d.bound {
        let ratio = |r: Option<f64>| r.map_or("–".into(), |r| format!("{r:.2}×"));
        tables.push(Table {
            header: vec!["roofline".into(), "value".into()],
            rows: vec![
                vec![
                    "batch (running requests) and mean context".into(),
                    format!("{:.1} sequences × {:.0} tokens", b.batch, b.context),
                ],
                vec![
                    "bytes a decode step reads".into(),
                    format!("{:.3} GB", b.bytes_per_step / 1e9),
                ],
                vec![
                    "memory side: bytes / bandwidth".into(),
                    format!("{:.3} ms", b.memory_side_ms()),
                ],
                vec![
                    "FLOPs of a decode step".into(),
                    b.flops_per_step
                        .map_or("unknown".into(), |f| format!("{:.3} GFLOP", f / 1e9)),
                ],
                vec![
                    "compute side: FLOPs / compute".into(),
                    b.compute_ms
                        .map_or("unknown".into(), |c| format!("{c:.3} ms")),
                ],
                vec![
                    "bound TPOT (the larger side)".into(),
                    format!("{:.3} ms ({} binds)", b.tpot_ms, b.binds),
                ],
                vec![
                    "observed TPOT median / bound".into(),
                    ratio(d.tpot_over_bound),
                ],
                vec![
                    "bound output tok/s at that batch".into(),
                    format!("{:.1}", b.output_tok_per_s),
                ],
                vec![
                    "observed output tok/s / bound".into(),
                    ratio(d.throughput_over_bound),
                ],
            ],
        });
        paragraphs.push(
            "The bound assumes no efficiency factor: a decode step reads the weights once and \
             every sequence's cached K and V at the memory's peak bandwidth, and computes its \
             FLOPs at the device's peak rate; the slower of the two is the floor. Observed / \
             bound is the finding: near 1 the hardware limits, far above it the engine or the \
             workload."
                .into(),
        );
    }
    if !d.missing.is_empty() {
        paragraphs.push(format!("Not known: {}.", d.missing.join("; ")));
    }
    Section {
        heading: "What limited this run".into(),
        paragraphs,
        tables,
        ..Section::default()
    }
}
