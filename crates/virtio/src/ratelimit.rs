//! Token-bucket rate limiting for a device: one bucket for bytes per
//! second, one for operations per second, either optional.
//!
//! A bucket holds at most `burst` tokens and refills continuously at
//! `rate` per second. An operation may start while a bucket is not empty
//! and then takes all it needs, possibly going into debt: so a request
//! larger than the burst is never stuck, and over any long interval the
//! rate holds exactly. While a bucket is in debt, [`RateLimiter::wait`]
//! says how long until it is positive again.

use std::time::{Duration, Instant};

/// The limits of one device; `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub bytes_per_sec: Option<u64>,
    pub ops_per_sec: Option<u64>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
}

impl Bucket {
    fn new(rate: u64) -> Self {
        let rate = rate as f64;
        // A tenth of a second's worth: short bursts, tight averages.
        let burst = (rate / 10.0).max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
        }
    }

    fn refill(&mut self, secs: f64) {
        self.tokens = (self.tokens + secs * self.rate).min(self.burst);
    }

    fn wait(&self) -> Duration {
        if self.tokens > 0.0 {
            Duration::ZERO
        } else {
            // Until the bucket holds at least one token again.
            Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
        }
    }
}

#[derive(Debug)]
pub struct RateLimiter {
    bytes: Option<Bucket>,
    ops: Option<Bucket>,
    limits: Limits,
    last: Instant,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

impl RateLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            bytes: limits.bytes_per_sec.filter(|r| *r > 0).map(Bucket::new),
            ops: limits.ops_per_sec.filter(|r| *r > 0).map(Bucket::new),
            limits,
            last: Instant::now(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// No limit is set: nothing needs the clock.
    pub fn unlimited(&self) -> bool {
        self.bytes.is_none() && self.ops.is_none()
    }

    /// Replaces the limits (at run time); buckets start full.
    pub fn set_limits(&mut self, limits: Limits) {
        *self = Self::new(limits);
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        for b in [&mut self.bytes, &mut self.ops].into_iter().flatten() {
            b.refill(secs);
        }
    }

    /// How long until an operation may start (zero: now).
    pub fn wait(&mut self, now: Instant) -> Duration {
        self.refill(now);
        [&self.bytes, &self.ops]
            .into_iter()
            .flatten()
            .map(Bucket::wait)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Charges an operation of `bytes` that has already happened (it may
    /// put the buckets in debt).
    pub fn charge(&mut self, bytes: u64, now: Instant) {
        self.refill(now);
        if let Some(b) = &mut self.bytes {
            b.tokens -= bytes as f64;
        }
        if let Some(b) = &mut self.ops {
            b.tokens -= 1.0;
        }
    }

    /// Starts an operation of `bytes` if the buckets allow it now; else
    /// returns how long to wait before asking again.
    pub fn consume(&mut self, bytes: u64, now: Instant) -> Result<(), Duration> {
        let w = self.wait(now);
        if !w.is_zero() {
            return Err(w);
        }
        if let Some(b) = &mut self.bytes {
            b.tokens -= bytes as f64;
        }
        if let Some(b) = &mut self.ops {
            b.tokens -= 1.0;
        }
        Ok(())
    }
}

/// A device's limiter shared with the API: changing the limits wakes the
/// device (through [`Shared::changed`]) so a request held back under the
/// old limits is looked at again at once.
pub struct Shared {
    limiter: std::sync::Mutex<RateLimiter>,
    pub changed: vmm_sys_util::eventfd::EventFd,
}

impl Shared {
    pub fn new(limits: Limits) -> std::io::Result<Self> {
        Ok(Self {
            limiter: std::sync::Mutex::new(RateLimiter::new(limits)),
            changed: vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, RateLimiter> {
        self.limiter.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn limits(&self) -> Limits {
        self.lock().limits()
    }

    pub fn set_limits(&self, limits: Limits) {
        self.lock().set_limits(limits);
        let _ = self.changed.write(1);
    }

    // The per-packet and per-request entry points read the clock only when
    // a limit is set: a clock read can be a system call (on hosts whose
    // clocksource is not the TSC, such as the nested test host's HPET), and
    // these run once per frame.

    /// [`RateLimiter::consume`] now.
    pub fn consume(&self, bytes: u64) -> Result<(), Duration> {
        let mut l = self.lock();
        if l.unlimited() {
            return Ok(());
        }
        l.consume(bytes, Instant::now())
    }

    /// [`RateLimiter::wait`] now.
    pub fn wait(&self) -> Duration {
        let mut l = self.lock();
        if l.unlimited() {
            return Duration::ZERO;
        }
        l.wait(Instant::now())
    }

    /// [`RateLimiter::charge`] now.
    pub fn charge(&self, bytes: u64) {
        let mut l = self.lock();
        if !l.unlimited() {
            l.charge(bytes, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs operations of `size` bytes as fast as the limiter allows over
    /// `secs` of simulated time; returns (bytes, ops) done.
    fn simulate(l: &mut RateLimiter, size: u64, secs: f64) -> (u64, u64) {
        let start = Instant::now();
        l.last = start;
        let mut now = start;
        let end = start + Duration::from_secs_f64(secs);
        let (mut bytes, mut ops) = (0, 0);
        while now < end {
            match l.consume(size, now) {
                Ok(()) => {
                    bytes += size;
                    ops += 1;
                }
                Err(w) => now += w,
            }
        }
        (bytes, ops)
    }

    #[test]
    fn charged_traffic_counts_against_the_limit() {
        let mut l = RateLimiter::new(Limits {
            bytes_per_sec: Some(1000),
            ops_per_sec: None,
        });
        let now = Instant::now();
        assert!(l.wait(now).is_zero());
        l.charge(1100, now);
        // 100 bytes burst, 1100 charged: a second of debt.
        let w = l.wait(now);
        assert!(
            w > Duration::from_millis(900) && w <= Duration::from_millis(1010),
            "{w:?}"
        );
        assert!(l.consume(1, now).is_err());
    }

    #[test]
    fn unlimited_never_waits() {
        let mut l = RateLimiter::default();
        for _ in 0..1000 {
            assert!(l.consume(1 << 30, Instant::now()).is_ok());
        }
    }

    #[test]
    fn bandwidth_holds_within_two_percent() {
        let mut l = RateLimiter::new(Limits {
            bytes_per_sec: Some(10 << 20),
            ops_per_sec: None,
        });
        let (bytes, _) = simulate(&mut l, 128 << 10, 10.0);
        // The initial burst (a tenth of a second) and the last request's
        // debt are the whole error: 1% to 2% over 10 s.
        let rate = bytes as f64 / 10.0;
        assert!((rate / f64::from(10 << 20) - 1.0).abs() < 0.02, "{rate}");
    }

    #[test]
    fn iops_hold_and_large_requests_are_not_stuck() {
        let mut l = RateLimiter::new(Limits {
            bytes_per_sec: None,
            ops_per_sec: Some(500),
        });
        let (_, ops) = simulate(&mut l, 4096, 10.0);
        assert!((ops as f64 / 5000.0 - 1.0).abs() < 0.01, "{ops}");
        // A request bigger than the burst goes through, then waits.
        let mut l = RateLimiter::new(Limits {
            bytes_per_sec: Some(1000),
            ops_per_sec: None,
        });
        let now = Instant::now();
        assert!(l.consume(1 << 20, now).is_ok());
        let w = l.consume(1, now).unwrap_err();
        assert!(w > Duration::from_secs(1000), "{w:?}");
    }

    #[test]
    fn zero_means_unlimited_and_limits_can_change() {
        let mut l = RateLimiter::new(Limits {
            bytes_per_sec: Some(0),
            ops_per_sec: Some(1),
        });
        let now = Instant::now();
        assert!(l.consume(1 << 40, now).is_ok());
        assert!(l.consume(1, now).is_err());
        l.set_limits(Limits::default());
        assert!(l.consume(1, now).is_ok());
    }

    #[test]
    fn shared_limiter_only_counts_when_limited() {
        let s = Shared::new(Limits::default()).unwrap();
        assert!(s.lock().unlimited());
        for _ in 0..1000 {
            assert!(s.consume(1 << 20).is_ok());
            s.charge(1 << 20);
        }
        assert!(s.wait().is_zero());
        s.set_limits(Limits {
            bytes_per_sec: Some(1000),
            ops_per_sec: None,
        });
        assert!(!s.lock().unlimited());
        assert!(s.consume(1000).is_ok(), "the bucket starts full");
        assert!(s.consume(1000).is_err(), "then it is empty");
        assert!(!s.wait().is_zero());
    }
}
