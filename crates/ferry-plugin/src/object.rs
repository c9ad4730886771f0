//! [`JsonObject`]: a Kubernetes object as Velero sends it (JSON bytes), decoded once.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why bytes are not the JSON of a Kubernetes object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// No bytes at all.
    #[error("empty; expected the JSON of a Kubernetes object")]
    Empty,
    /// Not valid JSON.
    #[error("invalid JSON")]
    Json(#[source] serde_json::Error),
    /// Valid JSON, but not an object.
    #[error("expected a JSON object, found {found}")]
    NotAnObject {
        /// The JSON type found instead: `null`, `boolean`, `number`, `string` or `array`.
        found: &'static str,
    },
    /// The object does not deserialize into the requested type.
    #[error("does not deserialize as {type_name}")]
    Deserialize {
        /// The Rust type asked for.
        type_name: &'static str,
        /// Why not.
        #[source]
        source: serde_json::Error,
    },
}

/// A Kubernetes object received as JSON: the bytes exactly as sent, and their parsed form.
///
/// The helpers read the common metadata; [`JsonObject::deserialize`] turns the object into a
/// typed struct (for example a `k8s-openapi` `PersistentVolumeClaim`).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonObject {
    raw: Vec<u8>,
    value: Value,
}

impl JsonObject {
    /// Decodes `bytes`, which must hold one JSON object.
    ///
    /// # Errors
    ///
    /// [`ObjectError::Empty`], [`ObjectError::Json`] or [`ObjectError::NotAnObject`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ObjectError> {
        Self::from_bytes(bytes.to_vec())
    }

    /// Like [`JsonObject::decode`], keeping `bytes` without copying them.
    ///
    /// # Errors
    ///
    /// As [`JsonObject::decode`].
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ObjectError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ObjectError::Empty);
        }
        let value: Value = serde_json::from_slice(&bytes).map_err(ObjectError::Json)?;
        if !value.is_object() {
            return Err(ObjectError::NotAnObject { found: json_type(&value) });
        }
        Ok(Self { raw: bytes, value })
    }

    /// Encodes `value`, which must be a JSON object.
    ///
    /// # Errors
    ///
    /// [`ObjectError::NotAnObject`].
    pub fn from_value(value: Value) -> Result<Self, ObjectError> {
        if !value.is_object() {
            return Err(ObjectError::NotAnObject { found: json_type(&value) });
        }
        // A `Value` always serializes: its map keys are strings.
        let raw = value.to_string().into_bytes();
        Ok(Self { raw, value })
    }

    /// The bytes as received.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The parsed object.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The parsed object, consuming `self`.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// The bytes as received, consuming `self`.
    pub fn into_raw(self) -> Vec<u8> {
        self.raw
    }

    /// The string at a JSON pointer (`/metadata/name`), if there is one.
    pub fn str_at(&self, pointer: &str) -> Option<&str> {
        self.value.pointer(pointer).and_then(Value::as_str)
    }

    /// `apiVersion`.
    pub fn api_version(&self) -> Option<&str> {
        self.str_at("/apiVersion")
    }

    /// `kind`.
    pub fn kind(&self) -> Option<&str> {
        self.str_at("/kind")
    }

    /// `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.str_at("/metadata/name")
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.str_at("/metadata/namespace")
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.str_at("/metadata/uid")
    }

    /// The value of the label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.value.get("metadata")?.get("labels")?.get(key)?.as_str()
    }

    /// The value of the annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.value.get("metadata")?.get("annotations")?.get(key)?.as_str()
    }

    /// Deserializes the object into `T`.
    ///
    /// # Errors
    ///
    /// [`ObjectError::Deserialize`] when the object does not have `T`'s shape.
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ObjectError> {
        T::deserialize(&self.value).map_err(|source| ObjectError::Deserialize {
            type_name: std::any::type_name::<T>(),
            source,
        })
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn reads_metadata() {
        let obj = JsonObject::decode(
            br#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data",
                "namespace":"apps","uid":"u-1","labels":{"a":"b"},"annotations":{"c":"d"}}}"#,
        )
        .unwrap();
        assert_eq!(obj.api_version(), Some("v1"));
        assert_eq!(obj.kind(), Some("PersistentVolumeClaim"));
        assert_eq!(obj.name(), Some("data"));
        assert_eq!(obj.namespace(), Some("apps"));
        assert_eq!(obj.uid(), Some("u-1"));
        assert_eq!(obj.label("a"), Some("b"));
        assert_eq!(obj.annotation("c"), Some("d"));
        assert_eq!(obj.annotation("a"), None);
    }

    #[test]
    fn rejects_what_is_not_an_object() {
        assert!(matches!(JsonObject::decode(b""), Err(ObjectError::Empty)));
        assert!(matches!(JsonObject::decode(b" \n"), Err(ObjectError::Empty)));
        assert!(matches!(JsonObject::decode(b"{"), Err(ObjectError::Json(_))));
        assert!(matches!(
            JsonObject::decode(b"[1]"),
            Err(ObjectError::NotAnObject { found: "array" })
        ));
        assert!(matches!(
            JsonObject::decode(b"null"),
            Err(ObjectError::NotAnObject { found: "null" })
        ));
        assert!(matches!(
            JsonObject::from_value(json!("x")),
            Err(ObjectError::NotAnObject { found: "string" })
        ));
    }

    #[test]
    fn deserializes_into_typed_structs() {
        #[derive(serde::Deserialize)]
        struct Meta {
            name: String,
        }
        #[derive(serde::Deserialize)]
        struct Obj {
            metadata: Meta,
        }
        let obj = JsonObject::decode(br#"{"metadata":{"name":"n"}}"#).unwrap();
        assert_eq!(obj.deserialize::<Obj>().unwrap().metadata.name, "n");
        let err = JsonObject::decode(br#"{"metadata":{}}"#).unwrap().deserialize::<Obj>();
        assert!(matches!(err, Err(ObjectError::Deserialize { .. })));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            map in prop::collection::btree_map(".{0,8}", json_value(), 0..6)
        ) {
            let value = Value::Object(map.into_iter().collect());
            let encoded = JsonObject::from_value(value.clone()).unwrap();
            let decoded = JsonObject::decode(encoded.raw()).unwrap();
            prop_assert_eq!(decoded.value(), &value);
            prop_assert_eq!(decoded.into_raw(), encoded.into_raw());
        }

        #[test]
        fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(obj) = JsonObject::decode(&bytes) {
                prop_assert!(obj.value().is_object());
                prop_assert_eq!(obj.raw(), &bytes[..]);
            }
        }
    }
}
