//! Latency statistics, printed like onnxruntime's perf_test / OpenVINO's
//! benchmark_app.

use std::time::Duration;

/// Summary of a set of latencies.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyStats {
    pub count: usize,
    pub total: Duration,
    pub mean: Duration,
    pub min: Duration,
    pub max: Duration,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    /// Inferences per second over the measured wall time.
    pub throughput: f64,
}

impl LatencyStats {
    /// Statistics of `samples` (per-inference latencies) measured over
    /// `wall` (which for pipelined runs is less than their sum).
    pub fn new(samples: &[Duration], wall: Duration) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort();
        let total: Duration = s.iter().sum();
        // Nearest-rank percentile.
        let pct = |p: f64| s[((p / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Some(Self {
            count: s.len(),
            total,
            mean: total / s.len() as u32,
            min: s[0],
            max: s[s.len() - 1],
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            throughput: s.len() as f64 / wall.as_secs_f64().max(f64::MIN_POSITIVE),
        })
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut j = self.durations_json();
        j["throughput_per_s"] = self.throughput.into();
        j
    }

    /// The count and the duration statistics alone (for times that are
    /// parts of other latencies, where a throughput means nothing).
    pub fn durations_json(&self) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        serde_json::json!({
            "count": self.count,
            "mean_ms": ms(self.mean),
            "min_ms": ms(self.min),
            "max_ms": ms(self.max),
            "p50_ms": ms(self.p50),
            "p90_ms": ms(self.p90),
            "p99_ms": ms(self.p99),
        })
    }
}

impl std::fmt::Display for LatencyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(f, "Count:      {} iterations", self.count)?;
        writeln!(f, "Latency:")?;
        writeln!(f, "    Mean:   {:.3} ms", ms(self.mean))?;
        writeln!(f, "    Min:    {:.3} ms", ms(self.min))?;
        writeln!(f, "    Median: {:.3} ms (p50)", ms(self.p50))?;
        writeln!(f, "    p90:    {:.3} ms", ms(self.p90))?;
        writeln!(f, "    p99:    {:.3} ms", ms(self.p99))?;
        writeln!(f, "    Max:    {:.3} ms", ms(self.max))?;
        write!(f, "Throughput: {:.2} inferences/s", self.throughput)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_throughput() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = LatencyStats::new(&samples, Duration::from_secs(5)).unwrap();
        assert_eq!(s.p50, Duration::from_millis(50));
        assert_eq!(s.p90, Duration::from_millis(90));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(s.max, Duration::from_millis(100));
        assert_eq!(s.mean, Duration::from_micros(50_500));
        assert!((s.throughput - 20.0).abs() < 1e-9);
        assert!(LatencyStats::new(&[], Duration::ZERO).is_none());
    }
}
