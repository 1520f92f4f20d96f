//! Host information for `meta.json` (Linux `/proc`; fields stay empty elsewhere).

use reports::records::HostInfo;

/// Hostname, CPU model, core count and OS of this machine.
pub fn host_info() -> HostInfo {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    HostInfo {
        hostname,
        cpu_model,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        os: std::env::consts::OS.to_string(),
    }
}
