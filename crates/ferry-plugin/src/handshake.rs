//! go-plugin's process handshake, plugin side.
//!
//! The host starts the plugin with environment variables: the magic cookie
//! (`VELERO_PLUGIN=hello` for Velero), the plugin protocol versions it speaks
//! (`PLUGIN_PROTOCOL_VERSIONS`, Velero: `2`), the TCP port range (`PLUGIN_MIN_PORT`,
//! `PLUGIN_MAX_PORT`: used by go-plugin only where there are no Unix sockets, so not here), and
//! optionally where and for which group to create the Unix socket (`PLUGIN_UNIX_SOCKET_DIR`,
//! `PLUGIN_UNIX_SOCKET_GROUP`), automatic mutual TLS (`PLUGIN_CLIENT_CERT`) and broker
//! multiplexing (`PLUGIN_MULTIPLEX_GRPC`). Ferry's own host adds `FERRY_PLUGIN_EXTRA_KINDS`,
//! the plugin kinds beyond Velero's it understands (see [`PluginKind::is_velero_kind`]). The plugin answers with one line on stdout:
//! `CORE|APP|NETWORK|ADDRESS|PROTOCOL`, here `1|2|unix|/tmp/ferry-plugin-XXXX/plugin.sock|grpc`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::errors::ServeError;
use crate::kind::PluginKind;

/// The environment variable holding the magic cookie.
pub const MAGIC_COOKIE_KEY: &str = "VELERO_PLUGIN";
/// The magic cookie's value.
pub const MAGIC_COOKIE_VALUE: &str = "hello";
/// go-plugin's core protocol version.
pub const CORE_PROTOCOL_VERSION: u32 = 1;
/// Velero's plugin protocol version.
pub const APP_PROTOCOL_VERSION: u32 = 2;

/// What the plugin host asked for in the environment, once checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    /// `PLUGIN_UNIX_SOCKET_DIR`: where to create the socket's directory (default: the system
    /// temporary directory).
    pub socket_parent: Option<PathBuf>,
    /// `PLUGIN_UNIX_SOCKET_GROUP`: a group name or ID to give write access to the socket.
    pub socket_group: Option<String>,
    /// `PLUGIN_MULTIPLEX_GRPC` was set. This server does not multiplex its broker, and says so
    /// in the handshake line so that a host requiring it fails with a precise error.
    pub multiplex_requested: bool,
    /// `FERRY_PLUGIN_EXTRA_KINDS` (comma-separated kind names): the kinds beyond Velero's that
    /// the host understands and wants listed by `ListPlugins`. Velero never sets it.
    pub extra_kinds: Vec<PluginKind>,
}

impl HostEnv {
    /// Whether `ListPlugins` may name plugins of `kind` to this host.
    pub fn lists(&self, kind: PluginKind) -> bool {
        kind.is_velero_kind() || self.extra_kinds.contains(&kind)
    }
}

impl HostEnv {
    /// Checks the environment as read through `lookup` (a variable's value, `None` when unset).
    ///
    /// # Errors
    ///
    /// [`ServeError::NotLaunchedByVelero`] without the magic cookie,
    /// [`ServeError::UnsupportedProtocolVersion`] when `PLUGIN_PROTOCOL_VERSIONS` is set and
    /// does not list version 2, [`ServeError::MutualTlsUnsupported`] when `PLUGIN_CLIENT_CERT`
    /// is set.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ServeError> {
        if lookup(MAGIC_COOKIE_KEY).as_deref() != Some(MAGIC_COOKIE_VALUE) {
            return Err(ServeError::NotLaunchedByVelero);
        }
        // An unset or empty list is a host that predates version negotiation; go-plugin serves
        // such a host its own version and lets it complain, and so does this server. Entries
        // that are not numbers are skipped, as go-plugin does.
        if let Some(offered) = lookup("PLUGIN_PROTOCOL_VERSIONS").filter(|v| !v.is_empty()) {
            let speaks_ours =
                offered.split(',').any(|v| v.parse::<u32>() == Ok(APP_PROTOCOL_VERSION));
            if !speaks_ours {
                return Err(ServeError::UnsupportedProtocolVersion { offered });
            }
        }
        if lookup("PLUGIN_CLIENT_CERT").is_some_and(|c| !c.is_empty()) {
            return Err(ServeError::MutualTlsUnsupported);
        }
        let non_empty = |key: &str| lookup(key).filter(|v| !v.is_empty());
        Ok(Self {
            socket_parent: non_empty("PLUGIN_UNIX_SOCKET_DIR").map(PathBuf::from),
            socket_group: non_empty("PLUGIN_UNIX_SOCKET_GROUP"),
            multiplex_requested: non_empty("PLUGIN_MULTIPLEX_GRPC").is_some(),
            extra_kinds: non_empty("FERRY_PLUGIN_EXTRA_KINDS")
                .map(|kinds| {
                    kinds.split(',').filter_map(|k| PluginKind::from_name(k.trim())).collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// Checks that this process was launched by Velero, from the process environment. Call it
/// first thing in a plugin binary to exit with a clear message when someone runs it by hand;
/// [`crate::PluginServer::serve`] checks again.
///
/// # Errors
///
/// As [`HostEnv::from_lookup`].
pub fn check_environment() -> Result<HostEnv, ServeError> {
    HostEnv::from_lookup(|key| std::env::var(key).ok())
}

/// The handshake line for a plugin listening on the Unix socket `socket` (without the newline).
///
/// go-plugin's own servers add a sixth field, the server's TLS certificate, which is empty
/// without automatic mutual TLS; hosts treat a missing and an empty sixth field alike. When the
/// host asked for broker multiplexing, a seventh field says it is not supported.
pub fn handshake_line(socket: &Path, multiplex_requested: bool) -> String {
    let mut line =
        format!("{CORE_PROTOCOL_VERSION}|{APP_PROTOCOL_VERSION}|unix|{}|grpc", socket.display());
    if multiplex_requested {
        line.push_str("||false");
    }
    line
}

/// Writes the handshake line to stdout and flushes it.
pub(crate) fn announce(line: &str) -> Result<(), ServeError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|source| ServeError::Handshake { source })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<HostEnv, ServeError> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        HostEnv::from_lookup(|k| vars.get(k).cloned())
    }

    #[test]
    fn requires_the_magic_cookie() {
        assert!(matches!(env(&[]), Err(ServeError::NotLaunchedByVelero)));
        assert!(matches!(env(&[("VELERO_PLUGIN", "bye")]), Err(ServeError::NotLaunchedByVelero)));
        assert_eq!(env(&[("VELERO_PLUGIN", "hello")]).unwrap(), HostEnv::default());
    }

    #[test]
    fn requires_protocol_version_2_when_the_host_lists_versions() {
        let ok = |v: &str| env(&[("VELERO_PLUGIN", "hello"), ("PLUGIN_PROTOCOL_VERSIONS", v)]);
        assert!(ok("2").is_ok());
        assert!(ok("1,2,3").is_ok());
        assert!(ok("x,2").is_ok());
        assert!(ok("").is_ok());
        for bad in ["1", "3,4", "two", " 2"] {
            match ok(bad) {
                Err(ServeError::UnsupportedProtocolVersion { offered }) => assert_eq!(offered, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn reads_socket_options_and_refuses_mutual_tls() {
        let e = env(&[
            ("VELERO_PLUGIN", "hello"),
            ("PLUGIN_MIN_PORT", "10000"),
            ("PLUGIN_MAX_PORT", "25000"),
            ("PLUGIN_UNIX_SOCKET_DIR", "/run/plugins"),
            ("PLUGIN_UNIX_SOCKET_GROUP", "velero"),
            ("PLUGIN_MULTIPLEX_GRPC", "true"),
        ])
        .unwrap();
        assert_eq!(e.socket_parent.as_deref(), Some(Path::new("/run/plugins")));
        assert_eq!(e.socket_group.as_deref(), Some("velero"));
        assert!(e.multiplex_requested);
        assert!(e.extra_kinds.is_empty());
        assert!(
            !e.lists(PluginKind::VolumeSnapshotterV2) && e.lists(PluginKind::VolumeSnapshotter)
        );
        let ferry = env(&[
            ("VELERO_PLUGIN", "hello"),
            ("FERRY_PLUGIN_EXTRA_KINDS", "VolumeSnapshotterV2, Unknown"),
        ])
        .unwrap();
        assert_eq!(ferry.extra_kinds, [PluginKind::VolumeSnapshotterV2]);
        assert!(ferry.lists(PluginKind::VolumeSnapshotterV2));
        let tls = env(&[("VELERO_PLUGIN", "hello"), ("PLUGIN_CLIENT_CERT", "-----BEGIN")]);
        assert!(matches!(tls, Err(ServeError::MutualTlsUnsupported)));
    }

    #[test]
    fn formats_the_handshake_line() {
        let socket = Path::new("/tmp/ferry-plugin-a1/plugin.sock");
        assert_eq!(handshake_line(socket, false), "1|2|unix|/tmp/ferry-plugin-a1/plugin.sock|grpc");
        assert_eq!(
            handshake_line(socket, true),
            "1|2|unix|/tmp/ferry-plugin-a1/plugin.sock|grpc||false"
        );
    }
}
