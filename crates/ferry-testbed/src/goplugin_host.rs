//! `interop/goplugin-host`, the Go program that loads plugins with Velero's own plugin manager
//! over hashicorp/go-plugin. `scripts/build-velero.sh` builds it inside Velero's own build (the
//! same module graph, so it loads plugins with exactly the Velero code the tests run, and
//! compiles almost nothing of its own) and caches it beside `velero`.

use std::path::PathBuf;

use anyhow::bail;

/// The built Go host (building Velero and the host unless a build of the same versions and
/// sources is cached).
///
/// # Errors
/// When `scripts/build-velero.sh` fails, or the folder it gives (or `$FERRY_VELERO_BIN`) has
/// no `goplugin-host`.
pub fn build() -> anyhow::Result<PathBuf> {
    let dir = crate::velero::velero_dir()?;
    let host = dir.join("goplugin-host");
    if !host.is_file() {
        bail!(
            "{} has no goplugin-host: unset FERRY_VELERO_BIN, or point it at a folder \
             scripts/build-velero.sh built",
            dir.display()
        );
    }
    Ok(host)
}
