//! RocketMQ's remoting layer (`rocketmq-remoting`): [`RemotingCommand`] (RocketMQ's
//! class of the same name), the frame codec (RocketMQ's `NettyEncoder` /
//! `NettyDecoder`), both header serializations and the request and response codes
//! ([`codes`]). The node, the load generator's remote mode and `register.rs` all speak
//! through it.
//!
//! A frame on the wire:
//!
//! ```text
//! +--------------+-----------------------------------+-------------+------------+
//! | length: i32  | serialize type (8) | header length (24) | header | body       |
//! +--------------+-----------------------------------+-------------+------------+
//!   big-endian     big-endian i32                                   the rest
//! ```
//!
//! `length` counts everything after itself (4 + header + body). The serialize type
//! is 0 (JSON header, RocketMQ's `RemotingSerializable`, `json_header.rs`) or 1
//! (RocketMQ's own binary header, `RocketMQSerializable`, `binary_header.rs`). Both are
//! accepted; a response uses the type of its request.
//!
//! Decoding is pure (no I/O) and never panics on any input: every length is bounded by
//! the bytes at hand and by the configured frame limit before it sizes anything.

mod binary_header;
pub mod codes;
pub mod encode;
pub mod headers;
mod json_header;
#[doc(hidden)]
pub mod oracle;
pub mod scan;

use bytes::Bytes;
use std::fmt;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;
/// Bytes of the (serialize type, header length) word.
pub const HEADER_WORD: usize = 4;
/// Fixed part of a binary header: code, language, version, opaque, flag, remark
/// length, ext length.
pub const BINARY_FIXED_LEN: usize = 2 + 1 + 2 + 4 + 4 + 4 + 4;
const _: () = assert!(BINARY_FIXED_LEN == 21);
/// Largest header length the 24-bit field can state.
pub const MAX_HEADER_LEN: usize = (1 << 24) - 1;

/// Bytes reserved up front for a frame's payload; the buffer grows as the rest
/// arrives, so a declared length costs nothing until its bytes come.
pub const INITIAL_FRAME_BUFFER: usize = 64 << 10;

/// `flag` bit: this command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// `flag` bit: the request wants no response.
pub const FLAG_ONEWAY: i32 = 2;

/// How a command's header is serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SerializeType {
    Json = 0,
    RocketMq = 1,
}

impl SerializeType {
    pub fn name(self) -> &'static str {
        match self {
            SerializeType::Json => "JSON",
            SerializeType::RocketMq => "ROCKETMQ",
        }
    }
}

/// RocketMQ's `LanguageCode`, by wire byte.
const LANGUAGES: &[(u8, &str)] = &[
    (0, "JAVA"),
    (1, "CPP"),
    (2, "DOTNET"),
    (3, "PYTHON"),
    (4, "DELPHI"),
    (5, "ERLANG"),
    (6, "RUBY"),
    (7, "OTHER"),
    (8, "HTTP"),
    (9, "GO"),
    (10, "PHP"),
    (11, "OMS"),
    (12, "RUST"),
];

fn language_code(name: &str) -> u8 {
    LANGUAGES
        .iter()
        .find(|(_, n)| *n == name)
        .map_or(7, |(c, _)| *c)
}

fn language_name(code: u8) -> &'static str {
    LANGUAGES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("OTHER", |(_, n)| n)
}

/// The language this side puts in its commands. RocketMQ brokers say `JAVA`; older
/// clients' enums have no `RUST`, and a value they cannot map turns into a null, so
/// this side says what every client understands.
pub const OUR_LANGUAGE: &str = "JAVA";

/// One request or response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotingCommand {
    pub code: i32,
    pub language: String,
    pub version: i32,
    pub opaque: i32,
    pub flag: i32,
    pub remark: Option<String>,
    /// Header fields in the order they came (or are to be sent).
    pub ext_fields: Vec<(String, String)>,
    pub serialize_type: SerializeType,
    pub body: Bytes,
}

/// Why bytes are not a frame. Any of these closes the connection that sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The length prefix is below the smallest frame or above the limit.
    BadLength {
        length: i64,
        max: usize,
    },
    /// The stated header length does not fit in the frame.
    BadHeaderLength {
        header: usize,
        frame: usize,
    },
    UnknownSerializeType(u8),
    /// The header bytes do not decode.
    BadHeader(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadLength { length, max } => {
                write!(f, "frame length {length} is outside 4..={max}")
            }
            FrameError::BadHeaderLength { header, frame } => {
                write!(
                    f,
                    "header length {header} does not fit a frame of {frame} bytes"
                )
            }
            FrameError::UnknownSerializeType(t) => write!(f, "unknown serialize type {t}"),
            FrameError::BadHeader(why) => write!(f, "bad header: {why}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl RemotingCommand {
    /// A request with `code` and the given header fields.
    pub fn request(code: i32, opaque: i32, ext_fields: Vec<(String, String)>) -> Self {
        RemotingCommand {
            code,
            language: OUR_LANGUAGE.to_string(),
            version: codes::OUR_VERSION,
            opaque,
            flag: 0,
            remark: None,
            ext_fields,
            serialize_type: SerializeType::Json,
            body: Bytes::new(),
        }
    }

    /// A response to `req` (same opaque and serialize type) with `code` and `remark`.
    pub fn response_to(req: &RemotingCommand, code: i32, remark: Option<String>) -> Self {
        RemotingCommand {
            code,
            language: OUR_LANGUAGE.to_string(),
            version: codes::OUR_VERSION,
            opaque: req.opaque,
            flag: FLAG_RESPONSE,
            remark,
            ext_fields: Vec::new(),
            serialize_type: req.serialize_type,
            body: Bytes::new(),
        }
    }

    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    pub fn with_field(mut self, name: &str, value: impl ToString) -> Self {
        self.ext_fields.push((name.to_string(), value.to_string()));
        self
    }

    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// A header field by name.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.ext_fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The whole frame, length prefix included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_head_into(&mut out);
        out.extend_from_slice(&self.body);
        out
    }

    /// Appends the frame without its body (whose length it states) to `out`.
    pub fn encode_head_into(&self, out: &mut Vec<u8>) {
        let header = match self.serialize_type {
            SerializeType::Json => json_header::encode(self),
            SerializeType::RocketMq => binary_header::encode(self),
        };
        let length = HEADER_WORD + header.len() + self.body.len();
        out.reserve(LENGTH_PREFIX + HEADER_WORD + header.len());
        out.extend_from_slice(&(length as u32).to_be_bytes());
        let word = ((self.serialize_type as u32) << 24) | (header.len() as u32 & 0x00FF_FFFF);
        out.extend_from_slice(&word.to_be_bytes());
        out.extend_from_slice(&header);
    }
}

/// Checks a length prefix against the limit; returns the bytes that follow it.
pub fn check_length(prefix: [u8; 4], max_frame: usize) -> Result<usize, FrameError> {
    let length = i32::from_be_bytes(prefix) as i64;
    if length < HEADER_WORD as i64 || length as u64 > max_frame as u64 {
        return Err(FrameError::BadLength {
            length,
            max: max_frame,
        });
    }
    Ok(length as usize)
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// else the command and the bytes it took.
pub fn decode_frame(
    buf: &[u8],
    max_frame: usize,
) -> Result<Option<(RemotingCommand, usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<4>() else {
        return Ok(None);
    };
    let length = check_length(*prefix, max_frame)?;
    let Some(frame) = buf.get(LENGTH_PREFIX..LENGTH_PREFIX + length) else {
        return Ok(None);
    };
    let cmd = decode_payload(Bytes::copy_from_slice(frame))?;
    Ok(Some((cmd, LENGTH_PREFIX + length)))
}

/// Decodes the bytes after a length prefix (header word, header, body).
pub fn decode_payload(frame: Bytes) -> Result<RemotingCommand, FrameError> {
    let Some(word) = frame.first_chunk::<4>() else {
        return Err(FrameError::BadLength {
            length: frame.len() as i64,
            max: 0,
        });
    };
    let word = u32::from_be_bytes(*word);
    let kind = (word >> 24) as u8;
    let header_len = (word & 0x00FF_FFFF) as usize;
    if header_len > frame.len() - HEADER_WORD {
        return Err(FrameError::BadHeaderLength {
            header: header_len,
            frame: frame.len(),
        });
    }
    let header = &frame[HEADER_WORD..HEADER_WORD + header_len];
    let body = frame.slice(HEADER_WORD + header_len..);
    let mut cmd = match kind {
        0 => json_header::decode(header)?,
        1 => binary_header::decode(header)?,
        other => return Err(FrameError::UnknownSerializeType(other)),
    };
    cmd.body = body;
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(kind: SerializeType) -> RemotingCommand {
        let mut c = RemotingCommand::request(
            codes::SEND_MESSAGE_V2,
            42,
            vec![("a".into(), "group".into()), ("b".into(), "Topic".into())],
        );
        c.serialize_type = kind;
        c.remark = Some("hi".into());
        c.body = Bytes::from_static(b"body bytes");
        c
    }

    #[test]
    fn round_trip_both_header_types() {
        for kind in [SerializeType::Json, SerializeType::RocketMq] {
            let c = sample(kind);
            let wire = c.encode();
            let (back, used) = decode_frame(&wire, 1 << 20).unwrap().unwrap();
            assert_eq!(used, wire.len());
            assert_eq!(back, c);
            // One byte short is "need more", never an error.
            assert_eq!(decode_frame(&wire[..wire.len() - 1], 1 << 20), Ok(None));
        }
    }

    #[test]
    fn json_header_carries_serialize_type() {
        let wire = sample(SerializeType::Json).encode();
        let text = String::from_utf8_lossy(&wire);
        assert!(
            text.contains(r#""serializeTypeCurrentRPC":"JSON""#),
            "{text}"
        );
    }

    #[test]
    fn accepts_json_without_serialize_type_and_numeric_fields() {
        let header = br#"{"code":105,"language":"CPP","version":0,"opaque":7,"flag":0,"extFields":{"topic":"T","n":5}}"#;
        let mut wire = ((4 + header.len()) as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&(header.len() as u32).to_be_bytes());
        wire.extend_from_slice(header);
        let (c, _) = decode_frame(&wire, 1 << 20).unwrap().unwrap();
        assert_eq!(c.code, 105);
        assert_eq!(c.opaque, 7);
        assert_eq!(c.language, "CPP");
        assert_eq!(c.field("topic"), Some("T"));
        assert_eq!(c.field("n"), Some("5"));
    }

    #[test]
    fn rejects_bad_frames() {
        let huge = 0x7FFF_FFFFu32.to_be_bytes();
        assert!(matches!(
            decode_frame(&huge, 1 << 20),
            Err(FrameError::BadLength { .. })
        ));
        let negative = (-5i32).to_be_bytes();
        assert!(decode_frame(&negative, 1 << 20).is_err());
        // Header longer than the frame.
        let mut w = 8u32.to_be_bytes().to_vec();
        w.extend_from_slice(&100u32.to_be_bytes());
        w.extend_from_slice(b"{}{}");
        assert!(matches!(
            decode_frame(&w, 1 << 20),
            Err(FrameError::BadHeaderLength { .. })
        ));
        // Unknown serialize type.
        let mut w = 6u32.to_be_bytes().to_vec();
        w.extend_from_slice(&((7u32 << 24) | 2).to_be_bytes());
        w.extend_from_slice(b"{}");
        assert_eq!(
            decode_frame(&w, 1 << 20),
            Err(FrameError::UnknownSerializeType(7))
        );
        // JSON without a code.
        let mut w = 6u32.to_be_bytes().to_vec();
        w.extend_from_slice(&2u32.to_be_bytes());
        w.extend_from_slice(b"{}");
        assert!(matches!(
            decode_frame(&w, 1 << 20),
            Err(FrameError::BadHeader(_))
        ));
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_frame(&bytes, 1 << 16);
        }

        #[test]
        fn decoder_never_panics_on_plausible_frames(
            kind in 0u8..3,
            header in proptest::collection::vec(any::<u8>(), 0..128),
            body in proptest::collection::vec(any::<u8>(), 0..32),
            cut in 0usize..200,
        ) {
            let mut w = ((4 + header.len() + body.len()) as u32).to_be_bytes().to_vec();
            w.extend_from_slice(&(((kind as u32) << 24) | header.len() as u32).to_be_bytes());
            w.extend_from_slice(&header);
            w.extend_from_slice(&body);
            let _ = decode_frame(&w, 1 << 16);
            let _ = decode_frame(&w[..cut.min(w.len())], 1 << 16);
        }

        #[test]
        fn binary_round_trip(
            code in any::<i16>(), opaque in any::<i32>(), flag in any::<i32>(),
            remark in proptest::option::of("[a-z ]{1,20}"),
            ext in proptest::collection::vec(("[a-zA-Z]{1,8}", "[ -~]{0,16}"), 0..6),
        ) {
            let mut c = RemotingCommand::request(code as i32, opaque, ext);
            c.flag = flag;
            c.remark = remark;
            c.serialize_type = SerializeType::RocketMq;
            let wire = c.encode();
            let (back, _) = decode_frame(&wire, 1 << 20).unwrap().unwrap();
            prop_assert_eq!(back, c);
        }
    }
}
