//! Reading Velero's BackupStorageLocation as an S3 location.

use std::collections::BTreeMap;

use base64::Engine as _;
use ferry_api::BackupStorageLocation;
use ferry_store::{ServerSideEncryption, StaticCredentials};
use kube::ResourceExt;

use crate::MoverError;

/// Where and how a BSL's objects are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BslLocation {
    /// The bucket.
    pub bucket: String,
    /// The BSL's prefix inside the bucket (may be empty).
    pub prefix: String,
    /// `config.region`.
    pub region: Option<String>,
    /// `config.s3Url`: a custom endpoint.
    pub endpoint: Option<String>,
    /// `config.s3ForcePathStyle`.
    pub force_path_style: bool,
    /// `config.profile`: the credentials file section.
    pub profile: String,
    /// The secret and key holding the credentials file: the BSL's `credential`, else
    /// Velero's default `cloud-credentials`/`cloud`.
    pub credential: (String, String),
    /// Whether the BSL names its credential (`spec.credential`): then a missing secret is an
    /// error, never a silent fall back to the node's own cloud identity.
    pub credential_named: bool,
    /// `objectStorage.caCert`, decoded: PEM certificates trusted for the endpoint in addition
    /// to the platform's roots.
    pub ca_cert: Option<Vec<u8>>,
    /// `objectStorage.caCertRef`: the Secret (in the BSL's namespace) and key holding the PEM
    /// certificates; when set it is used instead of `caCert`, as in Velero.
    pub ca_cert_ref: Option<(String, String)>,
    /// `config.kmsKeyId` (SSE-KMS with that key) or else `config.serverSideEncryption` (that
    /// algorithm), as Velero's AWS plugin asks for them on every object it writes.
    pub server_side_encryption: Option<ServerSideEncryption>,
}

/// Velero's default credentials secret and key.
const DEFAULT_CREDENTIAL: (&str, &str) = ("cloud-credentials", "cloud");

/// Reads an S3 location out of a BSL.
///
/// # Errors
/// [`MoverError::Location`] for providers other than AWS S3 (and S3-compatible servers), a
/// BSL without a bucket, or an `objectStorage.caCert` that is not base64.
pub fn location_of(bsl: &BackupStorageLocation) -> Result<BslLocation, MoverError> {
    let name = bsl.name_any();
    let fail = |reason: String| Err(MoverError::Location { name: name.clone(), reason });
    let provider = bsl.spec.provider.as_str();
    if !matches!(provider, "aws" | "velero.io/aws") {
        return fail(format!(
            "provider {provider:?} is not supported: Ferry stores data in S3 or an \
             S3-compatible server (provider aws)"
        ));
    }
    let storage = &bsl.spec.object_storage;
    if storage.bucket.is_empty() {
        return fail("objectStorage.bucket is empty".into());
    }
    let config = bsl.spec.config.clone().unwrap_or_default();
    let get = |key: &str| config.get(key).filter(|v| !v.is_empty()).cloned();
    let credential = bsl.spec.credential.as_ref().map_or_else(
        || (DEFAULT_CREDENTIAL.0.to_owned(), DEFAULT_CREDENTIAL.1.to_owned()),
        |c| (c.name.clone().unwrap_or_default(), c.key.clone()),
    );
    let ca_cert = match ca_cert(storage.ca_cert.as_deref()) {
        Ok(pem) => pem,
        Err(reason) => return fail(reason),
    };
    if get("customerKeyEncryptionFile").is_some() {
        return fail(
            "config.customerKeyEncryptionFile (SSE-C) is not supported by Ferry: its repository \
             is encrypted by Ferry itself; use serverSideEncryption or kmsKeyId for encryption \
             at rest by S3"
                .into(),
        );
    }
    let server_side_encryption = match (get("kmsKeyId"), get("serverSideEncryption")) {
        (Some(key), _) => Some(ServerSideEncryption::KmsKey(key)),
        (None, Some(algorithm)) => Some(ServerSideEncryption::Algorithm(algorithm)),
        (None, None) => None,
    };
    let ca_cert_ref =
        storage.ca_cert_ref.as_ref().map(|r| (r.name.clone().unwrap_or_default(), r.key.clone()));
    Ok(BslLocation {
        bucket: storage.bucket.clone(),
        prefix: storage.prefix.clone().unwrap_or_default(),
        region: get("region"),
        endpoint: get("s3Url"),
        force_path_style: get("s3ForcePathStyle").is_some_and(|v| v.eq_ignore_ascii_case("true")),
        profile: get("profile").unwrap_or_else(|| "default".into()),
        credential,
        credential_named: bsl.spec.credential.is_some(),
        ca_cert,
        ca_cert_ref,
        server_side_encryption,
    })
}

/// The PEM bytes of a caCert as Velero's API holds it (a Go `[]byte`, base64 in JSON); an
/// empty one is none. Line breaks are ignored, as Go's decoder does. Whether the PEM holds a
/// usable certificate is checked where the store is built.
fn ca_cert(encoded: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    let encoded: String =
        encoded.unwrap_or_default().chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if encoded.is_empty() {
        return Ok(None);
    }
    let pem = base64::engine::general_purpose::STANDARD.decode(&encoded).map_err(|e| {
        format!(
            "objectStorage.caCert is not base64 ({e}): it holds the PEM certificates \
             base64-encoded, as `base64 -w0 ca.pem` prints them"
        )
    })?;
    Ok(Some(pem))
}

/// Reads an AWS shared credentials file (the format of Velero's `cloud-credentials`) and
/// returns the keys of `profile`.
///
/// # Errors
/// A message naming what is missing.
pub fn aws_credentials(text: &str, profile: &str) -> Result<StaticCredentials, String> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let section = section.trim();
            current = section.strip_prefix("profile ").unwrap_or(section).trim().to_owned();
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            sections.entry(current.clone()).or_default().insert(k.trim().into(), v.trim().into());
        }
    }
    let Some(keys) = sections.get(profile) else {
        return Err(format!("no [{profile}] section"));
    };
    let need = |k: &str| keys.get(k).cloned().ok_or_else(|| format!("[{profile}] has no {k}"));
    Ok(StaticCredentials {
        access_key_id: need("aws_access_key_id")?,
        secret_access_key: need("aws_secret_access_key")?,
        session_token: keys.get("aws_session_token").cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_file_sections() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key=S\n\n\
                    [profile other]\naws_access_key_id=B\naws_secret_access_key=T\n\
                    aws_session_token = X\n";
        let d = aws_credentials(text, "default").expect("default");
        assert_eq!((d.access_key_id.as_str(), d.secret_access_key.as_str()), ("A", "S"));
        let o = aws_credentials(text, "other").expect("other");
        assert_eq!(o.session_token.as_deref(), Some("X"));
        assert!(aws_credentials(text, "nope").expect_err("missing").contains("[nope]"));
        let e = aws_credentials("[default]\naws_access_key_id=A\n", "default").expect_err("key");
        assert!(e.contains("aws_secret_access_key"), "{e}");
    }

    fn bsl(provider: &str, config: &[(&str, &str)]) -> BackupStorageLocation {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
            "metadata": { "name": "default", "namespace": "velero" },
            "spec": {
                "provider": provider,
                "objectStorage": { "bucket": "b", "prefix": "p" },
                "config": config.iter().cloned().collect::<BTreeMap<_, _>>(),
            },
        }))
        .expect("bsl")
    }

    fn bsl_with_ca(ca_cert: &str) -> BackupStorageLocation {
        let mut bsl = bsl("aws", &[("s3Url", "https://s3.example:9000")]);
        bsl.spec.object_storage.ca_cert = Some(ca_cert.to_owned());
        bsl
    }

    #[test]
    fn ca_certs_are_decoded_from_base64() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let encoded = base64::engine::general_purpose::STANDARD.encode(pem);
        let l = location_of(&bsl_with_ca(&encoded)).expect("base64");
        assert_eq!(l.ca_cert.as_deref(), Some(pem.as_bytes()));
        // Wrapped as `base64` prints it without -w0.
        let (head, tail) = encoded.split_at(20);
        let l = location_of(&bsl_with_ca(&format!("{head}\n{tail}\n"))).expect("wrapped");
        assert_eq!(l.ca_cert.as_deref(), Some(pem.as_bytes()));
        assert_eq!(location_of(&bsl_with_ca("")).expect("empty").ca_cert, None);
        assert_eq!(location_of(&bsl("aws", &[])).expect("absent").ca_cert, None);
    }

    #[test]
    fn a_ca_cert_that_is_not_base64_is_refused() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let err = location_of(&bsl_with_ca(pem)).expect_err("raw PEM");
        assert!(matches!(err, MoverError::Location { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("default"), "the BSL is not named: {message}");
        assert!(message.contains("objectStorage.caCert is not base64"), "{message}");
    }

    #[test]
    fn server_side_encryption_is_read_as_velero_reads_it() {
        let sse = |config: &[(&str, &str)]| {
            location_of(&bsl("aws", config)).map(|l| l.server_side_encryption)
        };
        assert_eq!(sse(&[]).expect("none"), None);
        assert_eq!(
            sse(&[("serverSideEncryption", "AES256")]).expect("sse-s3"),
            Some(ServerSideEncryption::Algorithm("AES256".into()))
        );
        assert_eq!(
            sse(&[("serverSideEncryption", "AES256"), ("kmsKeyId", "alias/k")]).expect("kms"),
            Some(ServerSideEncryption::KmsKey("alias/k".into())),
            "kmsKeyId wins, as in Velero"
        );
        let err = sse(&[("customerKeyEncryptionFile", "/k")]).expect_err("sse-c").to_string();
        assert!(err.contains("customerKeyEncryptionFile"), "{err}");
    }

    #[test]
    fn s3_locations_are_read_and_others_refused() {
        let l = location_of(&bsl(
            "aws",
            &[("region", "r"), ("s3Url", "http://127.0.0.1:9"), ("s3ForcePathStyle", "true")],
        ))
        .expect("aws");
        assert_eq!(l.bucket, "b");
        assert_eq!(l.prefix, "p");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert!(l.force_path_style);
        assert_eq!(l.credential, ("cloud-credentials".into(), "cloud".into()));
        let err = location_of(&bsl("gcp", &[])).expect_err("gcp").to_string();
        assert!(err.contains("\"gcp\"") && err.contains("default"), "{err}");
    }
}
