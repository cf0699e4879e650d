//! A loopback TCP proxy between an HA slave and its master that can break the stream
//! on purpose: hold the slave's reports, corrupt a frame's body, cut a frame in the
//! middle, shift a frame's offset. Blocking threads; every loop ends when either side
//! closes. Included with `#[path = "common/proxy.rs"] mod proxy;`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to the next data frame (then back to `None`), or to reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Flip a byte of the body CRC of the next data frame that starts with a record.
    CorruptBody,
    /// Forward the header and half the body of the next data frame, then close.
    CutMidFrame,
    /// Add 8 to the next data frame's offset.
    ShiftOffset,
    /// Swallow the slave's reports while set (not reset by a frame).
    HoldReports,
}

struct Shared {
    fault: Mutex<Fault>,
    /// Faults applied to frames so far.
    applied: AtomicU64,
    frames: AtomicU64,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::None),
            applied: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        std::thread::spawn(move || {
            while !sh.stop.load(Ordering::SeqCst) {
                let Ok((down, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let Ok(up) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = up.set_nodelay(true);
                let _ = down.set_nodelay(true);
                {
                    let mut c = sh.conns.lock().unwrap();
                    c.push(up.try_clone().unwrap());
                    c.push(down.try_clone().unwrap());
                }
                let (sh1, sh2) = (sh.clone(), sh.clone());
                let (up2, down2) = (up.try_clone().unwrap(), down.try_clone().unwrap());
                std::thread::spawn(move || frames(sh1, up, down));
                std::thread::spawn(move || reports(sh2, down2, up2));
            }
        });
        Proxy { addr, shared }
    }

    pub fn set(&self, f: Fault) {
        *self.shared.fault.lock().unwrap() = f;
    }

    pub fn fault(&self) -> Fault {
        *self.shared.fault.lock().unwrap()
    }

    /// Faults applied to frames so far.
    pub fn applied(&self) -> u64 {
        self.shared.applied.load(Ordering::SeqCst)
    }

    /// Closes every connection (the slave reconnects through the proxy).
    pub fn kill_connections(&self) {
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.kill_connections();
    }
}

fn close(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

/// master -> slave: frame by frame, faults applied to data frames.
fn frames(sh: Arc<Shared>, mut up: TcpStream, mut down: TcpStream) {
    let mut head = [0u8; 12];
    loop {
        if up.read_exact(&mut head).is_err() {
            break;
        }
        let size = i32::from_be_bytes(head[8..12].try_into().unwrap()).max(0) as usize;
        let mut body = vec![0u8; size];
        if up.read_exact(&mut body).is_err() {
            break;
        }
        sh.frames.fetch_add(1, Ordering::SeqCst);
        // A corruption goes into a frame that starts with a record, at its body CRC,
        // so no checksum can miss it (a blank's tail has none).
        let starts_record = size >= 12
            && matches!(
                u32::from_be_bytes(body[4..8].try_into().unwrap()),
                0xDAA3_20A7 | 0xDAA3_20AB
            );
        let fault = if size > 0 {
            let mut f = sh.fault.lock().unwrap();
            let now = *f;
            if now == Fault::CorruptBody && !starts_record {
                Fault::None
            } else {
                if now != Fault::HoldReports && now != Fault::None {
                    *f = Fault::None;
                    sh.applied.fetch_add(1, Ordering::SeqCst);
                }
                now
            }
        } else {
            Fault::None
        };
        match fault {
            Fault::CorruptBody => body[8] ^= 0x5a,
            Fault::ShiftOffset => {
                let off = i64::from_be_bytes(head[..8].try_into().unwrap()) + 8;
                head[..8].copy_from_slice(&off.to_be_bytes());
            }
            Fault::CutMidFrame => {
                let _ = down.write_all(&head);
                let _ = down.write_all(&body[..size / 2]);
                std::thread::sleep(Duration::from_millis(50));
                break;
            }
            Fault::None | Fault::HoldReports => {}
        }
        if down.write_all(&head).is_err() || down.write_all(&body).is_err() {
            break;
        }
    }
    close(&up, &down);
}

/// slave -> master: 8-byte reports, swallowed while `HoldReports` is set.
fn reports(sh: Arc<Shared>, mut down: TcpStream, mut up: TcpStream) {
    let mut r = [0u8; 8];
    loop {
        if down.read_exact(&mut r).is_err() {
            break;
        }
        if *sh.fault.lock().unwrap() == Fault::HoldReports {
            continue;
        }
        if up.write_all(&r).is_err() {
            break;
        }
    }
    close(&up, &down);
}
