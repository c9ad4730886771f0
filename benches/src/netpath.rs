//! A network path in user space, for the remote benchmarks (`compare/run.sh --remote`).
//!
//! This machine's kernel has no `netem` qdisc (`tc qdisc add ... netem` answers "Specified
//! qdisc kind is unknown"), so the delay and the rate limit of a path to an object store come
//! from a relay on loopback: every connection a client opens to the relay is forwarded to the
//! S3 server.
//!
//! The model, each direction on its own:
//! - one [`Link`] shared by every connection, as one network path is: bytes leave one read at
//!   a time, at the link's rate, in the order they were read;
//! - they arrive half the round trip after they left;
//! - a new connection's first bytes to the server wait one round trip more (TCP's handshake);
//! - a sender gets ahead of its link by at most [`MAX_LEAD`]; beyond that it is not read, so the
//!   sockets' own flow control holds the client back, as a full send queue does.
//!
//! Nothing is lost or reordered and there is no slow start: a clean, long-lived path. So the
//! figures measured through it are what request counts, round trips and bandwidth cost, not what
//! a congested path adds.
//!
//! It also counts what crosses it ([`Counts`]): connections, bytes each way, and the HTTP/1.1
//! requests clients send, each request head parsed by `httparse` and its body skipped by its
//! `Content-Length` or its chunked encoding ([`RequestParser`]).

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

/// How far ahead of its link a sender may be before the relay stops reading from it.
pub const MAX_LEAD: Duration = Duration::from_millis(2);
/// The most bytes read from a socket at once (one unit on the link).
const READ_SIZE: usize = 64 * 1024;
/// The longest request head or chunk-size line accepted before a stream is no longer parsed.
const MAX_HEAD: usize = 64 * 1024;

/// One direction of the path: a link of a fixed rate, shared by every connection, and a
/// one-way delay.
#[derive(Debug)]
pub struct Link {
    bytes_per_second: f64,
    one_way: Duration,
    free_at: Mutex<Option<Instant>>,
}

impl Link {
    /// A link of `rate_mbit` megabits (10^6 bits) per second whose bytes arrive `one_way`
    /// after they leave.
    ///
    /// # Panics
    /// `rate_mbit` is not a positive, finite number.
    #[must_use]
    pub fn new(rate_mbit: f64, one_way: Duration) -> Self {
        assert!(rate_mbit.is_finite() && rate_mbit > 0.0, "a link's rate must be positive");
        Self { bytes_per_second: rate_mbit * 1e6 / 8.0, one_way, free_at: Mutex::new(None) }
    }

    /// Puts `len` bytes on the link at `now`: returns when their last byte has left and when
    /// it arrives. (A connection's handshake is its own wait, never the link's: the link is
    /// shared, and booking the wait on it would hold up every other connection.)
    pub fn send(&self, now: Instant, len: usize) -> (Instant, Instant) {
        let mut free_at = self.free_at.lock().unwrap_or_else(PoisonError::into_inner);
        let start = free_at.map_or(now, |free| free.max(now));
        #[allow(clippy::cast_precision_loss)] // a read is at most 64 KiB
        let left = start + Duration::from_secs_f64(len as f64 / self.bytes_per_second);
        *free_at = Some(left);
        (left, left + self.one_way)
    }

    /// The most bytes one connection may have read but not yet delivered on this link: twice
    /// what the link carries in one trip (so a flowing connection never waits on it), at least
    /// 1 MiB. It bounds the memory a connection whose reader stalls holds.
    #[must_use]
    pub fn in_flight_budget(&self) -> usize {
        let trip = (self.one_way + MAX_LEAD).as_secs_f64();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // positive, bounded
        let bytes = (2.0 * self.bytes_per_second * trip).min(1e12) as usize;
        bytes.max(1 << 20)
    }
}

/// What crossed the path since it started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Connections clients opened.
    pub connections: u64,
    /// HTTP requests clients sent, by method.
    pub requests: BTreeMap<String, u64>,
    /// Bytes from clients to the server.
    pub bytes_up: u64,
    /// Bytes from the server to clients.
    pub bytes_down: u64,
    /// Client streams that stopped being HTTP/1.1 the parser understands (their later requests
    /// are not counted; a report must say so).
    pub unparsed_streams: u64,
}

impl Counts {
    /// The counts as one JSON object.
    #[must_use]
    pub fn to_json(&self) -> String {
        let total: u64 = self.requests.values().sum();
        serde_json::json!({
            "connections": self.connections,
            "requests": total,
            "by_method": self.requests,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "unparsed_streams": self.unparsed_streams,
        })
        .to_string()
    }
}

/// Where a client's stream is, between and inside requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before a request head (or inside one).
    Head,
    /// Inside a body of this many bytes still to come.
    Body(u64),
    /// Before a chunk-size line.
    ChunkSize,
    /// Inside a chunk's data (this many bytes still to come, its CRLF included).
    ChunkData(u64),
    /// After the last chunk: trailer lines, then an empty line.
    Trailers,
    /// Not HTTP/1.1 as the parser knows it: nothing more is counted.
    Lost,
}

/// Counts the requests in one client-to-server byte stream, fed in pieces of any size.
#[derive(Debug)]
pub struct RequestParser {
    phase: Phase,
    pending: Vec<u8>,
}

impl Default for RequestParser {
    fn default() -> Self {
        Self { phase: Phase::Head, pending: Vec::new() }
    }
}

/// What one step over the pending bytes did.
enum Step {
    /// This many bytes were used up; the phase moved on.
    Used(usize),
    /// More bytes are needed.
    More,
}

impl RequestParser {
    /// Whether the stream stopped being parsable (nothing after that point is counted).
    #[must_use]
    pub fn lost(&self) -> bool {
        self.phase == Phase::Lost
    }

    /// Feeds the stream's next bytes; `on_request` gets the method of each request whose head
    /// they complete.
    pub fn feed(&mut self, mut data: &[u8], on_request: &mut impl FnMut(&str)) {
        while !data.is_empty() {
            match self.phase {
                Phase::Lost => return,
                Phase::Body(left) | Phase::ChunkData(left) if self.pending.is_empty() => {
                    // Body bytes are skipped where they are, never copied.
                    let take = usize::try_from(left).map_or(data.len(), |l| l.min(data.len()));
                    data = &data[take..];
                    self.phase = self.phase.skipped(take as u64);
                }
                _ => {
                    self.pending.extend_from_slice(data);
                    data = &[];
                    self.drain_pending(on_request);
                }
            }
        }
    }

    fn drain_pending(&mut self, on_request: &mut impl FnMut(&str)) {
        let mut pending = std::mem::take(&mut self.pending);
        let mut at = 0;
        while at < pending.len() && self.phase != Phase::Lost {
            match self.step(&pending[at..], on_request) {
                Step::Used(n) => at += n,
                Step::More => break,
            }
        }
        if self.phase == Phase::Lost || pending.len() - at > MAX_HEAD {
            self.phase = Phase::Lost;
            return;
        }
        pending.drain(..at);
        self.pending = pending;
    }

    fn step(&mut self, buf: &[u8], on_request: &mut impl FnMut(&str)) -> Step {
        match self.phase {
            Phase::Lost => Step::More,
            Phase::Body(left) | Phase::ChunkData(left) => {
                let take = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                self.phase = self.phase.skipped(take as u64);
                Step::Used(take)
            }
            Phase::Head => self.head(buf, on_request),
            Phase::ChunkSize => match httparse::parse_chunk_size(buf) {
                Ok(httparse::Status::Complete((used, 0))) => {
                    self.phase = Phase::Trailers;
                    Step::Used(used)
                }
                Ok(httparse::Status::Complete((used, size))) => {
                    // The data, then its CRLF.
                    self.phase = Phase::ChunkData(size.saturating_add(2));
                    Step::Used(used)
                }
                Ok(httparse::Status::Partial) => Step::More,
                Err(_) => {
                    self.phase = Phase::Lost;
                    Step::More
                }
            },
            Phase::Trailers => match buf.windows(2).position(|w| w == b"\r\n") {
                // An empty line ends the trailers and the request.
                Some(0) => {
                    self.phase = Phase::Head;
                    Step::Used(2)
                }
                Some(end) => Step::Used(end + 2),
                None => Step::More,
            },
        }
    }

    fn head(&mut self, buf: &[u8], on_request: &mut impl FnMut(&str)) -> Step {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(buf) {
            Ok(httparse::Status::Complete(used)) => {
                let mut next = Phase::Head;
                for header in request.headers.iter() {
                    if header.name.eq_ignore_ascii_case("transfer-encoding") {
                        let chunked = std::str::from_utf8(header.value)
                            .is_ok_and(|v| v.to_ascii_lowercase().contains("chunked"));
                        if chunked {
                            next = Phase::ChunkSize;
                        }
                    } else if header.name.eq_ignore_ascii_case("content-length")
                        && next == Phase::Head
                    {
                        match std::str::from_utf8(header.value)
                            .ok()
                            .and_then(|v| v.trim().parse().ok())
                        {
                            Some(0) => {}
                            Some(n) => next = Phase::Body(n),
                            None => next = Phase::Lost,
                        }
                    }
                }
                on_request(request.method.unwrap_or("?"));
                self.phase = next;
                Step::Used(used)
            }
            Ok(httparse::Status::Partial) => Step::More,
            Err(_) => {
                self.phase = Phase::Lost;
                Step::More
            }
        }
    }
}

impl Phase {
    /// The phase after `n` more bytes of a body or chunk were skipped.
    fn skipped(self, n: u64) -> Self {
        match self {
            Self::Body(left) if left > n => Self::Body(left - n),
            Self::Body(_) => Self::Head,
            Self::ChunkData(left) if left > n => Self::ChunkData(left - n),
            Self::ChunkData(_) => Self::ChunkSize,
            other => other,
        }
    }
}

/// The path: a link each way, the round trip, and the counts.
#[derive(Debug)]
pub struct Path {
    up: Link,
    down: Link,
    rtt: Duration,
    counts: Mutex<Counts>,
}

impl Path {
    /// A path of `rtt` round trip with `rate_mbit` megabits per second each way.
    ///
    /// # Panics
    /// `rate_mbit` is not a positive, finite number.
    #[must_use]
    pub fn new(rtt: Duration, rate_mbit: f64) -> Self {
        Self {
            up: Link::new(rate_mbit, rtt / 2),
            down: Link::new(rate_mbit, rtt / 2),
            rtt,
            counts: Mutex::new(Counts::default()),
        }
    }

    /// What crossed the path so far.
    #[must_use]
    pub fn counts(&self) -> Counts {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Relays every connection `listener` accepts to `upstream` over `path`, until `stop`.
///
/// # Errors
/// Accepting fails.
pub async fn serve(
    listener: TcpListener,
    upstream: SocketAddr,
    path: Arc<Path>,
    stop: CancellationToken,
) -> io::Result<()> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return Ok(()),
        };
        let client = match accepted {
            Ok((client, _)) => client,
            // Out of descriptors or a connection gone before it was taken: the relay goes on
            // (after a pause, so a lasting shortage is not a busy loop).
            Err(e) if is_passing(&e) => {
                eprintln!("netpath: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let path = Arc::clone(&path);
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                result = relay(client, upstream, &path) => {
                    if let Err(e) = result {
                        // A reset connection is the client's or the server's business; the
                        // relay goes on with the others.
                        log_ended(&e);
                    }
                }
                () = stop.cancelled() => {}
            }
        });
    }
}

/// An accept error that ends one connection or passes with time, never the listener.
fn is_passing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || matches!(
        e.raw_os_error(),
        // Descriptors or memory short for a while, and the network errors accept(2) passes
        // on from a pending connection (to be treated as "try again").
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
                | libc::ENETDOWN
        )
    )
}

fn log_ended(e: &io::Error) {
    if !matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) {
        eprintln!("netpath: a connection ended: {e}");
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, path: &Path) -> io::Result<()> {
    let opened = Instant::now();
    let server = TcpStream::connect(upstream).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    path.count(|c| c.connections += 1);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // The client's first bytes could leave only after the handshake's round trip.
    let up = carry(client_read, server_write, path, Direction::Up, opened + path.rtt);
    let down = carry(server_read, client_write, path, Direction::Down, opened);
    tokio::try_join!(up, down)?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

/// Carries one direction of a connection over its link: reads, schedules each read on the
/// link, and writes it out when it arrives. Ends (passing the end of the stream on) when the
/// reading side ends.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    path: &Path,
    direction: Direction,
    not_before: Instant,
) -> io::Result<()> {
    let link = if direction == Direction::Up { &path.up } else { &path.down };
    // Each read holds its length in permits until it is delivered.
    let budget = Arc::new(Semaphore::new(link.in_flight_budget()));
    let (tx, mut rx) =
        mpsc::unbounded_channel::<(Instant, Vec<u8>, tokio::sync::OwnedSemaphorePermit)>();
    let deliver = async move {
        while let Some((arrives, bytes, permit)) = rx.recv().await {
            sleep_until(arrives).await;
            to.write_all(&bytes).await?;
            drop(permit);
        }
        to.shutdown().await
    };
    let read = async move {
        let mut parser = (direction == Direction::Up).then(RequestParser::default);
        let mut buf = vec![0u8; READ_SIZE];
        let mut first = true;
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if first {
                // This connection's own wait (its handshake); the link goes on carrying others.
                sleep_until(not_before).await;
                first = false;
            }
            let bytes = &buf[..n];
            path.count(|c| {
                if direction == Direction::Up {
                    c.bytes_up += n as u64;
                } else {
                    c.bytes_down += n as u64;
                }
            });
            if let Some(p) = parser.as_mut().filter(|p| !p.lost()) {
                let mut methods = Vec::new();
                p.feed(bytes, &mut |m: &str| methods.push(m.to_owned()));
                let lost = p.lost();
                path.count(|c| {
                    for m in methods {
                        *c.requests.entry(m).or_default() += 1;
                    }
                    if lost {
                        c.unparsed_streams += 1;
                    }
                });
            }
            #[allow(clippy::cast_possible_truncation)] // n <= READ_SIZE
            let Ok(permit) = Arc::clone(&budget).acquire_many_owned(n as u32).await else {
                break;
            };
            let now = Instant::now();
            let (left, arrives) = link.send(now, n);
            if tx.send((arrives, bytes.to_vec(), permit)).is_err() {
                break;
            }
            if left > now + MAX_LEAD {
                sleep_until(left - MAX_LEAD).await;
            }
        }
        Ok::<(), io::Error>(())
    };
    let (read, deliver) = tokio::join!(read, deliver);
    read.and(deliver)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn count(parser: &mut RequestParser, pieces: &[&[u8]]) -> Vec<String> {
        let mut seen = Vec::new();
        for piece in pieces {
            parser.feed(piece, &mut |m: &str| seen.push(m.to_owned()));
        }
        seen
    }

    const STREAM: &[u8] = b"PUT /b/k HTTP/1.1\r\nHost: s3\r\nContent-Length: 39\r\n\r\n\
GET /x HTTP/1.1\r\nHost: s3\r\n\r\n0123456789\
HEAD /b/k HTTP/1.1\r\nHost: s3\r\n\r\n\
POST /b?uploads HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n\
5;ext=1\r\nhello\r\n1a\r\nGET / HTTP/1.1\r\n\r\n01234567\r\n0\r\nx-trailer: 1\r\n\r\n\
DELETE /b/k HTTP/1.1\r\ncontent-length: 0\r\n\r\n";

    #[test]
    fn requests_are_counted_whatever_the_reads_boundaries() {
        let expected = ["PUT", "HEAD", "POST", "DELETE"];
        for cut in 0..=STREAM.len() {
            let mut parser = RequestParser::default();
            let seen = count(&mut parser, &[&STREAM[..cut], &STREAM[cut..]]);
            assert_eq!(seen, expected, "cut at {cut}");
            assert!(!parser.lost());
        }
        let mut parser = RequestParser::default();
        let bytes: Vec<&[u8]> = STREAM.chunks(1).collect();
        assert_eq!(count(&mut parser, &bytes), expected, "a byte at a time");
    }

    #[test]
    fn a_body_that_looks_like_requests_is_not_counted() {
        let body = b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        let mut stream =
            format!("PUT /k HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        stream.extend_from_slice(body);
        stream.extend_from_slice(b"GET /k HTTP/1.1\r\n\r\n");
        let mut parser = RequestParser::default();
        assert_eq!(count(&mut parser, &[&stream]), ["PUT", "GET"]);
    }

    #[test]
    fn a_stream_that_is_not_http_stops_counting_and_says_so() {
        let mut parser = RequestParser::default();
        assert_eq!(
            count(&mut parser, &[b"\x16\x03\x01\x02\x00 not http\r\n\r\n"]),
            Vec::<String>::new()
        );
        assert!(parser.lost());
        assert_eq!(count(&mut parser, &[b"GET / HTTP/1.1\r\n\r\n"]), Vec::<String>::new());

        let mut parser = RequestParser::default();
        count(&mut parser, &[b"PUT / HTTP/1.1\r\nContent-Length: lots\r\n\r\n"]);
        assert!(parser.lost(), "an unreadable length");

        let mut parser = RequestParser::default();
        count(&mut parser, &[&vec![b'A'; MAX_HEAD + 10]]);
        assert!(parser.lost(), "a head without end");
    }

    #[test]
    fn the_link_serialises_reads_at_its_rate_and_delays_them() {
        // 8 Mbit/s: a million bytes take one second.
        let link = Link::new(8.0, Duration::from_millis(10));
        let t0 = Instant::now();
        let (left, arrives) = link.send(t0, 1_000_000);
        assert_eq!(left - t0, Duration::from_secs(1));
        assert_eq!(arrives - left, Duration::from_millis(10));
        // A second read queues behind the first, even if read earlier than it has left.
        let (left2, _) = link.send(t0 + Duration::from_millis(500), 500_000);
        assert_eq!(left2 - t0, Duration::from_millis(1500));
        // An idle link starts a read at once.
        let later = t0 + Duration::from_secs(5);
        let (left3, _) = link.send(later, 1000);
        assert_eq!(left3 - later, Duration::from_millis(1));
        // A connection may hold twice a trip's bytes unread, at least 1 MiB.
        assert_eq!(link.in_flight_budget(), 1 << 20);
        let fast = Link::new(1000.0, Duration::from_millis(10)).in_flight_budget();
        assert!((2_999_000..=3_001_000).contains(&fast), "{fast}");
    }

    const REQUEST: &[u8] = b"GET /object HTTP/1.1\r\nHost: s3\r\n\r\n";

    /// Serves each connection: a reply of `b"ok"` for each `REQUEST` read.
    async fn echo_server() -> SocketAddr {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = server.accept().await {
                tokio::spawn(async move {
                    let mut got = vec![0u8; REQUEST.len()];
                    while s.read_exact(&mut got).await.is_ok() {
                        if s.write_all(b"ok").await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn ask(client: &mut TcpStream) {
        client.write_all(REQUEST).await.unwrap();
        let mut ok = [0u8; 2];
        client.read_exact(&mut ok).await.unwrap();
        assert_eq!(&ok, b"ok");
    }

    #[tokio::test]
    async fn a_new_connections_handshake_holds_up_no_other_connection() {
        let upstream = echo_server().await;
        // 400 ms: a request and its reply take one round trip once connected. (Were the
        // second connection's handshake booked on the shared link, the first's round trip
        // would take about 700 ms: 300 ms waiting for the link, then the round trip.)
        let path = Arc::new(Path::new(Duration::from_millis(400), 1000.0));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let relaying = tokio::spawn(serve(listener, upstream, Arc::clone(&path), stop.clone()));

        let mut first = TcpStream::connect(addr).await.unwrap();
        ask(&mut first).await;
        // A second connection opens and asks (its request waits for its handshake), then the
        // first asks again: its round trip is one round trip, not held up by the handshake.
        let mut second = TcpStream::connect(addr).await.unwrap();
        second.write_all(REQUEST).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        ask(&mut first).await;
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(400), "a round trip in {took:?}");
        assert!(took < Duration::from_millis(550), "held up by another's handshake: {took:?}");
        let mut ok = [0u8; 2];
        second.read_exact(&mut ok).await.unwrap();
        assert_eq!(path.counts().connections, 2);
        stop.cancel();
        relaying.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_relay_carries_bytes_intact_no_sooner_than_the_path_allows_and_counts_them() {
        let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = server.local_addr().unwrap();
        let body: Vec<u8> = (0..500_000u32).map(|i| (i % 251) as u8).collect();
        let reply = body.clone();
        let serving = tokio::spawn(async move {
            let (mut s, _) = server.accept().await.unwrap();
            let mut got = vec![0u8; REQUEST.len()];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(got, REQUEST);
            s.write_all(&reply).await.unwrap();
            s.shutdown().await.unwrap();
        });
        // 40 Mbit/s and 20 ms: the handshake's round trip (20 ms), the request's one-way trip
        // (10 ms), then 500 kB take 100 ms on the link and arrive 10 ms after they leave.
        let path = Arc::new(Path::new(Duration::from_millis(20), 40.0));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let relaying = tokio::spawn(serve(listener, upstream, Arc::clone(&path), stop.clone()));

        let started = std::time::Instant::now();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(REQUEST).await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let took = started.elapsed();
        assert!(got == body, "the reply arrived changed ({} bytes)", got.len());
        assert!(
            took >= Duration::from_millis(140),
            "arrived after {took:?}, sooner than the path allows"
        );
        serving.await.unwrap();

        let counts = path.counts();
        assert_eq!(counts.connections, 1);
        assert_eq!(counts.requests.get("GET"), Some(&1));
        assert_eq!(counts.bytes_up, REQUEST.len() as u64);
        assert_eq!(counts.bytes_down, 500_000);
        stop.cancel();
        relaying.await.unwrap().unwrap();
    }
}
