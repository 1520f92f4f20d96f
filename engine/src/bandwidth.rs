//! The memory bandwidth `GET /version` reports, for the bandwidth bound a load generator sets
//! beside its measurement: on the CPU measured at start-up (every core copying its share of
//! a buffer four times the last-level cache, at least 256 MiB, element by element; bytes read
//! plus written over the best of ten passes), on CUDA from the device's attributes (2 ×
//! memory clock × bus width: the double data rate's peak).

use std::time::Instant;

/// The smallest buffer copied: larger than any cache this runs on.
const MIN_BUFFER_BYTES: usize = 256 << 20;
const PASSES: usize = 10;

/// The last-level cache's size from sysfs, where the kernel says it.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..8)
        .filter_map(|i| std::fs::read_to_string(dir.join(format!("index{i}/size"))).ok())
        .filter_map(|text| {
            let t = text.trim();
            let (number, scale) = match t.strip_suffix('K') {
                Some(n) => (n, 1 << 10),
                None => match t.strip_suffix('M') {
                    Some(n) => (n, 1 << 20),
                    None => (t, 1),
                },
            };
            number.parse::<usize>().ok().map(|n| n * scale)
        })
        .max()
}

/// Bytes/s that `threads` threads copy, read plus written: the CPU's usable bandwidth.
pub fn cpu_copy_bandwidth(threads: usize) -> f64 {
    let bytes = (4 * last_level_cache_bytes().unwrap_or(0)).max(MIN_BUFFER_BYTES);
    let words = bytes / 8;
    // Both buffers written first (no page is mapped lazily during a pass), and a plain
    // element loop as `scripts/cpu-side-by-side.sh`'s C copy (STREAM "Copy") runs: glibc's
    // memcpy of buffers this large measured 10-20% lower here, its non-temporal stores
    // aside.
    let src = vec![1u64; words];
    let mut dst = vec![2u64; words];
    let chunk = words.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                scope.spawn(move || {
                    for (to, from) in d.iter_mut().zip(s) {
                        *to = *from;
                    }
                });
            }
        });
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    2.0 * (words * 8) as f64 / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_moves_gigabytes_a_second() {
        let bw = cpu_copy_bandwidth(2);
        // Any machine this runs on copies between 1 GB/s and 10 TB/s.
        assert!((1e9..1e13).contains(&bw), "{bw}");
    }
}
