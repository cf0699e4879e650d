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

/// The message ids of one put, one per stored record: a single put's one id is kept
/// inline (a put then allocates nothing for its ids, and a put answered on another
/// thread frees nothing there), a batch's in a `Vec`. Reads as a slice (`Deref`).
#[derive(Clone, Default)]
pub struct MessageIds(Ids);

/// Equal when they hold the same ids (a `Vec` of one id equals the inline one).
impl PartialEq for MessageIds {
    fn eq(&self, other: &MessageIds) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for MessageIds {}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Ids {
    #[default]
    None,
    One(MessageId),
    Many(Vec<MessageId>),
}

impl MessageIds {
    pub fn new() -> MessageIds {
        MessageIds(Ids::None)
    }

    /// Room for `n` ids (a `Vec` only when `n > 1`).
    pub fn with_capacity(n: usize) -> MessageIds {
        match n {
            0 | 1 => MessageIds(Ids::None),
            n => MessageIds(Ids::Many(Vec::with_capacity(n))),
        }
    }

    pub fn push(&mut self, id: MessageId) {
        match &mut self.0 {
            Ids::None => self.0 = Ids::One(id),
            Ids::One(first) => self.0 = Ids::Many(vec![*first, id]),
            Ids::Many(v) => v.push(id),
        }
    }

    /// Keeps the first `n` ids.
    pub fn truncate(&mut self, n: usize) {
        match &mut self.0 {
            Ids::Many(v) => {
                v.truncate(n);
                if v.len() < 2 {
                    *self = MessageIds::from(std::mem::take(v));
                }
            }
            Ids::One(_) if n == 0 => self.0 = Ids::None,
            Ids::None | Ids::One(_) => {}
        }
    }

    pub fn as_slice(&self) -> &[MessageId] {
        match &self.0 {
            Ids::None => &[],
            Ids::One(id) => std::slice::from_ref(id),
            Ids::Many(v) => v,
        }
    }
}

impl std::ops::Deref for MessageIds {
    type Target = [MessageId];

    fn deref(&self) -> &[MessageId] {
        self.as_slice()
    }
}

impl std::fmt::Debug for MessageIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl From<MessageId> for MessageIds {
    fn from(id: MessageId) -> MessageIds {
        MessageIds(Ids::One(id))
    }
}

impl From<Vec<MessageId>> for MessageIds {
    fn from(v: Vec<MessageId>) -> MessageIds {
        match v.as_slice() {
            [] => MessageIds(Ids::None),
            [one] => MessageIds(Ids::One(*one)),
            _ => MessageIds(Ids::Many(v)),
        }
    }
}

impl FromIterator<MessageId> for MessageIds {
    fn from_iter<I: IntoIterator<Item = MessageId>>(iter: I) -> MessageIds {
        let iter = iter.into_iter();
        let mut ids = MessageIds::with_capacity(iter.size_hint().0);
        iter.for_each(|id| ids.push(id));
        ids
    }
}

impl<'a> IntoIterator for &'a MessageIds {
    type Item = &'a MessageId;
    type IntoIter = std::slice::Iter<'a, MessageId>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
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

    #[test]
    fn ids_inline_one_then_spill() {
        let id = |offset| MessageId {
            store_host: "127.0.0.1:10911".parse().unwrap(),
            offset,
        };
        let mut ids = MessageIds::with_capacity(1);
        assert!(ids.is_empty());
        ids.push(id(1));
        assert_eq!(&ids[..], &[id(1)]);
        assert!(matches!(ids.0, Ids::One(_)), "one id is kept inline");
        ids.push(id(2));
        ids.push(id(3));
        assert_eq!(&ids[..], &[id(1), id(2), id(3)]);
        ids.truncate(1);
        assert_eq!(ids.0, Ids::One(id(1)));
        assert_eq!(MessageIds::from(vec![id(4)]).0, Ids::One(id(4)));
        assert_eq!(
            (1..4).map(id).collect::<MessageIds>(),
            MessageIds::from(vec![id(1), id(2), id(3)])
        );
        assert_eq!(
            format!("{:?}", MessageIds::from(vec![id(5)])),
            format!("{:?}", [id(5)])
        );
        // Room for three, one stored: the same ids as one inline, and truncating keeps it.
        let mut roomy = MessageIds::with_capacity(3);
        roomy.push(id(6));
        assert_eq!(roomy, MessageIds::from(id(6)));
        roomy.truncate(1);
        assert_eq!(roomy.0, Ids::One(id(6)));
        roomy.truncate(0);
        assert!(roomy.is_empty());
    }
}
