//! One retry schedule for everything that waits before trying again: doubling from a base
//! delay up to a cap, each delay with up to a quarter more at random so many retries do not
//! line up.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            failures: 0,
        }
    }

    /// The delay after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.delay_for(self.failures);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// The delay after `failures` earlier failures, without counting one more.
    pub fn delay_for(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.min(20);
        jitter(self.base.saturating_mul(factor).min(self.cap))
    }

    /// After a success: the next failure waits the base delay again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// `delay` plus up to 25% more.
pub fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    delay + delay.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let within = |d: Duration, base: u64| {
            d >= Duration::from_secs(base) && d <= Duration::from_secs(base).mul_f64(1.25)
        };
        assert!(within(b.next_delay(), 1));
        assert!(within(b.next_delay(), 2));
        assert!(within(b.next_delay(), 4));
        for _ in 0..40 {
            b.next_delay();
        }
        assert!(within(b.next_delay(), 60), "capped, and no overflow");
        b.reset();
        assert!(within(b.next_delay(), 1));
    }
}
