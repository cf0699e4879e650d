//! The binary half of [`HeaderView`](super::HeaderView): RocketMQ's `ROCKETMQ`
//! serialize type, read in place (`binary_header.rs`'s rules).

use super::{Declined, Ext, ExtField, HeaderView, Scan, Text};
use crate::node::remoting::headers::{Collect, Want};
use crate::node::remoting::{BINARY_FIXED_LEN, SerializeType};
use std::ops::Range;

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Scan<&'a [u8]> {
    if n > buf.len() {
        return Err(Declined);
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

fn be_i16(buf: &mut &[u8]) -> Scan<i16> {
    let b = take(buf, 2)?;
    Ok(i16::from_be_bytes([b[0], b[1]]))
}

fn be_i32(buf: &mut &[u8]) -> Scan<i32> {
    let b = take(buf, 4)?;
    Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn utf8<'a>(buf: &mut &'a [u8], len: usize) -> Scan<&'a str> {
    std::str::from_utf8(take(buf, len)?).map_err(|_| Declined)
}

/// The ext field at `*at` of `ext` (a binary header's ext fields): key length (i16) and
/// key, value length (i32) and value, big-endian; a negative length is declined.
/// `text_of` gives the text of a range of `ext` (`None`: not UTF-8, or out of range).
pub(super) fn binary_field<'a>(
    ext: &'a [u8],
    at: &mut usize,
    text_of: &impl Fn(Range<usize>) -> Option<&'a str>,
) -> Scan<ExtField<'a>> {
    let length = |at: &mut usize, n: usize| -> Scan<usize> {
        let bytes = ext.get(*at..*at + n).ok_or(Declined)?;
        *at += n;
        if bytes[0] & 0x80 != 0 {
            return Err(Declined);
        }
        Ok(bytes.iter().fold(0usize, |v, &x| v << 8 | x as usize))
    };
    let text = |at: &mut usize, n: usize| -> Scan<&'a str> {
        let s = text_of(*at..*at + n).ok_or(Declined)?;
        *at += n;
        Ok(s)
    };
    let klen = length(at, 2)?;
    let key = text(at, klen)?;
    let vlen = length(at, 4)?;
    let value = text(at, vlen)?;
    Ok(ExtField {
        key,
        value: Some(Text::plain(value)),
    })
}

/// The text of `ext[range]`, checked on its own.
pub(super) fn checked_text(ext: &[u8], range: Range<usize>) -> Option<&str> {
    ext.get(range).and_then(|b| std::str::from_utf8(b).ok())
}

/// Hands every ext field of `ext` (a binary header's, inside `header`) to `collect`.
fn collect_binary<'a>(
    header: &[u8],
    ext: &'a [u8],
    collect: &mut Collect,
    text_of: impl Fn(Range<usize>) -> Option<&'a str>,
) -> Scan<()> {
    let (mut at, mut pos) = (0, 0);
    while at < ext.len() {
        let f = binary_field(ext, &mut at, &text_of)?;
        collect.field(pos, f.key, f.value, header, false);
        pos += 1;
    }
    Ok(())
}

/// Reads a binary header, collecting its ext fields into `collect`; returns the view
/// and its code (the code collected for).
pub(super) fn parse_binary<'a>(
    header: &'a [u8],
    want: &dyn Fn(i32) -> Want,
    collect: &mut Collect,
) -> Scan<(HeaderView<'a>, Option<i32>)> {
    if header.len() < BINARY_FIXED_LEN {
        return Err(Declined);
    }
    let mut c = header;
    let code = be_i16(&mut c)? as i32;
    take(&mut c, 1)?; // language
    let version = be_i16(&mut c)? as i32;
    let opaque = be_i32(&mut c)?;
    let flag = be_i32(&mut c)?;
    let remark_len = be_i32(&mut c)?;
    let remark = if remark_len > 0 {
        Some(Text::plain(utf8(&mut c, remark_len as usize)?))
    } else {
        None
    };
    let ext_len = usize::try_from(be_i32(&mut c)?).map_err(|_| Declined)?;
    let ext = take(&mut c, ext_len)?;
    collect.reset(want(code));
    // Checked as UTF-8 once, each key and value then sliced out of it (a char-boundary
    // check, the same answer as a check of each; checked one by one they were a third of
    // a binary header's read). A length byte can make the whole not UTF-8: then each is
    // checked on its own.
    match std::str::from_utf8(ext) {
        Ok(text) => collect_binary(header, ext, collect, |r| text.get(r))?,
        Err(_) => collect_binary(header, ext, collect, |r| checked_text(ext, r))?,
    }
    let view = HeaderView {
        code,
        version,
        opaque,
        flag,
        serialize_type: SerializeType::RocketMq,
        remark,
        ext: if ext.is_empty() {
            Ext::None
        } else {
            Ext::Binary(ext)
        },
    };
    Ok((view, Some(code)))
}
