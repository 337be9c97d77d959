//! The descriptor channel's framing, shared by the daemon and the Rust
//! client: one protobuf message per SOCK_SEQPACKET packet, its descriptors
//! riding along as SCM_RIGHTS. The protocol itself is described with
//! `HandoutRequest` in the proto file.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use prost::Message;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::unix::AsyncFd;

/// The most descriptors one message carries, and so the most names one
/// `HandoutNeeds` asks for.
pub const MAX_FDS: usize = 64;

/// The largest message either side sends or takes.
pub const MAX_PACKET: usize = 128 * 1024;

/// The descriptor channel's socket beside the gRPC socket `grpc`.
pub fn socket_path(grpc: &Path) -> PathBuf {
    let mut p = grpc.as_os_str().to_owned();
    p.push(".fds");
    PathBuf::from(p)
}

/// Sends `msg` with `fds` as one packet.
pub fn send(socket: impl AsFd, msg: &impl Message, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::other(format!(
            "{} descriptors in one message, over {MAX_FDS}",
            fds.len()
        )));
    }
    let bytes = msg.encode_to_vec();
    if bytes.len() > MAX_PACKET {
        return Err(io::Error::other(format!(
            "a {} byte message, over {MAX_PACKET}",
            bytes.len()
        )));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(
            "descriptors do not fit the control buffer",
        ));
    }
    let socket = socket.as_fd();
    let sent = rustix::io::retry_on_intr(|| {
        rustix::net::sendmsg(
            socket,
            &[IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
    })?;
    if sent != bytes.len() {
        return Err(io::Error::other("a message was sent in part"));
    }
    Ok(())
}

/// Takes one packet: its message and descriptors (close-on-exec), or
/// `None` when the peer closed; a wait a signal interrupts goes on. A
/// packet over [`MAX_PACKET`] bytes or [`MAX_FDS`] descriptors, or one
/// that does not decode, is an `InvalidData` error (the descriptors that
/// did arrive are closed).
pub fn recv<M: Message + Default>(socket: impl AsFd) -> io::Result<Option<(M, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let socket = socket.as_fd();
    // A signal handled during a wait fails it with EINTR even under
    // SA_RESTART once the socket has a receive timeout (signal(7)).
    let got = rustix::io::retry_on_intr(|| {
        rustix::net::recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
    })?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    if got.flags.contains(ReturnFlags::TRUNC) {
        return Err(invalid(format!("a message over {MAX_PACKET} bytes")));
    }
    // The control buffer's rounding may fit a descriptor more than asked.
    if got.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
        return Err(invalid(format!(
            "more than {MAX_FDS} descriptors in one message"
        )));
    }
    let msg = M::decode(&buf[..got.bytes]).map_err(|e| invalid(format!("a bad message: {e}")))?;
    Ok(Some((msg, fds)))
}

/// [`send`] on a non-blocking socket registered with tokio: waits until
/// it may be written (dropping the future ends the wait).
pub async fn send_when_ready<T: AsRawFd + AsFd>(
    socket: &AsyncFd<T>,
    msg: &impl Message,
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    loop {
        let mut ready = socket.writable().await?;
        if let Ok(sent) = ready.try_io(|s| send(s.get_ref(), msg, fds)) {
            return sent;
        }
    }
}

/// [`recv`] on a non-blocking socket registered with tokio: waits until a
/// packet or the close arrives (dropping the future ends the wait).
pub async fn recv_when_ready<M: Message + Default, T: AsRawFd + AsFd>(
    socket: &AsyncFd<T>,
) -> io::Result<Option<(M, Vec<OwnedFd>)>> {
    loop {
        let mut ready = socket.readable().await?;
        if let Ok(got) = ready.try_io(|s| recv(s.get_ref())) {
            return got;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{handout_request, HandoutModel, HandoutRequest};
    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_message_and_its_descriptors_arrive_together() {
        let (a, b) = pair();
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let msg = HandoutRequest {
            step: Some(handout_request::Step::Model(HandoutModel {
                model_path: "/m.onnx".into(),
                outputs: Vec::new(),
            })),
        };
        send(&a, &msg, &[file.as_fd()]).unwrap();
        let (got, fds) = recv::<HandoutRequest>(&b).unwrap().unwrap();
        assert_eq!(got, msg);
        assert_eq!(fds.len(), 1);
        let flags = rustix::io::fcntl_getfd(&fds[0]).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        drop(a);
        assert!(recv::<HandoutRequest>(&b).unwrap().is_none());
    }

    /// The receive timeout is what turns a handled signal into EINTR; the
    /// signal is sent while the waiter sleeps in recvmsg, and the packet
    /// once the handler ran and the waiter sleeps in recvmsg again.
    #[test]
    fn a_handled_signal_does_not_end_a_wait() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static HANDLED: AtomicBool = AtomicBool::new(false);
        extern "C" fn handle(_: libc::c_int) {
            HANDLED.store(true, Ordering::SeqCst);
        }
        // SAFETY: the handler only stores to an atomic; no other test here
        // uses SIGUSR1.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handle as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
                0
            );
        }
        let (a, b) = pair();
        rustix::net::sockopt::set_socket_timeout(
            &b,
            rustix::net::sockopt::Timeout::Recv,
            Some(std::time::Duration::from_secs(20)),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self and gettid have no preconditions.
            tx.send(unsafe { (libc::pthread_self(), libc::gettid()) })
                .unwrap();
            recv::<HandoutRequest>(&b)
        });
        let (thread, tid) = rx.recv().unwrap();
        let syscall = format!("/proc/self/task/{tid}/syscall");
        let in_recvmsg = || {
            let line =
                std::fs::read_to_string(&syscall).unwrap_or_else(|e| panic!("{syscall}: {e}"));
            line.split(' ').next() == Some(&libc::SYS_recvmsg.to_string())
        };
        // Bounded by the waiter's own 20 s timeout.
        while !in_recvmsg() {
            assert!(
                !waiter.is_finished(),
                "the waiter ended before it was seen in recvmsg"
            );
            std::thread::yield_now();
        }
        // SAFETY: the thread is alive: it has not returned from recv.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
        while !HANDLED.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        while !in_recvmsg() && !waiter.is_finished() {
            std::thread::yield_now();
        }
        let msg = HandoutRequest {
            step: Some(handout_request::Step::Model(HandoutModel {
                model_path: "/m.onnx".into(),
                outputs: Vec::new(),
            })),
        };
        // A waiter the signal ended has closed its end: its error tells.
        let _ = send(&a, &msg, &[]);
        let (got, _) = waiter.join().unwrap().expect("the wait went on").unwrap();
        assert_eq!(got, msg);
    }

    #[test]
    fn too_many_descriptors_or_bytes_are_refused_not_kept() {
        let (a, b) = pair();
        let files: Vec<std::fs::File> = (0..MAX_FDS + 1)
            .map(|_| std::fs::File::open("/proc/self/exe").unwrap())
            .collect();
        let many: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        assert!(send(&a, &HandoutRequest::default(), &many).is_err());
        // A peer that does not use this framing sends more at once.
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&many)));
        rustix::net::sendmsg(&a, &[IoSlice::new(b"")], &mut control, SendFlags::empty()).unwrap();
        let e = recv::<HandoutRequest>(&b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        rustix::net::send(&a, &vec![1u8; MAX_PACKET + 1], SendFlags::empty()).unwrap();
        let e = recv::<HandoutRequest>(&b).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
    }
}
