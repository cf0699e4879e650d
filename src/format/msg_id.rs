//! RocketMQ's offset message id: store-host IPv4 address (4 bytes) + port (int32)
//! + commit-log offset (int64), shown as 32 upper-case hex characters.

use std::net::{Ipv4Addr, SocketAddrV4};

pub const MSG_ID_LEN: usize = 16;

/// A 16-byte offset message id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageId {
    pub store_host: SocketAddrV4,
    pub offset: u64,
}

impl MessageId {
    pub fn to_bytes(&self) -> [u8; MSG_ID_LEN] {
        let mut b = [0u8; MSG_ID_LEN];
        b[..4].copy_from_slice(&self.store_host.ip().octets());
        b[4..8].copy_from_slice(&(self.store_host.port() as i32).to_be_bytes());
        b[8..].copy_from_slice(&(self.offset as i64).to_be_bytes());
        b
    }

    pub fn from_bytes(b: &[u8; MSG_ID_LEN]) -> MessageId {
        let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        let port = i32::from_be_bytes(b[4..8].try_into().unwrap()) as u16;
        let offset = i64::from_be_bytes(b[8..].try_into().unwrap()) as u64;
        MessageId {
            store_host: SocketAddrV4::new(ip, port),
            offset,
        }
    }

    /// Parses 32 hex characters (either case); `None` for anything else.
    pub fn parse(s: &str) -> Option<MessageId> {
        // Only hex digits: `from_str_radix` alone would also take a leading '+'.
        if s.len() != MSG_ID_LEN * 2 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut b = [0u8; MSG_ID_LEN];
        for (i, slot) in b.iter_mut().enumerate() {
            *slot = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).ok()?;
        }
        Some(MessageId::from_bytes(&b))
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in self.to_bytes() {
            write!(f, "{byte:02X}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = MessageId {
            store_host: "127.0.0.1:10911".parse().unwrap(),
            offset: 0x1234,
        };
        let s = id.to_string();
        assert_eq!(s, "7F00000100002A9F0000000000001234");
        assert_eq!(MessageId::parse(&s), Some(id));
        assert_eq!(MessageId::parse(&s.to_lowercase()), Some(id));
        assert_eq!(MessageId::parse("xyz"), None);
        assert_eq!(MessageId::parse(&"G".repeat(32)), None);
        assert_eq!(MessageId::parse(&"+0".repeat(16)), None);
    }
}
