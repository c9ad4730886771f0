//! The `ferry` binary: every run mode of Ferry behind one command line.

use clap::Parser;

/// Ferry moves Kubernetes volume data to and from a deduplicating backup repository.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
