//! Zero-copy views of command headers, for the hot request codes (issue 20).
//!
//! [`HeaderView::parse`] reads a header (JSON or RocketMQ's binary layout) straight from
//! the frame's bytes: the fixed fields as numbers, the remark and the ext fields as
//! spans of the header. Nothing is allocated and no value tree is built.
//! [`HeaderView::parse_typed`] also hands each ext field, as it reads it, to the typed
//! header (`headers.rs`) the request's code names, so the node reads them once.
//!
//! The view takes only headers it reads exactly as the general decoders do
//! (`json_header.rs` through serde_json, `binary_header.rs`), and answers [`Declined`]
//! for every other header: invalid ones, and valid but unusual ones (nested values
//! outside `extFields`, floats, escaped keys, `-0`, integers of 19 digits or more, a
//! surrogate escape). A declined header goes to the general decoder, which accepts or
//! refuses it as before, so on every input the two paths answer alike
//! (`tests/header_decoders.rs` checks it, `scripts/fuzz.sh header_scan` too).
//!
//! JSON rules followed (serde_json's, which the general decoder uses): the header is
//! UTF-8; one object and nothing but whitespace (space, tab, CR, LF) after it; a key
//! given twice counts once, its last value; an `extFields` value that is `null` counts
//! as absent (the general decoder skips nulls) and numbers and booleans there count as
//! their JSON text; `code`, `version`, `opaque`, `flag` may be integers or strings.
//! Binary rules: `binary_header.rs`'s, with a field given twice read at its first.

mod binary;
mod json;

use super::SerializeType;
use super::headers::{Collect, Typed, Want};
use binary::{binary_field, checked_text, parse_binary};
pub(super) use json::plain_run_end;
use json::{Lex, escape_at, json_next_field, parse_json};

/// The header is not one this view reads exactly as the general decoder: use that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declined;

type Scan<T> = Result<T, Declined>;

/// Most digits of an integer this view takes (any such integer fits an `i64`).
const MAX_INT_DIGITS: usize = 18;

/// A command header read in place.
#[derive(Debug, Clone, Copy)]
pub struct HeaderView<'a> {
    pub code: i32,
    pub version: i32,
    pub opaque: i32,
    pub flag: i32,
    pub serialize_type: SerializeType,
    /// The remark, raw (JSON: between the quotes, escapes kept).
    pub remark: Option<Text<'a>>,
    ext: Ext<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Ext<'a> {
    None,
    /// The `extFields` object's text, braces included, already checked.
    Json(&'a str),
    /// The binary ext bytes, already checked.
    Binary(&'a [u8]),
}

/// A header string in place: JSON text between its quotes (escapes not yet applied),
/// the JSON text of a number or boolean, or a binary header's UTF-8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text<'a> {
    pub raw: &'a str,
    /// JSON escapes to apply ([`Text::unescape_into`]).
    pub escaped: bool,
}

impl<'a> Text<'a> {
    fn plain(raw: &'a str) -> Text<'a> {
        Text {
            raw,
            escaped: false,
        }
    }

    /// The text without escapes, when it has none.
    pub fn as_plain(&self) -> Option<&'a str> {
        (!self.escaped).then_some(self.raw)
    }

    /// Appends the text with its escapes applied to `out`.
    pub fn unescape_into(&self, out: &mut String) {
        if !self.escaped {
            out.push_str(self.raw);
            return;
        }
        let b = self.raw.as_bytes();
        let mut i = 0;
        let mut run = 0;
        while i < b.len() {
            // To the next backslash, a run at a time (a string's text holds no quote or
            // control character, where the run also stops, but a stop at one is passed).
            i = plain_run_end(b, i);
            if i >= b.len() {
                break;
            }
            if b[i] != b'\\' {
                i += 1;
                continue;
            }
            out.push_str(&self.raw[run..i]);
            match escape_at(b, i) {
                Some((c, next)) => {
                    out.push(c);
                    i = next;
                }
                // Checked when the view was made; never reached.
                None => return,
            }
            run = i;
        }
        out.push_str(&self.raw[run..]);
    }

    /// The text with escapes applied, as an owned string.
    pub fn to_owned_string(&self) -> String {
        let mut s = String::with_capacity(self.raw.len());
        self.unescape_into(&mut s);
        s
    }
}

/// One ext field: its key, and its value (`None`: a JSON `null`, which makes the
/// field absent, also when an earlier value named it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtField<'a> {
    pub key: &'a str,
    pub value: Option<Text<'a>>,
}

impl<'a> HeaderView<'a> {
    /// Reads a header of `kind` (the frame's serialize-type byte).
    pub fn parse(kind: u8, header: &'a [u8]) -> Scan<HeaderView<'a>> {
        Self::parse_typed(kind, header, |_| Want::Other).map(|(v, _)| v)
    }

    /// Reads a header of `kind` and collects its ext fields into the typed header
    /// `want` names for its code ([`super::headers::typed_for_code`] on the node), in
    /// the same pass: each field is read once. (A JSON header whose `code` comes after
    /// its `extFields`, which no client we know writes, gets a second pass over them.)
    pub fn parse_typed(
        kind: u8,
        header: &'a [u8],
        want: impl Fn(i32) -> Want,
    ) -> Scan<(HeaderView<'a>, Typed)> {
        // Filled in place: the collection is a few hundred bytes, and moving it out of
        // each function was ~10% of the header's read (benches/headers.rs).
        let mut collect = Collect::Other;
        let (view, collected_for) = match kind {
            0 => parse_json(header, &want, &mut collect)?,
            1 => parse_binary(header, &want, &mut collect)?,
            _ => return Err(Declined),
        };
        let last_wins = view.last_wins();
        if collected_for != Some(view.code) {
            collect.reset(want(view.code));
            if !matches!(collect, Collect::Other) {
                for (pos, f) in view.ext_fields().enumerate() {
                    collect.field(pos as u32, f.key, f.value, header, last_wins);
                }
            }
        }
        // Where the fields' texts lie: a binary header's ext fields, else all of it.
        let text = match view.ext {
            Ext::Binary(ext) => {
                let from = ext.as_ptr() as usize - header.as_ptr() as usize;
                (from as u32, (from + ext.len()) as u32)
            }
            Ext::None | Ext::Json(_) => (0, header.len() as u32),
        };
        Ok((view, collect.finish(last_wins, text)))
    }

    pub fn is_response(&self) -> bool {
        self.flag & super::FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & super::FLAG_ONEWAY != 0
    }

    /// Whether a key given twice counts at its last value (JSON) or its first (binary).
    pub fn last_wins(&self) -> bool {
        self.serialize_type == SerializeType::Json
    }

    /// The ext fields in wire order.
    pub fn ext_fields(&self) -> ExtFields<'a> {
        match self.ext {
            Ext::None => ExtFields::Done,
            Ext::Json(text) => {
                // Past the opening brace (checked at parse).
                let mut lex = Lex::new(text);
                match lex.eat(b'{') {
                    Some(()) => ExtFields::Json(lex, true),
                    None => ExtFields::Done,
                }
            }
            Ext::Binary(bytes) => ExtFields::Binary(bytes, 0),
        }
    }
}

/// Iterator over a view's ext fields.
pub enum ExtFields<'a> {
    Done,
    /// The lexer, and whether the next field is the first.
    Json(Lex<'a>, bool),
    /// The ext fields, and where the next one starts.
    Binary(&'a [u8], usize),
}

impl<'a> Iterator for ExtFields<'a> {
    type Item = ExtField<'a>;

    fn next(&mut self) -> Option<ExtField<'a>> {
        let item = match self {
            ExtFields::Done => None,
            ExtFields::Json(lex, first) => {
                let f = json_next_field(lex, *first);
                *first = false;
                f
            }
            // `None` at the end or on damage (which the parse already ruled out).
            ExtFields::Binary(ext, at) => (*at < ext.len())
                .then(|| binary_field(ext, at, &|r| checked_text(ext, r)).ok())
                .flatten(),
        };
        if item.is_none() {
            *self = ExtFields::Done;
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: &HeaderView<'_>) -> Vec<(String, Option<String>)> {
        v.ext_fields()
            .map(|f| (f.key.to_string(), f.value.map(|t| t.to_owned_string())))
            .collect()
    }

    #[test]
    fn reads_a_send_header_in_place() {
        let h = br#"{"code":310,"extFields":{"a":"g","b":"T","e":"3","i":"KEYS\u0001k\u0002","n":null},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":401}"#;
        let v = HeaderView::parse(0, h).unwrap();
        assert_eq!((v.code, v.opaque, v.version, v.flag), (310, 7, 401, 0));
        assert_eq!(
            fields(&v),
            vec![
                ("a".into(), Some("g".into())),
                ("b".into(), Some("T".into())),
                ("e".into(), Some("3".into())),
                ("i".into(), Some("KEYS\u{1}k\u{2}".into())),
                ("n".into(), None),
            ]
        );
    }

    #[test]
    fn declines_what_it_does_not_read_alike() {
        for h in [
            &br#"{"code":10.0}"#[..],
            br#"{"code":-0}"#,
            br#"{"code":1234567890123456789}"#,
            br#"{"code":10,"extFields":{"a":[1]}}"#,
            br#"{"code":10,"extFields":{"a":1.5}}"#,
            br#"{"code":10,"extFields":{"\u0061":"x"}}"#,
            br#"{"code":10,"x":{}}"#,
            br#"{"code":10,"extFields":{"a":"\ud800\udc00"}}"#,
            br#"{"code":10} x"#,
            br#"{"code":10,}"#,
            br#"{"code":"x"}"#,
            br#"{"opaque":1}"#,
            b"{\"code\":10,\"remark\":\"a\x01\"}",
            b"[]",
            b"",
        ] {
            assert_eq!(
                HeaderView::parse(0, h).map(|v| v.code),
                Err(Declined),
                "{}",
                String::from_utf8_lossy(h)
            );
        }
    }

    #[test]
    fn numbers_and_strings_for_the_fixed_fields() {
        let v = HeaderView::parse(
            0,
            br#" { "code" : "11" , "opaque":"x","flag":true,"version":99999999999 } "#,
        )
        .unwrap();
        assert_eq!((v.code, v.opaque, v.flag, v.version), (11, 0, 0, 0));
    }

    #[test]
    fn binary_header_in_place() {
        let mut c = super::super::RemotingCommand::request(
            320,
            9,
            vec![("b".into(), "T".into()), ("e".into(), "1".into())],
        );
        c.serialize_type = SerializeType::RocketMq;
        let frame = c.encode();
        let header = &frame[8..];
        let v = HeaderView::parse(1, header).unwrap();
        assert_eq!((v.code, v.opaque), (320, 9));
        assert_eq!(
            fields(&v),
            vec![
                ("b".into(), Some("T".into())),
                ("e".into(), Some("1".into()))
            ]
        );
        assert!(HeaderView::parse(1, &header[..header.len() - 1]).is_err());
    }
}
