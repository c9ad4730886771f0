//! The key commands: `repo key list|add|remove` and `repo passwd`. Each key file wraps the
//! repository's one master key under one password, so none of these rewrites any data.

use anyhow::Context;
use ferry_repo::{KdfParams, KeyInfo, RepoError};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cli::{NewPasswordArgs, RepoArgs};
use crate::password;
use crate::repo_cmds::open_repo_uncached;

#[derive(Serialize)]
struct KeyJson {
    id: String,
    current: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kdf: Option<KdfJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct KdfJson {
    algorithm: &'static str,
    memory_kib: u32,
    iterations: u32,
    parallelism: u32,
}

impl From<&KeyInfo> for KeyJson {
    fn from(key: &KeyInfo) -> Self {
        let (created, hostname, kdf, error) = match &key.file {
            Ok(d) => (
                Some(
                    jiff::Timestamp::from_second(d.created_unix)
                        .map_or_else(|_| d.created_unix.to_string(), |t| t.to_string()),
                ),
                Some(d.hostname.clone()),
                Some(KdfJson {
                    algorithm: "argon2id",
                    memory_kib: d.kdf.memory_kib,
                    iterations: d.kdf.iterations,
                    parallelism: d.kdf.parallelism,
                }),
                None,
            ),
            Err(e) => (None, None, None, Some(e.clone())),
        };
        Self { id: key.id.to_string(), current: key.current, created, hostname, kdf, error }
    }
}

pub async fn list(args: &RepoArgs, json: bool, cancel: &CancellationToken) -> anyhow::Result<()> {
    let repo = open_repo_uncached(args, cancel).await?;
    let keys = repo.key_files(cancel).await.context("listing key files")?;
    let rows: Vec<KeyJson> = keys.iter().map(KeyJson::from).collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("  {:<16} {:<20} {:<20} kdf", "id", "created", "hostname");
    for row in rows {
        let mark = if row.current { '*' } else { ' ' };
        let id = &row.id[..16.min(row.id.len())];
        match (&row.kdf, &row.error) {
            (Some(kdf), _) => println!(
                "{mark} {id:<16} {:<20} {:<20} argon2id m={} KiB t={} p={}",
                row.created.as_deref().unwrap_or("-"),
                row.hostname.as_deref().unwrap_or("-"),
                kdf.memory_kib,
                kdf.iterations,
                kdf.parallelism
            ),
            (None, error) => println!("{mark} {id:<16} {}", error.as_deref().unwrap_or("-")),
        }
    }
    Ok(())
}

pub async fn add(
    args: &RepoArgs,
    new_password: &NewPasswordArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let new = password::read_new(new_password.new_password_file.as_deref())?;
    let repo = open_repo_uncached(args, cancel).await?;
    let id =
        repo.add_password(&new, KdfParams::default(), cancel).await.context("adding a key file")?;
    eprintln!("added key {id}: the new password opens {} too", args.repo);
    println!("{id}");
    Ok(())
}

pub async fn remove(
    args: &RepoArgs,
    key_id: &str,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let repo = open_repo_uncached(args, cancel).await?;
    let id = repo.find_key(key_id, cancel).await?;
    repo.remove_key(&id, cancel).await.with_context(|| format!("removing key {id}"))?;
    println!("removed key {id}");
    Ok(())
}

pub async fn passwd(
    args: &RepoArgs,
    new_password: &NewPasswordArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let new = password::read_new(new_password.new_password_file.as_deref())?;
    if new == password::read(args.password_file.as_deref())? {
        anyhow::bail!("the new password is the same as the current one");
    }
    let repo = open_repo_uncached(args, cancel).await?;
    let old = repo.key_id();
    match repo.change_password(&new, KdfParams::default(), cancel).await {
        Ok(id) => {
            println!("changed the password: key {id} replaces key {old}");
            Ok(())
        }
        Err(e) => {
            let hint = match &e {
                RepoError::OldKeyKept { .. } => format!(
                    "remove the old key with `ferry repo key remove {old}` and the new password"
                ),
                RepoError::NewKeyLeft { new, .. } => format!(
                    "changing the password: remove the unchecked key with `ferry repo key \
                     remove {new}`"
                ),
                _ => "changing the password (nothing changed)".to_owned(),
            };
            Err(anyhow::Error::new(e).context(hint))
        }
    }
}
