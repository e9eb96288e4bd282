//! Small socket calls the socket crates do not wrap.

use std::os::fd::RawFd;

/// setsockopt with an `int` value.
pub(crate) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads one c_int of the size passed from a live local; the caller keeps
    // `fd` open.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Offset of `tcpi_rcv_wnd` in Linux's `struct tcp_info` (since 6.2; the libc crate's struct
/// stops earlier): the receive window this socket last advertised, in bytes.
const TCPI_RCV_WND: usize = 232;

/// Offset of `tcpi_rcv_mss` in Linux's `struct tcp_info` (since 2.6): the MSS this socket
/// expects to receive.
const TCPI_RCV_MSS: usize = 20;

/// The receive window `fd` last advertised and the segment size it receives
/// (`tcpi_rcv_wnd`, `tcpi_rcv_mss`), bytes; None where the kernel's `tcp_info` does not have
/// the window (before Linux 6.2) or the call fails.
pub(crate) fn receive_window(fd: RawFd) -> Option<(u32, u32)> {
    let mut buf = [0u8; 512];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`, a live local of that size, and
    // stores the length it wrote in `len`; the caller keeps `fd` open.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    let end = TCPI_RCV_WND + 4;
    if r != 0 || (len as usize) < end {
        return None;
    }
    let word = |at: usize| buf[at..at + 4].try_into().ok().map(u32::from_ne_bytes);
    Some((word(TCPI_RCV_WND)?, word(TCPI_RCV_MSS)?))
}

/// Bytes received on `fd` and not read yet (SIOCINQ), or None if the call fails.
pub(crate) fn unread_bytes(fd: RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD (SIOCINQ on a TCP socket) writes one c_int into `n`, a live local; the
    // caller keeps `fd` open.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    (r == 0).then_some(n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    /// On loopback: a socket whose reader stops reading advertises a zero window once its
    /// small buffer is full, and SIOCINQ counts what waits unread.
    #[test]
    fn a_full_receive_buffer_advertises_a_zero_window() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.connect(&addr.into()).unwrap();
        let mut c: std::net::TcpStream = s.into();
        let (mut srv, _) = l.accept().unwrap();
        let fd = c.as_raw_fd();
        let Some((open, mss)) = receive_window(fd) else {
            panic!("tcp_info has no tcpi_rcv_wnd on this kernel (needs Linux 6.2 or later)");
        };
        assert!(open > 0, "a fresh socket advertises an open window");
        assert!(
            (536..=65_535).contains(&mss),
            "tcpi_rcv_mss {mss} is no segment size (offset wrong?)"
        );
        srv.set_nonblocking(true).unwrap();
        let chunk = [7u8; 1024];
        let mut sent = 0usize;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while receive_window(fd).map(|w| w.0) != Some(0) {
            assert!(
                std::time::Instant::now() < deadline,
                "the window never closed"
            );
            match srv.write(&chunk) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        let unread = unread_bytes(fd).unwrap();
        assert!(
            unread > 0 && unread as usize <= sent,
            "{unread} unread of {sent}"
        );
        let mut buf = vec![0u8; 65536];
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0);
    }
}
