//! Parsing of human-friendly durations (`50ms`, `10s`, `2m`, `1.5` = seconds), fractions
//! (`2%`, `0.02`) and instants (RFC 3339 or Unix seconds).

use std::time::{Duration, SystemTime};

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

/// `clap` value parser for a fraction in [0, 1): `2%` or `0.02`.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let value = match t.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("`{text}`: expected a fraction such as 2% or 0.02"))?;
    if !(0.0..1.0).contains(&value) {
        return Err(format!("`{text}`: must be at least 0 and below 100%"));
    }
    Ok(value)
}

/// Parses `--start-at`: RFC 3339 (`2026-11-23T12:00:00Z`) or Unix seconds (`1795435200.5`).
pub fn parse_instant(text: &str) -> Result<SystemTime> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if !(secs.is_finite() && secs > 0.0) {
            bail!("--start-at `{text}`: Unix seconds must be positive");
        }
        return Ok(SystemTime::UNIX_EPOCH + Duration::from_secs_f64(secs));
    }
    let at = chrono::DateTime::parse_from_rfc3339(text).with_context(|| {
        format!("--start-at `{text}`: expected RFC 3339 (2026-11-23T12:00:00Z) or Unix seconds")
    })?;
    Ok(SystemTime::from(at))
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

    #[test]
    fn fractions() {
        assert_eq!(parse_fraction("2%"), Ok(0.02));
        assert_eq!(parse_fraction("0.05"), Ok(0.05));
        assert!(parse_fraction("150%").is_err());
        assert!(parse_fraction("two").is_err());
    }
}
