//! Frames (a node's responses, a load generator's requests) written straight into an
//! output buffer (issue 20): no
//! [`RemotingCommand`](super::RemotingCommand), no JSON value tree, no intermediate
//! vector. The bytes are exactly those [`RemotingCommand::encode`] writes for the same
//! response (serde_json's compact output with sorted keys for JSON, the field order
//! given for binary); `tests` below and `tests/header_decoders.rs` compare them.

use super::{HEADER_WORD, LENGTH_PREFIX, SerializeType, codes, language_code};
use crate::format::msg_id::MessageId;

/// A header field's value.
#[derive(Debug, Clone, Copy)]
pub enum FieldValue<'a> {
    Str(&'a str),
    Int(i64),
    UInt(u64),
    /// Message ids as RocketMQ shows them (32 hex characters), joined by commas.
    Ids(&'a [MessageId]),
}

/// Most ext fields one frame may carry (the node's answers carry at most six, a send
/// request fourteen).
pub const MAX_FIELDS: usize = 16;

/// A frame's header: what [`encode_frame`] writes.
#[derive(Debug, Clone, Copy)]
pub struct FrameHead<'a> {
    pub code: i32,
    /// [`FLAG_RESPONSE`](super::FLAG_RESPONSE) for a response, 0 (or `FLAG_ONEWAY`) for a request.
    pub flag: i32,
    pub opaque: i32,
    pub serialize_type: SerializeType,
    pub remark: Option<&'a str>,
    /// In the order a binary header carries them (JSON sorts them).
    pub fields: &'a [(&'a str, FieldValue<'a>)],
}

/// Appends a whole frame to `out` except its body, whose length is `body_len` (the
/// caller appends or queues the body right after).
pub fn encode_frame(out: &mut Vec<u8>, head: &FrameHead<'_>, body_len: usize) {
    assert!(head.fields.len() <= MAX_FIELDS);
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_PREFIX + HEADER_WORD]);
    let header_start = out.len();
    match head.serialize_type {
        SerializeType::Json => json_header(out, head),
        SerializeType::RocketMq => binary_header(out, head),
    }
    let header_len = out.len() - header_start;
    let length = HEADER_WORD + header_len + body_len;
    let word = ((head.serialize_type as u32) << 24) | (header_len as u32 & 0x00FF_FFFF);
    out[start..start + 4].copy_from_slice(&(length as u32).to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&word.to_be_bytes());
}

/// Decimal digits of `-n` (`negative`) or `n`, written into the end of `buf`;
/// returns them.
fn decimal(negative: bool, mut n: u64, buf: &mut [u8; 21]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if negative {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 21];
    out.extend_from_slice(decimal(v < 0, v.unsigned_abs(), &mut buf));
}

fn push_uint(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 21];
    out.extend_from_slice(decimal(false, v, &mut buf));
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_ids(out: &mut Vec<u8>, ids: &[MessageId]) {
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut text = [0u8; 2 * crate::format::msg_id::MSG_ID_LEN];
        for (pair, b) in text.chunks_exact_mut(2).zip(id.to_bytes()) {
            pair[0] = HEX[(b >> 4) as usize];
            pair[1] = HEX[(b & 15) as usize];
        }
        out.extend_from_slice(&text);
    }
}

/// The value's text length (binary headers state it first).
fn value_len(v: &FieldValue<'_>) -> usize {
    match v {
        FieldValue::Str(s) => s.len(),
        FieldValue::Int(n) => {
            let mut buf = [0u8; 21];
            decimal(*n < 0, n.unsigned_abs(), &mut buf).len()
        }
        FieldValue::UInt(n) => {
            let mut buf = [0u8; 21];
            decimal(false, *n, &mut buf).len()
        }
        FieldValue::Ids(ids) => (ids.len() * 33).saturating_sub(1),
    }
}

/// A JSON string as serde_json writes it: `"`, `\` and control characters escaped
/// (`\b \t \n \f \r` short, the rest `\u00xx` in lower-case hex), all else as is.
fn json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let b = s.as_bytes();
    // Most texts (keys, ids, numbers, topics) need no escape: one test over the whole
    // text (eight bytes at a time), then one copy (a byte-by-byte match was ~1.5% of a
    // node's samples, and a third of a send answer's encoding).
    if super::scan::plain_run_end(b, 0) == b.len() {
        out.extend_from_slice(b);
        out.push(b'"');
        return;
    }
    let mut run = 0;
    for (i, &c) in b.iter().enumerate() {
        let esc: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0A => b"\\n",
            0x0C => b"\\f",
            0x0D => b"\\r",
            0..=0x1F => b"",
            _ => continue,
        };
        out.extend_from_slice(&b[run..i]);
        if esc.is_empty() {
            const LOWER: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(LOWER[(c >> 4) as usize]);
            out.push(LOWER[(c & 15) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        run = i + 1;
    }
    out.extend_from_slice(&b[run..]);
    out.push(b'"');
}

fn json_value(out: &mut Vec<u8>, v: &FieldValue<'_>) {
    match v {
        FieldValue::Str(s) => json_str(out, s),
        FieldValue::Int(n) => {
            out.push(b'"');
            push_int(out, *n);
            out.push(b'"');
        }
        FieldValue::UInt(n) => {
            out.push(b'"');
            push_uint(out, *n);
            out.push(b'"');
        }
        FieldValue::Ids(ids) => {
            out.push(b'"');
            push_ids(out, ids);
            out.push(b'"');
        }
    }
}

/// `a < b`, decided by the first bytes when they differ (as they mostly do: no
/// `memcmp` call for those).
fn key_less(a: &str, b: &str) -> bool {
    match (a.as_bytes().first(), b.as_bytes().first()) {
        (Some(x), Some(y)) if x != y => x < y,
        _ => a < b,
    }
}

/// serde_json's compact object with keys sorted (its map is a `BTreeMap`):
/// code, extFields, flag, language, opaque, remark, serializeTypeCurrentRPC, version.
fn json_header(out: &mut Vec<u8>, head: &FrameHead<'_>) {
    out.extend_from_slice(b"{\"code\":");
    push_int(out, head.code as i64);
    out.extend_from_slice(b",\"extFields\":{");
    // Keys sorted as a BTreeMap sorts strings; a key given twice keeps its last value.
    let n = head.fields.len();
    let mut order = [0usize; MAX_FIELDS];
    let mut kept = 0;
    // Fields given in strictly ascending key order (the node's answers are) are
    // written as given: one compare per field instead of a search and a sort (192 -> 172
    // ns per send answer, benches/headers.rs).
    let sorted = head.fields.windows(2).all(|w| key_less(w[0].0, w[1].0));
    for i in 0..n {
        if sorted {
            order[i] = i;
            kept += 1;
            continue;
        }
        let key = head.fields[i].0;
        if head.fields[i + 1..n].iter().any(|(k, _)| *k == key) {
            continue;
        }
        let mut at = kept;
        while at > 0 && head.fields[order[at - 1]].0 > key {
            order[at] = order[at - 1];
            at -= 1;
        }
        order[at] = i;
        kept += 1;
    }
    for (k, &i) in order[..kept].iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        let (key, value) = &head.fields[i];
        json_str(out, key);
        out.push(b':');
        json_value(out, value);
    }
    out.extend_from_slice(b"},\"flag\":");
    push_int(out, head.flag as i64);
    out.extend_from_slice(b",\"language\":\"");
    out.extend_from_slice(super::OUR_LANGUAGE.as_bytes());
    out.extend_from_slice(b"\",\"opaque\":");
    push_int(out, head.opaque as i64);
    if let Some(r) = head.remark {
        out.extend_from_slice(b",\"remark\":");
        json_str(out, r);
    }
    out.extend_from_slice(b",\"serializeTypeCurrentRPC\":\"");
    out.extend_from_slice(head.serialize_type.name().as_bytes());
    out.extend_from_slice(b"\",\"version\":");
    push_int(out, codes::OUR_VERSION as i64);
    out.push(b'}');
}

fn binary_header(out: &mut Vec<u8>, head: &FrameHead<'_>) {
    out.extend_from_slice(&(head.code as i16).to_be_bytes());
    out.push(language_code(super::OUR_LANGUAGE));
    out.extend_from_slice(&(codes::OUR_VERSION as i16).to_be_bytes());
    out.extend_from_slice(&head.opaque.to_be_bytes());
    out.extend_from_slice(&head.flag.to_be_bytes());
    let remark = head.remark.unwrap_or("").as_bytes();
    out.extend_from_slice(&(remark.len() as i32).to_be_bytes());
    out.extend_from_slice(remark);
    let ext_len: usize = head
        .fields
        .iter()
        .map(|(k, v)| 2 + k.len() + 4 + value_len(v))
        .sum();
    out.extend_from_slice(&(ext_len as i32).to_be_bytes());
    for (k, v) in head.fields {
        out.extend_from_slice(&(k.len() as i16).to_be_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&(value_len(v) as i32).to_be_bytes());
        match v {
            FieldValue::Str(s) => out.extend_from_slice(s.as_bytes()),
            FieldValue::Int(n) => push_int(out, *n),
            FieldValue::UInt(n) => push_uint(out, *n),
            FieldValue::Ids(ids) => push_ids(out, ids),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::remoting::RemotingCommand;

    /// The general encoder's frame for the same command.
    fn general(head: &FrameHead<'_>, body: &[u8]) -> Vec<u8> {
        let mut c = RemotingCommand::request(0, head.opaque, Vec::new());
        c.code = head.code;
        c.flag = head.flag;
        c.serialize_type = head.serialize_type;
        c.remark = head.remark.map(String::from);
        for (k, v) in head.fields {
            let text = match v {
                FieldValue::Str(s) => s.to_string(),
                FieldValue::Int(n) => n.to_string(),
                FieldValue::UInt(n) => n.to_string(),
                FieldValue::Ids(ids) => ids
                    .iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            };
            c.ext_fields.push((k.to_string(), text));
        }
        c.body = bytes::Bytes::copy_from_slice(body);
        c.encode()
    }

    fn ours(head: &FrameHead<'_>, body: &[u8]) -> Vec<u8> {
        let mut out = b"left alone".to_vec();
        encode_frame(&mut out, head, body.len());
        out.extend_from_slice(body);
        assert_eq!(&out[..10], b"left alone");
        out.split_off(10)
    }

    #[test]
    fn same_bytes_as_the_general_encoder() {
        let ids = [
            MessageId {
                store_host: "127.0.0.1:10911".parse().unwrap(),
                offset: 77,
            },
            MessageId {
                store_host: "10.0.0.2:1".parse().unwrap(),
                offset: u64::MAX >> 1,
            },
        ];
        let fields = [
            ("msgId", FieldValue::Ids(&ids)),
            ("queueId", FieldValue::Int(3)),
            ("queueOffset", FieldValue::Int(i64::MIN)),
            ("maxOffset", FieldValue::UInt(u64::MAX)),
            ("MSG_REGION", FieldValue::Str("DefaultRegion")),
            ("TRACE_ON", FieldValue::Str("true")),
            ("weird \"key\"\n", FieldValue::Str("\u{1}\u{7f}é\\/")),
        ];
        // As given, sorted (written without sorting), and with a key given twice.
        let mut sorted = fields.to_vec();
        sorted.sort_by_key(|f| f.0);
        let mut twice = sorted.clone();
        twice.insert(3, ("queueId", FieldValue::Str("earlier")));
        for kind in [SerializeType::Json, SerializeType::RocketMq] {
            for (remark, flag) in [(None, 1), (Some("a \"remark\"\t\u{0}"), 0), (None, 2)] {
                for (fields, n) in [0, 1, 2, fields.len()]
                    .map(|n| (&fields[..], n))
                    .into_iter()
                    .chain([(&sorted[..], sorted.len()), (&twice[..], twice.len())])
                {
                    let head = FrameHead {
                        code: -17,
                        flag,
                        opaque: i32::MAX,
                        serialize_type: kind,
                        remark,
                        fields: &fields[..n],
                    };
                    assert_eq!(ours(&head, b"body"), general(&head, b"body"));
                    assert_eq!(ours(&head, b""), general(&head, b""));
                }
            }
        }
    }
}
