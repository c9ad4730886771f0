//! Installs CRDs (the shared fixtures', or any) and waits until they are served.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

use crate::paths;

const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Every CRD under the fixtures' `velero-crds/` and `snapshot-crds/`.
///
/// # Errors
/// A file is unreadable or not a CRD.
pub fn fixture_crds() -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let root = paths::fixtures_dir()?;
    let mut crds = Vec::new();
    for folder in ["velero-crds", "snapshot-crds"] {
        let mut files: Vec<_> = std::fs::read_dir(root.join(folder))
            .with_context(|| format!("reading {folder}"))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            let crd: CustomResourceDefinition = serde_yaml::from_str(&text)
                .with_context(|| format!("parsing {}", file.display()))?;
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Creates every fixture CRD and waits until each is Established.
///
/// # Errors
/// The API server refused a CRD or one did not become Established in time.
pub async fn install_all(client: &kube::Client) -> anyhow::Result<()> {
    install(client, &fixture_crds()?).await
}

/// Creates `crds` and waits until each is Established.
///
/// # Errors
/// The API server refused a CRD or one did not become Established in time.
pub async fn install(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        api.create(&PostParams::default(), crd).await.with_context(|| {
            format!("creating CRD {}", crd.metadata.name.as_deref().unwrap_or("?"))
        })?;
    }
    let deadline = Instant::now() + ESTABLISH_TIMEOUT;
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let current = api.get(&name).await?;
            let established = current
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                bail!("CRD {name} not Established after {ESTABLISH_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
