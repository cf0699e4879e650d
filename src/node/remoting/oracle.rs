//! The in-place header reader checked against the general decoder (issue 20): what
//! `tests/header_decoders.rs` and `scripts/fuzz.sh header_scan` run on every input.
//!
//! For any header bytes of either kind: when [`HeaderView`] takes them, the general
//! decoder takes them too, and both give the same code, version, opaque, flag,
//! serialize type and remark, the same send header and the same pull header (field by
//! field, after escapes), also through the offsets a request task keeps
//! ([`Spans`](super::headers::Spans)). When the general decoder refuses a header, the
//! view declines it. A header the view declines goes to the general decoder, so that
//! direction needs no check.

use super::headers::{PullHeader, SendHeader, Typed, Want, typed_for_code};
use super::scan::HeaderView;
use super::{HEADER_WORD, MAX_HEADER_LEN, decode_payload};

/// Checks `header` of `kind` (0 JSON, 1 binary, others refused by both); the first
/// disagreement found, described.
pub fn check_header(kind: u8, header: &[u8]) -> Result<(), String> {
    if header.len() > MAX_HEADER_LEN {
        return Ok(());
    }
    let view = HeaderView::parse(kind, header);
    let mut frame = Vec::with_capacity(HEADER_WORD + header.len());
    frame.extend_from_slice(&((u32::from(kind) << 24) | header.len() as u32).to_be_bytes());
    frame.extend_from_slice(header);
    let general = decode_payload(frame.into());
    let (view, cmd) = match (view, general) {
        (Err(_), _) => return Ok(()),
        (Ok(v), Err(e)) => {
            return Err(format!(
                "the view took a header the general decoder refuses ({e}): {v:?}"
            ));
        }
        (Ok(v), Ok(c)) => (v, c),
    };
    let fixed = |what: &str, a: String, b: String| {
        if a == b {
            Ok(())
        } else {
            Err(format!("{what}: view {a}, general {b}"))
        }
    };
    fixed("code", view.code.to_string(), cmd.code.to_string())?;
    fixed("version", view.version.to_string(), cmd.version.to_string())?;
    fixed("opaque", view.opaque.to_string(), cmd.opaque.to_string())?;
    fixed("flag", view.flag.to_string(), cmd.flag.to_string())?;
    fixed(
        "serialize type",
        format!("{:?}", view.serialize_type),
        format!("{:?}", cmd.serialize_type),
    )?;
    fixed(
        "remark",
        format!("{:?}", view.remark.map(|t| t.to_owned_string())),
        format!("{:?}", cmd.remark),
    )?;
    // Every header through both typed headers, whatever its code (the node collects
    // the one its code names).
    let mut scratch = String::new();
    let theirs = SendHeader::from_command(&cmd);
    match HeaderView::parse_typed(kind, header, |_| Want::Send) {
        Ok((_, Typed::Send(spans))) => {
            let ours = SendHeader::resolve(&spans, header, &mut scratch);
            if ours != theirs {
                return Err(format!("send header: view {ours:?}, general {theirs:?}"));
            }
        }
        other => return Err(format!("send header not collected: {other:?}")),
    }
    let theirs = PullHeader::from_command(&cmd);
    match HeaderView::parse_typed(kind, header, |_| Want::Pull) {
        Ok((_, Typed::Pull(spans))) => {
            let ours = PullHeader::resolve(&spans, header, &mut scratch);
            if ours != theirs {
                return Err(format!("pull header: view {ours:?}, general {theirs:?}"));
            }
        }
        other => return Err(format!("pull header not collected: {other:?}")),
    }
    // And the way the node reads it: the typed header its code names.
    let by_code = match HeaderView::parse_typed(kind, header, typed_for_code) {
        Ok((_, Typed::Send(spans))) => Some(format!(
            "{:?}",
            SendHeader::resolve(&spans, header, &mut scratch)
        ))
        .filter(|ours| *ours != format!("{:?}", SendHeader::from_command(&cmd))),
        Ok((_, Typed::Pull(spans))) => Some(format!(
            "{:?}",
            PullHeader::resolve(&spans, header, &mut scratch)
        ))
        .filter(|ours| *ours != format!("{:?}", PullHeader::from_command(&cmd))),
        Ok((_, Typed::Other)) => None,
        Err(_) => Some("declined".to_string()),
    };
    if let Some(ours) = by_code {
        return Err(format!("code {}: the node's typed header {ours}", cmd.code));
    }
    Ok(())
}
