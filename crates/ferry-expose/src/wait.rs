//! Bounded, cancellable polling of the API server.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ExposeError;

/// How often a wait looks again.
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
            () = tokio::time::sleep(POLL.min(deadline - now)) => {}
        }
    }
}
