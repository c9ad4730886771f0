//! TCP relays on loopback between the store and moto that misbehave the way networks and
//! some S3 servers do. They rely on the SDK sending one request at a time per connection
//! (no pipelining), so a read from the client starts with a request line.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

/// Accepts connections on a loopback port; `serve` gets each with a new connection to
/// `upstream`.
async fn relay<F, Fut>(upstream: SocketAddr, serve: F) -> SocketAddr
where
    F: Fn(TcpStream, TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let addr = listener.local_addr().expect("relay address");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            tokio::spawn(serve(client, server));
        }
    });
    addr
}

/// What [`intercept_answer`] does with the answer it intercepts.
#[derive(Debug, Clone)]
pub enum OnAnswer {
    /// Reads it and closes the client's connection, as a network that drops a response does.
    Drop,
    /// Holds it until notified, then passes it on: a slow answer, for a client to give up on.
    Hold(Arc<tokio::sync::Notify>),
}

/// Forwards everything, except the answer to the first request starting with
/// `request_line`, which it drops or holds. Returns its address and the number of answers
/// intercepted so far (counted when the answer arrives from upstream).
pub async fn intercept_answer(
    upstream: SocketAddr,
    request_line: String,
    action: OnAnswer,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let intercepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&intercepted);
    let addr = relay(upstream, move |client, server| {
        let (seen, counter, line) =
            (Arc::clone(&counter), Arc::clone(&counter), request_line.clone());
        let action = action.clone();
        async move {
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            let intercept = Arc::new(AtomicBool::new(false));
            let armed = Arc::clone(&intercept);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = client_rx.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if seen.load(Ordering::SeqCst) == 0 && buf[..n].starts_with(line.as_bytes()) {
                        armed.store(true, Ordering::SeqCst);
                    }
                    if server_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = server_rx.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if intercept.swap(false, Ordering::SeqCst) {
                    counter.fetch_add(1, Ordering::SeqCst);
                    match &action {
                        OnAnswer::Drop => break, // drops client_tx: the client sees it close
                        OnAnswer::Hold(release) => release.notified().await,
                    }
                }
                if client_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    })
    .await;
    (addr, intercepted)
}

/// Removes `If-None-Match` headers from requests: an S3 server that ignores conditional
/// writes, as some older compatible servers do.
pub async fn condition_stripping(upstream: SocketAddr) -> SocketAddr {
    relay(upstream, |client, server| async move {
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut server_rx, mut server_tx) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        });
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = client_rx.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]);
            let kept: Vec<u8> = if text.to_ascii_lowercase().contains("if-none-match:") {
                let lines = text.split_inclusive("\r\n");
                let kept = lines.filter(|l| !l.to_ascii_lowercase().starts_with("if-none-match:"));
                kept.collect::<String>().into_bytes()
            } else {
                buf[..n].to_vec()
            };
            if server_tx.write_all(&kept).await.is_err() {
                break;
            }
        }
    })
    .await
}

/// Forwards everything; counts the bytes that came back from upstream and were passed on.
/// A client that stops reading stops the count (the relay then waits to write, and reads
/// nothing more from upstream).
pub async fn counting(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let relayed = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&relayed);
    let addr = relay(upstream, move |client, server| {
        let counter = Arc::clone(&counter);
        async move {
            let (mut client_rx, mut client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
            });
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = server_rx.read(&mut buf).await {
                if n == 0 || client_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                counter.fetch_add(n, Ordering::SeqCst);
            }
        }
    })
    .await;
    (addr, relayed)
}

/// What S3 answers a conditional write that raced another one.
const CONFLICT: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>\
    <Code>ConditionalRequestConflict</Code><Message>A conflicting conditional operation is \
    currently in progress against this resource. Please try again.</Message>\
    <RequestId>ferry-relay</RequestId></Error>";

/// What [`conflict_injecting`] saw and did.
#[derive(Debug, Default)]
pub struct Injections {
    /// The request line of every request seen (reads that start with a method; the rest are
    /// bodies).
    pub requests: std::sync::Mutex<Vec<String>>,
    /// Requests answered with 409 (after reading them whole).
    pub answered: AtomicUsize,
    armed: AtomicBool,
}

impl Injections {
    /// Requests seen whose line starts with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        let requests = self.requests.lock().map(|r| r.clone()).unwrap_or_default();
        requests.iter().filter(|r| r.starts_with(prefix)).count()
    }
}

/// Answers the first request starting with `request_line` itself, with S3's
/// `409 ConditionalRequestConflict`, without passing it on, and closes that connection;
/// forwards everything else.
pub async fn conflict_injecting(
    upstream: SocketAddr,
    request_line: String,
) -> (SocketAddr, Arc<Injections>) {
    let log = Arc::new(Injections::default());
    let shared = Arc::clone(&log);
    let addr = relay(upstream, move |client, server| {
        let (log, line) = (Arc::clone(&shared), request_line.clone());
        async move {
            let (mut client_rx, client_tx) = client.into_split();
            let (mut server_rx, mut server_tx) = server.into_split();
            let client_tx = Arc::new(tokio::sync::Mutex::new(client_tx));
            let answers = Arc::clone(&client_tx);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = server_rx.read(&mut buf).await {
                    if n == 0 || answers.lock().await.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = client_rx.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let request_line = buf[..n].split(|&b| b == b'\r').next().unwrap_or_default();
                let is_request = ["GET ", "PUT ", "POST ", "HEAD ", "DELETE "]
                    .iter()
                    .any(|m| request_line.starts_with(m.as_bytes()));
                if is_request && let Ok(mut requests) = log.requests.lock() {
                    requests.push(String::from_utf8_lossy(request_line).into_owned());
                }
                if buf[..n].starts_with(line.as_bytes()) && !log.armed.swap(true, Ordering::SeqCst)
                {
                    if read_request(&mut client_rx, buf[..n].to_vec()).await.is_some() {
                        answer_conflict(&mut *client_tx.lock().await).await;
                        log.answered.fetch_add(1, Ordering::SeqCst);
                    }
                    return; // closes both connections
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    })
    .await;
    (addr, log)
}

/// Reads the rest of a request whose first bytes are `head` (headers, then a body of
/// `Content-Length` bytes, unless the client waits for `100 Continue`). `None` if the
/// connection ends first or the request passes 1 MiB.
async fn read_request(rx: &mut tokio::net::tcp::OwnedReadHalf, mut head: Vec<u8>) -> Option<()> {
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..64 {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let headers = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            if headers.contains("expect: 100-continue") {
                return Some(());
            }
            let length = headers
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if head.len() >= end + 4 + length {
                return Some(());
            }
        }
        let n = rx.read(&mut buf).await.ok().filter(|&n| n > 0)?;
        head.extend_from_slice(&buf[..n]);
        if head.len() > 1 << 20 {
            return None;
        }
    }
    None
}

async fn answer_conflict(tx: &mut OwnedWriteHalf) {
    let answer = format!(
        "HTTP/1.1 409 Conflict\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
         x-amz-request-id: ferry-relay\r\nConnection: close\r\n\r\n{CONFLICT}",
        CONFLICT.len()
    );
    let _ = tx.write_all(answer.as_bytes()).await;
    let _ = tx.shutdown().await;
}
