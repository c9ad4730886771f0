//! Audience-scoped service account tokens from the TokenRequest API.

use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount as KubeServiceAccount;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::Mutex;

use crate::CbtError;

/// How long a requested token lives: the API's minimum, as the token travels to another
/// service.
const LIFETIME: Duration = Duration::from_secs(600);
/// A token is asked for again once it is this old, well before it expires.
const RENEW_AFTER: Duration = Duration::from_secs(300);

/// A service account, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccount {
    /// Parses `NAMESPACE/NAME`.
    ///
    /// # Errors
    /// Not two non-empty parts.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self { namespace: namespace.into(), name: name.into() })
            }
            _ => Err(format!("{text:?} is not NAMESPACE/NAME")),
        }
    }
}

impl fmt::Display for ServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Tokens of one service account for one audience, renewed before they expire. The token is
/// a credential: it is never logged or shown in an error.
pub struct Tokens {
    source: Source,
    audience: String,
    current: Mutex<Option<(String, Instant)>>,
}

enum Source {
    /// Requested from the TokenRequest API, bound to a pod when one is named.
    Api { api: Box<Api<KubeServiceAccount>>, account: ServiceAccount, pod: Option<Pod> },
    /// Given once (a token file); never renewed.
    Fixed(String),
}

/// The pod a token is bound to: the token dies with the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pod {
    name: String,
    uid: Option<String>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let account = match &self.source {
            Source::Api { account, pod: None, .. } => account.to_string(),
            Source::Api { account, pod: Some(pod), .. } => format!("{account} (pod {})", pod.name),
            Source::Fixed(_) => "(a given token)".into(),
        };
        f.debug_struct("Tokens")
            .field("account", &account)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens of `account` scoped to `audience`, requested with `client`'s credentials
    /// (which need `create` on `serviceaccounts/token` for that account).
    #[must_use]
    pub fn new(client: kube::Client, account: ServiceAccount, audience: &str) -> Self {
        Self {
            source: Source::Api {
                api: Box::new(Api::namespaced(client, &account.namespace)),
                account,
                pod: None,
            },
            audience: audience.to_owned(),
            current: Mutex::new(None),
        }
    }

    /// Binds every token to the pod `name` (with `uid` when known) in the account's namespace:
    /// the API server stops accepting a token once its pod is gone, so a token that leaked
    /// from the service outlives nothing. Without effect on [`Self::fixed`] tokens.
    #[must_use]
    pub fn bound_to_pod(mut self, name: &str, uid: Option<&str>) -> Self {
        if let Source::Api { pod, .. } = &mut self.source {
            *pod = Some(Pod { name: name.to_owned(), uid: uid.map(str::to_owned) });
        }
        self
    }

    /// One given token (read from a file, say), used as it is for `audience`.
    #[must_use]
    pub fn fixed(token: String, audience: &str) -> Self {
        Self {
            source: Source::Fixed(token),
            audience: audience.to_owned(),
            current: Mutex::new(None),
        }
    }

    /// The audience the tokens are scoped to.
    #[must_use]
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// A valid token: the last one while it is young, else a new one.
    ///
    /// # Errors
    /// [`CbtError::Token`]: the API refused (no right to create tokens of the account, or no
    /// such account).
    pub async fn token(&self) -> Result<String, CbtError> {
        let (api, account, pod) = match &self.source {
            Source::Fixed(token) => return Ok(token.clone()),
            Source::Api { api, account, pod } => (api, account, pod),
        };
        let mut current = self.current.lock().await;
        if let Some((token, at)) = current.as_ref()
            && at.elapsed() < RENEW_AFTER
        {
            return Ok(token.clone());
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![self.audience.clone()],
                expiration_seconds: Some(i64::try_from(LIFETIME.as_secs()).unwrap_or(600)),
                bound_object_ref: pod.as_ref().map(|pod| BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name.clone()),
                    uid: pod.uid.clone(),
                }),
            },
            ..TokenRequest::default()
        };
        let issued = Instant::now();
        let answer: TokenRequest = api
            .create_subresource("token", &account.name, &PostParams::default(), &request)
            .await
            .map_err(|e| refused(account, &self.audience, e.to_string()))?;
        let token = answer.status.map(|s| s.token).unwrap_or_default();
        if token.is_empty() {
            return Err(refused(account, &self.audience, "the answer holds no token".into()));
        }
        *current = Some((token.clone(), issued));
        Ok(token)
    }

    /// Forgets the current token, so the next call asks for a new one (after the service
    /// refused it).
    pub async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

fn refused(account: &ServiceAccount, audience: &str, reason: String) -> CbtError {
    CbtError::Token {
        namespace: account.namespace.clone(),
        name: account.name.clone(),
        audience: audience.to_owned(),
        reason,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_is_namespace_slash_name() {
        let sa = ServiceAccount::parse("velero/ferry-agent").unwrap();
        assert_eq!((sa.namespace.as_str(), sa.name.as_str()), ("velero", "ferry-agent"));
        assert_eq!(sa.to_string(), "velero/ferry-agent");
        for bad in ["", "velero", "/x", "x/", "a/b/c"] {
            assert!(ServiceAccount::parse(bad).is_err(), "{bad}");
        }
    }
}
