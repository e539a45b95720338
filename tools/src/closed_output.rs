//! A closed standard output (`shardc run ART | head -1`) is the end of the output, for every
//! subcommand, handled here once.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader is gone fails with `BrokenPipe`:
//! `println!` panics with "failed printing to stdout", and an explicit write returns the
//! error up to the `shardc` binary's `main` (the root package's `src/main.rs`). Both end
//! here: the process exits quietly with status 141 (128 + SIGPIPE, what a shell reports for
//! `yes | head -1`'s writer). SIGPIPE itself stays ignored, so a peer that vanishes from a
//! socket is still an error that names it, never a silent death. Before exiting quietly, the
//! stream is checked to be really closed (its reader gone, by `poll`): any other failure still
//! reports and fails as before.

/// The shell's status for a writer ended by a closed pipe: 128 + SIGPIPE.
pub const CLOSED_OUTPUT_STATUS: i32 = 128 + libc::SIGPIPE;

/// Whether the stream on `fd` (1 or 2) is a pipe or socket whose reading end is closed.
pub fn is_closed(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Whether standard output or standard error is closed.
fn an_output_is_closed() -> bool {
    is_closed(1) || is_closed(2)
}

/// Installs the panic hook that turns "failed printing to stdout/stderr" on a closed stream
/// into a quiet exit with [`CLOSED_OUTPUT_STATUS`], on any thread. Other panics go to the hook
/// that was there before.
pub fn install() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        let printing = payload.starts_with("failed printing to stdout")
            || payload.starts_with("failed printing to stderr");
        if printing && an_output_is_closed() {
            std::process::exit(CLOSED_OUTPUT_STATUS);
        }
        previous(info);
    }));
}

/// Whether `e` is a write to a closed standard output or error (then the command ends
/// quietly with [`CLOSED_OUTPUT_STATUS`]). A `BrokenPipe` from anything else, such as a
/// peer's socket, is not.
pub fn is_closed_output(e: &anyhow::Error) -> bool {
    let broken = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    });
    broken && an_output_is_closed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_without_a_reader_is_closed_and_one_with_a_reader_is_not() {
        let mut fds = [0; 2];
        // SAFETY: a two-element array for pipe(2); both ends are closed below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert!(!is_closed(fds[1]));
        // SAFETY: closing the read end this test opened.
        unsafe { libc::close(fds[0]) };
        assert!(is_closed(fds[1]));
        // SAFETY: closing the write end this test opened.
        unsafe { libc::close(fds[1]) };
    }
}
