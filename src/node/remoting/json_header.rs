//! The JSON command header, RocketMQ's `RemotingSerializable` (serialize type 0):
//! `code`, `language`, `version`, `opaque`, `flag`, `remark` and `extFields` (every
//! value a string) in one JSON object.
//!
//! Headers may come with or without `serializeTypeCurrentRPC` (the C++ client never
//! sends it); every header this side writes carries it, because some clients refuse a
//! response without. `code`, `version`, `opaque` and `flag` may come as numbers or
//! strings and `language` as a name or a `LanguageCode` number; `extFields` values that
//! are not strings are kept as their JSON text, nulls are skipped. A header without an
//! integer `code` is refused.

use super::{FrameError, RemotingCommand, SerializeType, language_name};
use bytes::Bytes;

/// The header of `cmd` as JSON bytes.
pub(super) fn encode(cmd: &RemotingCommand) -> Vec<u8> {
    let mut ext = serde_json::Map::new();
    for (k, v) in &cmd.ext_fields {
        ext.insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    let mut obj = serde_json::Map::new();
    obj.insert("code".into(), cmd.code.into());
    obj.insert("language".into(), cmd.language.clone().into());
    obj.insert("version".into(), cmd.version.into());
    obj.insert("opaque".into(), cmd.opaque.into());
    obj.insert("flag".into(), cmd.flag.into());
    if let Some(r) = &cmd.remark {
        obj.insert("remark".into(), r.clone().into());
    }
    obj.insert("extFields".into(), serde_json::Value::Object(ext));
    obj.insert(
        "serializeTypeCurrentRPC".into(),
        cmd.serialize_type.name().into(),
    );
    serde_json::to_vec(&serde_json::Value::Object(obj)).unwrap_or_default()
}

fn json_i32(obj: &serde_json::Map<String, serde_json::Value>, key: &str) -> Option<i32> {
    match obj.get(key)? {
        serde_json::Value::Number(n) => n.as_i64().and_then(|v| i32::try_from(v).ok()),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Decodes a JSON header; the body is left empty.
pub(super) fn decode(header: &[u8]) -> Result<RemotingCommand, FrameError> {
    let value: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| FrameError::BadHeader(e.to_string()))?;
    let serde_json::Value::Object(obj) = value else {
        return Err(FrameError::BadHeader(
            "the JSON header is not an object".into(),
        ));
    };
    let code = json_i32(&obj, "code")
        .ok_or_else(|| FrameError::BadHeader("no integer `code` in the header".into()))?;
    let mut ext_fields = Vec::new();
    if let Some(serde_json::Value::Object(ext)) = obj.get("extFields") {
        for (k, v) in ext {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => continue,
                other => other.to_string(),
            };
            ext_fields.push((k.clone(), v));
        }
    }
    let language = match obj.get("language") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => {
            language_name(n.as_u64().unwrap_or(7).min(255) as u8).to_string()
        }
        _ => "OTHER".to_string(),
    };
    Ok(RemotingCommand {
        code,
        language,
        version: json_i32(&obj, "version").unwrap_or(0),
        opaque: json_i32(&obj, "opaque").unwrap_or(0),
        flag: json_i32(&obj, "flag").unwrap_or(0),
        remark: obj
            .get("remark")
            .and_then(|r| r.as_str())
            .map(str::to_string),
        ext_fields,
        serialize_type: SerializeType::Json,
        body: Bytes::new(),
    })
}
