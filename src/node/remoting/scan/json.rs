//! The JSON half of [`HeaderView`](super::HeaderView): a cursor over the header's
//! checked UTF-8 text, and the header's read with its ext fields collected in the same
//! pass (serde_json's rules, as the module above says).

use super::{Declined, Ext, ExtField, HeaderView, MAX_INT_DIGITS, Scan, Text};
use crate::node::remoting::SerializeType;
use crate::node::remoting::headers::{Collect, Want};

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
    /// An integer's text and its value (read as its digits are scanned).
    Int(&'a str, i64),
    Bool(&'a str),
    Null,
    Object,
    Array,
}

impl<'a> Lex<'a> {
    /// A cursor at the start of `s`.
    pub(super) fn new(s: &'a str) -> Lex<'a> {
        Lex { s, at: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.at).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips whitespace, then takes `b`.
    pub(super) fn eat(&mut self, b: u8) -> Option<()> {
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
    /// fraction or exponent. Its text and its value, summed as the digits are scanned
    /// (the fixed fields' texts were parsed again after the scan: ~20 ns of a send
    /// header's read in a node's profile, `benches/headers.rs` too coarse to see it).
    fn integer(&mut self) -> Option<(&'a str, i64)> {
        let b = self.s.as_bytes();
        let start = self.at;
        let mut i = start;
        let negative = b.get(i) == Some(&b'-');
        if negative {
            i += 1;
        }
        let digits = i;
        // At most MAX_INT_DIGITS (18) digits are summed before the length is checked:
        // below 10^18, so no overflow.
        let mut value: i64 = 0;
        match b.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => {
                while let Some(&d @ b'0'..=b'9') = b.get(i) {
                    if i - digits < MAX_INT_DIGITS {
                        value = value * 10 + (d - b'0') as i64;
                    }
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
        Some((self.s.get(start..i)?, if negative { -value } else { value }))
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
            b'-' | b'0'..=b'9' => {
                let (text, value) = self.integer()?;
                Value::Int(text, value)
            }
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
pub(in crate::node::remoting) fn plain_run_end(b: &[u8], mut i: usize) -> usize {
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
pub(super) fn escape_at(b: &[u8], i: usize) -> Option<(char, usize)> {
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

/// The general decoder's `json_i32` for `version`, `opaque`, `flag`: an integer or a
/// string holding one, else 0. Declines what it cannot read alike.
fn json_i32_or_zero(v: Value<'_>) -> Scan<i32> {
    match v {
        Value::Int(_, v) => Ok(i32::try_from(v).unwrap_or(0)),
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
                Value::Int(t, _) | Value::Bool(t) => Some(Text::plain(t)),
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
pub(super) fn json_next_field<'a>(lex: &mut Lex<'a>, first: bool) -> Option<ExtField<'a>> {
    lex.ws();
    if first && lex.peek() == Some(b'}') {
        return None;
    }
    let key = lex.string()?;
    lex.eat(b':')?;
    let value = match lex.value()? {
        Value::Str(t) => Some(t),
        Value::Int(t, _) | Value::Bool(t) => Some(Text::plain(t)),
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
pub(super) fn parse_json<'a>(
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
                        // serde_json's way: `as_i64`, then `i32`.
                        Value::Int(_, v) => i32::try_from(v).map_err(|_| Declined)?,
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
                        Value::Int(..) | Value::Bool(_) | Value::Null => None,
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
                        Value::Str(_) | Value::Int(..) | Value::Bool(_) | Value::Null => Ext::None,
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
}
