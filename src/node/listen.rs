//! Listening sockets with `SO_REUSEPORT` (the server socket RocketMQ's
//! `NettyRemotingServer` binds): one per shard on the same address, so the kernel
//! spreads new connections over the shards and no two executors share a socket. (Sharing one socket through dup'ed descriptors does not work with
//! glommio: its accept flips `O_NONBLOCK` on the shared open file, and a shard can
//! end up blocked in `accept(2)` on its executor thread.)

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::FromRawFd;

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// One listening socket bound to `addr` with `SO_REUSEADDR` and `SO_REUSEPORT`.
fn bind_one(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket calls on a descriptor this function owns; the sockaddr
    // structs are fully initialized and passed with their own sizes.
    unsafe {
        let fd = check(libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        // From here the listener owns (and on error closes) the descriptor.
        let listener = TcpListener::from_raw_fd(fd);
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            check(libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &one as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ))?;
        }
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                check(libc::bind(
                    fd,
                    &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ))?;
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_scope_id = a.scope_id();
                check(libc::bind(
                    fd,
                    &sa as *const libc::sockaddr_in6 as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                ))?;
            }
        }
        check(libc::listen(fd, 1024))?;
        Ok(listener)
    }
}

/// `n` listening sockets on `addr` (port 0: the first picks the port, the others
/// take the same).
pub(crate) fn bind_group(addr: SocketAddr, n: usize) -> io::Result<Vec<TcpListener>> {
    let first = bind_one(addr)?;
    let bound = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n.max(1) {
        all.push(bind_one(bound)?);
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn group_sockets_share_the_port_but_not_the_open_file() {
        let group = bind_group("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let port = group[0].local_addr().unwrap().port();
        assert!(group.iter().all(|l| l.local_addr().unwrap().port() == port));
        // File status flags (O_NONBLOCK) belong to the open file: flipping them on
        // one socket must not touch another shard's (glommio's accept flips them).
        group[0].set_nonblocking(true).unwrap();
        // SAFETY: F_GETFL on descriptors owned by `group`.
        let flags = |l: &TcpListener| unsafe { libc::fcntl(l.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags(&group[0]) & libc::O_NONBLOCK, 0);
        assert_eq!(flags(&group[1]) & libc::O_NONBLOCK, 0);
        assert_eq!(flags(&group[2]) & libc::O_NONBLOCK, 0);
        // Connections reach the group.
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    }
}
