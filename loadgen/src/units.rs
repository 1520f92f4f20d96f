//! Parsing of human-friendly durations (`50ms`, `10s`, `2m`, `1.5` = seconds).

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Parses a duration: a number with unit `us`, `ms`, `s`, `m` or `h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .with_context(|| format!("duration `{text}`: expected e.g. 50ms, 10s, 2m"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => bail!("duration `{text}`: unknown unit `{other}` (us, ms, s, m, h)"),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        bail!("duration `{text}` must be a non-negative number");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `clap` value parser for durations.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("50ms").unwrap(), Duration::from_millis(50));
        assert_eq!(parse_duration("120s").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
