//! The client's own CPU use over a run, for the client-bound rule: CPU time of this process
//! (user + system, `getrusage`) over wall time × the cores it may run on.

use std::time::Instant;

/// A starting point: wall clock and process CPU time.
pub struct CpuClock {
    wall: Instant,
    cpu_s: f64,
}

fn process_cpu_s() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

impl CpuClock {
    pub fn start() -> CpuClock {
        CpuClock {
            wall: Instant::now(),
            cpu_s: process_cpu_s(),
        }
    }

    /// CPU time since [`CpuClock::start`] as a share of wall time × available cores;
    /// `None` over less than 100 ms (too short to say).
    pub fn share(&self) -> Option<f64> {
        let wall = self.wall.elapsed().as_secs_f64();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        (wall >= 0.1).then(|| ((process_cpu_s() - self.cpu_s) / (wall * cores)).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_in_the_share() {
        let clock = CpuClock::start();
        let end = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < end {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        let share = clock.share().unwrap();
        // One thread spinning: about 1 / cores, less when the machine is shared, more when
        // other tests of this process run at the same time; never beyond all the cores.
        assert!(share > 0.3 / cores && share <= 1.05, "{share}, {x}");
    }
}
