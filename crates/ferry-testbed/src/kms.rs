//! AWS KMS for tests: moto's KMS (served beside its S3, [`crate::S3Server`]) driven directly,
//! and a local endpoint that answers like AWS where moto does not (moto 5 ignores a key's
//! state: `Decrypt` still answers after `DisableKey`).

use std::io::{Read, Write};

use anyhow::{Context, bail};

/// Calls moto's KMS action `target` (`CreateKey`, `DisableKey`, ...) with a JSON body and
/// returns the HTTP answer. moto does not check signatures; it only reads the service name
/// from the credential scope.
///
/// # Errors
/// moto is unreachable or did not answer 200.
pub fn moto_kms(endpoint: &str, target: &str, body: &str) -> anyhow::Result<String> {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).context("connecting to moto")?;
    write!(
        stream,
        "POST / HTTP/1.1\r\nHost: {addr}\r\nX-Amz-Target: TrentService.{target}\r\n\
         Content-Type: application/x-amz-json-1.1\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=ferry-test/20250101/us-east-1/kms/aws4_request, \
         SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .context("sending to moto")?;
    let mut response = String::new();
    stream.read_to_string(&mut response).context("reading moto's answer")?;
    if !response.starts_with("HTTP/1.1 200") {
        bail!("moto's KMS refused {target}: {response}");
    }
    Ok(response)
}

/// Creates a KMS key on moto at `endpoint`; returns its ARN.
///
/// # Errors
/// As [`moto_kms`], or the answer names no ARN.
pub fn create_kms_key(endpoint: &str) -> anyhow::Result<String> {
    let answer = moto_kms(endpoint, "CreateKey", "{}")?;
    let start = answer.find("\"Arn\": \"").map(|i| i + 8).context("no Arn in moto's answer")?;
    let len = answer[start..].find('"').context("no end to the Arn")?;
    Ok(answer[start..start + len].to_owned())
}

/// Starts, on the current tokio runtime, an endpoint that answers every request with HTTP
/// `status` and the AWS JSON error `code` / `message` (as AWS KMS sends errors: a key disabled
/// is 400 `DisabledException`); returns its URL. It serves until the runtime ends.
///
/// # Panics
/// No local port can be bound.
pub async fn kms_answering(status: u16, code: &str, message: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a local port");
    let addr = listener.local_addr().expect("its address");
    let body = format!(r#"{{"__type":"{code}","message":"{message}"}}"#);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // Headers, then as many body bytes as Content-Length says.
                loop {
                    let Ok(n) = socket.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                    let Some(end) = text.find("\r\n\r\n") else { continue };
                    let length = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
                let answer = format!(
                    "HTTP/1.1 {status} Error\r\nContent-Type: application/x-amz-json-1.1\r\n\
                     x-amzn-RequestId: test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

/// [`kms_answering`] as AWS answers for the disabled key `arn`.
pub async fn kms_disabled(arn: &str) -> String {
    kms_answering(400, "DisabledException", &format!("{arn} is disabled.")).await
}
