//! Changed-block tracking on the real node: the hostpath driver's SnapshotMetadata service
//! behind the `csi-snapshot-metadata` sidecar (external-snapshot-metadata, built from its
//! release in the third-party folder), with a TLS certificate of its own and the cluster-scoped
//! `SnapshotMetadataService` object that tells clients where it is.
//!
//! Each node runs its own sidecar beside its own driver, listening at
//! [`super::NODE_IP`]`:`[`PORT`] inside the node's network namespace: every node has that
//! address, so the one object serves every node, and a pod reaches the sidecar of its own node
//! (the hostpath driver's snapshots live on one node's disk).

use std::path::{Path, PathBuf};

use anyhow::Context;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::{DRIVER, NODE_IP, make_dir, write_file};

/// The sidecar's gRPC port on every node.
pub const PORT: u16 = 6444;
/// The audience a client's token must be scoped to.
pub const AUDIENCE: &str = "ferry-testbed-snapshot-metadata";
/// The CRD's file, extracted from the sidecar's release by `scripts/build-realnode.sh`.
const CRD_FILE: &str = "cbt.storage.k8s.io_snapshotmetadataservices.yaml";

/// The sidecar's certificate and key files, and the CA that signed them.
#[derive(Debug)]
pub struct Tls {
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The authority's certificate (PEM), published in the `SnapshotMetadataService`.
    pub ca_pem: String,
}

impl Tls {
    /// A new CA and a server certificate for [`NODE_IP`], written under `dir`.
    ///
    /// # Errors
    /// Key generation, signing or writing failed.
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Ferry test bed snapshot-metadata CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).context("signing the CA")?;
        let mut params = CertificateParams::new(vec![NODE_IP.to_owned()])
            .context("the sidecar's certificate names")?;
        params.distinguished_name.push(DnType::CommonName, "csi-snapshot-metadata");
        params.key_usages =
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().context("generating the sidecar's key")?;
        let cert = params.signed_by(&key, &ca).context("signing the sidecar's certificate")?;
        let dir = dir.join("snapshot-metadata");
        make_dir(&dir)?;
        let tls = Self { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca_pem: ca.pem() };
        write_file(&tls.cert, cert.pem())?;
        write_file(&tls.key, key.serialize_pem())?;
        Ok(tls)
    }

    /// The sidecar's arguments on a node whose driver listens at `csi_socket`.
    #[must_use]
    pub fn sidecar_args(&self, csi_socket: &Path, kubeconfig: &Path) -> Vec<String> {
        vec![
            format!("--csi-address={}", csi_socket.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--port={PORT}"),
            format!("--tls-cert={}", self.cert.display()),
            format!("--tls-key={}", self.key.display()),
            // Health and metrics on the node's loopback, on any free port.
            "--http-endpoint=127.0.0.1:0".into(),
            "--v=2".into(),
        ]
    }

    /// The `SnapshotMetadataService` object for the hostpath driver.
    #[must_use]
    pub fn service_object(&self) -> serde_json::Value {
        let ca = k8s_openapi::ByteString(self.ca_pem.clone().into_bytes());
        serde_json::json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": DRIVER},
            "spec": {
                "address": format!("{NODE_IP}:{PORT}"),
                "audience": AUDIENCE,
                "caCert": ca,
            }
        })
    }
}

/// The `SnapshotMetadataService` CRD of the sidecar's release.
///
/// # Errors
/// `scripts/build-realnode.sh` did not extract it, or it is not a CRD.
pub fn crd() -> anyhow::Result<CustomResourceDefinition> {
    let bin = crate::paths::realnode_bin()?;
    let file = bin.parent().unwrap_or(&bin).join("manifests").join(CRD_FILE);
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!("reading {} (scripts/build-realnode.sh extracts it)", file.display())
    })?;
    serde_yaml::from_str(&text).with_context(|| format!("parsing {}", file.display()))
}
