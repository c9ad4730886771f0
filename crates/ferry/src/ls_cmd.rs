//! `ferry ls`: the entries of a tree snapshot, streamed page by page (a directory of millions
//! of entries is never held at once).

use std::io::Write;

use anyhow::Context;
use ferry_repo::format::{Node, NodeBody};
use ferry_repo::{RepoError, SnapshotKind};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::LsArgs;
use crate::repo_cmds::{open_repo, time_text};

#[derive(Serialize)]
struct EntryJson<'a> {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    mode: String,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

fn kind(node: &Node) -> (&'static str, char) {
    match node.body {
        NodeBody::File(_) => ("file", '-'),
        NodeBody::Dir { .. } => ("dir", 'd'),
        NodeBody::Symlink { .. } => ("symlink", 'l'),
        NodeBody::Fifo => ("fifo", 'p'),
        NodeBody::Socket => ("socket", 's'),
        NodeBody::CharDevice { .. } => ("chardev", 'c'),
        NodeBody::BlockDevice { .. } => ("blockdev", 'b'),
        NodeBody::Volume { .. } => ("volume", 'v'),
    }
}

fn size(node: &Node) -> u64 {
    match &node.body {
        NodeBody::File(c) | NodeBody::Volume { content: c, .. } => c.size,
        NodeBody::Symlink { target } => target.len() as u64,
        _ => 0,
    }
}

/// `rwxr-xr-x` with setuid, setgid and sticky shown as `ls` shows them.
fn permissions(mode: u32) -> String {
    let mut out = String::with_capacity(9);
    for (shift, special, set, unset) in
        [(6, 0o4000, 's', 'S'), (3, 0o2000, 's', 'S'), (0, 0o1000, 't', 'T')]
    {
        let bits = (mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    out
}

fn print(
    out: &mut impl Write,
    path: &std::path::Path,
    node: &Node,
    json: bool,
) -> std::io::Result<()> {
    let (kind, letter) = kind(node);
    let target = match &node.body {
        NodeBody::Symlink { target } => Some(String::from_utf8_lossy(target).into_owned()),
        _ => None,
    };
    if json {
        let entry = EntryJson {
            path: path.display().to_string(),
            kind,
            mode: format!("{:04o}", node.meta.mode & 0o7777),
            uid: node.meta.uid,
            gid: node.meta.gid,
            size: size(node),
            mtime: time_text(&node.meta.mtime),
            target,
            error: node.error.as_deref(),
        };
        let line = serde_json::to_string(&entry).map_err(std::io::Error::other)?;
        return writeln!(out, "{line}");
    }
    let mtime = time_text(&node.meta.mtime);
    write!(
        out,
        "{letter}{} {:>6} {:>6} {:>12} {:<19} {}",
        permissions(node.meta.mode),
        node.meta.uid,
        node.meta.gid,
        size(node),
        mtime.get(..19).unwrap_or(&mtime),
        path.display()
    )?;
    if let Some(t) = target {
        write!(out, " -> {t}")?;
    }
    if let Some(e) = &node.error {
        write!(out, "  (unreadable at backup: {e})")?;
    }
    writeln!(out)
}

pub async fn ls(args: &LsArgs, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo(&args.repo, cancel).await?;
    let id =
        crate::snapshot_arg::find(&repo, &args.snapshot, Some(SnapshotKind::Tree), cancel).await?;
    let snapshot =
        repo.load_snapshot(&id, cancel).await.with_context(|| format!("reading snapshot {id}"))?;
    if !matches!(snapshot.root.body, NodeBody::Dir { .. }) {
        anyhow::bail!("snapshot {id} is not a directory snapshot: it has no files to list");
    }
    let node = ferry_repo::browse::find_node(&repo, &snapshot, &args.path, cancel).await?;
    let shown = std::path::Path::new("/").join(
        ferry_repo::browse::snapshot_path(&args.path)?
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<std::path::PathBuf>(),
    );
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let written = |source: std::io::Error| RepoError::Io {
        operation: "write",
        path: "stdout".into(),
        source,
    };
    let listed = if matches!(node.body, NodeBody::Dir { .. }) {
        let json = args.json;
        ferry_repo::browse::walk_dir(&repo, &node, &shown, args.recursive, cancel, &mut |p, n| {
            print(&mut out, p, n, json).map_err(written)
        })
        .await
    } else {
        print(&mut out, &shown, &node, args.json).map_err(written)
    };
    match listed.and_then(|()| out.flush().map_err(written)) {
        // The reader went away (`ferry ls … | head`): nothing more to say.
        Err(RepoError::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            Ok(())
        }
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::permissions;

    #[test]
    fn permissions_read_as_ls_shows_them() {
        assert_eq!(permissions(0o755), "rwxr-xr-x");
        assert_eq!(permissions(0o4755), "rwsr-xr-x");
        assert_eq!(permissions(0o2644), "rw-r-Sr--");
        assert_eq!(permissions(0o1777), "rwxrwxrwt");
        assert_eq!(permissions(0), "---------");
    }
}
