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
use super::{HEADER_WORD, MAX_HEADER_LEN, RemotingCommand, decode_payload};

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
    // the one its code names), then the node's way: the typed header its code names.
    let mut scratch = String::new();
    for (what, want) in [("send", Want::Send), ("pull", Want::Pull)] {
        match HeaderView::parse_typed(kind, header, |_| want) {
            Ok((_, typed @ (Typed::Send(_) | Typed::Pull(_))))
                if matches!(typed, Typed::Send(_)) == (want == Want::Send) =>
            {
                typed_agrees(typed, header, &cmd, &mut scratch)
                    .map_err(|e| format!("{what} header: {e}"))?
            }
            other => return Err(format!("{what} header not collected: {other:?}")),
        }
    }
    match HeaderView::parse_typed(kind, header, typed_for_code) {
        Ok((_, typed)) => typed_agrees(typed, header, &cmd, &mut scratch)
            .map_err(|e| format!("code {}: the node's typed header: {e}", cmd.code)),
        Err(_) => Err(format!(
            "code {}: the node's typed header declined",
            cmd.code
        )),
    }
}

/// Whether `typed`, read in `header`, is the typed header the general decoder gives
/// for `cmd`.
fn typed_agrees(
    typed: Typed,
    header: &[u8],
    cmd: &RemotingCommand,
    scratch: &mut String,
) -> Result<(), String> {
    match typed {
        Typed::Send(spans) => {
            let (ours, theirs) = (
                SendHeader::resolve(&spans, header, scratch),
                SendHeader::from_command(cmd),
            );
            (ours == theirs)
                .then_some(())
                .ok_or_else(|| format!("view {ours:?}, general {theirs:?}"))
        }
        Typed::Pull(spans) => {
            let (ours, theirs) = (
                PullHeader::resolve(&spans, header, scratch),
                PullHeader::from_command(cmd),
            );
            (ours == theirs)
                .then_some(())
                .ok_or_else(|| format!("view {ours:?}, general {theirs:?}"))
        }
        Typed::Other => Ok(()),
    }
}
