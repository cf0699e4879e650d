//! The node's in-place header reader (`remoting::scan`, `remoting::headers`) against
//! the general decoder (issue 20): on every header the in-place reader takes, both
//! give the same fixed fields and the same send and pull headers; a header the
//! general decoder refuses, the in-place reader declines
//! (`coremq::node::remoting::oracle::check_header`, which `scripts/fuzz.sh
//! header_scan` also runs). Inputs: valid headers of both kinds with keys the typed
//! headers know (long and V2 names, repeated, unknown ones), values with escapes,
//! control characters and non-ASCII text, then mutated (bytes replaced, inserted,
//! removed, truncated), hand-written JSON corner cases, and random bytes.
#![cfg(feature = "node")]

use coremq::node::remoting::oracle::check_header;
use coremq::node::remoting::scan::HeaderView;
use coremq::node::remoting::{HEADER_WORD, RemotingCommand, SerializeType};
use proptest::prelude::*;

const KEYS: &[&str] = &[
    "producerGroup",
    "topic",
    "queueId",
    "properties",
    "bornTimestamp",
    "flag",
    "batch",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
    "n",
    "consumerGroup",
    "queueOffset",
    "maxMsgNums",
    "sysFlag",
    "commitOffset",
    "suspendTimeoutMillis",
    "subscription",
    "subVersion",
    "expressionType",
    "x",
    "",
];

fn header_of(c: &RemotingCommand) -> Vec<u8> {
    let frame = c.encode();
    let word = u32::from_be_bytes(frame[4..8].try_into().unwrap());
    let len = (word & 0x00FF_FFFF) as usize;
    frame[4 + HEADER_WORD..4 + HEADER_WORD + len].to_vec()
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_%|-]{0,12}",
        "-?[0-9]{1,20}",
        any::<String>(),
        "[\"\\\\/\u{1}\u{2}\u{7f}é\u{10348}\n\t ]{0,6}",
    ]
}

fn command() -> impl Strategy<Value = (RemotingCommand, u8)> {
    (
        // The codes with a typed header often (the node collects it as it reads).
        prop_oneof![
            proptest::sample::select(vec![10i16, 310, 320, 11, 361]),
            any::<i16>()
        ],
        any::<i32>(),
        0i32..4,
        proptest::option::of(value()),
        proptest::collection::vec((proptest::sample::select(KEYS), value()), 0..12),
        any::<bool>(),
    )
        .prop_map(|(code, opaque, flag, remark, fields, binary)| {
            let fields = fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            let mut c = RemotingCommand::request(code as i32, opaque, fields);
            c.flag = flag;
            c.remark = remark;
            c.serialize_type = if binary {
                SerializeType::RocketMq
            } else {
                SerializeType::Json
            };
            (c, binary as u8)
        })
}

#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = prop_oneof![
        any::<u8>(),
        proptest::sample::select(b"{}[]\":,\\0123456789-.eEnultrfsa \t\r\n".to_vec()),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(a, b)| Edit::Set(a, b)),
        (any::<usize>(), byte).prop_map(|(a, b)| Edit::Insert(a, b)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(h: &mut Vec<u8>, e: &Edit) {
    let at = |a: usize, n: usize| if n == 0 { 0 } else { a % n };
    match *e {
        Edit::Set(a, b) if !h.is_empty() => {
            let i = at(a, h.len());
            h[i] = b;
        }
        Edit::Insert(a, b) => {
            let i = at(a, h.len() + 1);
            h.insert(i, b);
        }
        Edit::Remove(a) if !h.is_empty() => {
            let i = at(a, h.len());
            h.remove(i);
        }
        Edit::Truncate(a) => {
            let i = at(a, h.len() + 1);
            h.truncate(i);
        }
        _ => {}
    }
}

fn check(kind: u8, h: &[u8]) {
    if let Err(e) = check_header(kind, h) {
        panic!("{e}\nkind {kind}, header {:?}", String::from_utf8_lossy(h));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(800))]

    #[test]
    fn valid_headers_read_alike((c, kind) in command()) {
        let h = header_of(&c);
        // The view takes every header this encoder writes without exotic text.
        check(kind, &h);
    }

    #[test]
    fn mutated_headers_read_alike_or_are_declined(
        (c, kind) in command(),
        edits in proptest::collection::vec(edit(), 1..4),
    ) {
        let mut h = header_of(&c);
        for e in &edits {
            apply(&mut h, e);
        }
        check(kind, &h);
        check(1 - kind, &h);
    }

    #[test]
    fn random_bytes_read_alike_or_are_declined(
        kind in 0u8..3,
        h in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        check(kind, &h);
    }
}

#[test]
fn json_corner_cases() {
    let cases: &[&str] = &[
        r#"{"code":310,"extFields":{"b":"T","b":"U","e":null,"i":"K\u0001v\u0002"},"flag":0,"opaque":7}"#,
        r#"{"code":"310","opaque":"7","flag":"2","extFields":{"topic":"T","b":"S"}}"#,
        // A later null takes back an earlier value of the same key.
        r#"{"code":310,"extFields":{"b":"T","e":"1","e":null,"topic":"L","topic":null}}"#,
        r#"{"code":11,"extFields":{"topic":"T","queueId":"1","queueId":null}}"#,
        r#"{"code":11,"extFields":{"topic":"T","queueId":1,"maxMsgNums":true,"sysFlag":-3}}"#,
        r#"{"code":11,"extFields":{"topic":"T","queueOffset":12.5}}"#,
        r#"{"code":11,"extFields":{"topic":{"nested":1}}}"#,
        r#"{"code":11,"extFields":{"topic":"\ud83d\ude00"}}"#,
        r#"{"code":11,"extFields":{"topic":"\ud83d"}}"#,
        r#"{"code":-0,"extFields":{}}"#,
        r#"{"code":1234567890123456789,"extFields":{}}"#,
        r#"{"code":10,"remark":"a\"b\\c","extFields":{"t\u006fpic":"T"}} "#,
        r#"{"code":10,"extFields":{"topic":"T"}} x"#,
        r#"{"code":10,"extFields":{"topic":"T"},"x":[1,{"y":null}]}"#,
        r#"{"code":10,"extFields":null}"#,
        r#"{"code":10,"extFields":{"topic":"T"},"extFields":{"queueId":"2"}}"#,
        r#"{"code":10,"language":"CPP","version":317,"serializeTypeCurrentRPC":"JSON"}"#,
        r#"{"code":10,"serializeTypeCurrentRPC":"ROCKETMQ"}"#,
        r#"{"code":10 , "extFields" : { "topic" : "T" } }"#,
        "{\"code\":10,\"extFields\":{\"topic\":\"a\tb\"}}",
        r#"[]"#,
        r#""#,
        r#"{"#,
        // Keys next to the ones read by a first letter and one compare (`Lex::top_key`)
        // and one load (`Lex::short_key`): the general reading decides them.
        r#"{"codes":1,"cod":2,"code":10,"extFieldsX":{"b":"T"},"extFields":{"b":"U"}}"#,
        r#"{"code":10,"versio":2,"versionX":3,"version":4,"opaque":5,"opaqu":6,"flag":7}"#,
        r#"{"code":10,"remarks":"x","remark":"y","language":"JAVA","languages":1}"#,
        r#"{ "code":10,"extFields":{ "b":"T","c" :"U",""":"V","é":"W","b":"X"}}"#,
        r#"{"code":10,"extFields":{"b":"T","\":"U"}}"#,
        r#"{"code":10,"extFields":{"b":"T","#,
        r#"{"code":10,"extFields":{"b""#,
        r#"{"code":10,"extFields":{"b":"#,
        r#"{"c"#,
    ];
    for c in cases {
        check(0, c.as_bytes());
    }
    // The hot shapes are taken in place (not declined), so the fast path is used.
    for c in &cases[..5] {
        assert!(HeaderView::parse(0, c.as_bytes()).is_ok(), "{c}");
    }
}

/// A binary header's ext fields are read from one UTF-8 check of them all when they
/// pass it; lengths of 128 bytes or more put bytes of 0x80 and up between the texts,
/// so these headers are not UTF-8 as a whole (or are, by a lead byte and the next
/// text's first byte), and are read field by field: the same header either way.
#[test]
fn binary_headers_with_long_values_read_alike() {
    let long = |n: usize, c: char| std::iter::repeat_n(c, n).collect::<String>();
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![("b", "T".into()), ("i", long(200, 'x')), ("e", "3".into())],
        // A length of 194 (0xC2, a lead byte) before a text beginning with 'é' (C3 A9):
        // not UTF-8 as a whole, read field by field.
        vec![("b", long(0xC3 / 2, 'é')), ("e", "é1".into())],
        vec![
            ("topic", long(130, 'é')),
            ("queueId", long(64, '\u{10348}')),
        ],
        vec![("b", "T".into()), ("m", "true".into()), ("a", "g".into())],
    ];
    for fields in cases {
        for code in [310, 10, 11] {
            let mut c = RemotingCommand::request(
                code,
                7,
                fields
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
            );
            c.serialize_type = SerializeType::RocketMq;
            let h = header_of(&c);
            check(1, &h);
            // And taken by the view, not declined: these are plain valid headers.
            assert!(HeaderView::parse(1, &h).is_ok(), "{fields:?}");
        }
    }
}
