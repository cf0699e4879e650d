//! `--target echo`: a loopback TCP echo server in the load generator's process, the
//! floor a node's round trip (and its CPU per round trip) is compared with.

use super::READ_BUF;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

/// The echo server's connection threads: how many still run, and the CPU (user and
/// system seconds, `CLOCK_THREAD_CPUTIME_ID`) of those that ended. One side of a bare loopback
/// round trip: the floor a node's CPU per message at one in flight is compared with.
static ECHO_CPU: (Mutex<(usize, f64)>, std::sync::Condvar) =
    (Mutex::new((0, 0.0)), std::sync::Condvar::new());

/// The echo threads' CPU once every connection has closed (waits up to 2 s for the
/// threads to see their connection end).
pub(super) fn echo_cpu_seconds() -> f64 {
    let (lock, ended) = &ECHO_CPU;
    let state = lock.lock().unwrap_or_else(|e| e.into_inner());
    let (state, _) = ended
        .wait_timeout_while(state, Duration::from_secs(2), |(live, _)| *live > 0)
        .unwrap_or_else(|e| e.into_inner());
    state.1
}

/// A loopback echo server (`--target echo`): a thread per connection writes back
/// whatever it reads. Returns its address.
pub(super) fn echo_server() -> Result<String, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("echo server: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?.to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            ECHO_CPU.0.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
            std::thread::spawn(move || {
                let _ = s.set_nodelay(true);
                let mut buf = vec![0u8; READ_BUF];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let cpu = super::super::measure::thread_cpu_seconds();
                let mut state = ECHO_CPU.0.lock().unwrap_or_else(|e| e.into_inner());
                *state = (state.0 - 1, state.1 + cpu);
                ECHO_CPU.1.notify_all();
            });
        }
    });
    Ok(addr)
}
