//! The binary command header, RocketMQ's `RocketMQSerializable` (serialize type 1),
//! all big-endian:
//!
//! ```text
//! code: i16 | language: u8 | version: i16 | opaque: i32 | flag: i32
//! | remark length: i32 | remark | ext length: i32
//! | ext: (key length: i16 | key | value length: i32 | value)*
//! ```
//!
//! Every length is checked against the bytes left before anything is taken or sized,
//! so no input panics or allocates more than the header's own bytes.

use super::{FrameError, RemotingCommand, SerializeType, language_code, language_name};
use bytes::Bytes;

/// The header of `cmd` in RocketMQ's binary layout.
pub(super) fn encode(cmd: &RemotingCommand) -> Vec<u8> {
    let mut h = Vec::with_capacity(64);
    h.extend_from_slice(&(cmd.code as i16).to_be_bytes());
    h.push(language_code(&cmd.language));
    h.extend_from_slice(&(cmd.version as i16).to_be_bytes());
    h.extend_from_slice(&cmd.opaque.to_be_bytes());
    h.extend_from_slice(&cmd.flag.to_be_bytes());
    let remark = cmd.remark.as_deref().unwrap_or("").as_bytes();
    h.extend_from_slice(&(remark.len() as i32).to_be_bytes());
    h.extend_from_slice(remark);
    let mut ext = Vec::new();
    for (k, v) in &cmd.ext_fields {
        ext.extend_from_slice(&(k.len() as i16).to_be_bytes());
        ext.extend_from_slice(k.as_bytes());
        ext.extend_from_slice(&(v.len() as i32).to_be_bytes());
        ext.extend_from_slice(v.as_bytes());
    }
    h.extend_from_slice(&(ext.len() as i32).to_be_bytes());
    h.extend_from_slice(&ext);
    h
}

/// A bounds-checked reader over a binary header.
struct Cursor<'a> {
    buf: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        if n > self.buf.len() {
            return Err(FrameError::BadHeader(format!(
                "{what} needs {n} bytes, {} left",
                self.buf.len()
            )));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], FrameError> {
        let b = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn i16(&mut self, what: &str) -> Result<i16, FrameError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    fn i32(&mut self, what: &str) -> Result<i32, FrameError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    /// A length field followed by that many bytes, as UTF-8.
    fn string(&mut self, len: i64, what: &str) -> Result<String, FrameError> {
        let len = usize::try_from(len)
            .map_err(|_| FrameError::BadHeader(format!("negative {what} length")))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| FrameError::BadHeader(format!("{what} is not UTF-8")))
    }
}

/// Decodes a binary header; the body is left empty.
pub(super) fn decode(header: &[u8]) -> Result<RemotingCommand, FrameError> {
    let mut c = Cursor { buf: header };
    let code = c.i16("code")? as i32;
    let language = language_name(c.array::<1>("language")?[0]).to_string();
    let version = c.i16("version")? as i32;
    let opaque = c.i32("opaque")?;
    let flag = c.i32("flag")?;
    let remark_len = c.i32("remark length")?;
    let remark = if remark_len > 0 {
        Some(c.string(remark_len as i64, "remark")?)
    } else {
        None
    };
    let ext_len = c.i32("ext length")?;
    let ext = c.take(
        usize::try_from(ext_len)
            .map_err(|_| FrameError::BadHeader("negative ext length".into()))?,
        "ext fields",
    )?;
    let mut e = Cursor { buf: ext };
    let mut ext_fields = Vec::new();
    while !e.buf.is_empty() {
        let klen = e.i16("ext key length")?;
        let key = e.string(klen as i64, "ext key")?;
        let vlen = e.i32("ext value length")?;
        let value = e.string(vlen as i64, "ext value")?;
        ext_fields.push((key, value));
    }
    Ok(RemotingCommand {
        code,
        language,
        version,
        opaque,
        flag,
        remark,
        ext_fields,
        serialize_type: SerializeType::RocketMq,
        body: Bytes::new(),
    })
}
