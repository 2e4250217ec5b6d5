//! Percentiles over measured durations, and the report table.

use std::time::Duration;

use serde::Serialize;

use crate::progress::Progress;

/// One measured case.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// What was measured.
    pub case: String,
    /// How many operations.
    pub n: usize,
    /// Operations per second over the whole run.
    pub ops_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 95th percentile, microseconds.
    pub p95_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Slowest, microseconds.
    pub max_us: f64,
    /// A figure that is not a latency distribution (a CPU cost, a share, a memory size): the
    /// row has no latencies and is reported with its unit, never as a rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figure: Option<Figure>,
}

/// One figure and its unit.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub value: f64,
    pub unit: &'static str,
}

impl Summary {
    /// Summarizes per-operation latencies; `total` is the wall time of the whole run.
    pub fn new(case: impl Into<String>, mut samples: Vec<Duration>, total: Duration) -> Self {
        samples.sort_unstable();
        let n = samples.len();
        let pct = |p: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            samples[idx].as_secs_f64() * 1e6
        };
        Self {
            case: case.into(),
            n,
            ops_per_sec: if total.is_zero() {
                0.0
            } else {
                n as f64 / total.as_secs_f64()
            },
            p50_us: pct(0.50),
            p95_us: pct(0.95),
            p99_us: pct(0.99),
            max_us: pct(1.0),
            figure: None,
        }
    }

    /// A row that reports one figure in `unit` instead of latencies.
    pub fn figure(case: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self {
            figure: Some(Figure { value, unit }),
            ..Self::new(case, Vec::new(), Duration::ZERO)
        }
    }
}

/// Times `n` runs of `op`, one sample each.
pub fn measure(
    case: impl Into<String>,
    n: usize,
    mut op: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Summary> {
    let case = case.into();
    let bar = Progress::bar(n as u64, case.clone());
    // Drawn a hundred times per case at most, so it costs the timed operations nothing.
    let step = (n / 100).max(1);
    let mut samples = Vec::with_capacity(n);
    let start = std::time::Instant::now();
    for i in 0..n {
        let t = std::time::Instant::now();
        op(i)?;
        samples.push(t.elapsed());
        if i % step == 0 {
            bar.set(i as u64);
        }
    }
    Ok(Summary::new(case, samples, start.elapsed()))
}

/// A fixed-width table of the measured cases, then the figures, each with its unit.
pub fn table(rows: &[Summary]) -> String {
    let mut out = format!(
        "{:<44} {:>7} {:>11} {:>10} {:>10} {:>10} {:>10}\n",
        "case", "n", "ops/s", "p50 µs", "p95 µs", "p99 µs", "max µs"
    );
    for r in rows.iter().filter(|r| r.figure.is_none()) {
        out += &format!(
            "{:<44} {:>7} {:>11.0} {:>10.1} {:>10.1} {:>10.1} {:>10.1}\n",
            r.case, r.n, r.ops_per_sec, r.p50_us, r.p95_us, r.p99_us, r.max_us
        );
    }
    let figures: Vec<_> = rows
        .iter()
        .filter_map(|r| Some((&r.case, r.figure.as_ref()?)))
        .collect();
    if !figures.is_empty() {
        out += &format!("\n{:<66} {:>11}  unit\n", "figure", "value");
        for (case, f) in figures {
            out += &format!("{case:<66} {:>11.1}  {}\n", f.value, f.unit);
        }
    }
    out.trim_end().to_owned()
}

/// The CPU model and core count, for the report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{cpu}, {cores} cores")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_right_sample() {
        let samples = (1..=100).map(Duration::from_micros).collect();
        let s = Summary::new("x", samples, Duration::from_secs(1));
        assert_eq!(
            (s.p50_us, s.p95_us, s.p99_us, s.max_us),
            (50.0, 95.0, 99.0, 100.0)
        );
        assert_eq!(s.ops_per_sec, 100.0);
    }

    #[test]
    fn figures_are_printed_with_their_unit_below_the_rates() {
        let rows = [
            Summary::new(
                "sends",
                vec![Duration::from_micros(5)],
                Duration::from_secs(1),
            ),
            Summary::figure("relay CPU per message", 26.5, "µs"),
        ];
        let text = table(&rows);
        let (rates, figures) = text.split_once("\n\n").expect("a figures block");
        assert!(
            rates.contains("sends") && !rates.contains("relay CPU"),
            "{text}"
        );
        let line = figures.lines().nth(1).unwrap();
        assert!(line.starts_with("relay CPU per message"), "{text}");
        assert!(line.ends_with("26.5  µs"), "{text}");
    }
}
