//! The plugin's Unix socket, in a fresh temporary directory removed on exit.

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::Stream;
use tempfile::TempDir;
use tokio::net::{UnixListener, UnixStream};

use crate::errors::ServeError;
use crate::handshake::HostEnv;

/// The socket's file name inside its directory.
const SOCKET_NAME: &str = "plugin.sock";

/// The directory holding the socket; removing it removes the socket.
#[derive(Debug)]
pub(crate) struct SocketDir {
    dir: TempDir,
    socket: PathBuf,
}

impl SocketDir {
    /// Creates the directory under `PLUGIN_UNIX_SOCKET_DIR` (or the system temporary
    /// directory) and listens on a socket in it. Must run inside a Tokio runtime.
    pub(crate) fn bind(env: &HostEnv) -> Result<(Self, UnixListener), ServeError> {
        let parent = env.socket_parent.clone().unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("ferry-plugin-")
            .tempdir_in(&parent)
            .map_err(|source| ServeError::CreateSocketDir { parent, source })?;
        let socket = dir.path().join(SOCKET_NAME);
        let listener = UnixListener::bind(&socket)
            .map_err(|source| ServeError::Listen { path: socket.clone(), source })?;
        if let Some(group) = &env.socket_group {
            share_with_group(dir.path(), &socket, group).map_err(|source| {
                ServeError::SocketGroup { group: group.clone(), path: socket.clone(), source }
            })?;
        }
        Ok((Self { dir, socket }, listener))
    }

    /// The socket's path.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Removes the directory and the socket in it.
    pub(crate) fn remove(self) -> Result<(), ServeError> {
        let path = self.dir.path().to_owned();
        self.dir.close().map_err(|source| ServeError::RemoveSocketDir { path, source })
    }
}

/// Gives `group` (a name or a numeric ID) access to the socket, as go-plugin does for
/// `PLUGIN_UNIX_SOCKET_GROUP`: the socket becomes group-writable, its directory
/// group-searchable.
fn share_with_group(dir: &Path, socket: &Path, group: &str) -> io::Result<()> {
    let gid = match group.parse::<u32>() {
        Ok(gid) => gid,
        Err(_) => nix::unistd::Group::from_name(group)
            .map_err(io::Error::from)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such group"))?
            .gid
            .as_raw(),
    };
    std::os::unix::fs::chown(dir, None, Some(gid))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
    std::os::unix::fs::chown(socket, None, Some(gid))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
}

/// The connections accepted on `listener`. After a failed accept (out of file descriptors,
/// say) the stream waits a moment before the next, so a persistent failure cannot spin.
pub(crate) fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<UnixStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = match listener.accept().await {
            Ok((stream, _)) => Ok(stream),
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection on the plugin socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(e)
            }
        };
        Some((next, listener))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[tokio::test]
    async fn binds_in_a_fresh_directory_under_the_requested_parent_and_removes_it() {
        let parent = tempfile::tempdir().unwrap();
        let env = HostEnv { socket_parent: Some(parent.path().to_owned()), ..HostEnv::default() };
        let (dir, listener) = SocketDir::bind(&env).unwrap();
        let socket = dir.socket().to_owned();
        assert_eq!(socket.parent().and_then(Path::parent), Some(parent.path()));
        assert!(
            socket
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("ferry-plugin-")
        );
        let client = UnixStream::connect(&socket).await.unwrap();
        let (_accepted, _) = listener.accept().await.unwrap();
        drop(client);
        dir.remove().unwrap();
        assert!(!socket.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn shares_the_socket_with_a_group() {
        let parent = tempfile::tempdir().unwrap();
        let gid = nix::unistd::getgid().as_raw();
        let env = HostEnv {
            socket_parent: Some(parent.path().to_owned()),
            socket_group: Some(gid.to_string()),
            ..HostEnv::default()
        };
        let (dir, _listener) = SocketDir::bind(&env).unwrap();
        let meta = std::fs::metadata(dir.socket()).unwrap();
        assert_eq!(meta.gid(), gid);
        assert_eq!(meta.mode() & 0o777, 0o660);
        let no_group = HostEnv { socket_group: Some("no-such-group-ferry".into()), ..env };
        let err = SocketDir::bind(&no_group).unwrap_err();
        assert!(matches!(err, ServeError::SocketGroup { .. }), "{err:?}");
        dir.remove().unwrap();
    }

    #[test]
    fn reports_a_missing_parent_directory() {
        let env = HostEnv {
            socket_parent: Some(PathBuf::from("/nonexistent/ferry/sockets")),
            ..HostEnv::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = rt.block_on(async { SocketDir::bind(&env).map(|_| ()) }).unwrap_err();
        assert!(matches!(err, ServeError::CreateSocketDir { .. }), "{err:?}");
    }
}
