//! Per-thread pools of the buffers a send needs (issue 20): a [`Message`] (its topic
//! and properties strings keep their capacity), a batch's messages, and the scratch
//! string escaped JSON header values are unescaped into. A shard serving sends takes
//! and returns the same few objects, so once warm a send allocates nothing of its own.
//!
//! Each pool keeps at most [`KEEP`] objects. A message routed to another shard comes
//! back with the answer and returns to the pool of the thread that took it
//! (`StoreOps::put_and_return`): dropped there, its strings were freed across threads.

use crate::message::Message;
use bytes::Bytes;
use std::cell::RefCell;
use std::net::SocketAddr;

/// Most idle objects a pool keeps per thread.
pub const KEEP: usize = 1024;

thread_local! {
    static MESSAGES: RefCell<Vec<Message>> = const { RefCell::new(Vec::new()) };
    static BATCHES: RefCell<Vec<Vec<Message>>> = const { RefCell::new(Vec::new()) };
    static STRINGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn empty_message() -> Message {
    Message {
        topic: String::new(),
        queue_id: 0,
        flag: 0,
        body: Bytes::new(),
        properties: Vec::new(),
        born_timestamp_ms: 0,
        born_host: SocketAddr::from(([0, 0, 0, 0], 0)),
        sys_flag: 0,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

fn give_back<T>(pool: &'static std::thread::LocalKey<RefCell<Vec<T>>>, item: T) {
    // During thread teardown the pool may be gone: then the item is just dropped.
    let _ = pool.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut()
            && p.len() < KEEP
        {
            p.push(item);
        }
    });
}

fn take_from<T>(pool: &'static std::thread::LocalKey<RefCell<Vec<T>>>) -> Option<T> {
    pool.try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop()))
        .ok()
        .flatten()
}

/// A message from this thread's pool, returned to it on drop (its body released).
pub(crate) struct PooledMessage(Option<Message>);

impl PooledMessage {
    pub fn take() -> PooledMessage {
        PooledMessage(Some(take_from(&MESSAGES).unwrap_or_else(empty_message)))
    }

    /// The message, leaving the pool for now (it travels to another shard).
    pub fn into_inner(mut self) -> Message {
        self.0.take().unwrap_or_else(empty_message)
    }

    /// A message back from another shard ([`PooledMessage::into_inner`]), returned to
    /// this thread's pool on drop.
    pub fn adopt(m: Message) -> PooledMessage {
        PooledMessage(Some(m))
    }
}

impl std::ops::Deref for PooledMessage {
    type Target = Message;
    fn deref(&self) -> &Message {
        self.0
            .as_ref()
            .expect("a pooled message is present until dropped")
    }
}

impl std::ops::DerefMut for PooledMessage {
    fn deref_mut(&mut self) -> &mut Message {
        self.0
            .as_mut()
            .expect("a pooled message is present until dropped")
    }
}

impl Drop for PooledMessage {
    fn drop(&mut self) {
        if let Some(mut m) = self.0.take() {
            m.body = Bytes::new();
            give_back(&MESSAGES, m);
        }
    }
}

/// A vector of messages from this thread's pool (a batch), returned on drop.
pub(crate) struct PooledBatch(Vec<Message>);

impl PooledBatch {
    pub fn take() -> PooledBatch {
        PooledBatch(take_from(&BATCHES).unwrap_or_default())
    }

    pub fn messages(&mut self) -> &mut Vec<Message> {
        &mut self.0
    }

    /// The messages, leaving the pool for good.
    pub fn into_inner(mut self) -> Vec<Message> {
        std::mem::take(&mut self.0)
    }
}

impl Drop for PooledBatch {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        if v.capacity() == 0 {
            return;
        }
        for m in &mut v {
            m.body = Bytes::new();
        }
        give_back(&BATCHES, v);
    }
}

/// A string from this thread's pool, returned (cleared) on drop.
pub(crate) struct PooledString(String);

impl PooledString {
    pub fn take() -> PooledString {
        PooledString(take_from(&STRINGS).unwrap_or_default())
    }

    pub fn get(&mut self) -> &mut String {
        &mut self.0
    }
}

impl Drop for PooledString {
    fn drop(&mut self) {
        let mut s = std::mem::take(&mut self.0);
        if s.capacity() > 0 {
            s.clear();
            give_back(&STRINGS, s);
        }
    }
}

/// Sets `props` to the pairs of RocketMQ's properties text `text` (as
/// `properties::iter` reads it), reusing the strings already there.
pub(crate) fn set_properties(props: &mut Vec<(String, String)>, text: &str) {
    let mut n = 0;
    for (name, value) in crate::format::properties::iter_text(text) {
        match props.get_mut(n) {
            Some((k, v)) => {
                k.clear();
                k.push_str(name);
                v.clear();
                v.push_str(value);
            }
            None => props.push((name.to_string(), value.to_string())),
        }
        n += 1;
    }
    props.truncate(n);
}

/// Sets `s` to `text`, reusing its capacity.
pub(crate) fn set_string(s: &mut String, text: &str) {
    s.clear();
    s.push_str(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_messages_come_back_with_their_capacity() {
        let cap = {
            let mut m = PooledMessage::take();
            set_string(&mut m.topic, "SomeTopicName");
            set_properties(&mut m.properties, "KEYS\u{1}a b\u{2}TAGS\u{1}t\u{2}");
            m.body = Bytes::from_static(b"x");
            assert_eq!(m.properties.len(), 2);
            m.topic.capacity()
        };
        let m = PooledMessage::take();
        assert!(m.topic.capacity() >= cap);
        assert!(m.body.is_empty());
        let mut props = m.properties.clone();
        set_properties(&mut props, "A\u{1}b\u{2}");
        assert_eq!(props, vec![("A".to_string(), "b".to_string())]);
    }
}
