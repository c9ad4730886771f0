//! `ferry repo move`: a repository copied object by object to another location, proven to
//! open there, and only then removed from the old one.
//!
//! Safe to rerun after an interruption at any point: objects are created only where absent
//! (one already there must hold the same bytes), the `config` object (what makes a location
//! a repository) is copied last and deleted first, and the old objects are deleted only after
//! the new location opens with the password.

use std::sync::Arc;

use anyhow::{Context, bail};
use ferry_repo::{OpenOptions, Repository};
use ferry_store::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreError, StoreUrl};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cli::RepoArgs;
use crate::{password, repo_cmds};

/// The object whose presence makes a location a repository (FORMAT.md).
const CONFIG: &str = "config";
/// Objects copied or deleted at once.
const CONCURRENCY: usize = 8;

/// Every object at `store`; none when the location does not exist (yet).
async fn list_all(
    store: &dyn ObjectStore,
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<ObjectMeta>> {
    match store.list("", cancel).await {
        Ok(listed) => Ok(listed),
        Err(StoreError::LocationMissing { .. } | StoreError::NotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("listing {}", store.location())),
    }
}

/// Runs `work` on every key, at most [`CONCURRENCY`] at once; the first error stops the rest.
/// Returns the sum of the results.
async fn for_each_key<F, Fut>(keys: Vec<ObjectKey>, work: F) -> anyhow::Result<u64>
where
    F: Fn(ObjectKey) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send + 'static,
{
    let mut running = JoinSet::new();
    let mut sum = 0;
    for key in keys {
        if running.len() >= CONCURRENCY
            && let Some(done) = running.join_next().await
        {
            sum += done.context("copy task")??;
        }
        running.spawn(work(key));
    }
    while let Some(done) = running.join_next().await {
        sum += done.context("copy task")??;
    }
    Ok(sum)
}

/// Copies one object unless the same bytes are there already. Returns the bytes copied.
async fn copy_one(
    from: Arc<dyn ObjectStore>,
    to: Arc<dyn ObjectStore>,
    key: ObjectKey,
    cancel: CancellationToken,
) -> anyhow::Result<u64> {
    let (key, cancel) = (&key, &cancel);
    let bytes = from.get(key, cancel).await.with_context(|| format!("reading {key}"))?;
    let len = bytes.len() as u64;
    match to
        .put_if_absent(key, bytes.clone(), cancel)
        .await
        .with_context(|| format!("writing {key} to {}", to.location()))?
    {
        PutOutcome::Created => Ok(len),
        PutOutcome::AlreadyExists => {
            let there = to.get(key, cancel).await.with_context(|| format!("reading {key} back"))?;
            if there != bytes {
                bail!(
                    "{key} exists at {} with other bytes than at {}: the destination holds \
                     another repository (or a damaged copy); nothing was deleted",
                    to.location(),
                    from.location()
                );
            }
            Ok(0)
        }
    }
}

/// Checks that `to_url` is neither `repo_url` nor inside it (or it inside `to_url`), and makes
/// a file destination's directory.
pub(crate) fn prepare_destination(repo_url: &str, to_url: &str) -> anyhow::Result<()> {
    if StoreUrl::parse(repo_url)? == StoreUrl::parse(to_url)? {
        bail!("--repo and --to are the same location");
    }
    let (a, b) = (repo_url.trim_end_matches('/'), to_url.trim_end_matches('/'));
    if a.starts_with(&format!("{b}/")) || b.starts_with(&format!("{a}/")) {
        bail!("--repo and --to are inside one another: choose a location beside it");
    }
    if let StoreUrl::File { root } = StoreUrl::parse(to_url)? {
        std::fs::create_dir_all(&root)
            .with_context(|| format!("creating directory {}", root.display()))?;
    }
    Ok(())
}

pub async fn move_repo(
    args: &RepoArgs,
    to_url: &str,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let password = password::read(args.password_file.as_deref())?;
    prepare_destination(&args.repo, to_url)?;
    let from = repo_cmds::open_store(args).await?;
    let to_args = RepoArgs { repo: to_url.to_owned(), ..args.clone() };
    let to = repo_cmds::open_store(&to_args).await?;
    // A repository under KMS opens only with its key wrapper.
    let opening =
        OpenOptions { key_wrapper: repo_cmds::key_wrapper(args).await?, ..OpenOptions::default() };

    let listed = list_all(&*from, cancel).await?;
    let config = ObjectKey::new(CONFIG)?;
    let has_config = listed.iter().any(|m| m.key == config);
    if has_config {
        // A wrong password fails here, before anything is copied.
        Repository::open_with(Arc::clone(&from), &password, &opening, cancel)
            .await
            .with_context(|| format!("opening repository {}", args.repo))?;
        // Another repository at the destination is refused before anything is copied.
        if to.head(&config, cancel).await?.is_some() {
            let (ours, theirs) = (from.get(&config, cancel).await?, to.get(&config, cancel).await?);
            if ours != theirs {
                bail!("{to_url} holds another repository (its config differs); nothing was copied");
            }
        }
    } else if listed.is_empty() {
        // Nothing left here: a finished move, or no repository at all.
        Repository::open_with(Arc::clone(&to), &password, &opening, cancel).await.with_context(
            || format!("{} holds nothing; and opening the repository at {to_url}", args.repo),
        )?;
        println!("{} is empty; the repository is at {to_url}", args.repo);
        return Ok(());
    } else if to.head(&config, cancel).await?.is_none() {
        bail!(
            "{} holds objects but no repository config, and {to_url} holds no repository: \
             not a repository (or one damaged); nothing was copied",
            args.repo
        );
    }
    // Everything but the config, then the config: the destination becomes a repository only
    // once whole.
    let (last, rest): (Vec<_>, Vec<_>) =
        listed.iter().map(|m| m.key.clone()).partition(|k| *k == config);
    let copy = |key| copy_one(Arc::clone(&from), Arc::clone(&to), key, cancel.clone());
    let mut copied = for_each_key(rest, copy).await?;
    for key in last {
        copied += copy(key).await?;
    }
    Repository::open_with(Arc::clone(&to), &password, &opening, cancel)
        .await
        .with_context(|| format!("opening the copy at {to_url}; nothing was deleted"))?;

    // The old location stops being a repository first, then the rest goes.
    if has_config {
        from.delete(&config, cancel).await.with_context(|| format!("deleting {config}"))?;
    }
    let others: Vec<_> = listed.iter().map(|m| m.key.clone()).filter(|k| *k != config).collect();
    for_each_key(others, |key| {
        let (from, cancel) = (Arc::clone(&from), cancel.clone());
        async move {
            from.delete(&key, &cancel).await.with_context(|| format!("deleting {key}"))?;
            Ok(0)
        }
    })
    .await?;
    println!(
        "moved {} objects ({copied} bytes copied) from {} to {to_url}; {} is empty",
        listed.len(),
        args.repo,
        args.repo
    );
    Ok(())
}
