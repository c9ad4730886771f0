//! Repositories the agent keeps open (real API server, moto): a changed BSL or credential is
//! picked up without a restart, idle repositories are closed, one stalled repository holds up
//! no other, and a garbage collection that stops says so on the BSL.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{BSL, SOURCE_NS, World};
use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, Secret};
use ferry_api::k8s_openapi::api::events::v1::Event;
use ferry_mover::deletion::{SNAPSHOT_INFO_LABEL, forget_recorded};
use ferry_mover::space::{COLLECTION_STOPPED, LocationEvents};
use ferry_mover::{MoverError, RepositorySource};
use ferry_store::ObjectKey;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_changed_location_or_credential_is_used_without_a_restart() {
    let world = World::new("kept-changed").await;
    let cancel = CancellationToken::new();
    let source = world.source();
    let first = source.open(BSL, SOURCE_NS, &cancel).await.expect("open");
    assert_eq!(first.location, format!("s3://{}/velero/plugins/ferry/app", world.bucket));

    // The operator points the location at another prefix: the next CR uses it.
    world.patch_bsl(BSL, json!({ "objectStorage": { "prefix": "moved" } })).await;
    let moved = source.open(BSL, SOURCE_NS, &cancel).await.expect("open after the change");
    assert_eq!(moved.location, format!("s3://{}/moved/plugins/ferry/app", world.bucket));
    assert_ne!(
        moved.repo.config().repo_id,
        first.repo.config().repo_id,
        "a new repository at the new prefix"
    );
    // Velero validates the location every minute and writes its status (the CRD has no
    // status subresource, so the resourceVersion changes): the repository stays open.
    let bsls: Api<ferry_api::BackupStorageLocation> =
        Api::namespaced(world.client.clone(), &world.namespace);
    let validated =
        json!({ "status": { "phase": "Available", "lastValidationTime": "2026-11-28T08:00:00Z" } });
    bsls.patch(BSL, &PatchParams::default(), &Patch::Merge(&validated)).await.expect("status");
    let again = source.open(BSL, SOURCE_NS, &cancel).await.expect("open unchanged");
    assert_eq!(
        again.repo.config().repo_id,
        moved.repo.config().repo_id,
        "kept while nothing changed"
    );
    let (kept, before) =
        (again.in_use.as_ref().expect("kept"), moved.in_use.as_ref().expect("kept"));
    assert!(
        kept.same_repository(before),
        "the same open repository, not opened again after a status change"
    );

    // The credential secret changes (here: broken): the next open reads it, not a cached one.
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let broken = json!({ "stringData": { "cloud": "[default]\naws_access_key_id = t\n" } });
    secrets
        .patch("cloud-credentials", &PatchParams::default(), &Patch::Merge(&broken))
        .await
        .expect("patch secret");
    let err = source.open(BSL, SOURCE_NS, &cancel).await.expect_err("broken credential");
    assert!(matches!(err, MoverError::Secret { .. }), "{err:?}");
    assert!(err.to_string().contains("aws_secret_access_key"), "{err}");
}

#[tokio::test]
async fn repositories_unused_for_the_idle_time_are_closed() {
    let world = World::new("kept-idle").await;
    let cancel = CancellationToken::new();
    let kept = world.source();
    kept.open(BSL, "one", &cancel).await.expect("open one");
    kept.open(BSL, "two", &cancel).await.expect("open two");
    assert_eq!(kept.open_count(), 2, "both kept within the idle time");

    let closing = world.source().with_idle_close(Duration::ZERO);
    closing.open(BSL, "one", &cancel).await.expect("open one");
    assert_eq!(closing.open_count(), 1);
    closing.open(BSL, "two", &cancel).await.expect("open two");
    assert_eq!(closing.open_count(), 1, "one closed when the next open found it idle");
    let reopened = closing.open(BSL, "one", &cancel).await.expect("open one again");
    assert!(reopened.repo.snapshots(&cancel).await.expect("list").is_empty(), "opens again");
}

/// A repository in use (a data movement longer than the idle time) is not closed under it,
/// so the next CR of its namespace reuses it instead of opening it a second time; once let go,
/// the idle closer closes it without waiting for another CR.
#[tokio::test]
async fn a_repository_in_use_stays_open_and_closes_once_idle_without_a_new_cr() {
    let world = World::new("kept-in-use").await;
    let cancel = CancellationToken::new();
    let source = std::sync::Arc::new(world.source().with_idle_close(Duration::ZERO));
    let using = source.open(BSL, "one", &cancel).await.expect("open one");
    assert!(using.in_use.is_some(), "a kept repository is handed out in use");
    source.open(BSL, "two", &cancel).await.expect("open two");
    assert_eq!(source.open_count(), 2, "the one in use was not closed as idle");
    let again = source.open(BSL, "one", &cancel).await.expect("open one again");
    assert_eq!(again.repo.key_files_tried(), using.repo.key_files_tried(), "the same handle");
    drop((using, again));

    let closer = source.spawn_idle_closer(cancel.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while source.open_count() > 0 {
        assert!(std::time::Instant::now() < deadline, "idle repositories stay open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    closer.await.expect("the closer ends on cancel");
}

/// The idle time of a repository counts from when its last user let go, not from its open.
#[tokio::test]
async fn the_idle_time_starts_when_the_last_user_lets_go() {
    let world = World::new("kept-idle-clock").await;
    let cancel = CancellationToken::new();
    let idle = Duration::from_millis(300);
    let source = world.source().with_idle_close(idle);
    let using = source.open(BSL, SOURCE_NS, &cancel).await.expect("open");
    tokio::time::sleep(idle + Duration::from_millis(100)).await;
    source.close_idle();
    assert_eq!(source.open_count(), 1, "in use: kept");
    drop(using);
    source.close_idle();
    assert_eq!(source.open_count(), 1, "just let go: its idle time starts now");
    tokio::time::sleep(idle + Duration::from_millis(100)).await;
    source.close_idle();
    assert_eq!(source.open_count(), 0, "idle since it was let go: closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_repository_holds_up_no_other() {
    let world = World::new("kept-stalled").await;
    // An "S3 server" that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    world.add_bsl("silent", &endpoint).await;
    let source = std::sync::Arc::new(world.source());
    let cancel = CancellationToken::new();

    let stalled = tokio::spawn({
        let (source, cancel) = (std::sync::Arc::clone(&source), cancel.clone());
        async move { source.open("silent", SOURCE_NS, &cancel).await.map(|_| ()) }
    });
    // Wait until the stalled open is inside its network call.
    let (held, _) = tokio::time::timeout(Duration::from_secs(30), silent.accept())
        .await
        .expect("the stalled open connects within 30 s")
        .expect("accept");

    let other = tokio::time::timeout(Duration::from_secs(60), source.open(BSL, SOURCE_NS, &cancel))
        .await
        .expect("another repository opens while one is stalled")
        .expect("open");
    assert!(other.location.ends_with("/plugins/ferry/app"), "{}", other.location);
    assert!(!stalled.is_finished(), "the stalled open is still waiting on its server");

    cancel.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(30), stalled).await;
    drop(held);
    assert!(ended.expect("cancel ends the stalled open").expect("join").is_err());
}

/// A snapshot of twenty files of 40 kB in `repo`.
async fn twenty_files_backed_up(
    repo: &ferry_repo::Repository,
    cancel: &CancellationToken,
) -> ferry_repo::BackupSummary {
    let src = tempfile::tempdir().expect("tempdir");
    for n in 0..20u8 {
        std::fs::write(src.path().join(format!("f{n}")), vec![n; 40_000]).expect("write");
    }
    let options = ferry_repo::BackupOptions::default();
    ferry_repo::backup_tree(repo, src.path(), &options, None, cancel).await.expect("backup")
}

#[tokio::test]
async fn a_collection_that_stops_says_why_on_the_location() {
    let world = World::new("kept-gc-stop").await;
    let cancel = CancellationToken::new();
    let source = world.source();
    let opened = source.open(BSL, SOURCE_NS, &cancel).await.expect("open");
    twenty_files_backed_up(&opened.repo, &cancel).await;

    // The index is lost (a hostile or broken bucket): the snapshot's data is in packs no
    // index names. Collecting now would delete them as orphans; gc must stop instead.
    let store = world.store("velero/plugins/ferry/app").await;
    let index: Vec<_> = store.list("index/", &cancel).await.expect("list index");
    assert!(!index.is_empty());
    for meta in &index {
        store.delete(&meta.key, &cancel).await.expect("delete index file");
    }
    let packs_before = store.list("data/", &cancel).await.expect("list data").len();

    let fresh = world.source();
    let mut pending = BTreeSet::from([(BSL.to_owned(), SOURCE_NS.to_owned())]);
    let uncollected = ferry_mover::upload_finalizer::collect(&mut pending, &fresh, &cancel).await;
    assert_eq!(pending.len(), 1, "still pending");
    let [stop] = uncollected.as_slice() else { panic!("one repository: {uncollected:?}") };
    assert!(stop.stopped, "{stop:?}");
    assert!(stop.reason.contains("missing from the index"), "{}", stop.reason);
    let packs_after = store.list("data/", &cancel).await.expect("list data").len();
    assert_eq!(packs_after, packs_before, "no pack deleted");

    LocationEvents::new(world.client.clone(), &world.namespace, "node-a").uncollected(stop).await;
    let events: Api<Event> = Api::namespaced(world.client.clone(), &world.namespace);
    let listed = events.list(&ListParams::default()).await.expect("events");
    let event = listed
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some(COLLECTION_STOPPED))
        .expect("a GarbageCollectionStopped event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let regarding = event.regarding.as_ref().expect("regarding");
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("BackupStorageLocation"), Some(BSL))
    );
    let note = event.note.as_deref().unwrap_or_default();
    assert!(note.contains("deleted nothing") && note.contains("ferry check"), "{note}");
}

/// A deleted backup's record (written by Ferry's delete action) stays until a collection that
/// started after the forget has run: while another collector holds the repository's lock
/// (the DataUpload finalizer forgets too) the snapshot is forgotten but the record kept, and
/// the next round collects the space and deletes the record.
#[tokio::test]
async fn a_deleted_backups_record_stays_until_its_space_is_collected() {
    let world = World::new("kept-gc-record").await;
    let cancel = CancellationToken::new();
    let source = world.source();
    let opened = source.open(BSL, SOURCE_NS, &cancel).await.expect("open");
    let summary = twenty_files_backed_up(&opened.repo, &cancel).await;
    let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), &world.namespace);
    let record: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "du-1-ferry-info", "namespace": world.namespace,
                      "labels": { SNAPSHOT_INFO_LABEL: "true" } },
        "data": { "backupStorageLocation": BSL, "volumeNamespace": SOURCE_NS,
                  "snapshotID": summary.snapshot_id.to_string(), "datamover": "ferry" },
    }))
    .expect("record");
    maps.create(&PostParams::default(), &record).await.expect("create record");

    // Another collector's live lease on the repository's lock (its documented key form:
    // holder, then expiry in Unix seconds).
    let store = world.store("velero/plugins/ferry/app").await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    let expires = now.as_secs() + 120;
    let lock = ObjectKey::new(format!("gc/lock-{}-{expires:020}", "ab".repeat(16))).expect("key");
    store.put_if_absent(&lock, "another collector".into(), &cancel).await.expect("lease");
    let packs_before = store.list("data/", &cancel).await.expect("list data").len();
    assert!(packs_before > 0);

    let round = forget_recorded(&world.client, &world.namespace, "ferry", &source, &cancel)
        .await
        .expect("round");
    assert_eq!(round.forgotten, 1, "{round:?}");
    let [held] = round.uncollected.as_slice() else { panic!("one repository: {round:?}") };
    assert!(!held.stopped, "a held lock is a wait: {held:?}");
    assert!(maps.get_opt("du-1-ferry-info").await.expect("get").is_some(), "record kept");
    assert!(opened.repo.snapshots(&cancel).await.expect("list").is_empty(), "forgotten");
    let packs_held = store.list("data/", &cancel).await.expect("list data").len();
    assert_eq!(packs_held, packs_before, "nothing collected under another's lock");

    // The other collector is done: the next round finds the snapshot gone, collects, and
    // deletes the record.
    store.delete(&lock, &cancel).await.expect("release");
    let round = forget_recorded(&world.client, &world.namespace, "ferry", &source, &cancel)
        .await
        .expect("round");
    assert!(round.uncollected.is_empty() && round.failed.is_empty(), "{round:?}");
    assert!(maps.get_opt("du-1-ferry-info").await.expect("get").is_none(), "record deleted");
    let packs_after = store.list("data/", &cancel).await.expect("list data").len();
    assert!(packs_after < packs_before, "{packs_after} of {packs_before} packs left");
}

#[tokio::test]
async fn a_closed_repository_opens_again_with_one_key_derivation() {
    let world = World::new("kept-hint").await;
    let cancel = CancellationToken::new();
    let source = world.source().with_idle_close(Duration::ZERO);
    let first = source.open(BSL, SOURCE_NS, &cancel).await.expect("create");
    // Other keys (other tools, old passwords): each costs a derivation when tried.
    for n in 0..5 {
        let password = format!("another password number {n}");
        let kdf = ferry_repo::KdfParams::insecure_for_tests();
        first.repo.add_password(password.as_bytes(), kdf, &cancel).await.expect("add key");
    }
    drop(first);
    // The next open closes the idle one; opening it again tries the key that opened it first.
    source.open(BSL, "other", &cancel).await.expect("open another");
    assert_eq!(source.open_count(), 1, "the first repository was closed");
    let again = source.open(BSL, SOURCE_NS, &cancel).await.expect("open again");
    assert_eq!(again.repo.key_files_tried(), 1, "six keys, one derivation");
}
