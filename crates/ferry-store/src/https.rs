//! The one HTTPS client every AWS SDK client of Ferry's uses (S3, KMS, and the credential
//! providers behind them: STS, SSO, instance metadata).
//!
//! The SDKs' own TLS features would bring a second TLS stack (their legacy hyper 0.14 client
//! with rustls 0.21, and aws-lc for the newer one); Ferry builds without them and hands each
//! loader this client instead: hyper 1 and rustls on `ring`, the crypto provider the rest of
//! Ferry already uses. A loader without a client would fail every request at run time, so both
//! [`crate::S3Store`] and [`crate::AwsKms`] set it before loading; a caller building an SDK
//! client of its own (a test's admin client) takes [`aws_http_client`].

use aws_sdk_s3::config::SharedHttpClient;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext};
use aws_smithy_http_client::{Builder, ConnectorBuilder};

/// The HTTP(S) client every AWS SDK client of Ferry's gets, trusting the platform's roots
/// (S3 and KMS here, and SDK clients built elsewhere, which have no client of their own).
#[must_use]
pub fn aws_http_client() -> SharedHttpClient {
    client(None)
}

/// An HTTPS (and plain HTTP) client trusting the platform's roots, or `tls`'s trust store.
/// As the SDKs' own default client does: the SDK's connect and read timeouts and its sleep
/// for each connection, and the proxy the environment names (`HTTPS_PROXY`, `HTTP_PROXY`,
/// `ALL_PROXY`, `NO_PROXY`, lower case too), so a node that reaches S3, KMS or STS only
/// through a proxy still does.
pub(crate) fn client(tls: Option<TlsContext>) -> SharedHttpClient {
    Builder::new().build_with_connector_fn(move |settings, components| {
        let mut connector =
            ConnectorBuilder::default().tls_provider(Provider::Rustls(CryptoMode::Ring));
        if let Some(tls) = &tls {
            connector.set_tls_context(tls.clone());
        }
        connector.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            connector.set_sleep_impl(components.sleep_impl());
        }
        connector.set_proxy_config(Some(ProxyConfig::from_env()));
        connector.build()
    })
}
