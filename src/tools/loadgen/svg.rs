//! The latency percentile curves as an SVG picture, drawn by hand (no plotting
//! dependency): x is the percentile on a log scale of "nines" (0 to 99.999), y the
//! latency on a log scale of microseconds.

use super::report::{Report, us};
use hdrhistogram::Histogram;
use std::fmt::Write as _;

/// Decades of "nines" on the x axis: x = -log10(1 - p/100), 0 (p0) to 5 (p99.999).
const SVG_NINES: f64 = 5.0;

fn escape_xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws percentile curves of latency histograms (nanoseconds) by hand.
pub(super) fn latency_svg(
    title: &str,
    subtitle: &str,
    curves: &[(&str, &str, &Histogram<u64>)],
) -> String {
    let (w, h) = (900.0, 540.0);
    let (left, right, top, bottom) = (80.0, 170.0, 64.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    // y range: whole decades of microseconds around every curve.
    let lo_ns = curves
        .iter()
        .map(|(_, _, h)| h.value_at_quantile(0.0).max(1))
        .min()
        .unwrap_or(1_000);
    let hi_ns = curves
        .iter()
        .map(|(_, _, h)| h.max().max(1))
        .max()
        .unwrap_or(1_000_000);
    let y_lo = (us(lo_ns).max(0.1)).log10().floor();
    let y_hi = (us(hi_ns).max(1.0)).log10().ceil().max(y_lo + 1.0);
    let x_of = |nines: f64| left + nines / SVG_NINES * pw;
    let y_of = |v_us: f64| top + ph - (v_us.max(1e-3).log10() - y_lo) / (y_hi - y_lo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{x}" y="24" text-anchor="middle" font-size="15">{}</text><text x="{x}" y="44" text-anchor="middle">{}</text>"#,
        escape_xml(title),
        escape_xml(subtitle),
        x = left + pw / 2.0,
    );
    // x grid: 0, 90, 99, 99.9, ...
    for (i, label) in ["0", "90", "99", "99.9", "99.99", "99.999"]
        .iter()
        .enumerate()
    {
        let x = x_of(i as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            top + ph,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile</text>"#,
        left + pw / 2.0,
        h - 15.0
    );
    // y grid: decades of microseconds.
    let mut d = y_lo;
    while d <= y_hi + 1e-9 {
        let v = 10f64.powf(d);
        let y = y_of(v);
        let label = if v >= 1e6 {
            format!("{} s", v / 1e6)
        } else if v >= 1e3 {
            format!("{} ms", v / 1e3)
        } else {
            format!("{v} µs")
        };
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
            left + pw,
            left - 6.0,
            y + 4.0
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency</text>"#,
        top + ph / 2.0,
        top + ph / 2.0
    );
    let _ = writeln!(
        s,
        r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for (i, (name, color, hist)) in curves.iter().enumerate() {
        let steps = 500;
        let mut points = String::new();
        for k in 0..=steps {
            let nines = SVG_NINES * k as f64 / steps as f64;
            let q = 1.0 - 10f64.powf(-nines);
            let v = us(hist.value_at_quantile(q));
            let _ = write!(points, "{:.1},{:.1} ", x_of(nines), y_of(v));
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.trim_end()
        );
        let ly = top + 20.0 + 36.0 * i as f64;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{:.1}">{name}</text><text x="{}" y="{:.1}" font-size="10">p99 {:.0} µs, max {:.0} µs</text>"#,
            lx + 25.0,
            lx + 32.0,
            ly + 4.0,
            lx,
            ly + 18.0,
            Report::percentile_us(hist, 99.0),
            us(hist.max())
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::loadgen::report::new_histogram;

    #[test]
    fn svg_has_one_curve_per_histogram() {
        let mut h = new_histogram();
        for v in 1..10_000u64 {
            h.record(v * 1000).unwrap();
        }
        let svg = latency_svg("t <&>", "s", &[("put", "#000", &h), ("e2e", "#f00", &h)]);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
