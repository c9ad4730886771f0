//! Secrets stay out of the agents' logs: with every crate logging at debug level, a backup and
//! its restore (both open the repository with the password, both reach S3 with the BSL's
//! keys) leave neither the repository password nor the S3 secret key in any agent's log.

use ferry_api::k8s_openapi::ByteString;
use ferry_api::k8s_openapi::api::core::v1::Secret;
use ferry_api::{DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase};
use ferry_sim::FsTree;
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::Api;

use crate::harness::{Setup, TestResult, World, dd_phase, du_phase};

/// Every agent's whole log.
fn all_logs(world: &World) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(world.logs.path()).into_iter().flatten().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            out.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_agent_logs_the_repository_password_or_the_s3_secret_even_at_debug() -> TestResult {
    let setup = Setup { log_filter: Some("debug"), ..Setup::default() };
    let world = World::start_with("e2e-secrets", setup).await?;
    let tree = FsTree::sample(3);
    let vs = world.volume_with_snapshot("data", "64Mi", &tree).await?;
    let du = world.create_data_upload("nightly", "data", &vs.name_any()).await?;
    let done = |d: &DataUpload| {
        matches!(du_phase(d), Some(DataUploadPhase::Completed | DataUploadPhase::Failed))
    };
    let du: DataUpload = world.wait_for(&du.name_any(), "terminal", done).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Completed), "{}", world.agent_logs());
    let dd = world.create_data_download("back", &world.ns, "restored", "64Mi", &du).await?;
    let done = |d: &DataDownload| {
        matches!(dd_phase(d), Some(DataDownloadPhase::Completed | DataDownloadPhase::Failed))
    };
    let dd: DataDownload = world.wait_for(&dd.name_any(), "terminal", done).await?;
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Completed), "{}", world.agent_logs());

    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let password = secrets
        .get(ferry_mover::PASSWORD_SECRET)
        .await?
        .data
        .and_then(|d| d.get(ferry_mover::PASSWORD_KEY).cloned())
        .ok_or("Ferry's password secret has no password")?;
    let as_text = String::from_utf8(password.0.clone())?;
    let as_base64 = serde_json::to_value(ByteString(password.0))?;
    let as_base64 = as_base64.as_str().unwrap_or_default().to_owned();
    assert!(as_text.len() >= 16, "a short password: {} bytes", as_text.len());

    let logs = all_logs(&world);
    // Debug logging was on: the agents said much more than at info level.
    assert!(logs.contains("DEBUG"), "no debug lines in the agents' logs");
    for (what, secret) in [
        ("the repository password", as_text.trim()),
        ("the repository password in base64", as_base64.as_str()),
        ("the S3 secret access key", "ferry-e2e-secret"),
    ] {
        if let Some(at) = logs.find(secret) {
            let line = logs[..at].rsplit('\n').next().unwrap_or_default();
            panic!("{what} is in an agent's log, in the line starting: {line:.200}");
        }
    }
    Ok(())
}
