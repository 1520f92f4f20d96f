//! CSV exports (`loadgen report --csv`) for pandas or a spreadsheet: `records.csv`, one row
//! per request with every field of its record flattened (nested objects as `session.turn`,
//! `error.kind`, …; lists as space-separated numbers) and its TTFT, TPOT and E2E, and
//! `levels.csv`, one row per sweep level with its rates, percentiles and regime.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Map, Value};

use crate::capacity::SweepLevel;
use crate::latency::DistStats;
use crate::metrics::{request_latency, SloMetric};
use crate::records::RequestRecord;

/// The columns first, in this order; any other field follows in its first record's order.
const LEAD: [&str; 6] = ["id", "phase", "class", "ttft_ms", "tpot_ms", "e2el_ms"];

/// `value` flattened into `out` under `prefix`.
fn flatten(prefix: &str, value: &Value, out: &mut Map<String, Value>) {
    match value {
        Value::Object(fields) => {
            for (k, v) in fields {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(items) => {
            let text: Vec<String> = items.iter().map(cell).collect();
            out.insert(prefix.to_string(), Value::String(text.join(" ")));
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// A value as its CSV cell (empty for null).
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Writes `records` to `path` as CSV.
pub fn write_records(records: &[RequestRecord], path: &Path) -> Result<()> {
    let mut rows = Vec::with_capacity(records.len());
    let mut columns: Vec<String> = LEAD.iter().map(|c| c.to_string()).collect();
    let mut known: BTreeSet<String> = columns.iter().cloned().collect();
    for r in records {
        let mut row = Map::new();
        flatten(
            "",
            &serde_json::to_value(r).context("serialising a record")?,
            &mut row,
        );
        let latency = request_latency(r);
        row.insert("ttft_ms".into(), latency.map(|l| l.ttft).into());
        row.insert("tpot_ms".into(), latency.and_then(|l| l.tpot).into());
        row.insert("e2el_ms".into(), latency.map(|l| l.e2el).into());
        for key in row.keys() {
            if known.insert(key.clone()) {
                columns.push(key.clone());
            }
        }
        rows.push(row);
    }
    let mut writer =
        csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
    writer.write_record(&columns)?;
    for row in &rows {
        writer.write_record(
            columns
                .iter()
                .map(|c| row.get(c).map_or_else(String::new, cell)),
        )?;
    }
    writer
        .flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes one row per sweep level to `path` as CSV, each with its folder (`dirs`, in the
/// levels' order: where its `records.csv` is).
pub fn write_levels(levels: &[SweepLevel], dirs: &[String], path: &Path) -> Result<()> {
    let mut writer =
        csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
    let mut header = vec![
        "level".to_string(),
        "dir".into(),
        "repeat".into(),
        "offered_rate".into(),
        "scheduled_rate".into(),
        "completed_rate".into(),
        "output_tokens_per_s".into(),
        "completed".into(),
        "saturated".into(),
        "saturation_rule".into(),
        "regime".into(),
    ];
    let metrics = [
        (SloMetric::Ttft, "ttft"),
        (SloMetric::TimeToFirstAnswer, "time_to_first_answer"),
        (SloMetric::Tpot, "tpot"),
        (SloMetric::E2el, "e2el"),
    ];
    for (_, name) in metrics {
        for p in ["p50", "p90", "p99"] {
            header.push(format!("{name}_{p}_ms"));
        }
    }
    writer.write_record(&header)?;
    let number = |v: Option<f64>| v.map_or_else(String::new, |v| v.to_string());
    for (i, level) in levels.iter().enumerate() {
        let regime = level
            .diagnosis
            .as_ref()
            .and_then(|d| serde_json::to_value(d.regime).ok())
            .map_or_else(String::new, |v| cell(&v));
        let mut row = vec![
            i.to_string(),
            dirs.get(i).cloned().unwrap_or_default(),
            level.repeat.map_or_else(|| "0".into(), |r| r.to_string()),
            level.offered_rate.to_string(),
            number(level.scheduled_rate),
            level.completed_rate.to_string(),
            level.output_tokens_per_s.to_string(),
            level.samples.requests.len().to_string(),
            level.saturated.to_string(),
            level.saturation_rule.clone().unwrap_or_default(),
            regime,
        ];
        for (metric, _) in metrics {
            let d = DistStats::from_values(&level.samples.values(metric));
            for v in [d.p50, d.p90, d.p99] {
                row.push(if d.count > 0 {
                    v.to_string()
                } else {
                    String::new()
                });
            }
        }
        writer.write_record(&row)?;
    }
    writer
        .flush()
        .with_context(|| format!("writing {}", path.display()))
}
