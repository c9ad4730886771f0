//! The flags Velero passes to its plugins, read leniently.
//!
//! Velero starts every plugin binary with the flags its own server was started with
//! (`--log-level debug --features=EnableCSI --uploader-type=kopia ...`), which a plugin knows
//! nothing about in general. A plugin must therefore accept any flag. [`HostArgs::parse`]
//! picks out the two worth honouring and never fails.

use std::ffi::OsString;

/// What a plugin may take from the command line Velero gave it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostArgs {
    /// `--log-level`: Velero's level name (`panic`, `fatal`, `error`, `warning`, `info`,
    /// `debug`, `trace`), as given.
    pub log_level: Option<String>,
    /// `--features`: Velero's feature flags, comma-separated on the command line.
    pub features: Vec<String>,
    /// Every other argument, in order, untouched.
    pub ignored: Vec<OsString>,
}

impl HostArgs {
    /// Reads `args` (without the program name, e.g. `std::env::args_os().skip(1)`). Accepts
    /// `--flag value`, `--flag=value` and the single-dash forms, as Go's flag parsers do; the
    /// last `--log-level` wins, `--features` accumulate.
    pub fn parse<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let mut out = Self::default();
        let mut args = args.into_iter().map(Into::into);
        while let Some(arg) = args.next() {
            let Some(text) = arg.to_str() else {
                out.ignored.push(arg);
                continue;
            };
            let name = text.trim_start_matches('-');
            let dashes = text.len() - name.len();
            if dashes == 0 || dashes > 2 {
                out.ignored.push(arg);
                continue;
            }
            let (flag, inline) = match name.split_once('=') {
                Some((flag, value)) => (flag, Some(value.to_owned())),
                None => (name, None),
            };
            if flag != "log-level" && flag != "features" {
                out.ignored.push(arg);
                continue;
            }
            // Like Go's flag parsers, a value-taking flag without `=` takes the next argument
            // whatever it looks like.
            let value = match inline {
                Some(value) => value,
                None => match args.next() {
                    Some(next) => next.to_string_lossy().into_owned(),
                    None => String::new(),
                },
            };
            if flag == "log-level" {
                out.log_level = Some(value);
            } else {
                out.features.extend(
                    value.split(',').map(str::trim).filter(|f| !f.is_empty()).map(Into::into),
                );
            }
        }
        out
    }

    /// The `tracing` level matching `--log-level`, if it names one of Velero's levels.
    pub fn tracing_level(&self) -> Option<tracing::Level> {
        match self.log_level.as_deref()?.to_ascii_lowercase().as_str() {
            "panic" | "fatal" | "error" => Some(tracing::Level::ERROR),
            "warning" | "warn" => Some(tracing::Level::WARN),
            "info" => Some(tracing::Level::INFO),
            "debug" => Some(tracing::Level::DEBUG),
            "trace" => Some(tracing::Level::TRACE),
            _ => None,
        }
    }

    /// Whether Velero's feature flag `feature` is on.
    pub fn has_feature(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_velero_server_flags_and_keeps_the_rest() {
        let a = HostArgs::parse([
            "--log-level",
            "debug",
            "--features=EnableCSI,EnableAPIGroupVersions",
            "--uploader-type=kopia",
            "-default-volumes-to-fs-backup",
            "positional",
        ]);
        assert_eq!(a.log_level.as_deref(), Some("debug"));
        assert_eq!(a.tracing_level(), Some(tracing::Level::DEBUG));
        assert_eq!(a.features, ["EnableCSI", "EnableAPIGroupVersions"]);
        assert!(a.has_feature("EnableCSI") && !a.has_feature("Other"));
        assert_eq!(
            a.ignored,
            ["--uploader-type=kopia", "-default-volumes-to-fs-backup", "positional"]
                .map(OsString::from)
        );
    }

    #[test]
    fn handles_empty_missing_and_odd_values() {
        let a = HostArgs::parse(["--features=", "-log-level=warning", "--features"]);
        assert!(a.features.is_empty());
        assert_eq!(a.tracing_level(), Some(tracing::Level::WARN));
        let b = HostArgs::parse(["--features", "--log-level", "info"]);
        assert_eq!(b.features, ["--log-level"]);
        assert_eq!(b.log_level, None);
        assert_eq!(b.ignored, [OsString::from("info")]);
        assert_eq!(HostArgs::parse(["---log-level=x"]).log_level, None);
        assert_eq!(HostArgs::parse(["--log-level=loud"]).tracing_level(), None);
        assert_eq!(HostArgs::parse(Vec::<String>::new()), HostArgs::default());
    }

    proptest! {
        #[test]
        fn never_fails_and_accounts_for_every_unknown_argument(
            args in prop::collection::vec("-{0,3}[a-z=,-]{0,12}", 0..12)
        ) {
            let parsed = HostArgs::parse(args.clone());
            let known = |a: &String| {
                let name = a.trim_start_matches('-');
                let flag = name.split('=').next().unwrap_or_default();
                (1..=2).contains(&(a.len() - name.len())) && (flag == "log-level" || flag == "features")
            };
            if !args.iter().any(known) {
                prop_assert_eq!(parsed.ignored, args.iter().map(OsString::from).collect::<Vec<_>>());
            }
        }
    }
}
