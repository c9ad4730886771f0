//! Just enough of moto's IAM and auth switches to test credential failures for real.
//!
//! moto accepts any credentials until authentication is switched on (`/moto-api/reset-auth`
//! with a count of 0); from then on it checks SigV4 signatures against the access keys its
//! IAM holds and IAM policies against each action, as AWS does.

use std::net::SocketAddr;

use super::http;

/// An IAM access key created in moto.
#[derive(Debug)]
pub struct AccessKey {
    pub id: String,
    pub secret: String,
}

/// Creates an IAM user with an access key and no permissions. Must run before
/// [`enable_auth`].
pub fn create_user_without_policy(addr: SocketAddr, user: &str) -> AccessKey {
    iam_call(addr, &format!("Action=CreateUser&UserName={user}&Version=2010-05-08"));
    let body =
        iam_call(addr, &format!("Action=CreateAccessKey&UserName={user}&Version=2010-05-08"));
    AccessKey { id: xml_field(&body, "AccessKeyId"), secret: xml_field(&body, "SecretAccessKey") }
}

/// Switches authentication on for every later request.
pub fn enable_auth(addr: SocketAddr) {
    let (status, body) = http::request(addr, "POST", "/moto-api/reset-auth", &[], b"0")
        .unwrap_or_else(|e| panic!("reset-auth: {e}"));
    assert_eq!(status, 200, "reset-auth answered {body}");
}

fn iam_call(addr: SocketAddr, form: &str) -> String {
    // moto routes by the service named in the credential scope; the signature itself is not
    // checked while authentication is off.
    let auth = "AWS4-HMAC-SHA256 Credential=setup/20250101/us-east-1/iam/aws4_request, \
                SignedHeaders=host, Signature=0";
    let headers = [("Content-Type", "application/x-www-form-urlencoded"), ("Authorization", auth)];
    let (status, body) = http::request(addr, "POST", "/", &headers, form.as_bytes())
        .unwrap_or_else(|e| panic!("IAM call: {e}"));
    assert_eq!(status, 200, "IAM {form} answered {body}");
    body
}

fn xml_field(body: &str, name: &str) -> String {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    body.split_once(&open)
        .and_then(|(_, rest)| rest.split_once(&close))
        .map(|(value, _)| value.to_owned())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}
