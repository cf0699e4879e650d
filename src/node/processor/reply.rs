//! What the processors answer (issue 20): the hot answers (send, pull) as typed replies
//! a connection encodes straight into its output queue (`remoting::encode`, pulled
//! records queued as the store's `Bytes`, never copied into one body), every other
//! answer as a [`RemotingCommand`]. [`Reply::into_command`] gives any reply as the
//! command the processors built before, for the in-process entry
//! (`Node::serve_request`) and the thread front end; both forms are the same bytes on
//! the wire (unit tests below).

use crate::format::msg_id::{MessageId, MessageIds};
use crate::node::out_queue::OutQueue;
use crate::node::remoting::encode::{FieldValue, FrameHead, encode_frame};
use crate::node::remoting::{RemotingCommand, SerializeType, codes};
use bytes::Bytes;

/// Where a response goes: its request's opaque and serialize type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplyTo {
    pub opaque: i32,
    pub serialize_type: SerializeType,
}

impl ReplyTo {
    pub fn of(req: &RemotingCommand) -> ReplyTo {
        ReplyTo {
            opaque: req.opaque,
            serialize_type: req.serialize_type,
        }
    }

    /// A response command with `code` and `remark`, as `RemotingCommand::response_to`.
    pub fn command(&self, code: i32, remark: Option<String>) -> RemotingCommand {
        let mut c = RemotingCommand::request(code, self.opaque, Vec::new());
        c.flag = crate::node::remoting::FLAG_RESPONSE;
        c.serialize_type = self.serialize_type;
        c.remark = remark;
        c
    }
}

/// A stored send's answer (RocketMQ's `SendMessageResponseHeader`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SendReply {
    pub code: i32,
    pub remark: Option<String>,
    /// One id per stored message (a batch's joined by commas).
    pub ids: MessageIds,
    pub queue_id: i32,
    pub queue_offset: u64,
}

/// A pull's answer that is not a refusal (RocketMQ's `PullMessageResponseHeader`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PullReply {
    pub code: i32,
    pub remark: Option<&'static str>,
    pub suggest_broker: u64,
    pub next_begin_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    /// The records found, as the store returned them; the body when `code` is SUCCESS.
    pub records: Vec<Bytes>,
}

/// Any answer.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    Command(RemotingCommand),
    Send(SendReply),
    Pull(PullReply),
}

impl SendReply {
    /// In JSON's order (sorted keys), so a JSON answer is written without sorting
    /// (`encode::json_header`); a binary one carries them in this order too.
    fn fields(&self) -> [(&str, FieldValue<'_>); 5] {
        [
            ("MSG_REGION", FieldValue::Str("DefaultRegion")),
            ("TRACE_ON", FieldValue::Str("true")),
            ("msgId", FieldValue::Ids(&self.ids)),
            ("queueId", FieldValue::Int(self.queue_id as i64)),
            ("queueOffset", FieldValue::UInt(self.queue_offset)),
        ]
    }
}

impl PullReply {
    /// In JSON's order, as [`SendReply::fields`].
    fn fields(&self) -> [(&str, FieldValue<'_>); 4] {
        [
            ("maxOffset", FieldValue::UInt(self.max_offset)),
            ("minOffset", FieldValue::UInt(self.min_offset)),
            ("nextBeginOffset", FieldValue::UInt(self.next_begin_offset)),
            (
                "suggestWhichBrokerId",
                FieldValue::UInt(self.suggest_broker),
            ),
        ]
    }

    /// The records that make the body (none unless found).
    fn body(&self) -> &[Bytes] {
        if self.code == codes::SUCCESS {
            &self.records
        } else {
            &[]
        }
    }
}

fn text(v: &FieldValue<'_>) -> String {
    match v {
        FieldValue::Str(s) => s.to_string(),
        FieldValue::Int(n) => n.to_string(),
        FieldValue::UInt(n) => n.to_string(),
        FieldValue::Ids(ids) => ids
            .iter()
            .map(MessageId::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl Reply {
    /// The response code.
    pub fn code(&self) -> i32 {
        match self {
            Reply::Command(c) => c.code,
            Reply::Send(s) => s.code,
            Reply::Pull(p) => p.code,
        }
    }

    /// Appends the response frame to `out` (a command's or a pull's body as `Bytes`).
    pub fn encode_into(&self, to: ReplyTo, out: &mut OutQueue) {
        match self {
            Reply::Command(c) => {
                out.inline(|b| c.encode_head_into(b));
                if !c.body.is_empty() {
                    out.push_body(c.body.clone());
                }
            }
            Reply::Send(s) => {
                let fields = s.fields();
                let head = FrameHead {
                    code: s.code,
                    flag: crate::node::remoting::FLAG_RESPONSE,
                    opaque: to.opaque,
                    serialize_type: to.serialize_type,
                    remark: s.remark.as_deref(),
                    fields: &fields,
                };
                out.inline(|b| encode_frame(b, &head, 0));
            }
            Reply::Pull(p) => {
                let fields = p.fields();
                let head = FrameHead {
                    code: p.code,
                    flag: crate::node::remoting::FLAG_RESPONSE,
                    opaque: to.opaque,
                    serialize_type: to.serialize_type,
                    remark: p.remark,
                    fields: &fields,
                };
                let body = p.body();
                let len = body.iter().map(Bytes::len).sum();
                out.inline(|b| encode_frame(b, &head, len));
                for r in body {
                    out.push_body(r.clone());
                }
            }
        }
    }

    /// The reply as a command (the processors' answer before issue 20).
    pub fn into_command(self, to: ReplyTo) -> RemotingCommand {
        match self {
            Reply::Command(c) => c,
            Reply::Send(s) => {
                let mut c = to.command(s.code, s.remark.clone());
                for (k, v) in s.fields() {
                    c.ext_fields.push((k.to_string(), text(&v)));
                }
                c
            }
            Reply::Pull(p) => {
                let mut c = to.command(p.code, p.remark.map(str::to_string));
                for (k, v) in p.fields() {
                    c.ext_fields.push((k.to_string(), text(&v)));
                }
                let body = p.body();
                if !body.is_empty() {
                    let total = body.iter().map(Bytes::len).sum();
                    let mut all = Vec::with_capacity(total);
                    for r in body {
                        all.extend_from_slice(r);
                    }
                    c.body = all.into();
                }
                c
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(r: &Reply, to: ReplyTo) -> Vec<u8> {
        let mut q = OutQueue::default();
        r.encode_into(to, &mut q);
        let mut out = Vec::new();
        while !q.is_empty() {
            let s = q.first_slice().to_vec();
            out.extend_from_slice(&s);
            q.advance(s.len());
        }
        out
    }

    #[test]
    fn typed_replies_are_the_commands_bytes() {
        let id = MessageId {
            store_host: "127.0.0.1:10911".parse().unwrap(),
            offset: 1 << 56,
        };
        let replies = [
            Reply::Send(SendReply {
                code: 0,
                remark: None,
                ids: vec![id].into(),
                queue_id: 3,
                queue_offset: 9,
            }),
            Reply::Send(SendReply {
                code: 10,
                remark: Some("flush disk timeout".into()),
                ids: vec![id, id].into(),
                queue_id: 0,
                queue_offset: u64::MAX,
            }),
            Reply::Send(SendReply {
                code: 0,
                remark: None,
                ids: MessageIds::new(),
                queue_id: -1,
                queue_offset: 0,
            }),
            Reply::Pull(PullReply {
                code: 0,
                remark: None,
                suggest_broker: 0,
                next_begin_offset: 32,
                min_offset: 0,
                max_offset: 100,
                records: vec![Bytes::from(vec![1u8; 1000]), Bytes::from_static(b"short")],
            }),
            Reply::Pull(PullReply {
                code: codes::PULL_NOT_FOUND,
                remark: Some("no new message"),
                suggest_broker: 1,
                next_begin_offset: 5,
                min_offset: 0,
                max_offset: 5,
                records: vec![Bytes::from_static(b"not sent")],
            }),
            Reply::Command(
                RemotingCommand::request(0, 0, vec![("k".into(), "v".into())])
                    .with_body(vec![5u8; 2000]),
            ),
        ];
        for kind in [SerializeType::Json, SerializeType::RocketMq] {
            let to = ReplyTo {
                opaque: 42,
                serialize_type: kind,
            };
            for r in &replies {
                let mut r = r.clone();
                if let Reply::Command(c) = &mut r {
                    c.serialize_type = kind;
                }
                assert_eq!(wire(&r, to), r.clone().into_command(to).encode(), "{r:?}");
            }
        }
    }
}
