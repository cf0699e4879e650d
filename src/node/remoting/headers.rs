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
//! * [`HeaderView::parse_typed`](super::scan::HeaderView::parse_typed) collects the ext
//!   fields of the typed header the request's code names as it reads the frame's
//!   header, once, into [`Spans`] (offsets into the header, nothing allocated); the
//!   request's task, which owns the frame, reads them with [`SendHeader::resolve`] /
//!   [`PullHeader::resolve`], escaped JSON strings unescaped into a scratch string the
//!   caller keeps across requests. Reading the ext fields twice (a check, then a
//!   collecting pass) and copying the fields between arrays three times were ~22% of
//!   a node's samples under single sends; in one pass the parse's own functions hold
//!   ~6.5%, ~10-12% with everything called under them (docs/performance/node.md).
//!
//! `tests/header_decoders.rs` checks that both give the same header on every input the
//! view takes.

use super::RemotingCommand;
use super::scan::Text;

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
        SendHeader {
            fields: collect_send(req),
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
            if let Some(i) = pull_index(k)
                && fields[i].is_none()
            {
                fields[i] = Some(v.as_str());
            }
        }
        PullHeader { fields }
    }
}

/// Collects the send fields from a decoded command's ext fields (in the general
/// decoder's order, its first value of a key), then maps one-letter names
/// ([`map_short_names`]).
fn collect_send(req: &RemotingCommand) -> [Option<&str>; SEND_FIELD_COUNT] {
    let mut long = [None; SEND_FIELD_COUNT];
    let mut short = [None; SEND_FIELD_COUNT];
    for (pos, (key, val)) in req.ext_fields.iter().enumerate() {
        let (slots, i) = match send_index(key) {
            Some((true, i)) => (&mut long, i),
            Some((false, i)) => (&mut short, i),
            None => continue,
        };
        if slots[i].is_none() {
            slots[i] = Some((val.as_str(), pos));
        }
    }
    map_short_names(&long, &short, |_, l, s| s.1 < l.1).map(|f| f.map(|(text, _)| text))
}

/// RocketMQ's mapping of one-letter names: when the header has no `topic` but a `b`,
/// each field takes its one-letter value, or its long one when that comes first in
/// the general decoder's order (`short_first`).
fn map_short_names<T: Copy>(
    long: &[Option<T>; SEND_FIELD_COUNT],
    short: &[Option<T>; SEND_FIELD_COUNT],
    short_first: impl Fn(usize, &T, &T) -> bool,
) -> [Option<T>; SEND_FIELD_COUNT] {
    let topic = SendField::Topic as usize;
    if !short_names_apply(long[topic].is_some(), short[topic].is_some()) {
        return *long;
    }
    std::array::from_fn(|i| mapped(long[i], short[i], |l, s| short_first(i, l, s)))
}

/// Whether a send header's one-letter names apply (RocketMQ's V2 mapping): it has no
/// `topic` but a `b`.
fn short_names_apply(has_topic: bool, has_b: bool) -> bool {
    !has_topic && has_b
}

/// A field's value under the one-letter mapping: the one-letter value, or the long one
/// when only it is given or when it comes first (`short_first` false).
fn mapped<T: Copy>(
    long: Option<T>,
    short: Option<T>,
    short_first: impl Fn(&T, &T) -> bool,
) -> Option<T> {
    match (long, short) {
        (Some(l), Some(s)) => Some(if short_first(&l, &s) { s } else { l }),
        (l, s) => s.or(l),
    }
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
        return match SHORT_INDEX.get(b as usize) {
            Some(&i) if i != u8::MAX => Some((false, i as usize)),
            _ => None,
        };
    }
    // A match (by length, then the bytes), not a search of the table.
    let f = match key {
        "producerGroup" => SendField::ProducerGroup,
        "topic" => SendField::Topic,
        "defaultTopic" => SendField::DefaultTopic,
        "defaultTopicQueueNums" => SendField::DefaultTopicQueueNums,
        "queueId" => SendField::QueueId,
        "sysFlag" => SendField::SysFlag,
        "bornTimestamp" => SendField::BornTimestamp,
        "flag" => SendField::Flag,
        "properties" => SendField::Properties,
        "reconsumeTimes" => SendField::ReconsumeTimes,
        "unitMode" => SendField::UnitMode,
        "maxReconsumeTimes" => SendField::MaxReconsumeTimes,
        "batch" => SendField::Batch,
        "brokerName" => SendField::BrokerName,
        _ => return None,
    };
    Some((true, f as usize))
}

/// The field index of a pull header key.
fn pull_index(key: &str) -> Option<usize> {
    let f = match key {
        "consumerGroup" => PullField::ConsumerGroup,
        "topic" => PullField::Topic,
        "queueId" => PullField::QueueId,
        "queueOffset" => PullField::QueueOffset,
        "maxMsgNums" => PullField::MaxMsgNums,
        "sysFlag" => PullField::SysFlag,
        "commitOffset" => PullField::CommitOffset,
        "suspendTimeoutMillis" => PullField::SuspendTimeoutMillis,
        "subscription" => PullField::Subscription,
        "subVersion" => PullField::SubVersion,
        "expressionType" => PullField::ExpressionType,
        _ => return None,
    };
    Some(f as usize)
}

/// Where one field's text lies in its header: start, length, whether it has JSON
/// escapes to apply. Eight bytes, and an `Option` of one as well (the start is kept
/// plus one, never zero; the escape flag is the length's top bit): the spans travel
/// with every request from the frame's reader to its task, and at 12 bytes a span
/// the collection's reset, the typed header's copy out of the read and its finish were
/// ~18% of a node's `memmove` under JSON single sends (5.5 + 8.4 + 4.1%, a call-graph
/// profile); the binary header's read 193-202 -> 161-167 ns (benches/headers.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    start_plus_one: std::num::NonZeroU32,
    len_and_escaped: u32,
}

const ESCAPED: u32 = 1 << 31;
const _: () = assert!(std::mem::size_of::<Option<Span>>() == 8);

impl Span {
    /// The span of `t`, a text inside `header` (`None` if it is not, or if it does not
    /// fit the span's fields: a header of 2 GiB or more, which no frame is).
    fn of(t: Text<'_>, header: &[u8]) -> Option<Span> {
        let start = (t.raw.as_ptr() as usize).checked_sub(header.as_ptr() as usize)?;
        Span::new(start, t.raw.len(), t.escaped).filter(|_| start + t.raw.len() <= header.len())
    }

    fn new(start: usize, len: usize, escaped: bool) -> Option<Span> {
        let start_plus_one = u32::try_from(start.checked_add(1)?).ok()?;
        let len = u32::try_from(len).ok().filter(|l| l & ESCAPED == 0)?;
        Some(Span {
            start_plus_one: std::num::NonZeroU32::new(start_plus_one)?,
            len_and_escaped: len | if escaped { ESCAPED } else { 0 },
        })
    }

    fn start(&self) -> usize {
        self.start_plus_one.get() as usize - 1
    }

    fn len(&self) -> usize {
        (self.len_and_escaped & !ESCAPED) as usize
    }

    fn escaped(&self) -> bool {
        self.len_and_escaped & ESCAPED != 0
    }
}

/// A typed header's field texts as spans of its header bytes: what the reader of a
/// frame hands to the request's task, which owns the frame and reads the texts from
/// them without parsing again ([`SendHeader::resolve`], [`PullHeader::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spans<const N: usize> {
    fields: [Option<Span>; N],
    /// The part of the header that holds the fields' texts (JSON: all of it; binary:
    /// the ext fields), checked as UTF-8 once by [`Spans::resolve`] rather than per
    /// field (a check per field was a third of a binary header's read).
    text: (u32, u32),
}

/// The typed header a header's ext fields were collected into, by its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Typed {
    Send(Spans<SEND_FIELD_COUNT>),
    Pull(Spans<PULL_FIELD_COUNT>),
    /// A code without a typed header: nothing collected.
    Other,
}

/// Which typed header a request code has (codes 10, 310, 320: send; 11, 361: pull).
pub fn typed_for_code(code: i32) -> Want {
    use super::codes::{
        LITE_PULL_MESSAGE, PULL_MESSAGE, SEND_BATCH_MESSAGE, SEND_MESSAGE, SEND_MESSAGE_V2,
    };
    match code {
        SEND_MESSAGE | SEND_MESSAGE_V2 | SEND_BATCH_MESSAGE => Want::Send,
        PULL_MESSAGE | LITE_PULL_MESSAGE => Want::Pull,
        _ => Want::Other,
    }
}

/// Which typed header to collect a header's ext fields into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Send,
    Pull,
    Other,
}

/// A send or pull header's ext fields, collected one by one as the header is read
/// (once, in [`super::scan::HeaderView::parse_typed`]), into spans of the header.
// A temporary of one parse on its stack: boxing the large variant would allocate per
// request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Collect {
    Send {
        /// Each field's span and wire position: at `i` under its long name, at
        /// `SEND_FIELD_COUNT + i` under its one-letter name; `present` says which hold
        /// one. Flat arrays and a bit mask rather than `Option`s of pairs, which every
        /// read filled, mapped and copied: a binary header's read 315-319 -> 265-274 ns,
        /// a JSON one's 651-672 -> 608-626 (benches/headers.rs, three runs each).
        slots: [Span; 2 * SEND_FIELD_COUNT],
        pos: [u32; 2 * SEND_FIELD_COUNT],
        present: u32,
    },
    Pull([Option<Span>; PULL_FIELD_COUNT]),
    Other,
}

const _: () = assert!(2 * SEND_FIELD_COUNT <= u32::BITS as usize);

const NO_SPAN: Span = Span {
    start_plus_one: std::num::NonZeroU32::MIN,
    len_and_escaped: 0,
};

impl Collect {
    /// Empties the collection for a header of the typed kind `want` names.
    pub(crate) fn reset(&mut self, want: Want) {
        *self = match want {
            Want::Send => Collect::Send {
                slots: [NO_SPAN; 2 * SEND_FIELD_COUNT],
                pos: [0; 2 * SEND_FIELD_COUNT],
                present: 0,
            },
            Want::Pull => Collect::Pull([None; PULL_FIELD_COUNT]),
            Want::Other => Collect::Other,
        }
    }

    /// Ext field number `at` (wire order) of `header`: `key`, and its value (`None`:
    /// JSON `null`). `last_wins`: a key given twice counts at its last value (JSON),
    /// else its first (binary).
    pub(crate) fn field(
        &mut self,
        at: u32,
        key: &str,
        value: Option<Text<'_>>,
        header: &[u8],
        last_wins: bool,
    ) {
        match self {
            Collect::Send {
                slots,
                pos,
                present,
            } => {
                let i = match send_index(key) {
                    Some((true, i)) => i,
                    Some((false, i)) => SEND_FIELD_COUNT + i,
                    None => return,
                };
                let bit = 1u32 << i;
                if last_wins || *present & bit == 0 {
                    match value.and_then(|t| Span::of(t, header)) {
                        Some(span) => {
                            slots[i] = span;
                            pos[i] = at;
                            *present |= bit;
                        }
                        None => *present &= !bit,
                    }
                }
            }
            Collect::Pull(slots) => {
                if let Some(i) = pull_index(key)
                    && (last_wins || slots[i].is_none())
                {
                    slots[i] = value.and_then(|t| Span::of(t, header));
                }
            }
            Collect::Other => {}
        }
    }

    /// The typed header collected. `last_wins` as for [`Collect::field`]: it also says
    /// the general decoder's order (JSON: by key; binary: by position).
    /// `text`: the part of the header holding the texts ([`Spans`]).
    pub(crate) fn finish(&self, last_wins: bool, text: (u32, u32)) -> Typed {
        match self {
            Collect::Send {
                slots,
                pos,
                present,
            } => {
                let get = |i: usize| (present & (1 << i) != 0).then_some(i);
                let topic = SendField::Topic as usize;
                let short = short_names_apply(
                    get(topic).is_some(),
                    get(SEND_FIELD_COUNT + topic).is_some(),
                );
                let mut fields = [None; SEND_FIELD_COUNT];
                for (i, f) in fields.iter_mut().enumerate() {
                    let long = get(i);
                    let slot = if short {
                        mapped(long, get(SEND_FIELD_COUNT + i), |&l, &s| {
                            if last_wins {
                                // JSON: the general decoder sorts keys.
                                SEND_FIELDS[i].1 < SEND_FIELDS[i].0
                            } else {
                                pos[s] < pos[l]
                            }
                        })
                    } else {
                        long
                    };
                    *f = slot.map(|s| slots[s]);
                }
                Typed::Send(Spans { fields, text })
            }
            Collect::Pull(fields) => Typed::Pull(Spans {
                fields: *fields,
                text,
            }),
            Collect::Other => Typed::Other,
        }
    }
}

impl<const N: usize> Spans<N> {
    /// The texts in `header` (the bytes the spans were taken from), escapes applied
    /// into `scratch` (cleared first); a span that does not fit or is not UTF-8 there
    /// reads as absent.
    fn resolve<'s>(&self, header: &'s [u8], scratch: &'s mut String) -> [Option<&'s str>; N] {
        // The part holding the texts is checked once and each field sliced out of it
        // (a char-boundary check): the same answer as a check per field, without a
        // UTF-8 pass per field (~2% of a node's samples). A field outside it, or a part
        // that is not UTF-8 as a whole, is checked on its own.
        const { assert!(N <= u32::BITS as usize) };
        let (from, to) = (self.text.0 as usize, self.text.1 as usize);
        let text = header
            .get(from..to)
            .and_then(|t| std::str::from_utf8(t).ok());
        scratch.clear();
        let mut out: [Option<&'s str>; N] = [None; N];
        // Fields with escapes: unescaped into `scratch` first, set once it is done.
        let mut unescaped = [(0u32, 0u32); N];
        let mut escaped_fields = 0u32;
        for (i, f) in self.fields.iter().enumerate() {
            let Some(f) = *f else {
                continue;
            };
            let escaped = f.escaped();
            let span = f.start()..f.start() + f.len();
            let raw = match text {
                Some(text) if from <= span.start && span.end <= to => {
                    text.get(span.start - from..span.end - from)
                }
                _ => header.get(span).and_then(|b| std::str::from_utf8(b).ok()),
            };
            let Some(raw) = raw else { continue };
            if escaped {
                let at = scratch.len() as u32;
                Text { raw, escaped }.unescape_into(scratch);
                unescaped[i] = (at, scratch.len() as u32);
                escaped_fields |= 1 << i;
            } else {
                out[i] = Some(raw);
            }
        }
        if escaped_fields != 0 {
            let scratch: &'s String = scratch;
            for (i, (o, &(a, b))) in out.iter_mut().zip(&unescaped).enumerate() {
                if escaped_fields & (1 << i) != 0 {
                    *o = Some(scratch.get(a as usize..b as usize).unwrap_or(""));
                }
            }
        }
        out
    }
}

impl<'s> SendHeader<'s> {
    /// The send header from its spans in `header`, escapes applied into `scratch`.
    pub fn resolve(
        spans: &Spans<SEND_FIELD_COUNT>,
        header: &'s [u8],
        scratch: &'s mut String,
    ) -> SendHeader<'s> {
        SendHeader {
            fields: spans.resolve(header, scratch),
        }
    }
}

impl<'s> PullHeader<'s> {
    /// The pull header from its spans in `header`, escapes applied into `scratch`.
    pub fn resolve(
        spans: &Spans<PULL_FIELD_COUNT>,
        header: &'s [u8],
        scratch: &'s mut String,
    ) -> PullHeader<'s> {
        PullHeader {
            fields: spans.resolve(header, scratch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::remoting::scan::HeaderView;
    use crate::node::remoting::{SerializeType, decode_frame};

    /// The send spans of `header` (collected whatever its code).
    fn send_spans(kind: u8, header: &[u8]) -> Spans<SEND_FIELD_COUNT> {
        match HeaderView::parse_typed(kind, header, |_| Want::Send)
            .unwrap()
            .1
        {
            Typed::Send(spans) => spans,
            other => panic!("{other:?}"),
        }
    }

    fn both(c: &RemotingCommand) -> (SendHeader<'_>, Vec<Option<String>>) {
        let wire = c.encode();
        let (back, _) = decode_frame(&wire, 1 << 20).unwrap().unwrap();
        let mut scratch = String::new();
        let header = &wire[8..];
        let spans = send_spans(c.serialize_type as u8, header);
        let fast = SendHeader::resolve(&spans, header, &mut scratch);
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

    /// Every pull field name finds its own field, and nothing else does.
    #[test]
    fn every_pull_name_maps_to_its_field() {
        for (i, name) in PULL_FIELDS.iter().enumerate() {
            assert_eq!(pull_index(name), Some(i), "{name}");
        }
        for other in ["a", "b", "", "producerGroup", "queueIdX"] {
            assert_eq!(pull_index(other), None, "{other}");
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
    fn spans_resolve_to_the_same_texts() {
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
            let spans = send_spans(kind as u8, header);
            let mut scratch = String::new();
            let h = SendHeader::resolve(&spans, header, &mut scratch);
            assert_eq!(h.get(SendField::Topic), Some("T\u{e9}"), "{kind:?}");
            assert_eq!(h.get(SendField::Properties), Some(&*"p".repeat(200)));
            let t = SendField::Topic as usize;
            let span = spans.fields[t].unwrap();
            let mut cut = spans;
            cut.fields[t] = Span::new(span.start(), span.len() - 1, span.escaped());
            let h = SendHeader::resolve(&cut, header, &mut scratch);
            assert_eq!(h.get(SendField::Topic), None, "cuts the e-acute");
            cut.fields[t] = Span::new(header.len(), 1, span.escaped());
            let h = SendHeader::resolve(&cut, header, &mut scratch);
            assert_eq!(h.get(SendField::Topic), None, "beyond the end");
        }
    }

    /// The node collects the typed header its code names, in the same pass as the
    /// rest of the header; a JSON header whose code comes after its ext fields, or
    /// changes after them (given twice: the last counts), gets the same result.
    #[test]
    fn the_code_picks_the_typed_header_wherever_it_stands() {
        let send = br#"{"code":310,"extFields":{"b":"T","e":"3"},"flag":0}"#;
        let late = br#"{"extFields":{"b":"T","e":"3"},"flag":0,"code":310}"#;
        let changed = br#"{"code":11,"extFields":{"b":"T","e":"3"},"code":310}"#;
        let mut s = String::new();
        for h in [&send[..], late, changed] {
            let (view, typed) = HeaderView::parse_typed(0, h, typed_for_code).unwrap();
            assert_eq!(view.code, 310);
            let Typed::Send(spans) = typed else {
                panic!("{typed:?}")
            };
            let header = SendHeader::resolve(&spans, h, &mut s);
            assert_eq!(header.get(SendField::Topic), Some("T"));
            assert_eq!(header.get(SendField::QueueId), Some("3"));
        }
        let pull = br#"{"code":11,"extFields":{"topic":"T","queueId":"2"}}"#;
        let (_, typed) = HeaderView::parse_typed(0, pull, typed_for_code).unwrap();
        let Typed::Pull(spans) = typed else {
            panic!("{typed:?}")
        };
        assert_eq!(
            PullHeader::resolve(&spans, pull, &mut s).get(PullField::QueueId),
            Some("2")
        );
        let other = br#"{"code":34,"extFields":{"topic":"T"}}"#;
        let (_, typed) = HeaderView::parse_typed(0, other, typed_for_code).unwrap();
        assert_eq!(typed, Typed::Other);
        // An extFields given twice: only the last one's fields.
        let twice = br#"{"code":310,"extFields":{"b":"T","e":"3"},"extFields":{"b":"U"}}"#;
        let spans = send_spans(0, twice);
        let header = SendHeader::resolve(&spans, twice, &mut s);
        assert_eq!(header.get(SendField::Topic), Some("U"));
        assert_eq!(header.get(SendField::QueueId), None);
    }

    #[test]
    fn json_null_and_repeated_keys() {
        let header =
            br#"{"code":10,"extFields":{"topic":"A","topic":"B","queueId":"1","queueId":null}}"#;
        let spans = send_spans(0, header);
        let mut s = String::new();
        let h = SendHeader::resolve(&spans, header, &mut s);
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
        let header = &wire[8..];
        let Typed::Pull(spans) = HeaderView::parse_typed(0, header, |_| Want::Pull)
            .unwrap()
            .1
        else {
            panic!("not collected")
        };
        let mut s = String::new();
        let fast = PullHeader::resolve(&spans, header, &mut s);
        assert_eq!(fast, PullHeader::from_command(&c));
        assert_eq!(fast.get(PullField::Subscription), Some("a || \"b\""));
    }
}
