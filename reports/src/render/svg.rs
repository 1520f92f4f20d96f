//! Hand-written SVG plots: line/point charts with reference lines, and histograms.
//! Output is plain SVG markup without scripts, styles from outside or links.

use std::fmt::Write;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 50.0;
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Line,
    Points,
    LinePoints,
    DashedLine,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
    /// Vertical error bars (x, low, high) in the series' colour; a bound beyond the data is
    /// drawn to the plot's edge with an open end.
    pub error_bars: Vec<(f64, Option<f64>, Option<f64>)>,
}

/// A labelled reference line (an SLO limit, the knee).
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    pub value: f64,
    pub label: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Horizontal lines at y values.
    pub h_markers: Vec<Marker>,
    /// Vertical lines at x values.
    pub v_markers: Vec<Marker>,
    /// Shaded x ranges behind the series (from, to, label), e.g. a run's warm-up.
    pub shaded: Vec<(f64, f64, String)>,
}

/// Horizontal stacked bars: one per row (`(label, values)`, a value per part in `parts`'
/// order), the parts in the palette's colours with a legend, the x axis from 0.
pub fn stacked_bars(
    title: &str,
    x_label: &str,
    parts: &[&str],
    rows: &[(String, Vec<f64>)],
) -> String {
    let totals = rows.iter().map(|(_, v)| v.iter().sum::<f64>());
    let x = Axis::new(totals.chain([0.0]), LEFT + 40.0, WIDTH - RIGHT, true);
    let mut out = String::new();
    open(&mut out, title, x_label, "");
    x_grid(&mut out, &x);
    let (y0, y1) = (TOP, HEIGHT - BOTTOM);
    let band = (y1 - y0) / rows.len().max(1) as f64;
    let height = (band * 0.6).min(40.0);
    for (i, (label, values)) in rows.iter().enumerate() {
        let top = y0 + band * i as f64 + (band - height) / 2.0;
        let _ = write!(
            out,
            r#"<text x="{lx}" y="{ly:.1}" text-anchor="end">{l}</text>"#,
            lx = LEFT + 36.0,
            ly = top + height / 2.0 + 4.0,
            l = escape(&shorten(label, 14))
        );
        let mut from = 0.0;
        for (k, value) in values.iter().enumerate() {
            if !(value.is_finite() && *value > 0.0) {
                continue;
            }
            let (x0, x1) = (x.map(from), x.map(from + value));
            let _ = write!(
                out,
                r#"<rect x="{x0:.1}" y="{top:.1}" width="{w:.1}" height="{height:.1}" fill="{c}"/>"#,
                w = (x1 - x0).max(0.5),
                c = PALETTE[k % PALETTE.len()]
            );
            from += value;
        }
    }
    let entries: Vec<(String, &str, bool)> = parts
        .iter()
        .enumerate()
        .map(|(k, p)| (p.to_string(), PALETTE[k % PALETTE.len()], false))
        .collect();
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

/// Longest legend entry that fits beside the plot area.
const LEGEND_CHARS: usize = 22;

/// `text` cut to `max` characters, with an ellipsis when cut.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(max - 1).collect();
        cut.push('…');
        cut
    }
}

/// Escapes text for XML content and attribute values.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A linear axis mapping data to pixels.
struct Axis {
    min: f64,
    max: f64,
    step: f64,
    from: f64,
    to: f64,
}

impl Axis {
    fn new(values: impl Iterator<Item = f64>, from: f64, to: f64, include_zero: bool) -> Axis {
        let (mut min, mut max) = values
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if !min.is_finite() {
            (min, max) = (0.0, 1.0);
        }
        if include_zero {
            min = min.min(0.0);
            max = max.max(0.0);
        }
        if max - min < 1e-12 {
            let pad = if max.abs() > 0.0 {
                max.abs() * 0.1
            } else {
                1.0
            };
            (min, max) = (min - pad, max + pad);
        }
        let step = nice_step((max - min) / 5.0);
        Axis {
            min: (min / step).floor() * step,
            max: (max / step).ceil() * step,
            step,
            from,
            to,
        }
    }

    fn map(&self, v: f64) -> f64 {
        self.from + (v - self.min) / (self.max - self.min) * (self.to - self.from)
    }

    fn ticks(&self) -> Vec<f64> {
        let count = ((self.max - self.min) / self.step).round() as usize;
        (0..=count)
            .map(|i| self.min + i as f64 * self.step)
            .collect()
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1e-12);
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// Compact tick label.
fn format_tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_string()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn open(out: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" font-family="sans-serif" font-size="12"><title>{t}</title><rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{cx}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{t}</text><text x="{cx}" y="{xy}" text-anchor="middle">{xl}</text><text transform="translate(16 {cy}) rotate(-90)" text-anchor="middle">{yl}</text>"#,
        t = escape(title),
        cx = (LEFT + WIDTH - RIGHT) / 2.0,
        cy = (TOP + HEIGHT - BOTTOM) / 2.0,
        xy = HEIGHT - 10.0,
        xl = escape(x_label),
        yl = escape(y_label),
    );
}

/// The x axis's grid lines across the plot area, each with its tick label below.
fn x_grid(out: &mut String, x: &Axis) {
    let (y0, y1) = (HEIGHT - BOTTOM, TOP);
    for t in x.ticks() {
        let px = x.map(t);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{y0}" x2="{px:.1}" y2="{y1}" stroke="#e5e5e5"/><text x="{px:.1}" y="{ty}" text-anchor="middle">{l}</text>"##,
            ty = y0 + 16.0,
            l = format_tick(t)
        );
    }
}

fn axes(out: &mut String, x: &Axis, y: &Axis) {
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP);
    x_grid(out, x);
    for t in y.ticks() {
        let py = y.map(t);
        let _ = write!(
            out,
            r##"<line x1="{x0}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="#e5e5e5"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{l}</text>"##,
            tx = x0 - 6.0,
            ty = py + 4.0,
            l = format_tick(t)
        );
    }
    let _ = write!(
        out,
        r##"<rect x="{x0}" y="{y1}" width="{w}" height="{h}" fill="none" stroke="#333"/>"##,
        w = x1 - x0,
        h = y0 - y1
    );
}

fn legend(out: &mut String, entries: &[(String, &str, bool)]) {
    for (i, (name, color, dashed)) in entries.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 18.0;
        let x = WIDTH - RIGHT + 12.0;
        let dash = if *dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{x2}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/><text x="{tx}" y="{ty}">{n}</text>"#,
            x2 = x + 20.0,
            tx = x + 26.0,
            ty = y + 4.0,
            n = escape(&shorten(name, LEGEND_CHARS))
        );
    }
}

/// Renders a chart of series and reference lines.
pub fn chart(c: &Chart) -> String {
    let xs = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(c.v_markers.iter().map(|m| m.value))
        .chain(c.shaded.iter().flat_map(|&(from, to, _)| [from, to]));
    let ys = c
        .series
        .iter()
        .flat_map(|s| {
            s.points.iter().map(|p| p.1).chain(
                s.error_bars
                    .iter()
                    .flat_map(|&(_, low, high)| low.into_iter().chain(high)),
            )
        })
        .chain(c.h_markers.iter().map(|m| m.value));
    let x = Axis::new(xs, LEFT, WIDTH - RIGHT, false);
    let y = Axis::new(ys, HEIGHT - BOTTOM, TOP, true);
    let mut out = String::new();
    open(&mut out, &c.title, &c.x_label, &c.y_label);
    for (from, to, label) in &c.shaded {
        let (x0, x1) = (x.map(*from), x.map(*to));
        let _ = write!(
            out,
            r##"<rect x="{x0:.1}" y="{TOP}" width="{w:.1}" height="{h}" fill="#ececec"/><text x="{tx:.1}" y="{ty}" fill="#777">{l}</text>"##,
            w = (x1 - x0).max(0.0),
            h = HEIGHT - BOTTOM - TOP,
            tx = x0 + 4.0,
            ty = TOP + 28.0,
            l = escape(label)
        );
    }
    axes(&mut out, &x, &y);
    let mut entries = Vec::new();
    for (i, s) in c.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(px, py)| (x.map(px), y.map(py)))
            .collect();
        let dashed = s.style == Style::DashedLine;
        if matches!(s.style, Style::Line | Style::LinePoints | Style::DashedLine)
            && !points.is_empty()
        {
            let path: Vec<String> = points
                .iter()
                .map(|(px, py)| format!("{px:.1},{py:.1}"))
                .collect();
            let dash = if dashed {
                r#" stroke-dasharray="5 3""#
            } else {
                ""
            };
            let _ = write!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
        }
        for &(bx, low, high) in &s.error_bars {
            if !bx.is_finite() {
                continue;
            }
            let px = x.map(bx);
            let y_low = low.map_or(HEIGHT - BOTTOM, |v| y.map(v));
            let y_high = high.map_or(TOP, |v| y.map(v));
            let _ = write!(
                out,
                r#"<line x1="{px:.1}" y1="{y_low:.1}" x2="{px:.1}" y2="{y_high:.1}" stroke="{color}" stroke-width="1.2"/>"#
            );
            for (end, bound) in [(y_low, low), (y_high, high)] {
                if bound.is_some() {
                    let _ = write!(
                        out,
                        r#"<line x1="{:.1}" y1="{end:.1}" x2="{:.1}" y2="{end:.1}" stroke="{color}" stroke-width="1.2"/>"#,
                        px - 4.0,
                        px + 4.0
                    );
                }
            }
        }
        if matches!(s.style, Style::Points | Style::LinePoints) {
            for (px, py) in &points {
                let _ = write!(
                    out,
                    r#"<circle cx="{px:.1}" cy="{py:.1}" r="3.5" fill="{color}"/>"#
                );
            }
        }
        entries.push((s.name.clone(), color, dashed));
    }
    for m in &c.h_markers {
        let py = y.map(m.value);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{tx}" y="{ty:.1}" text-anchor="end" fill="#000">{l}</text>"##,
            x1 = WIDTH - RIGHT,
            tx = WIDTH - RIGHT - 4.0,
            ty = py - 4.0,
            l = escape(&m.label)
        );
    }
    for m in &c.v_markers {
        let px = x.map(m.value);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{y0}" stroke="#7f7f7f" stroke-width="2" stroke-dasharray="2 3"/><text x="{tx:.1}" y="{ty}" fill="#555">{l}</text>"##,
            y0 = HEIGHT - BOTTOM,
            tx = px + 4.0,
            ty = TOP + 14.0,
            l = escape(&m.label)
        );
    }
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

/// Histogram of `values` in `bins` equal-width bins, with an optional vertical marker.
pub fn histogram(
    title: &str,
    x_label: &str,
    values: &[f64],
    bins: usize,
    marker: Option<Marker>,
) -> String {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let bins = bins.max(1);
    let (lo, hi) = finite
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    let (lo, hi) = if finite.is_empty() {
        (0.0, 1.0)
    } else if hi - lo < 1e-12 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for v in &finite {
        let i = (((v - lo) / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    let x = Axis::new(
        [lo, hi].into_iter().chain(marker.iter().map(|m| m.value)),
        LEFT,
        WIDTH - RIGHT,
        false,
    );
    let y = Axis::new(counts.iter().map(|&c| c as f64), HEIGHT - BOTTOM, TOP, true);
    let mut out = String::new();
    open(&mut out, title, x_label, "requests");
    axes(&mut out, &x, &y);
    for (i, &count) in counts.iter().enumerate() {
        let x0 = x.map(lo + i as f64 * width);
        let x1 = x.map(lo + (i + 1) as f64 * width);
        let top = y.map(count as f64);
        let _ = write!(
            out,
            r##"<rect x="{x0:.1}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="#1f77b4" fill-opacity="0.75" stroke="white" stroke-width="0.5"/>"##,
            w = (x1 - x0).max(0.5),
            h = (y.map(0.0) - top).max(0.0)
        );
    }
    if let Some(m) = marker {
        let px = x.map(m.value);
        let _ = write!(
            out,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{y0}" stroke="#d62728" stroke-width="2" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{ty}" fill="#d62728">{l}</text>"##,
            y0 = HEIGHT - BOTTOM,
            tx = px + 4.0,
            ty = TOP + 14.0,
            l = escape(&m.label)
        );
    }
    let _ = write!(
        out,
        r#"<text x="{tx}" y="{ty}">n = {n}</text>"#,
        tx = WIDTH - RIGHT + 12.0,
        ty = TOP + 10.0,
        n = finite.len()
    );
    out.push_str("</svg>");
    out
}

/// Empirical CDF points of `values`, thinned to at most `max_points`.
pub fn cdf_points(values: &[f64], max_points: usize) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(max_points.max(2));
    let mut points: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (sorted[i], (i + 1) as f64 / n as f64))
        .collect();
    if points.last().map(|p| p.1) != Some(1.0) {
        points.push((sorted[n - 1], 1.0));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(70.0), 100.0);
    }

    #[test]
    fn cdf_ends_at_one() {
        let points = cdf_points(&[3.0, 1.0, 2.0], 100);
        assert_eq!(points, vec![(1.0, 1.0 / 3.0), (2.0, 2.0 / 3.0), (3.0, 1.0)]);
        assert_eq!(
            cdf_points(&(0..1000).map(f64::from).collect::<Vec<_>>(), 100).len(),
            101
        );
    }

    #[test]
    fn text_is_escaped() {
        let svg = chart(&Chart {
            title: "a<b & \"c\"".into(),
            ..Chart::default()
        });
        assert!(svg.contains("a&lt;b &amp; &quot;c&quot;"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }
}
