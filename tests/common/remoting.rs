//! A small blocking RocketMQ remoting client for tests that talk to a node.
#![allow(dead_code)]

use bytes::Bytes;
use coremq::node::remoting::codes::SUCCESS;
use coremq::node::remoting::{RemotingCommand, SerializeType, decode_payload};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Client {
    s: TcpStream,
    opaque: i32,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { s, opaque: 0 }
    }

    pub fn call(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        self.opaque += 1;
        let mut c = RemotingCommand::request(
            code,
            self.opaque,
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c.serialize_type = SerializeType::Json;
        c.body = Bytes::copy_from_slice(body);
        self.s.write_all(&c.encode()).unwrap();
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut payload).unwrap();
        let r = decode_payload(payload.into()).expect("a well-formed frame");
        assert!(r.is_response());
        assert_eq!(r.opaque, self.opaque);
        r
    }

    pub fn ok(&mut self, code: i32, fields: &[(&str, &str)], body: &[u8]) -> RemotingCommand {
        let r = self.call(code, fields, body);
        assert_eq!(r.code, SUCCESS, "code {code}: {:?}", r.remark);
        r
    }
}
