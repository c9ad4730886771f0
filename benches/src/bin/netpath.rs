//! A network path to an S3 server, in user space, for `compare/run.sh --remote` (the model is
//! in `ferry_benches::netpath`): a relay on loopback with a round-trip delay and a rate limit
//! each way, shared by every connection, that counts the HTTP requests crossing it.
//!
//! ```text
//! cargo build --release -p ferry-benches --bin netpath
//! target/release/netpath --upstream 127.0.0.1:9000 --rtt-ms 20 --rate-mbit 1000 \
//!     --stats /tmp/path.json --ready-file /tmp/path.addr [--listen 127.0.0.1:0]
//! ```
//!
//! It writes the address it listens on to `--ready-file` once it listens, and its counts (one
//! JSON object) to `--stats` on every SIGUSR1, each file whole (written aside, then renamed).
//! SIGTERM or Ctrl-C stops it. Only loopback addresses are accepted: it is a benchmark's path,
//! never a way onto the host's network.

use std::io;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ferry_benches::netpath::{Path, serve};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(about = "A delayed, rate-limited relay to an S3 server that counts its requests")]
struct Args {
    /// Where to listen (a loopback address; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The S3 server (a loopback address).
    #[arg(long)]
    upstream: SocketAddr,
    /// Round-trip time in milliseconds.
    #[arg(long)]
    rtt_ms: u64,
    /// Rate each way, in megabits (10^6 bits) per second.
    #[arg(long)]
    rate_mbit: f64,
    /// Where the counts go on SIGUSR1.
    #[arg(long)]
    stats: PathBuf,
    /// Where the listening address goes once it listens.
    #[arg(long)]
    ready_file: PathBuf,
}

/// Writes `text` to `path` whole: to `<path>.partial` first (a name of its own for each file),
/// then renamed.
fn write_whole(path: &FsPath, text: &str) -> io::Result<()> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".partial");
    let aside = PathBuf::from(aside);
    std::fs::write(&aside, text)?;
    std::fs::rename(&aside, path)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> io::Result<()> {
    let args = Args::parse();
    if !args.listen.ip().is_loopback() || !args.upstream.ip().is_loopback() {
        return Err(io::Error::other(
            "netpath: --listen and --upstream must be loopback addresses",
        ));
    }
    if !(args.rate_mbit.is_finite() && args.rate_mbit > 0.0) {
        return Err(io::Error::other("netpath: --rate-mbit must be a positive number"));
    }
    let path = Arc::new(Path::new(Duration::from_millis(args.rtt_ms), args.rate_mbit));
    // The handlers first: once the ready file is there, a signal must find them.
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let listener = TcpListener::bind(args.listen).await?;
    write_whole(&args.ready_file, &listener.local_addr()?.to_string())?;

    let stop = CancellationToken::new();
    let mut serving = tokio::spawn(serve(listener, args.upstream, Arc::clone(&path), stop.clone()));
    loop {
        tokio::select! {
            _ = usr1.recv() => write_whole(&args.stats, &path.counts().to_json())?,
            _ = term.recv() => break,
            _ = int.recv() => break,
            // The relay stopped on its own (an accept error that does not pass): exit with it,
            // so the benchmark sees a dead path instead of one that accepts nothing.
            ended = &mut serving => {
                ended.map_err(io::Error::other)??;
                return Err(io::Error::other("netpath: the relay stopped"));
            }
        }
    }
    stop.cancel();
    serving.await.map_err(io::Error::other)?
}
