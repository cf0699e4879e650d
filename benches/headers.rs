//! What reading a send request's header costs the node (issue 20): the frame reader's
//! [`HeaderView::parse_typed`] plus the request task's [`SendHeader::resolve`], per
//! header, for the load generator's JSON header, a Java client's JSON header and the
//! load generator's binary (`ROCKETMQ`) header, and the encoding of a send's response.
//!
//! `cargo bench --bench headers --features node` for full counts; `cargo test --benches
//! --features node` runs it tiny (and checks each header decodes as a send).

use coremq::format::msg_id::MessageId;
use coremq::node::remoting::SerializeType;
use coremq::node::remoting::codes::{SEND_MESSAGE_V2, SUCCESS};
use coremq::node::remoting::encode::{FieldValue, FrameHead, encode_frame};
use coremq::node::remoting::headers::{SendField, SendHeader, Typed, typed_for_code};
use coremq::node::remoting::scan::HeaderView;
use std::hint::black_box;
use std::time::Instant;

/// The load generator's single send (`src/tools/loadgen/remote`), one key.
fn loadgen_header(kind: SerializeType) -> Vec<u8> {
    let props = "KEYS\u{1}bench-1234567\u{2}";
    let fields = [
        ("a", FieldValue::Str("bench-producer")),
        ("b", FieldValue::Str("BenchTopic0")),
        ("c", FieldValue::Str("TBW102")),
        ("d", FieldValue::Int(4)),
        ("e", FieldValue::Int(3)),
        ("f", FieldValue::Int(0)),
        ("g", FieldValue::Int(1_764_950_400_123)),
        ("h", FieldValue::Int(0)),
        ("i", FieldValue::Str(props)),
        ("j", FieldValue::Int(0)),
        ("m", FieldValue::Str("false")),
    ];
    header_of(&FrameHead {
        code: SEND_MESSAGE_V2,
        flag: 0,
        opaque: 123_456,
        serialize_type: kind,
        remark: None,
        fields: &fields,
    })
}

/// The header bytes of a frame `encode_frame` writes.
fn header_of(head: &FrameHead<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(&mut out, head, 0);
    out[8..].to_vec()
}

/// A Java client's `SendMessageRequestHeaderV2` as fastjson writes it.
fn java_header() -> Vec<u8> {
    concat!(
        r#"{"code":310,"extFields":{"a":"please_rename_unique_group_name","b":"TopicTest","#,
        r#""c":"TBW102","d":"4","e":"1","f":"0","g":"1764950400123","h":"0","#,
        r#""i":"UNIQ_KEY\u0001AC110002300C18B4AAC27D4B0B560000\u0002WAIT\u0001true\u0002TAGS\u0001TagA\u0002","#,
        r#""j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","#,
        r#""opaque":42,"serializeTypeCurrentRPC":"JSON","version":453}"#
    )
    .as_bytes()
    .to_vec()
}

/// Nanoseconds per header to parse it and resolve its send fields.
fn read_cost(kind: u8, header: &[u8], rounds: u32) -> f64 {
    let mut scratch = String::new();
    let mut check = 0usize;
    let started = Instant::now();
    for _ in 0..rounds {
        let (view, typed) = HeaderView::parse_typed(kind, black_box(header), typed_for_code)
            .expect("a send header the view reads");
        let Typed::Send(spans) = typed else {
            panic!("not read as a send: code {}", view.code)
        };
        let h = SendHeader::resolve(&spans, header, &mut scratch);
        check += h.get(SendField::Topic).map_or(0, str::len)
            + h.get(SendField::Properties).map_or(0, str::len);
    }
    let took = started.elapsed();
    assert!(check > 0);
    black_box(check);
    took.as_nanos() as f64 / rounds as f64
}

/// Nanoseconds per send response encoded (`SendMessageResponseHeader`'s fields).
fn encode_cost(kind: SerializeType, rounds: u32) -> f64 {
    let id = [MessageId {
        store_host: std::net::SocketAddrV4::new([127, 0, 0, 1].into(), 10911),
        offset: 123_456_789,
    }];
    let mut out = Vec::with_capacity(1024);
    let started = Instant::now();
    for i in 0..rounds {
        out.clear();
        // As `SendReply::fields` gives them.
        let fields = [
            ("MSG_REGION", FieldValue::Str("DefaultRegion")),
            ("TRACE_ON", FieldValue::Str("true")),
            ("msgId", FieldValue::Ids(&id)),
            ("queueId", FieldValue::Int(3)),
            ("queueOffset", FieldValue::UInt(i as u64)),
        ];
        encode_frame(
            &mut out,
            black_box(&FrameHead {
                code: SUCCESS,
                flag: 1,
                opaque: i as i32,
                serialize_type: kind,
                remark: None,
                fields: &fields,
            }),
            0,
        );
        black_box(&out);
    }
    started.elapsed().as_nanos() as f64 / rounds as f64
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    // `-- --bench NAME`: only the cases whose name holds NAME.
    let only = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    let rounds = if full { 2_000_000 } else { 1_000 };
    let cases = [
        ("loadgen JSON", 0u8, loadgen_header(SerializeType::Json)),
        ("java JSON", 0, java_header()),
        (
            "loadgen ROCKETMQ",
            1,
            loadgen_header(SerializeType::RocketMq),
        ),
    ];
    for (name, kind, header) in cases.iter().filter(|c| wanted(c.0)) {
        // Warm up, then the best of three (the machine is shared).
        read_cost(*kind, header, rounds / 10);
        let best = (0..3)
            .map(|_| read_cost(*kind, header, rounds))
            .fold(f64::MAX, f64::min);
        println!(
            "read {name:<18} {:>4} bytes  {best:>7.1} ns/header  {:>5.2} ns/byte",
            header.len(),
            best / header.len() as f64
        );
    }
    for kind in [SerializeType::Json, SerializeType::RocketMq] {
        if !wanted(&format!("encode {}", kind.name())) {
            continue;
        }
        encode_cost(kind, rounds / 10);
        let best = (0..3)
            .map(|_| encode_cost(kind, rounds))
            .fold(f64::MAX, f64::min);
        println!("encode send response {:<8} {best:>7.1} ns", kind.name());
    }
}
