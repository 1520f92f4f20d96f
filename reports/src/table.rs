//! The terminal result table, in the layout of `vllm bench serve` (50 columns, label padded
//! to 40), extended with p90 / p95 / p99.9, token-true ITL, schedule lag and errors.

use std::fmt::Write;

use crate::metrics::DistStats;
use crate::summary::Summary;

const WIDTH: usize = 50;

fn title(out: &mut String, text: &str, fill: char) {
    let text = format!(" {text} ");
    let pad = WIDTH.saturating_sub(text.chars().count());
    let left = pad / 2;
    let fill_str = |n| std::iter::repeat_n(fill, n).collect::<String>();
    let _ = writeln!(out, "{}{text}{}", fill_str(left), fill_str(pad - left));
}

fn row(out: &mut String, label: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{label:<40} {value:<10}");
}

fn dist(out: &mut String, heading: &str, short: &str, d: &DistStats) {
    title(out, heading, '-');
    row(
        out,
        &format!("Mean {short} (ms):"),
        format!("{:.2}", d.mean),
    );
    for (name, q) in [
        ("Median", 0.5),
        ("P90", 0.9),
        ("P95", 0.95),
        ("P99", 0.99),
        ("P99.9", 0.999),
    ] {
        row(
            out,
            &format!("{name} {short} (ms):"),
            d.percentile_text(q, 2),
        );
    }
}

/// Renders the table for `summary`.
pub fn render(summary: &Summary) -> String {
    let mut out = String::new();
    let result_title = if summary.incomplete {
        "Serving Benchmark Result (INCOMPLETE)"
    } else {
        "Serving Benchmark Result"
    };
    title(&mut out, result_title, '=');
    row(&mut out, "Successful requests:", summary.completed);
    row(&mut out, "Failed requests:", summary.failed);
    for (kind, n) in &summary.errors {
        row(&mut out, &format!("  failed ({kind}):"), n);
    }
    if summary.unfinished > 0 {
        row(&mut out, "Unfinished (stopped early):", summary.unfinished);
    }
    if summary.interrupted > 0 {
        row(
            &mut out,
            "Interrupted (stop, session drain):",
            summary.interrupted,
        );
    }
    row(
        &mut out,
        "Benchmark duration (s):",
        format!("{:.2}", summary.duration),
    );
    row(&mut out, "Total input tokens:", summary.total_input_tokens);
    row(
        &mut out,
        "Total generated tokens:",
        summary.total_output_tokens,
    );
    if summary.total_reasoning_tokens > 0 {
        let counted = if summary.counted_reasoning_tokens > 0 {
            " (counted from chunks)"
        } else {
            ""
        };
        row(
            &mut out,
            "  of which reasoning:",
            format!("{}{counted}", summary.total_reasoning_tokens),
        );
    }
    if summary.no_answer > 0 {
        row(&mut out, "Reasoning only, no answer:", summary.no_answer);
    }
    row(
        &mut out,
        "Request throughput (req/s):",
        format!("{:.2}", summary.request_throughput),
    );
    if let Some(goodput) = summary.request_goodput {
        row(
            &mut out,
            "Request goodput (req/s):",
            format!("{goodput:.2}"),
        );
    }
    if let Some(s) = &summary.sessions {
        row(&mut out, "Sessions (measured):", s.sessions);
        row(
            &mut out,
            "Session rate (sessions/s):",
            format!("{:.2}", s.session_rate),
        );
        row(
            &mut out,
            "Requests per session:",
            format!("{:.2}", s.requests_per_session),
        );
        let ended: Vec<String> = s.ended.iter().map(|(k, n)| format!("{k} {n}")).collect();
        row(&mut out, "Sessions ended:", ended.join(", "));
    }
    if let Some(share) = summary.cached_prompt_share {
        row(
            &mut out,
            "Prompt tokens from prefix cache:",
            format!("{:.1}%", share * 100.0),
        );
    }
    row(
        &mut out,
        "Output token throughput (tok/s):",
        format!("{:.2}", summary.output_throughput),
    );
    row(
        &mut out,
        "Total Token throughput (tok/s):",
        format!("{:.2}", summary.total_token_throughput),
    );
    let get = |key: &str| summary.metrics.get(key).copied().unwrap_or_default();
    dist(&mut out, "Time to First Token", "TTFT", &get("ttft"));
    dist(
        &mut out,
        "Time to First Answer Token (after reasoning)",
        "TTFA",
        &get("time_to_first_answer"),
    );
    dist(
        &mut out,
        "Time per Output Token (excl. 1st token)",
        "TPOT",
        &get("tpot"),
    );
    dist(
        &mut out,
        "Inter-token Latency (per chunk)",
        "ITL",
        &get("itl"),
    );
    dist(
        &mut out,
        "Inter-token Latency (token-true)",
        "token ITL",
        &get("token_itl"),
    );
    dist(&mut out, "End-to-end Latency", "E2EL", &get("e2el"));
    if let Some(s) = &summary.sessions {
        title(&mut out, "By Turn (sessions)", '-');
        for t in &s.by_turn {
            let cached = t
                .cached_share
                .map_or(String::new(), |c| format!(", cached {:.0}%", c * 100.0));
            row(
                &mut out,
                &format!("Turn {} ({} ok, {} failed):", t.turn, t.completed, t.failed),
                format!(
                    "TTFT p50 {:.1} ms, prompt {:.0} tok{cached}",
                    t.ttft.p50, t.prompt_tokens_mean
                ),
            );
        }
    }
    title(&mut out, "Schedule Lag", '-');
    let lag = get("schedule_lag");
    row(&mut out, "Median lag (ms):", format!("{:.3}", lag.p50));
    let ttft_p99 = get("ttft").p99;
    row(
        &mut out,
        "P99 lag (ms):",
        if ttft_p99 > 0.0 {
            format!(
                "{:.3} ({:.2}% of TTFT p99)",
                lag.p99,
                lag.p99 / ttft_p99 * 100.0
            )
        } else {
            format!("{:.3}", lag.p99)
        },
    );
    row(&mut out, "Max lag (ms):", format!("{:.3}", lag.max));
    let queue = get("queue_time");
    if queue.max > 0.0 {
        row(
            &mut out,
            "P99 queue time (ms):",
            format!("{:.3}", queue.p99),
        );
        row(
            &mut out,
            "P99 TTFT from scheduled (ms):",
            format!("{:.2}", get("ttft_from_scheduled").p99),
        );
    }
    let connect = get("connect");
    if connect.count > 0 {
        row(
            &mut out,
            "Connections opened (in TTFT):",
            format!(
                "{} (connect median {:.3} ms, max {:.3} ms)",
                connect.count, connect.p50, connect.max
            ),
        );
    }
    let gap = get("client_server_gap");
    row(
        &mut out,
        "Client–server gap (ms):",
        if gap.count > 0 {
            format!(
                "p50 {:.2}, p99 {:.2} (E2E minus the server's queue, prefill and decode time, \
                 {} requests; llama.cpp gives no queue time: there its queue is in the gap)",
                gap.p50, gap.p99, gap.count
            )
        } else {
            "unknown: the server gave no per-request timing (a `timings` object, or vLLM's \
             `metrics` with --enable-per-request-metrics)"
                .to_string()
        },
    );
    if let (Some(scheduled), Some(sent)) = (summary.scheduled_rate, summary.sent_rate) {
        row(
            &mut out,
            "Scheduled / sent rate (req/s):",
            format!("{scheduled:.2} / {sent:.2}"),
        );
    }
    if let Some(cpu) = summary.client_cpu {
        row(
            &mut out,
            "Client CPU:",
            format!("{:.0}% of its cores", cpu * 100.0),
        );
    }
    if summary.client_bound {
        row(
            &mut out,
            "CLIENT-BOUND:",
            summary.client_bound_reasons.join("; "),
        );
    }
    if let (Some(regime), Some(evidence)) = (summary.regime, &summary.regime_evidence) {
        row(&mut out, "Regime:", format!("{regime}: {evidence}"));
        let flags = summary
            .diagnosis
            .as_ref()
            .and_then(|d| d.knob_flags.as_deref())
            .map_or(String::new(), |f| format!(" ({f})"));
        row(
            &mut out,
            "Knob to try:",
            format!("{}{flags}", regime.knob_to_try()),
        );
    }
    // Last, so that a failed run never reads as a clean one.
    if summary.failed > 0 {
        let kinds: Vec<String> = summary
            .errors
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        row(
            &mut out,
            "FAILED:",
            format!(
                "{} of {} requests ({})",
                summary.failed,
                summary.failed + summary.completed,
                kinds.join(", ")
            ),
        );
    }
    let _ = writeln!(out, "{}", "=".repeat(WIDTH));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn layout_matches_vllm() {
        let mut m = Metrics {
            completed: 7,
            ..Metrics::default()
        };
        m.ttft.p50 = 50.25;
        m.ttft.count = 7;
        let text = render(&Summary::new(&m, &[], false, 0));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "============ Serving Benchmark Result ============"
        );
        assert_eq!(
            lines[1],
            format!("{:<40} {:<10}", "Successful requests:", 7)
        );
        assert!(text.contains("Median TTFT (ms):                        50.25"));
        assert!(text.contains("Median TTFA (ms):"));
        assert!(
            !text.contains("reasoning:"),
            "no reasoning, no reasoning row"
        );
        assert_eq!(lines.last().unwrap().len(), WIDTH);
    }
}
