//! The conditions every number is reported under (workload, schedule, server, hardware),
//! read from a run's `meta.json`: what every report states beside its numbers.

use serde::{Deserialize, Serialize};

use crate::records::RunMeta;

/// The conditions every number is reported under.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conditions {
    pub workload: String,
    pub schedule: String,
    pub server: String,
    pub hardware: String,
    /// Further key/value facts (seed, command line, loadgen version, …).
    pub extra: Vec<(String, String)>,
}

impl Conditions {
    /// Conditions from a run's `meta.json`. Server hardware is taken from
    /// `extra.server_hardware` when the run recorded it.
    pub fn from_meta(meta: &RunMeta) -> Conditions {
        let server_hardware = meta
            .extra
            .get("server_hardware")
            .map(json_text)
            .unwrap_or_else(|| "not recorded".to_string());
        let mut extra = vec![
            ("seed".into(), meta.seed.to_string()),
            ("started".into(), meta.start_time.clone()),
            ("loadgen".into(), meta.loadgen_version.clone()),
            ("command".into(), meta.command_line.join(" ")),
        ];
        if !meta.complete {
            extra.push((
                "ended".into(),
                "no: meta.json is the copy written at the start, so the run was killed before its \
                 end; the records kept cover only part of the schedule"
                    .into(),
            ));
        }
        if let Some(shard) = &meta.shard {
            extra.push((
                "shard".into(),
                format!(
                    "{}/{} of a {}-request schedule starting {}",
                    shard.index, shard.count, shard.schedule_requests, shard.start_at
                ),
            ));
        }
        if !meta.merged_from.is_empty() {
            let shards: Vec<String> = meta
                .merged_from
                .iter()
                .map(|m| {
                    let clock = m
                        .shard
                        .clock
                        .map_or("clock state unknown".to_string(), |c| {
                            if c.synchronized {
                                format!("clock synchronised, est. error {:.0} µs", c.est_error_us)
                            } else {
                                "clock not synchronised".to_string()
                            }
                        });
                    format!(
                        "{}/{} on {} ({} records, {clock})",
                        m.shard.index, m.shard.count, m.host.hostname, m.records
                    )
                })
                .collect();
            extra.push(("merged from".into(), shards.join("; ")));
        }
        Conditions {
            workload: json_text(&meta.workload),
            schedule: json_text(&meta.schedule),
            server: format!(
                "{} ({} API), model {}, version {}",
                meta.url,
                meta.backend,
                meta.model,
                meta.server_version.as_deref().unwrap_or("unknown")
            ),
            hardware: format!(
                "server: {server_hardware}; client: {} ({} cores, {}) on {}",
                meta.host.cpu_model, meta.host.cores, meta.host.os, meta.host.hostname
            ),
            extra,
        }
    }
}

/// A JSON description for people: its leaves as "key value" pairs ("mode open, arrival
/// poisson, rate 0.5, warmup s 5"), nulls left out; a bare string as itself.
fn json_text(value: &serde_json::Value) -> String {
    fn leaves(path: &str, value: &serde_json::Value, out: &mut Vec<String>) {
        let key = path.replace('_', " ");
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    // Enum tags ("kind") and wrappers read better without their own key.
                    let child = if k == "kind" || k == "schedule" {
                        path.to_string()
                    } else {
                        k.clone()
                    };
                    leaves(&child, v, out);
                }
            }
            serde_json::Value::Array(items) => {
                let text: Vec<String> = items.iter().map(json_text).collect();
                out.push(format!("{key} [{}]", text.join(", ")).trim().to_string());
            }
            serde_json::Value::String(s) => out.push(format!("{key} {s}").trim().to_string()),
            other => out.push(format!("{key} {other}").trim().to_string()),
        }
    }
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => {
            let mut out = Vec::new();
            leaves("", other, &mut out);
            out.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::json_text;

    #[test]
    fn conditions_read_as_words_not_json() {
        let schedule = serde_json::json!({
            "mode": "open",
            "schedule": {"arrival": {"kind": "poisson"}, "rate": 0.5, "ramp_up": null},
            "warmup_s": 5.0,
        });
        assert_eq!(
            json_text(&schedule),
            "mode open, arrival poisson, rate 0.5, warmup s 5.0"
        );
        assert_eq!(json_text(&serde_json::json!("as is")), "as is");
    }

    #[test]
    fn conditions_say_when_a_run_was_cut_short_or_merged_from_shards() {
        let mut meta: crate::records::RunMeta = serde_json::from_value(serde_json::json!({
            "schema_version": 1, "loadgen_version": "0.1.0", "command_line": ["loadgen"],
            "seed": 1, "workload": {}, "schedule": {}, "url": "http://x", "backend": "completions",
            "model": "m", "host": {"hostname": "h", "cpu_model": "c", "cores": 2, "os": "linux"},
            "start_time": "2026-11-23T12:00:00Z", "approximate_lengths": true,
            "planned_requests": 9, "complete": false,
            "merged_from": [{"folder": "s0", "records": 5, "client_cpu": 0.1,
                "host": {"hostname": "w0", "cpu_model": "c", "cores": 2, "os": "linux"},
                "shard": {"index": 0, "count": 2, "schedule_requests": 9,
                    "start_at": "2026-11-23T12:00:00Z", "ready_before_start_ms": 2900.0,
                    "clock": {"synchronized": true, "offset_us": 3.0, "est_error_us": 120.0,
                              "max_error_us": 400.0}}}]
        }))
        .unwrap();
        let find = |c: &super::Conditions, key: &str| {
            c.extra
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let c = super::Conditions::from_meta(&meta);
        assert!(find(&c, "ended").unwrap().contains("killed"));
        assert_eq!(
            find(&c, "merged from").unwrap(),
            "0/2 on w0 (5 records, clock synchronised, est. error 120 µs)"
        );
        meta.complete = true;
        assert_eq!(find(&super::Conditions::from_meta(&meta), "ended"), None);
    }
}
