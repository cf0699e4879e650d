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

use super::headers::{Collect, Typed, Want};
use super::{BINARY_FIXED_LEN, SerializeType};
use std::ops::Range;

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
                let mut lex = Lex { s: text, at: 0 };
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

// ---------------------------------------------------------------------------------
// JSON

/// A cursor over checked UTF-8 JSON text. Positions only ever stop on ASCII bytes, so
/// every slice taken is on a character boundary.
#[derive(Debug, Clone, Copy)]
pub struct Lex<'a> {
    s: &'a str,
    at: usize,
}

/// A JSON scalar, or the start of a nested value.
enum Value<'a> {
    Str(Text<'a>),
    Int(&'a str),
    Bool(&'a str),
    Null,
    Object,
    Array,
}

impl<'a> Lex<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.at).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips whitespace, then takes `b`.
    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        if self.peek()? == b {
            self.at += 1;
            Some(())
        } else {
            None
        }
    }

    /// A string at the cursor (after whitespace); checks its escapes and that it holds
    /// no control character. Declines surrogate escapes.
    #[inline(always)]
    fn string(&mut self) -> Option<Text<'a>> {
        self.eat(b'"')?;
        let b = self.s.as_bytes();
        let start = self.at;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = plain_run_end(b, i);
            match *b.get(i)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i = escape_at(b, i)?.1;
                }
                // A control character.
                _ => return None,
            }
        }
        self.at = i + 1;
        Some(Text {
            raw: self.s.get(start..i)?,
            escaped,
        })
    }

    /// A one-character key and its colon at the cursor, written without whitespace
    /// (`"b":`, as every client writes a V2 send header's keys): read with one load
    /// rather than as a string and then a colon, which give the same key. The byte
    /// between the quotes is a whole character: a byte of a longer one is never
    /// followed by a quote in UTF-8.
    #[inline(always)]
    fn short_key(&mut self) -> Option<&'a str> {
        let b = self.s.as_bytes().get(self.at..self.at + 4)?;
        if b[0] != b'"' || b[2] != b'"' || b[3] != b':' || matches!(b[1], b'"' | b'\\' | 0..=0x1f) {
            return None;
        }
        let key = self.s.get(self.at + 1..self.at + 2)?;
        self.at += 4;
        Some(key)
    }

    /// A key and its colon at the cursor, the general way: a string without escapes
    /// (a header with an escaped key is declined), whitespace allowed around the colon.
    fn key(&mut self) -> Scan<&'a str> {
        let key = self.string().ok_or(Declined)?;
        if key.escaped {
            return Err(Declined);
        }
        self.eat(b':').ok_or(Declined)?;
        Ok(key.raw)
    }

    /// An integer at the cursor: `-?(0|[1-9][0-9]*)` of at most [`MAX_INT_DIGITS`]
    /// digits, not `-0` (serde_json reads that as a float), not followed by a
    /// fraction or exponent.
    fn integer(&mut self) -> Option<&'a str> {
        let b = self.s.as_bytes();
        let start = self.at;
        let mut i = start;
        let negative = b.get(i) == Some(&b'-');
        if negative {
            i += 1;
        }
        let digits = i;
        match b.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => {
                while let Some(b'0'..=b'9') = b.get(i) {
                    i += 1;
                }
            }
            _ => return None,
        }
        if i - digits > MAX_INT_DIGITS
            || (negative && b.get(digits) == Some(&b'0'))
            || matches!(b.get(i), Some(b'.' | b'e' | b'E' | b'0'..=b'9'))
        {
            return None;
        }
        self.at = i;
        self.s.get(start..i)
    }

    fn literal(&mut self, word: &'static str) -> Option<&'a str> {
        let text = self.s.get(self.at..self.at + word.len())?;
        if text != word {
            return None;
        }
        self.at += word.len();
        Some(text)
    }

    /// The value at the cursor (after whitespace). For an object or array, the cursor
    /// stays on its opening bracket.
    #[inline(always)]
    fn value(&mut self) -> Option<Value<'a>> {
        self.ws();
        Some(match self.peek()? {
            b'"' => Value::Str(self.string()?),
            b'-' | b'0'..=b'9' => Value::Int(self.integer()?),
            b't' => Value::Bool(self.literal("true")?),
            b'f' => Value::Bool(self.literal("false")?),
            b'n' => {
                self.literal("null")?;
                Value::Null
            }
            b'{' => Value::Object,
            b'[' => Value::Array,
            _ => return None,
        })
    }

    /// After a member: `,` (more follow: true) or `}` (the object ends: false).
    fn member_end(&mut self) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(true)
            }
            b'}' => {
                self.at += 1;
                Some(false)
            }
            _ => None,
        }
    }
}

/// The first position at or after `i` in `b` that is not a plain string character:
/// a `"`, a `\\`, a control character (below 0x20), or `b.len()`.
///
/// Eight bytes at a time (the strings of a send header are most of its bytes; byte
/// by byte this loop was the parse's hottest, benches/headers.rs): for each of the
/// three tests a byte's high bit is set where it holds, exact for the lowest byte
/// that holds (a borrow only runs up from a byte that holds), which is all the
/// first position needs.
pub(super) fn plain_run_end(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = ONES * 0x80;
    /// High bit of each byte below `n` (bytes of 0x80 and more never count).
    fn below(w: u64, n: u8) -> u64 {
        w.wrapping_sub(ONES * n as u64) & !w & HIGHS
    }
    while let Some(chunk) = b.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let hits = below(w ^ (ONES * b'"' as u64), 1)
            | below(w ^ (ONES * b'\\' as u64), 1)
            | below(w, 0x20);
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if matches!(c, b'"' | b'\\' | 0..=0x1f) {
            break;
        }
        i += 1;
    }
    i
}

/// The character a JSON escape at `b[i]` (a backslash) stands for, and the position
/// after it. `None` for a bad escape and for any surrogate escape (declined: a pair is
/// valid JSON, but rare enough that the general decoder may take it).
fn escape_at(b: &[u8], i: usize) -> Option<(char, usize)> {
    let c = match *b.get(i + 1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hex = b.get(i + 2..i + 6)?;
            let mut v = 0u32;
            for h in hex {
                v = v * 16 + (*h as char).to_digit(16)?;
            }
            return Some((char::from_u32(v)?, i + 6));
        }
        _ => return None,
    };
    Some((c, i + 2))
}

/// An `i32` from a JSON integer's text, serde_json's way (`as_i64`, then `i32`).
fn int_i32(text: &str) -> Option<i32> {
    text.parse::<i64>().ok().and_then(|v| i32::try_from(v).ok())
}

/// The general decoder's `json_i32` for `version`, `opaque`, `flag`: an integer or a
/// string holding one, else 0. Declines what it cannot read alike.
fn json_i32_or_zero(v: Value<'_>) -> Scan<i32> {
    match v {
        Value::Int(t) => Ok(int_i32(t).unwrap_or(0)),
        Value::Str(t) => Ok(t.as_plain().ok_or(Declined)?.parse().unwrap_or(0)),
        Value::Bool(_) | Value::Null => Ok(0),
        Value::Object | Value::Array => Err(Declined),
    }
}

/// Checks an `extFields` object at the cursor (on its `{`), handing each field to
/// `collect`; returns its text. Every key is a string without escapes, every value a
/// string, an integer, a boolean or null.
fn json_ext_object<'a>(lex: &mut Lex<'a>, collect: &mut Collect) -> Scan<&'a str> {
    let start = lex.at;
    lex.eat(b'{').ok_or(Declined)?;
    lex.ws();
    if lex.peek() == Some(b'}') {
        lex.at += 1;
    } else {
        let mut pos = 0;
        loop {
            let key = match lex.short_key() {
                Some(key) => key,
                None => lex.key()?,
            };
            let value = match lex.value().ok_or(Declined)? {
                Value::Str(t) => Some(t),
                Value::Int(t) | Value::Bool(t) => Some(Text::plain(t)),
                Value::Null => None,
                Value::Object | Value::Array => return Err(Declined),
            };
            collect.field(pos, key, value, lex.s.as_bytes(), true);
            pos += 1;
            if !lex.member_end().ok_or(Declined)? {
                break;
            }
        }
    }
    lex.s.get(start..lex.at).ok_or(Declined)
}

/// The next field of a checked `extFields` object (`first`: right after the brace).
fn json_next_field<'a>(lex: &mut Lex<'a>, first: bool) -> Option<ExtField<'a>> {
    lex.ws();
    if first && lex.peek() == Some(b'}') {
        return None;
    }
    let key = lex.string()?;
    lex.eat(b':')?;
    let value = match lex.value()? {
        Value::Str(t) => Some(t),
        Value::Int(t) | Value::Bool(t) => Some(Text::plain(t)),
        Value::Null => None,
        Value::Object | Value::Array => return None,
    };
    // `,`: another field follows; `}`: this is the last. Either way this one counts.
    let more = lex.member_end()?;
    if !more {
        // Park the cursor at the end so the next call finds nothing.
        lex.at = lex.s.len();
    }
    Some(ExtField {
        key: key.raw,
        value,
    })
}

/// A key of a header's top-level object, by what the view does with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Code,
    Version,
    Opaque,
    Flag,
    Remark,
    ExtFields,
    /// `language`, `serializeTypeCurrentRPC` or any other: skipped.
    Other,
}

impl TopKey {
    fn of(key: &str) -> TopKey {
        match key {
            "code" => TopKey::Code,
            "version" => TopKey::Version,
            "opaque" => TopKey::Opaque,
            "flag" => TopKey::Flag,
            "remark" => TopKey::Remark,
            "extFields" => TopKey::ExtFields,
            _ => TopKey::Other,
        }
    }
}

impl Lex<'_> {
    /// A top-level key every client writes, with its quotes and colon and no
    /// whitespace (`"opaque":`), at the cursor: picked by its first letter and compared
    /// whole, without a string scan or a search of the names. The same key as
    /// [`Lex::string`] then a colon would read.
    #[inline(always)]
    fn top_key(&mut self) -> Option<TopKey> {
        let b = self.s.as_bytes().get(self.at..)?;
        /// Whether `b` starts with `text` (a fixed-size compare, no `memcmp` call).
        fn starts<const N: usize>(b: &[u8], text: &[u8; N]) -> Option<usize> {
            (b.get(..N)? == text).then_some(N)
        }
        let (len, key) = match *b.get(1)? {
            b'c' => (starts(b, b"\"code\":")?, TopKey::Code),
            b'e' => (starts(b, b"\"extFields\":")?, TopKey::ExtFields),
            b'f' => (starts(b, b"\"flag\":")?, TopKey::Flag),
            b'l' => (starts(b, b"\"language\":")?, TopKey::Other),
            b'o' => (starts(b, b"\"opaque\":")?, TopKey::Opaque),
            b'r' => (starts(b, b"\"remark\":")?, TopKey::Remark),
            b's' => (starts(b, b"\"serializeTypeCurrentRPC\":")?, TopKey::Other),
            b'v' => (starts(b, b"\"version\":")?, TopKey::Version),
            _ => return None,
        };
        self.at += len;
        Some(key)
    }
}

/// Reads a JSON header, collecting its ext fields into `collect` as it goes when its
/// code comes before them; returns the view and the code it collected for (`None`:
/// nothing collected).
fn parse_json<'a>(
    header: &'a [u8],
    want: &dyn Fn(i32) -> Want,
    collect: &mut Collect,
) -> Scan<(HeaderView<'a>, Option<i32>)> {
    let s = std::str::from_utf8(header).map_err(|_| Declined)?;
    let mut collected_for = None;
    let mut lex = Lex { s, at: 0 };
    let mut code = None;
    let (mut version, mut opaque, mut flag) = (0, 0, 0);
    let mut remark = None;
    let mut ext = Ext::None;
    lex.eat(b'{').ok_or(Declined)?;
    lex.ws();
    if lex.peek() == Some(b'}') {
        lex.at += 1;
    } else {
        loop {
            let key = match lex.top_key() {
                Some(key) => key,
                None => TopKey::of(lex.key()?),
            };
            let value = lex.value().ok_or(Declined)?;
            match key {
                TopKey::Code => {
                    code = Some(match value {
                        Value::Int(t) => int_i32(t).ok_or(Declined)?,
                        Value::Str(t) => {
                            t.as_plain().and_then(|t| t.parse().ok()).ok_or(Declined)?
                        }
                        _ => return Err(Declined),
                    })
                }
                TopKey::Version => version = json_i32_or_zero(value)?,
                TopKey::Opaque => opaque = json_i32_or_zero(value)?,
                TopKey::Flag => flag = json_i32_or_zero(value)?,
                TopKey::Remark => {
                    remark = match value {
                        Value::Str(t) => Some(t),
                        Value::Int(_) | Value::Bool(_) | Value::Null => None,
                        Value::Object | Value::Array => return Err(Declined),
                    }
                }
                TopKey::ExtFields => {
                    // Given twice, the last counts: what an earlier one collected goes.
                    collected_for = None;
                    ext = match value {
                        Value::Object => {
                            // Collected as read when the code came first (it does in
                            // every client's header we know), else after the parse.
                            collect.reset(code.map_or(Want::Other, want));
                            let text = json_ext_object(&mut lex, collect)?;
                            collected_for = code;
                            Ext::Json(text)
                        }
                        Value::Str(_) | Value::Int(_) | Value::Bool(_) | Value::Null => Ext::None,
                        Value::Array => return Err(Declined),
                    }
                }
                // `language`, `serializeTypeCurrentRPC` and anything else: not needed,
                // but only scalars are skipped.
                TopKey::Other => {
                    if matches!(value, Value::Object | Value::Array) {
                        return Err(Declined);
                    }
                }
            }
            if !lex.member_end().ok_or(Declined)? {
                break;
            }
        }
    }
    lex.ws();
    if lex.at != s.len() {
        return Err(Declined);
    }
    let view = HeaderView {
        code: code.ok_or(Declined)?,
        version,
        opaque,
        flag,
        serialize_type: SerializeType::Json,
        remark,
        ext,
    };
    Ok((view, collected_for))
}

// ---------------------------------------------------------------------------------
// binary

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
fn binary_field<'a>(
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
fn checked_text(ext: &[u8], range: Range<usize>) -> Option<&str> {
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
fn parse_binary<'a>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_run_ends_where_the_byte_loop_ends() {
        fn by_byte(b: &[u8], i: usize) -> usize {
            (i..b.len())
                .find(|&j| matches!(b[j], b'"' | b'\\' | 0..=0x1f))
                .unwrap_or(b.len())
        }
        // Every stop byte, and the bytes next to the tests' bounds (a borrow or a
        // high bit in the wrong place would show), at every position of a run
        // longer than two words, behind every other kind of byte.
        let stops = [b'"', b'\\', 0x00, 0x01, 0x1f];
        let plain = [b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0x81, 0xff];
        for len in 0..24 {
            for at in 0..=len {
                for &stop in &stops {
                    for &fill in &plain {
                        let mut b = vec![fill; len];
                        if at < len {
                            b[at] = stop;
                        }
                        // A second stop after the first must not hide it.
                        b.push(0x00);
                        b.push(b'"');
                        for from in 0..=at.min(len) {
                            assert_eq!(
                                plain_run_end(&b, from),
                                by_byte(&b, from),
                                "{b:?} from {from}"
                            );
                        }
                    }
                }
            }
        }
        // Byte pairs across a word: each stop right above each other byte.
        for x in 0..=255u8 {
            for &stop in &stops {
                let b = [b'a', b'a', b'a', x, stop, b'a', b'a', b'a', b'a'];
                assert_eq!(plain_run_end(&b, 0), by_byte(&b, 0), "{b:?}");
            }
        }
    }

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
