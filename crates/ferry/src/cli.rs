//! Command-line syntax.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Ferry moves Kubernetes volume data to and from a deduplicating, encrypted backup repository.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about)]
pub struct Cli {
    /// More logging on stderr (-v: info, -vv: debug). `FERRY_LOG` (else `RUST_LOG`) takes a full
    /// filter; no colour codes unless stderr is a terminal and `NO_COLOR` is unset.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Repository management.
    Repo {
        #[command(subcommand)]
        command: RepoCommand,
    },
    /// Back up a directory, or a block device or volume image as a volume snapshot; prints the
    /// snapshot ID last.
    Backup(BackupArgs),
    /// Restore a tree snapshot into a directory, or a volume snapshot onto a block device or
    /// image file.
    Restore(RestoreArgs),
    /// List the entries of a tree snapshot at a path (default: its root).
    Ls(LsArgs),
    /// List snapshots.
    Snapshots {
        #[command(flatten)]
        repo: RepoArgs,
        /// Print JSON: a list of objects with id, time, tags, parent, bytes.
        #[arg(long)]
        json: bool,
    },
    /// What the repository holds: snapshots, unique content, packs, and the space saved.
    Stats {
        #[command(flatten)]
        repo: RepoArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Back up or restore a PVC through Ferry's agents, without Velero.
    Volume {
        #[command(subcommand)]
        command: crate::pvc::VolumeCommand,
    },
    /// Ask a CSI driver's SnapshotMetadata service (changed-block tracking) which ranges of a
    /// VolumeSnapshot hold data or changed since a base snapshot.
    Cbt {
        #[command(subcommand)]
        command: crate::cbt_cmd::CbtCommand,
    },
    /// Run the node agent: process DataUploads and DataDownloads on this node.
    Agent(Box<crate::agent_cmd::AgentArgs>),
    /// Wait until stopped (the command of the pods that hold exposed volumes).
    Hold,
    /// Serve Ferry's Velero plugins (Velero starts this; flags are Velero's own).
    Plugin {
        /// Velero's flags (`--log-level`, `--features`, …), accepted as given.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Forget snapshots: delete their manifests (run `gc` to reclaim their space).
    Forget(crate::gc_cmds::ForgetArgs),
    /// Reclaim the space of forgotten snapshots; safe while other nodes back up.
    Gc(crate::gc_cmds::GcArgs),
    /// Verify the repository's structure and references.
    Check {
        #[command(flatten)]
        repo: RepoArgs,
        /// Also read and authenticate every stored byte.
        #[arg(long)]
        read_data: bool,
        /// Read and authenticate only part of the packs: group N of M (`2/5`; running 1/5 to
        /// 5/5 reads each pack once) or P percent of them drawn at random, rounded up to at
        /// least one pack (`10%`).
        #[arg(long, value_name = "N/M|P%", conflicts_with = "read_data")]
        read_data_subset: Option<ferry_repo::PackSubset>,
    },
}

#[derive(Debug, Subcommand)]
pub enum RepoCommand {
    /// Create a repository (safe if another node creates it at the same time).
    Init {
        #[command(flatten)]
        repo: RepoArgs,
        /// Size packs are filled to before they are stored, in MiB (1 to 1024; default 16).
        /// Smaller packs mean more objects but less to upload again after an interrupted
        /// backup. Fixed when the repository is created.
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=1024))]
        pack_size_mib: Option<u32>,
    },
    /// Change the password: stores a key file for the new password, proves it opens the
    /// repository, then removes the key file of the current password. No data is rewritten.
    Passwd {
        #[command(flatten)]
        repo: RepoArgs,
        #[command(flatten)]
        new_password: NewPasswordArgs,
    },
    /// Key files: each lets one password open the repository.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Move the repository to another location: copy every object (an object already at the
    /// destination must hold the same bytes), prove the copy opens with the password, then
    /// delete the old objects. Safe to run again after an interruption.
    Move {
        #[command(flatten)]
        repo: RepoArgs,
        /// Where the repository goes (`file:///abs/path` or `s3://bucket/prefix`; the same S3
        /// endpoint, region and credentials as `--repo`).
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Copy the repository into a new one of the newest format (3: small files compressed
    /// together) at another location, under the same keys: the same passwords and KMS keys
    /// open it, and it holds the same snapshots under the same ids. Every blob is read and
    /// checked on the way. The old repository is left as it is. Safe to run again after an
    /// interruption (it goes on where it stopped) or after new backups (it copies what is
    /// new).
    Migrate {
        #[command(flatten)]
        repo: RepoArgs,
        /// Where the new repository goes: an empty location (`file:///abs/path` or
        /// `s3://bucket/prefix`; the same S3 endpoint, region and credentials as `--repo`).
        #[arg(long, value_name = "URL")]
        to: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// List the key files, oldest first; `*` marks the one the given password opens.
    List {
        #[command(flatten)]
        repo: RepoArgs,
        /// Print JSON: a list of objects with id, current, created, hostname, kdf (or error).
        #[arg(long)]
        json: bool,
    },
    /// Let another password open the repository too; prints the new key's id.
    Add {
        #[command(flatten)]
        repo: RepoArgs,
        #[command(flatten)]
        new_password: NewPasswordArgs,
    },
    /// Remove a key file (not the last one, nor the one the given password opens).
    Remove {
        #[command(flatten)]
        repo: RepoArgs,
        /// The key's id, or a unique prefix of at least 4 hex digits.
        key_id: String,
    },
}

/// Where a new password comes from.
#[derive(Debug, Clone, Args)]
pub struct NewPasswordArgs {
    /// A file holding the new password (else `FERRY_NEW_PASSWORD`).
    #[arg(long, value_name = "FILE")]
    pub new_password_file: Option<PathBuf>,
}

/// Where the repository is and how to open it.
#[derive(Debug, Clone, Args)]
pub struct RepoArgs {
    /// `file:///abs/path` or `s3://bucket/prefix`.
    #[arg(long, env = "FERRY_REPO")]
    pub repo: String,
    /// A file holding the password (else `FERRY_PASSWORD`).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// S3 endpoint URL for S3-compatible servers (path-style addressing is then used).
    #[arg(long, env = "FERRY_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 region (else from the AWS environment).
    #[arg(long, env = "FERRY_S3_REGION")]
    pub s3_region: Option<String>,
    #[command(flatten)]
    pub kms: KmsArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// AWS KMS wrapping of the repository's key files, on top of the password.
#[derive(Debug, Clone, Default, Args)]
pub struct KmsArgs {
    /// An AWS KMS key (key id, key ARN, `alias/NAME` or alias ARN) that wraps the repository's
    /// key files as well as the password. `repo init` then creates a repository that opens
    /// only with kms:Decrypt on this key, and key files written later (`repo passwd`, `repo
    /// key add`) are wrapped by it too. Needed to open a repository whose key files a KMS key
    /// wraps (the key files name their key: any of the repository's keys is then decrypted
    /// with its own).
    #[arg(long, env = "FERRY_KMS_KEY_ID", value_name = "KEY")]
    pub kms_key_id: Option<String>,
    /// KMS endpoint URL for a KMS-compatible service (with --kms-key-id).
    #[arg(long, env = "FERRY_KMS_ENDPOINT", value_name = "URL")]
    pub kms_endpoint: Option<String>,
    /// KMS region for a key id or alias that is no ARN (an ARN's own region is used); else
    /// --s3-region, else from the AWS environment.
    #[arg(long, env = "FERRY_KMS_REGION", value_name = "REGION")]
    pub kms_region: Option<String>,
}

/// The local cache of index files, snapshot manifests and tree packs.
#[derive(Debug, Clone, Default, Args)]
pub struct CacheArgs {
    /// Keep a cache of the repository's index files, snapshot manifests and tree packs here
    /// (one folder per repository; safe to delete at any time). Default for S3 repositories:
    /// `$XDG_CACHE_HOME/ferry/repos` or `~/.cache/ferry/repos`; file repositories, and
    /// `ferry agent`, use none unless this is given.
    #[arg(long, env = "FERRY_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most the whole cache directory may hold, in MiB: every repository's folder together,
    /// also those of repositories not open now (the least recently used files go first).
    #[arg(long, env = "FERRY_CACHE_SIZE_MIB", value_name = "MIB", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub cache_size_mib: u64,
    /// Use no local cache (also when a cache folder is given).
    #[arg(long)]
    pub no_cache: bool,
}

impl CacheArgs {
    /// The cache asked for: in `--cache-dir`, else in `default_dir`; none with `--no-cache`.
    pub fn options(&self, default_dir: Option<PathBuf>) -> Option<ferry_repo::CacheOptions> {
        if self.no_cache {
            return None;
        }
        let dir = self.cache_dir.clone().or(default_dir)?;
        Some(ferry_repo::CacheOptions { dir, max_bytes: self.cache_size_mib << 20 })
    }
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Snapshot to compare with: unchanged files are not read again. `latest`: the newest
    /// snapshot of the same path, host and kind (a full backup when there is none).
    #[arg(long, value_name = "SNAPSHOT")]
    pub parent: Option<String>,
    /// The host name recorded in the snapshot (and matched by `--parent latest`); default:
    /// this machine's.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Tag the snapshot (repeatable).
    #[arg(long = "tag", value_name = "K=V", value_parser = parse_tag)]
    pub tags: Vec<(String, String)>,
    /// Print a JSON summary instead of the snapshot ID.
    #[arg(long)]
    pub json: bool,
    /// Leave out entries matching this glob (repeatable): a name at any depth (`*.log`,
    /// `node_modules`) or, with a `/`, a path from PATH (`/tmp`, `cache/**/*.bin`); a
    /// trailing `/` matches directories only (`logs/`).
    #[arg(long, value_name = "PATTERN")]
    pub exclude: Vec<String>,
    /// Read more exclude patterns from FILE, one per line (blank lines and `#` comments
    /// skipped).
    #[arg(long, value_name = "FILE")]
    pub exclude_file: Option<PathBuf>,
    /// Back up PATH, a regular file, as a volume image (block devices always are volumes).
    #[arg(long)]
    pub volume: bool,
    /// zstd level for the data: 1 to 19 (higher: smaller and slower), -7 to -1 for zstd's
    /// fast modes, 0 to store it uncompressed. Data that does not compress is stored as is at
    /// any level. Default: 3.
    #[arg(long, value_name = "LEVEL", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-7..=19))]
    pub compression: Option<i32>,
    /// The directory, block device or (with `--volume`) image file to back up.
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Write files sparsely (holes for all-zero ranges).
    #[arg(long)]
    pub sparse: bool,
    /// Volume snapshots: the target device already reads as zeros, so zero ranges are not
    /// written (only when certain, e.g. a freshly provisioned thin volume).
    #[arg(long)]
    pub target_zeroed: bool,
    /// Restore only this path of a tree snapshot: a directory's content goes into TARGET,
    /// anything else into TARGET under its own name.
    #[arg(long, value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// The snapshot ID, a unique prefix of it (at least 4 hex digits), or `latest`.
    pub snapshot: String,
    /// The directory to restore a tree into (created if missing), or the block device or
    /// image file (created if missing) to restore a volume onto.
    pub target: PathBuf,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Also list every subdirectory's entries, depth first.
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// Print one JSON object per line: path, type, mode, uid, gid, size, mtime, and target
    /// (symbolic links) or error (entries that could not be read at backup time).
    #[arg(long)]
    pub json: bool,
    /// The snapshot ID, a unique prefix of it (at least 4 hex digits), or `latest`.
    pub snapshot: String,
    /// A directory (or any entry) inside the snapshot.
    #[arg(default_value = "/")]
    pub path: PathBuf,
}

pub(crate) fn parse_tag(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("tag {text:?} is not K=V")),
    }
}
