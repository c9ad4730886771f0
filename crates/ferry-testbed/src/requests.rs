//! A kube client that records every request it sends, so a test can count what a component
//! asked of the real API server (the LISTs a cache saves, say) without reading the server's
//! process-wide metrics, which every other client of a shared control plane moves too.

use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use http::Method;

/// One request: its method, path and query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// `GET`, `POST`, ...
    pub method: Method,
    /// `/api/v1/nodes`, `/apis/velero.io/v2alpha1/namespaces/velero/datauploads/du-1`, ...
    pub path: String,
    /// The query string without its `?` (empty when there is none).
    pub query: String,
}

impl Sent {
    /// Whether this is a LIST of `resource` (plural, lower case: `nodes`): a GET of the
    /// collection that is not a watch.
    #[must_use]
    pub fn is_list_of(&self, resource: &str) -> bool {
        let watch = self.query.split('&').any(|p| p == "watch=true" || p == "watch=1");
        self.method == Method::GET && !watch && self.path.rsplit('/').next() == Some(resource)
    }
}

/// The requests a [`recording_client`] sent, in order.
#[derive(Debug, Clone, Default)]
pub struct Requests(Arc<Mutex<Vec<Sent>>>);

impl Requests {
    /// Every request so far.
    #[must_use]
    pub fn all(&self) -> Vec<Sent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many LISTs of `resource` were sent (see [`Sent::is_list_of`]).
    #[must_use]
    pub fn lists_of(&self, resource: &str) -> usize {
        self.all().iter().filter(|s| s.is_list_of(resource)).count()
    }

    fn push(&self, sent: Sent) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(sent);
    }
}

/// A client for `config` that records each request in the returned [`Requests`] before
/// sending it. Recorded once per call: the layer sits outside kube's retry layer, so a request
/// retried after a 429 or 503 counts once (counts are of what the component asked for).
///
/// # Errors
/// The client cannot be built from `config`.
pub fn recording_client(config: kube::Config) -> anyhow::Result<(kube::Client, Requests)> {
    crate::install_crypto_provider();
    let requests = Requests::default();
    let log = requests.clone();
    let record =
        tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
            log.push(Sent {
                method: req.method().clone(),
                path: req.uri().path().to_owned(),
                query: req.uri().query().unwrap_or_default().to_owned(),
            });
            req
        });
    let client = kube::client::ClientBuilder::try_from(config)
        .context("building a kube client")?
        .with_layer(&record)
        .build();
    Ok((client, requests))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(method: Method, path: &str, query: &str) -> Sent {
        Sent { method, path: path.into(), query: query.into() }
    }

    #[test]
    fn lists_are_told_from_gets_watches_and_writes() {
        assert!(sent(Method::GET, "/api/v1/nodes", "resourceVersion=0").is_list_of("nodes"));
        assert!(sent(Method::GET, "/api/v1/nodes", "").is_list_of("nodes"));
        assert!(
            !sent(Method::GET, "/api/v1/nodes", "watch=true&resourceVersion=5").is_list_of("nodes")
        );
        assert!(!sent(Method::GET, "/api/v1/nodes/n1", "").is_list_of("nodes"));
        assert!(!sent(Method::POST, "/api/v1/namespaces/a/pods", "").is_list_of("pods"));
        assert!(!sent(Method::GET, "/api/v1/namespaces/a/pods", "").is_list_of("nodes"));
    }
}
