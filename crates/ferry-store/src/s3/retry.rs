//! The backend's own bounded retries, for the two failures the SDK's retry strategy cannot
//! see: a response body that breaks off after the SDK handed the response over, and S3's
//! `409 ConditionalRequestConflict` on racing conditional writes (which S3 asks callers to
//! retry). Everything else is retried inside the SDK (standard mode, see `config`).

use std::time::Duration;

use rand::Rng;

use super::S3Options;

/// Attempt counter with exponential backoff and full jitter.
#[derive(Debug)]
pub(super) struct Backoff {
    attempt: u32,
    max_attempts: u32,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    pub(super) fn new(options: &S3Options) -> Self {
        Self {
            attempt: 1,
            max_attempts: options.max_attempts,
            initial: options.initial_backoff,
            max: options.max_backoff,
        }
    }

    /// Waits before the next attempt; `false` (without waiting) once attempts are used up.
    pub(super) async fn pause(&mut self) -> bool {
        if self.attempt >= self.max_attempts {
            return false;
        }
        let delay = self.delay_bound();
        self.attempt += 1;
        let jittered = delay.mul_f64(rand::rng().random::<f64>());
        tokio::time::sleep(jittered).await;
        true
    }

    /// Upper bound of the next delay: `initial * 2^(attempt-1)`, capped at `max`.
    fn delay_bound(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn attempts_are_bounded_and_delays_grow_to_the_cap() {
        let options = S3Options {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(3),
            ..S3Options::default()
        };
        let mut backoff = Backoff::new(&options);
        let mut bounds = Vec::new();
        loop {
            bounds.push(backoff.delay_bound());
            if !backoff.pause().await {
                break;
            }
        }
        let ms = |n| Duration::from_millis(n);
        assert_eq!(bounds, [ms(1), ms(2), ms(3), ms(3)]);
    }
}
