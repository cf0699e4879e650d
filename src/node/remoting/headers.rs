//! Typed request headers of the hot codes (issue 20): RocketMQ's
//! `SendMessageRequestHeader` (codes 10 and 320), `SendMessageRequestHeaderV2` (310,
//! the same fields under one-letter names) and `PullMessageRequestHeader` (11, 361).
//!
//! A header holds each known field's text, or `None` when absent, exactly as a lookup
//! by name on the general decoder's [`RemotingCommand`] finds it (first field of that
//! name in its order; JSON: keys sorted, a key given twice at its last value, `null`
//! absent; binary: wire order). The processors parse numbers from that text, so a
//! malformed value is refused with the same remark whichever way the header came.
//!
//! Two ways in, one result:
//! * [`SendHeader::from_command`] / [`PullHeader::from_command`]: from a decoded
//!   command (the general path, every front end);
//! * [`RawSend::from_view`] / [`RawPull::from_view`] then `resolve`: straight from the
//!   frame's bytes through [`HeaderView`], nothing allocated; escaped JSON strings are
//!   unescaped into a scratch string the caller keeps across requests.
//!
//! `tests/header_decoders.rs` checks that both give the same header on every input the
//! view takes.

use super::RemotingCommand;
use super::scan::{HeaderView, Text};

/// `SendMessageRequestHeader`'s fields: `(long name, V2 one-letter name)`, in the order
/// of [`SendField`].
pub const SEND_FIELDS: [(&str, &str); SEND_FIELD_COUNT] = [
    ("producerGroup", "a"),
    ("topic", "b"),
    ("defaultTopic", "c"),
    ("defaultTopicQueueNums", "d"),
    ("queueId", "e"),
    ("sysFlag", "f"),
    ("bornTimestamp", "g"),
    ("flag", "h"),
    ("properties", "i"),
    ("reconsumeTimes", "j"),
    ("unitMode", "k"),
    ("maxReconsumeTimes", "l"),
    ("batch", "m"),
    ("brokerName", "n"),
];
pub const SEND_FIELD_COUNT: usize = 14;

/// A field of [`SEND_FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendField {
    ProducerGroup,
    Topic,
    DefaultTopic,
    DefaultTopicQueueNums,
    QueueId,
    SysFlag,
    BornTimestamp,
    Flag,
    Properties,
    ReconsumeTimes,
    UnitMode,
    MaxReconsumeTimes,
    Batch,
    BrokerName,
}
const _: () = assert!(SendField::BrokerName as usize + 1 == SEND_FIELD_COUNT);

/// `PullMessageRequestHeader`'s fields, in the order of [`PullField`].
pub const PULL_FIELDS: [&str; PULL_FIELD_COUNT] = [
    "consumerGroup",
    "topic",
    "queueId",
    "queueOffset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "subVersion",
    "expressionType",
];
pub const PULL_FIELD_COUNT: usize = 11;

/// A field of [`PULL_FIELDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullField {
    ConsumerGroup,
    Topic,
    QueueId,
    QueueOffset,
    MaxMsgNums,
    SysFlag,
    CommitOffset,
    SuspendTimeoutMillis,
    Subscription,
    SubVersion,
    ExpressionType,
}
const _: () = assert!(PullField::ExpressionType as usize + 1 == PULL_FIELD_COUNT);

/// A send request's header fields (long names; a V2 header's one-letter names already
/// mapped as RocketMQ's `SendMessageRequestHeaderV2.createSendMessageRequestHeaderV1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendHeader<'a> {
    fields: [Option<&'a str>; SEND_FIELD_COUNT],
}

/// A pull request's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PullHeader<'a> {
    fields: [Option<&'a str>; PULL_FIELD_COUNT],
}

impl<'a> SendHeader<'a> {
    pub fn get(&self, f: SendField) -> Option<&'a str> {
        self.fields[f as usize]
    }

    /// The header of a decoded send request (codes 10, 310, 320).
    pub fn from_command(req: &'a RemotingCommand) -> SendHeader<'a> {
        let positions = req.ext_fields.iter().enumerate().map(|(i, (k, v))| {
            (
                k.as_str(),
                Some(Val {
                    text: v.as_str(),
                    at: Order::Pos(i as u32),
                }),
            )
        });
        let slots = collect_send(positions, false);
        SendHeader {
            fields: slots.map(|s| s.map(|v| v.text)),
        }
    }
}

impl<'a> PullHeader<'a> {
    pub fn get(&self, f: PullField) -> Option<&'a str> {
        self.fields[f as usize]
    }

    /// The header of a decoded pull request (codes 11, 361).
    pub fn from_command(req: &'a RemotingCommand) -> PullHeader<'a> {
        let mut fields = [None; PULL_FIELD_COUNT];
        for (k, v) in &req.ext_fields {
            if let Some(i) = PULL_FIELDS.iter().position(|n| n == k)
                && fields[i].is_none()
            {
                fields[i] = Some(v.as_str());
            }
        }
        PullHeader { fields }
    }
}

/// Where a value stands in the general decoder's order of ext fields: its position
/// (binary, or a decoded command), or its key (JSON, whose keys the general decoder
/// sorts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Order<'k> {
    Pos(u32),
    Key(&'k str),
}

#[derive(Debug, Clone, Copy)]
struct Val<'a, T> {
    text: T,
    at: Order<'a>,
}

type Slots<'a, T> = [Option<Val<'a, T>>; SEND_FIELD_COUNT];

/// Collects the send fields from `(key, value)` pairs (a `None` value: JSON `null`),
/// then maps one-letter names as RocketMQ does: when the header has no `topic` but a
/// `b`, each field takes its one-letter value, or its long one when that comes first.
/// `last_wins`: a key given twice counts at its last value (JSON), else its first.
fn collect_send<'a, T: Copy>(
    pairs: impl Iterator<Item = (&'a str, Option<Val<'a, T>>)>,
    last_wins: bool,
) -> Slots<'a, T> {
    let mut long: Slots<'a, T> = [None; SEND_FIELD_COUNT];
    let mut short: Slots<'a, T> = [None; SEND_FIELD_COUNT];
    for (key, val) in pairs {
        let (slots, i) = match send_index(key) {
            Some((true, i)) => (&mut long, i),
            Some((false, i)) => (&mut short, i),
            None => continue,
        };
        if last_wins || slots[i].is_none() {
            slots[i] = val;
        }
    }
    let topic = SendField::Topic as usize;
    if long[topic].is_some() || short[topic].is_none() {
        return long;
    }
    let mut out = long;
    for i in 0..SEND_FIELD_COUNT {
        out[i] = match (long[i], short[i]) {
            (Some(l), Some(s)) => Some(if s.at < l.at { s } else { l }),
            (l, s) => s.or(l),
        };
    }
    out
}

/// The field index of each one-letter name, by its byte (`u8::MAX`: none).
const SHORT_INDEX: [u8; 128] = {
    let mut t = [u8::MAX; 128];
    let mut i = 0;
    while i < SEND_FIELD_COUNT {
        let b = SEND_FIELDS[i].1.as_bytes();
        assert!(b.len() == 1 && b[0] < 128);
        t[b[0] as usize] = i as u8;
        i += 1;
    }
    t
};

/// `(is the long name, field index)` of a send header key.
fn send_index(key: &str) -> Option<(bool, usize)> {
    if let &[b] = key.as_bytes() {
        // A V2 header's names are all one letter: a table, not a search.
        match SHORT_INDEX.get(b as usize) {
            Some(&i) if i != u8::MAX => Some((false, i as usize)),
            _ => None,
        }
    } else {
        SEND_FIELDS
            .iter()
            .position(|(l, _)| *l == key)
            .map(|i| (true, i))
    }
}

/// A send header read in place, before escapes are applied ([`RawSend::resolve`]).
#[derive(Debug, Clone, Copy)]
pub struct RawSend<'a> {
    fields: [Option<Text<'a>>; SEND_FIELD_COUNT],
}

/// A pull header read in place, before escapes are applied ([`RawPull::resolve`]).
#[derive(Debug, Clone, Copy)]
pub struct RawPull<'a> {
    fields: [Option<Text<'a>>; PULL_FIELD_COUNT],
}

impl<'a> RawSend<'a> {
    /// The send fields of a header read in place.
    pub fn from_view(view: &HeaderView<'a>) -> RawSend<'a> {
        let json = view.last_wins();
        let pairs = view.ext_fields().enumerate().map(|(i, f)| {
            let at = if json {
                Order::Key(f.key)
            } else {
                Order::Pos(i as u32)
            };
            (f.key, f.value.map(|text| Val { text, at }))
        });
        RawSend {
            fields: collect_send(pairs, json).map(|s| s.map(|v| v.text)),
        }
    }

    /// The header, escaped strings unescaped into `scratch` (cleared first).
    pub fn resolve<'s>(&self, scratch: &'s mut String) -> SendHeader<'s>
    where
        'a: 's,
    {
        SendHeader {
            fields: resolve(&self.fields, scratch),
        }
    }
}

impl<'a> RawPull<'a> {
    /// The pull fields of a header read in place.
    pub fn from_view(view: &HeaderView<'a>) -> RawPull<'a> {
        let last_wins = view.last_wins();
        let mut fields = [None; PULL_FIELD_COUNT];
        for f in view.ext_fields() {
            if let Some(i) = PULL_FIELDS.iter().position(|n| *n == f.key)
                && (last_wins || fields[i].is_none())
            {
                fields[i] = f.value;
            }
        }
        RawPull { fields }
    }

    /// The header, escaped strings unescaped into `scratch` (cleared first).
    pub fn resolve<'s>(&self, scratch: &'s mut String) -> PullHeader<'s>
    where
        'a: 's,
    {
        PullHeader {
            fields: resolve(&self.fields, scratch),
        }
    }
}

/// A header's field texts as offsets into the header bytes: what a task that owns the
/// frame needs to read them again without parsing ([`Spans::attach`]).
#[derive(Debug, Clone, Copy)]
pub struct Spans<const N: usize> {
    /// Start, length, whether escaped.
    fields: [Option<(u32, u32, bool)>; N],
}

impl<const N: usize> Spans<N> {
    fn detach(fields: &[Option<Text<'_>>; N], header: &[u8]) -> Spans<N> {
        let base = header.as_ptr() as usize;
        Spans {
            fields: fields.map(|f| {
                f.and_then(|t| {
                    let start = (t.raw.as_ptr() as usize).checked_sub(base)?;
                    (start + t.raw.len() <= header.len()).then_some((
                        start as u32,
                        t.raw.len() as u32,
                        t.escaped,
                    ))
                })
            }),
        }
    }

    /// The texts again, in `header` (the bytes the spans were taken from; a span that
    /// does not fit or is not UTF-8 there reads as absent).
    fn attach<'a>(&self, header: &'a [u8]) -> [Option<Text<'a>>; N] {
        // A header that is text as a whole (a JSON one is) is checked once and each
        // field sliced out of it (a char-boundary check): the same answer as a check
        // per field, without a UTF-8 pass per field (~2% of a node's samples).
        let text = std::str::from_utf8(header).ok();
        self.fields.map(|f| {
            let (start, len, escaped) = f?;
            let span = start as usize..start as usize + len as usize;
            let raw = match text {
                Some(text) => text.get(span)?,
                None => std::str::from_utf8(header.get(span)?).ok()?,
            };
            Some(Text { raw, escaped })
        })
    }
}

impl<'a> RawSend<'a> {
    /// The fields as offsets into `header` (the bytes the view was parsed from).
    pub fn detach(&self, header: &'a [u8]) -> Spans<SEND_FIELD_COUNT> {
        Spans::detach(&self.fields, header)
    }

    /// The fields from their offsets into `header`.
    pub fn attach(spans: &Spans<SEND_FIELD_COUNT>, header: &'a [u8]) -> RawSend<'a> {
        RawSend {
            fields: spans.attach(header),
        }
    }
}

impl<'a> RawPull<'a> {
    /// The fields as offsets into `header` (the bytes the view was parsed from).
    pub fn detach(&self, header: &'a [u8]) -> Spans<PULL_FIELD_COUNT> {
        Spans::detach(&self.fields, header)
    }

    /// The fields from their offsets into `header`.
    pub fn attach(spans: &Spans<PULL_FIELD_COUNT>, header: &'a [u8]) -> RawPull<'a> {
        RawPull {
            fields: spans.attach(header),
        }
    }
}

/// Each text as a `&str`: in place when it has no escapes, else unescaped into
/// `scratch`.
fn resolve<'a: 's, 's, const N: usize>(
    fields: &[Option<Text<'a>>; N],
    scratch: &'s mut String,
) -> [Option<&'s str>; N] {
    scratch.clear();
    let mut spans: [Option<Result<&'a str, (usize, usize)>>; N] = [None; N];
    for (span, field) in spans.iter_mut().zip(fields) {
        *span = field.map(|t| match t.as_plain() {
            Some(s) => Ok(s),
            None => {
                let start = scratch.len();
                t.unescape_into(scratch);
                Err((start, scratch.len()))
            }
        });
    }
    let scratch: &'s String = scratch;
    spans.map(|s| {
        s.map(|r| match r {
            Ok(s) => s,
            Err((a, b)) => scratch.get(a..b).unwrap_or(""),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::remoting::{SerializeType, decode_frame};

    fn both(c: &RemotingCommand) -> (SendHeader<'_>, Vec<Option<String>>) {
        let wire = c.encode();
        let (back, _) = decode_frame(&wire, 1 << 20).unwrap().unwrap();
        let mut scratch = String::new();
        let view = HeaderView::parse(c.serialize_type as u8, &wire[8..]).unwrap();
        let fast = RawSend::from_view(&view).resolve(&mut scratch);
        let fast: Vec<Option<String>> = fast.fields.iter().map(|f| f.map(String::from)).collect();
        let slow: Vec<Option<String>> = SendHeader::from_command(&back)
            .fields
            .iter()
            .map(|f| f.map(String::from))
            .collect();
        assert_eq!(fast, slow);
        (SendHeader::from_command(c), fast)
    }

    #[test]
    fn v2_names_map_to_long_ones() {
        for kind in [SerializeType::Json, SerializeType::RocketMq] {
            let mut c = RemotingCommand::request(
                310,
                1,
                vec![
                    ("b".into(), "T".into()),
                    ("e".into(), "3".into()),
                    ("i".into(), "KEYS\u{1}k\u{2}".into()),
                ],
            );
            c.serialize_type = kind;
            let (h, _) = both(&c);
            assert_eq!(h.get(SendField::Topic), Some("T"));
            assert_eq!(h.get(SendField::QueueId), Some("3"));
            assert_eq!(h.get(SendField::Properties), Some("KEYS\u{1}k\u{2}"));
        }
    }

    /// Every one-letter name lands on its own field, and nothing else does.
    #[test]
    fn every_v2_name_maps_to_its_field() {
        for (i, (long, short)) in SEND_FIELDS.iter().enumerate() {
            assert_eq!(send_index(short), Some((false, i)), "{short}");
            assert_eq!(send_index(long), Some((true, i)), "{long}");
        }
        for other in ["o", "z", "A", "\u{7f}", "", "ab", "topicX"] {
            assert_eq!(send_index(other), None, "{other}");
        }
    }

    #[test]
    fn long_topic_wins_over_short_names() {
        let c = RemotingCommand::request(
            310,
            1,
            vec![("topic".into(), "L".into()), ("b".into(), "S".into())],
        );
        let (h, _) = both(&c);
        assert_eq!(h.get(SendField::Topic), Some("L"));
    }

    #[test]
    fn a_long_and_a_short_name_for_one_field_take_the_first_in_order() {
        // No long topic, so short names map; `flag` and `h` both name the flag. JSON
        // sorts keys ("flag" < "h"), binary keeps wire order.
        let fields = vec![
            ("h".into(), "2".into()),
            ("b".into(), "T".into()),
            ("flag".into(), "1".into()),
        ];
        let mut c = RemotingCommand::request(310, 1, fields);
        let (_, fast) = both(&c);
        assert_eq!(fast[SendField::Flag as usize].as_deref(), Some("1"));
        c.serialize_type = SerializeType::RocketMq;
        let (_, fast) = both(&c);
        assert_eq!(fast[SendField::Flag as usize].as_deref(), Some("2"));
    }

    /// Spans taken on the read loop give the task the same texts, whether the header is
    /// text as a whole (JSON: one check) or not (binary lengths: a check per field), and
    /// a span that does not fit or cuts a character reads as absent.
    #[test]
    fn spans_attach_to_the_same_texts() {
        for kind in [SerializeType::Json, SerializeType::RocketMq] {
            let mut c = RemotingCommand::request(
                310,
                1,
                vec![
                    ("b".into(), "T\u{e9}".into()),
                    ("e".into(), "3".into()),
                    // A length of 0x80+ makes a binary header invalid UTF-8 as a whole.
                    ("i".into(), "p".repeat(200)),
                ],
            );
            c.serialize_type = kind;
            let wire = c.encode();
            let header = &wire[8..];
            let whole = std::str::from_utf8(header).is_ok();
            assert_eq!(whole, kind == SerializeType::Json, "{kind:?}");
            let view = HeaderView::parse(kind as u8, header).unwrap();
            let raw = RawSend::from_view(&view);
            let spans = raw.detach(header);
            let again = RawSend::attach(&spans, header);
            assert_eq!(again.fields, raw.fields, "{kind:?}");
            let t = SendField::Topic as usize;
            let (start, len, esc) = spans.fields[t].unwrap();
            let mut cut = spans;
            cut.fields[t] = Some((start, len - 1, esc));
            assert_eq!(
                RawSend::attach(&cut, header).fields[t],
                None,
                "cuts the e-acute"
            );
            cut.fields[t] = Some((header.len() as u32, 1, esc));
            assert_eq!(
                RawSend::attach(&cut, header).fields[t],
                None,
                "beyond the end"
            );
        }
    }

    #[test]
    fn json_null_and_repeated_keys() {
        let header =
            br#"{"code":10,"extFields":{"topic":"A","topic":"B","queueId":"1","queueId":null}}"#;
        let view = HeaderView::parse(0, header).unwrap();
        let mut s = String::new();
        let raw = RawSend::from_view(&view);
        let h = raw.resolve(&mut s);
        assert_eq!(h.get(SendField::Topic), Some("B"));
        assert_eq!(h.get(SendField::QueueId), None);
    }

    #[test]
    fn pull_header_both_ways() {
        let c = RemotingCommand::request(
            11,
            1,
            vec![
                ("topic".into(), "T".into()),
                ("queueId".into(), "0".into()),
                ("queueOffset".into(), "5".into()),
                ("subscription".into(), "a || \"b\"".into()),
            ],
        );
        let wire = c.encode();
        let view = HeaderView::parse(0, &wire[8..]).unwrap();
        let mut s = String::new();
        let raw = RawPull::from_view(&view);
        let fast = raw.resolve(&mut s);
        assert_eq!(fast, PullHeader::from_command(&c));
        assert_eq!(fast.get(PullField::Subscription), Some("a || \"b\""));
    }
}
