//! The `ferry` binary: every run mode of Ferry behind one command line.
//!
//! Exit status 0 on success; on failure a one-line cause on stderr and a non-zero status.

mod agent_cmd;
mod allocator;
mod cbt_cmd;
mod cli;
mod forget_policy;
mod gc_cmds;
mod key_cmds;
mod ls_cmd;
mod migrate_cmd;
mod move_cmd;
mod password;
mod plugin_cmd;
mod progress;
mod pvc;
mod repo_cmds;
mod retention;
mod serve;
mod snapshot_arg;
mod stats_cmd;
mod volume_cmds;

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, Command, KeyCommand, RepoCommand};

fn main() -> ExitCode {
    allocator::tune();
    let cli = if plugin_cmd::started_as_plugin() {
        Cli { verbose: 1, command: Command::Plugin { args: std::env::args_os().skip(1).collect() } }
    } else {
        Cli::parse()
    };
    init_logging(cli.verbose);
    // aws-sdk-s3 links rustls' aws-lc provider and kube links ring; with both present rustls
    // cannot pick one, so choose ring for the whole process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&anyhow::anyhow!(e).context("starting the async runtime")),
    };
    let cancel = CancellationToken::new();
    let result = runtime.block_on(async {
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            on_signal.cancel();
        });
        run(cli.command, &cancel).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

async fn run(command: Command, cancel: &CancellationToken) -> anyhow::Result<()> {
    match command {
        Command::Repo { command: RepoCommand::Init { repo, pack_size_mib } } => {
            repo_cmds::init(&repo, pack_size_mib, cancel).await
        }
        Command::Repo { command: RepoCommand::Move { repo, to } } => {
            move_cmd::move_repo(&repo, &to, cancel).await
        }
        Command::Repo { command: RepoCommand::Migrate { repo, to, json } } => {
            migrate_cmd::migrate(&repo, &to, json, cancel).await
        }
        Command::Repo { command: RepoCommand::Passwd { repo, new_password } } => {
            key_cmds::passwd(&repo, &new_password, cancel).await
        }
        Command::Repo { command: RepoCommand::Key { command } } => match command {
            KeyCommand::List { repo, json } => key_cmds::list(&repo, json, cancel).await,
            KeyCommand::Add { repo, new_password } => {
                key_cmds::add(&repo, &new_password, cancel).await
            }
            KeyCommand::Remove { repo, key_id } => key_cmds::remove(&repo, &key_id, cancel).await,
        },
        Command::Backup(args) => repo_cmds::backup(&args, cancel).await,
        Command::Restore(args) => repo_cmds::restore(&args, cancel).await,
        Command::Ls(args) => ls_cmd::ls(&args, cancel).await,
        Command::Snapshots { repo, json } => repo_cmds::snapshots(&repo, json, cancel).await,
        Command::Stats { repo, json } => stats_cmd::stats(&repo, json, cancel).await,
        Command::Check { repo, read_data, read_data_subset } => {
            let options = ferry_repo::CheckOptions {
                read_data: read_data || read_data_subset.is_some(),
                subset: read_data_subset,
            };
            repo_cmds::check(&repo, options, cancel).await
        }
        Command::Agent(args) => agent_cmd::run(&args, cancel).await,
        Command::Volume { command } => pvc::run(&command, cancel).await,
        Command::Hold => agent_cmd::hold(cancel).await,
        Command::Plugin { args } => plugin_cmd::run(args).await,
        Command::Forget(args) => gc_cmds::forget(&args, cancel).await,
        Command::Gc(args) => gc_cmds::gc(&args, cancel).await,
        Command::Cbt { command } => cbt_cmd::run(&command, cancel).await,
    }
}

/// Prints the error chain on one line and returns the failure exit code.
fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("ferry: error: {}", one_line(err));
    ExitCode::FAILURE
}

/// The error and its causes on one line, each said once (Ferry's errors show their source in
/// their own message): the agent's rendering of a failure, also used for CR messages.
fn one_line(err: &anyhow::Error) -> String {
    ferry_agent::error_chain(err.as_ref())
}

/// Logs to stderr, filtered by `FERRY_LOG`, else by `RUST_LOG`, else by `-v`; colour only on
/// a terminal and when `NO_COLOR` is unset or empty (a pod's log is a file, not a terminal).
fn init_logging(verbose: u8) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;

    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty());
    let filter = match ["FERRY_LOG", "RUST_LOG"].into_iter().find(|var| set(var)) {
        Some(var) => EnvFilter::try_from_env(var).unwrap_or_else(|e| {
            eprintln!("ferry: warning: ignoring {var}, not a log filter ({e}); using {default}");
            EnvFilter::new(default)
        }),
        None => EnvFilter::new(default),
    };
    let ansi = std::io::stderr().is_terminal() && !set("NO_COLOR");
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

#[cfg(test)]
mod tests {
    use super::one_line;

    /// An error whose message includes its source, as Ferry's errors do.
    #[derive(Debug)]
    struct Damaged(std::io::Error);

    impl std::fmt::Display for Damaged {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "pack data/ab is damaged: {}", self.0)
        }
    }

    impl std::error::Error for Damaged {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let inner = Damaged(std::io::Error::other("authentication failed"));
        let err = anyhow::Error::new(inner).context("restoring s1 into /t");
        assert_eq!(
            one_line(&err),
            "restoring s1 into /t: pack data/ab is damaged: authentication failed"
        );
        let plain = anyhow::Error::new(std::io::Error::other("disk full")).context("writing f");
        assert_eq!(one_line(&plain), "writing f: disk full");
    }
}
