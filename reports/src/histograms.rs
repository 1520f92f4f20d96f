//! `histograms.hlog`: a run folder's measured-window latency histograms, in HdrHistogram's
//! interval-log format (one interval per distribution, tagged with its name; values in µs,
//! V2-deflate encoded). The encoding is lossless, so the histograms of the shards of one
//! schedule add up to exactly the histograms of their merged records, and HdrHistogram's own
//! tools (HistogramLogAnalyzer, `HistogramLogProcessor`) read the file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use hdrhistogram::serialization::interval_log::{
    IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, Tag,
};
use hdrhistogram::serialization::{Deserializer, V2DeflateSerializer};
use hdrhistogram::Histogram;

use crate::records::RequestRecord;

/// The file name in a run folder.
pub const HISTOGRAMS_FILE: &str = "histograms.hlog";

/// Named histograms (µs), as [`crate::metrics::window_histograms`] makes them.
pub type Histograms = BTreeMap<String, Histogram<u64>>;

/// Writes `hists` to `path`, each as one interval from `start` lasting `span`.
pub fn write(path: &Path, hists: &Histograms, start: SystemTime, span: Duration) -> Result<()> {
    let mut out = Vec::new();
    let mut serializer = V2DeflateSerializer::new();
    {
        let mut log = IntervalLogWriterBuilder::new()
            .add_comment("loadgen: measured-window latency histograms, values in microseconds")
            .with_start_time(start)
            .with_base_time(start)
            .with_max_value_divisor(1000.0)
            .begin_log_with(&mut out, &mut serializer)
            .context("starting the histogram log")?;
        for (name, hist) in hists {
            let tag = Tag::new(name).with_context(|| format!("histogram name `{name}`"))?;
            log.write_histogram(hist, Duration::ZERO, span, Some(tag))
                .map_err(|e| anyhow::anyhow!("encoding the `{name}` histogram: {e:?}"))?;
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// The measured-window histograms of `records`, written to `dir/histograms.hlog`.
pub fn write_for_records(
    dir: &Path,
    records: &[RequestRecord],
    start: SystemTime,
    span: Duration,
) -> Result<()> {
    let hists = crate::metrics::window_histograms(records);
    write(&dir.join(HISTOGRAMS_FILE), &hists, start, span)
}

/// Reads the tagged histograms of an interval log; a name seen twice is added up.
pub fn read(path: &Path) -> Result<Histograms> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Histograms::new();
    let mut deserializer = Deserializer::new();
    for entry in IntervalLogIterator::new(&bytes) {
        let entry = entry.map_err(|e| anyhow::anyhow!("{}: {e:?}", path.display()))?;
        let LogEntry::Interval(interval) = entry else {
            continue;
        };
        let Some(tag) = interval.tag() else {
            bail!("{}: an interval without a tag", path.display());
        };
        let name = tag.as_str().to_string();
        let raw = base64::engine::general_purpose::STANDARD
            .decode(interval.encoded_histogram())
            .with_context(|| format!("{}: the `{name}` histogram is not base64", path.display()))?;
        let hist: Histogram<u64> = deserializer
            .deserialize(&mut raw.as_slice())
            .map_err(|e| anyhow::anyhow!("{}: the `{name}` histogram: {e:?}", path.display()))?;
        add_named(&mut out, &name, &hist)
            .with_context(|| format!("{}: the `{name}` histogram", path.display()))?;
    }
    Ok(out)
}

/// Adds every histogram of `from` into `into`, by name.
pub fn add(into: &mut Histograms, from: &Histograms) -> Result<()> {
    for (name, hist) in from {
        add_named(into, name, hist).with_context(|| format!("adding the `{name}` histogram"))?;
    }
    Ok(())
}

fn add_named(into: &mut Histograms, name: &str, hist: &Histogram<u64>) -> Result<()> {
    match into.get_mut(name) {
        Some(existing) => existing.add(hist).map_err(|e| anyhow::anyhow!("{e:?}"))?,
        None => {
            into.insert(name.to_string(), hist.clone());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{histogram_of, new_histogram};

    #[test]
    fn histograms_round_trip_exactly_and_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let a: Histograms = [
            ("ttft".to_string(), histogram_of(&[50.1, 51.25, 3_000.0])),
            ("tpot".to_string(), histogram_of(&[10.0, 10.5])),
            ("queue_time".to_string(), new_histogram()),
        ]
        .into();
        let b: Histograms = [("ttft".to_string(), histogram_of(&[49.0, 0.001]))].into();
        let path = dir.path().join(HISTOGRAMS_FILE);
        write(&path, &a, SystemTime::UNIX_EPOCH, Duration::from_secs(10)).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back, a);
        let mut sum = back;
        add(&mut sum, &b).unwrap();
        assert_eq!(sum["ttft"].len(), 5);
        assert_eq!(
            sum["ttft"],
            histogram_of(&[50.1, 51.25, 3_000.0, 49.0, 0.001])
        );
        std::fs::write(&path, "Tag=ttft,0.000,10.000,3.000,not-base64!\n").unwrap();
        let err = format!("{:#}", read(&path).unwrap_err());
        assert!(
            err.contains("histograms.hlog") && err.contains("ttft"),
            "{err}"
        );
    }
}
