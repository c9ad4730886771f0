//! Bounded, cancellable polling of the API server.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ExposeError;

/// The first pause between looks: most waits (a snapshot becoming ready, a pod starting) end
/// within a second, and each pause at the end of one is latency added to the data movement.
const FIRST_POLL: Duration = Duration::from_millis(25);
/// The longest pause between looks: pauses double up to this, so a long wait costs the API
/// server no more than one request per wait every 300 ms.
const POLL: Duration = Duration::from_millis(300);

/// What one look found.
pub(crate) enum Look<T> {
    /// Done, with the result.
    Ready(T),
    /// Not yet; the text says what was seen (used in the timeout message).
    NotYet(String),
}

/// Calls `look` until it is ready, fails, `timeout` passes or `cancel` fires.
pub(crate) async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    cancel: &CancellationToken,
    mut look: F,
) -> Result<T, ExposeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Look<T>, ExposeError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = FIRST_POLL;
    loop {
        if cancel.is_cancelled() {
            return Err(ExposeError::Canceled);
        }
        let seen = match look().await? {
            Look::Ready(v) => return Ok(v),
            Look::NotYet(seen) => seen,
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let last = if seen.is_empty() { seen } else { format!("; last seen: {seen}") };
            return Err(ExposeError::Timeout { what: what.to_owned(), after: timeout, last });
        }
        tokio::select! {
            () = cancel.cancelled() => return Err(ExposeError::Canceled),
            () = tokio::time::sleep(pause.min(deadline - now)) => {}
        }
        pause = (pause * 2).min(POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Looks `ready_at` times before the wait ends; returns the virtual time it took.
    async fn wait_for(ready_at: u32) -> Duration {
        let looks = AtomicU32::new(0);
        let start = tokio::time::Instant::now();
        let found =
            until("the test", Duration::from_secs(60), &CancellationToken::new(), || {
                let n = looks.fetch_add(1, Ordering::Relaxed) + 1;
                async move {
                    Ok(if n >= ready_at { Look::Ready(n) } else { Look::NotYet(String::new()) })
                }
            })
            .await;
        assert!(matches!(found, Ok(n) if n == ready_at));
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn pauses_start_short_and_double_up_to_the_poll_interval() {
        assert_eq!(wait_for(1).await, Duration::ZERO);
        assert_eq!(wait_for(2).await, Duration::from_millis(25));
        assert_eq!(wait_for(4).await, Duration::from_millis(25 + 50 + 100));
        // 25 + 50 + 100 + 200, then 300 ms per look.
        assert_eq!(wait_for(8).await, Duration::from_millis(375 + 3 * 300));
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeout_bounds_the_wait_and_says_what_was_seen() {
        let r: Result<(), _> =
            until("pod x to run", Duration::from_secs(2), &CancellationToken::new(), || async {
                Ok(Look::NotYet("Pending".to_owned()))
            })
            .await;
        match r {
            Err(ExposeError::Timeout { what, last, .. }) => {
                assert_eq!(what, "pod x to run");
                assert!(last.contains("Pending"), "{last}");
            }
            other => panic!("expected a timeout, got {:?}", other.err()),
        }
    }
}
