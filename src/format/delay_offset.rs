//! `config/delayOffset.json`: RocketMQ's `ScheduleMessageService` progress file
//! (`DelayOffsetSerializeWrapper`, written by fastjson), plus coremq's delivery
//! positions. Pure: text in, typed values out; the decoder never panics.
//!
//! ```text
//! {
//!     "dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},
//!     "offsetTable":{1:5,3:17},              level -> next schedule-queue offset
//!     "coremqLogOffset":4096,                positions cover records below this
//!     "coremqDelivered":[[0,0,1700000000123,42],[1,3,17,0]]
//! }                                          [shard, lane, hi, lo]: newest delivered
//! ```
//!
//! RocketMQ writes `offsetTable` with unquoted integer keys (fastjson's default for
//! non-string map keys), which is not JSON; both forms are read, and this writer
//! writes them unquoted, as RocketMQ does, so RocketMQ reads the file back. RocketMQ
//! ignores the `coremq*` fields. `offsetTable` holds this shard's delay levels; the
//! other lanes (the timer's, other shards' deliveries stored here) are in
//! `coremqDelivered` (`format::schedule::Position` explains lanes and `hi`/`lo`).
//!
//! The file is replaced whole (temporary file, rename, directory sync), so a crash
//! leaves the old or the new one; `store/delivered.rs` says when it is written.

use std::collections::BTreeMap;

/// A lane: (source shard, lane) as in `format::schedule::Position`.
pub type Lane = (u32, u32);
/// The newest delivered position of a lane: (hi, lo).
pub type Key = (u64, u64);

/// What the file holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelayOffsets {
    /// RocketMQ's `offsetTable`: delay level -> next schedule-queue offset to deliver.
    pub offset_table: BTreeMap<i32, i64>,
    /// `dataVersion.counter`, carried forward.
    pub counter: i64,
    /// Delivery positions cover every record below this commit-log offset.
    pub log_offset: Option<u64>,
    /// Newest delivered position per lane, other than this shard's delay levels.
    pub delivered: BTreeMap<Lane, Key>,
}

/// Nesting allowed in the file (it needs 3).
const MAX_DEPTH: usize = 16;

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Object(Vec<(String, Value)>),
    Array(Vec<Value>),
    Int(i64),
    /// A number that is not a whole i64 (kept only to be ignored).
    OtherNumber,
    Str(String),
    Bool,
    Null,
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> String {
        format!("{what} at byte {}", self.at)
    }

    fn skip_ws(&mut self) {
        while self.s.get(self.at).is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.at).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.err(&format!("expected '{}'", c as char)))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::Str),
            Some(b'-' | b'0'..=b'9') => Ok(self.number()),
            Some(_) => {
                let word = self.bare();
                match word.as_str() {
                    "true" | "false" => Ok(Value::Bool),
                    "null" => Ok(Value::Null),
                    _ => Err(self.err("unexpected token")),
                }
            }
            None => Err(self.err("unexpected end")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.expect(b'{')?;
        let mut out = Vec::new();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(out));
        }
        loop {
            // fastjson writes non-string keys bare: `{1:5}`.
            let key = match self.peek() {
                Some(b'"') => self.string()?,
                _ => self.bare(),
            };
            if key.is_empty() {
                return Err(self.err("expected a key"));
            }
            self.expect(b':')?;
            out.push((key, self.value(depth + 1)?));
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(out));
                }
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(out));
        }
        loop {
            out.push(self.value(depth + 1)?);
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(out));
                }
                _ => return Err(self.err("expected ',' or ']'")),
            }
        }
    }

    /// A run of identifier or number characters (a bare key or literal).
    fn bare(&mut self) -> String {
        self.skip_ws();
        let start = self.at;
        while self.s.get(self.at).is_some_and(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'-' | b'+' | b'.')
        }) {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).into_owned()
    }

    fn number(&mut self) -> Value {
        let word = self.bare();
        word.parse::<i64>().map_or(Value::OtherNumber, Value::Int)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.at) else {
                return Err(self.err("unterminated string"));
            };
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.at) else {
                        return Err(self.err("unterminated escape"));
                    };
                    self.at += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let hex = self
                                .s
                                .get(self.at..self.at + 4)
                                .and_then(|h| std::str::from_utf8(h).ok())
                                .and_then(|h| u32::from_str_radix(h, 16).ok())
                                .ok_or_else(|| self.err("bad \\u escape"))?;
                            self.at += 4;
                            let c = char::from_u32(hex).unwrap_or('\u{FFFD}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
        String::from_utf8(out).map_err(|_| self.err("string is not UTF-8"))
    }
}

fn field<'a>(obj: &'a [(String, Value)], name: &str) -> Option<&'a Value> {
    obj.iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

impl DelayOffsets {
    /// Reads the file's text (RocketMQ's or coremq's). Unknown fields are ignored;
    /// a malformed document, a non-integer level or offset, or a negative one, is an
    /// error saying where.
    pub fn decode(text: &[u8]) -> Result<DelayOffsets, String> {
        let mut p = Parser { s: text, at: 0 };
        let Value::Object(root) = p.value(0)? else {
            return Err("the document is not an object".into());
        };
        if p.peek().is_some() {
            return Err(p.err("text after the document"));
        }
        let mut out = DelayOffsets::default();
        if let Some(Value::Object(dv)) = field(&root, "dataVersion")
            && let Some(Value::Int(c)) = field(dv, "counter")
        {
            out.counter = *c;
        }
        match field(&root, "offsetTable") {
            None | Some(Value::Null) => {}
            Some(Value::Object(table)) => {
                for (k, v) in table {
                    let level: i32 = k
                        .trim()
                        .parse()
                        .map_err(|_| format!("offsetTable key {k:?} is not a level"))?;
                    let Value::Int(offset) = v else {
                        return Err(format!("offsetTable[{level}] is not an integer"));
                    };
                    if *offset < 0 || level <= 0 {
                        return Err(format!("offsetTable[{level}] = {offset} is out of range"));
                    }
                    out.offset_table.insert(level, *offset);
                }
            }
            Some(_) => return Err("offsetTable is not an object".into()),
        }
        match field(&root, "coremqLogOffset") {
            None | Some(Value::Null) => {}
            Some(Value::Int(o)) if *o >= 0 => out.log_offset = Some(*o as u64),
            Some(_) => return Err("coremqLogOffset is not a non-negative integer".into()),
        }
        match field(&root, "coremqDelivered") {
            None | Some(Value::Null) => {}
            Some(Value::Array(rows)) => {
                for row in rows {
                    let nums: Option<Vec<i64>> = match row {
                        Value::Array(xs) if xs.len() == 4 => xs
                            .iter()
                            .map(|x| match x {
                                Value::Int(n) if *n >= 0 => Some(*n),
                                _ => None,
                            })
                            .collect(),
                        _ => None,
                    };
                    let n = nums.ok_or_else(|| {
                        "coremqDelivered rows must be [shard, lane, hi, lo] of non-negative integers"
                            .to_string()
                    })?;
                    let (Ok(shard), Ok(lane)) = (u32::try_from(n[0]), u32::try_from(n[1])) else {
                        return Err("coremqDelivered: shard or lane out of range".into());
                    };
                    let key = (n[2] as u64, n[3] as u64);
                    let e = out.delivered.entry((shard, lane)).or_insert(key);
                    *e = (*e).max(key);
                }
            }
            Some(_) => return Err("coremqDelivered is not an array".into()),
        }
        Ok(out)
    }

    /// The file's text (module docs), `dataVersion` stamped with `now_ms`.
    pub fn encode(&self, now_ms: i64) -> Vec<u8> {
        let table: Vec<String> = self
            .offset_table
            .iter()
            .map(|(l, o)| format!("{l}:{o}"))
            .collect();
        let rows: Vec<String> = self
            .delivered
            .iter()
            .map(|((s, l), (hi, lo))| format!("[{s},{l},{hi},{lo}]"))
            .collect();
        let mut out = format!(
            "{{\n\t\"dataVersion\":{{\n\t\t\"counter\":{},\n\t\t\"stateVersion\":0,\n\t\t\"timestamp\":{now_ms}\n\t}},\n\t\"offsetTable\":{{{}\n\t}}",
            self.counter,
            table.join(",")
        );
        if let Some(o) = self.log_offset {
            out.push_str(&format!(",\n\t\"coremqLogOffset\":{o}"));
        }
        out.push_str(&format!(
            ",\n\t\"coremqDelivered\":[{}]\n}}",
            rows.join(",")
        ));
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as RocketMQ 5 writes it (fastjson, pretty, unquoted integer keys).
    const ROCKETMQ: &str = "{\n\t\"dataVersion\":{\n\t\t\"counter\":12,\n\t\t\"stateVersion\":0,\n\t\t\"timestamp\":1700000000000\n\t},\n\t\"offsetTable\":{1:5,2:0,3:17\n\t}\n}";

    #[test]
    fn reads_rocketmq_files_with_bare_keys() {
        let d = DelayOffsets::decode(ROCKETMQ.as_bytes()).unwrap();
        assert_eq!(d.counter, 12);
        assert_eq!(d.offset_table, BTreeMap::from([(1, 5), (2, 0), (3, 17)]));
        assert_eq!(d.log_offset, None);
        // 4.x has no dataVersion; quoted keys read too.
        let d = DelayOffsets::decode(br#"{"offsetTable":{"4":9}}"#).unwrap();
        assert_eq!(d.offset_table, BTreeMap::from([(4, 9)]));
        assert_eq!(
            DelayOffsets::decode(b"{}").unwrap(),
            DelayOffsets::default()
        );
    }

    #[test]
    fn round_trips_coremq_fields() {
        let d = DelayOffsets {
            offset_table: BTreeMap::from([(1, 5), (18, 300)]),
            counter: 4,
            log_offset: Some(1 << 56),
            delivered: BTreeMap::from([((0, 0), (1_700_000_000_123, 42)), ((1, 3), (17, 0))]),
        };
        let text = d.encode(99);
        assert_eq!(DelayOffsets::decode(&text).unwrap(), d);
        assert!(String::from_utf8(text).unwrap().contains("{1:5,18:300"));
    }

    #[test]
    fn bad_documents_are_errors_not_panics() {
        for bad in [
            "",
            "[]",
            "{",
            "{\"offsetTable\":{1:-1}}",
            "{\"offsetTable\":{x:1}}",
            "{\"offsetTable\":{1:1.5}}",
            "{\"offsetTable\":[1]}",
            "{\"coremqDelivered\":[[1,2,3]]}",
            "{\"coremqDelivered\":[[1,2,3,-4]]}",
            "{\"coremqLogOffset\":-1}",
            "{} x",
            "{\"a\":\"\\u12\"}",
        ] {
            assert!(DelayOffsets::decode(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(100_000);
        assert!(DelayOffsets::decode(format!("{{\"a\":{deep}}}").as_bytes()).is_err());
    }
}
