//! The wall clock, for workers that share one start instant (`--start-at`, parsed in
//! `units`): its RFC 3339 form, and the kernel's account of how well the system clock is synchronised.

use std::time::SystemTime;

use reports::records::ClockSync;

/// `at` as RFC 3339 with microseconds, UTC.
pub fn rfc3339(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The kernel's clock-synchronisation state (Linux `adjtimex`, read only); `None` elsewhere
/// or when the call fails.
pub fn clock_sync() -> Option<ClockSync> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `timex` is plain data; with `modes` = 0 the call only reads the kernel's
        // clock state into it.
        let mut tx: libc::timex = unsafe { std::mem::zeroed() };
        let state = unsafe { libc::adjtimex(&mut tx) };
        if state < 0 {
            return None;
        }
        let offset_us = if tx.status & libc::STA_NANO != 0 {
            tx.offset as f64 / 1000.0
        } else {
            tx.offset as f64
        };
        Some(ClockSync {
            synchronized: tx.status & libc::STA_UNSYNC == 0 && state != libc::TIME_ERROR,
            offset_us,
            est_error_us: tx.esterror as f64,
            max_error_us: tx.maxerror as f64,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::parse_instant;

    #[test]
    fn start_instants_parse_from_rfc3339_and_unix_seconds() {
        let a = parse_instant("2026-11-23T12:00:00.5Z").unwrap();
        let b = parse_instant("1795435200.5").unwrap();
        assert_eq!(a, b);
        assert_eq!(rfc3339(a), "2026-11-23T12:00:00.500000Z");
        assert_eq!(
            parse_instant("2026-11-23T13:00:00+01:00").unwrap(),
            parse_instant("1795435200").unwrap()
        );
        assert!(parse_instant("tomorrow").is_err());
        assert!(parse_instant("-5").is_err());
    }
}
