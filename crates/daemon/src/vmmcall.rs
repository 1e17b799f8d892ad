//! A failed exchange with a domain's VMM, as the daemon reports it: the
//! VMM's own error, or, where its process ended meanwhile, that.

use domus_api::client::ClientError;

use crate::{db, host, Error};

/// A failed call to domain `r`'s own API, as the daemon reports it.
pub(crate) fn vmm_error(r: &db::Row) -> impl FnOnce(ClientError) -> Error + '_ {
    move |e| match e {
        ClientError::Transport { .. } if vmm_exited(r) => {
            Error::Invalid(format!("domain {}: {}: {e}", r.name, VMM_EXITED))
        }
        e => Error::Invalid(format!("domain {}: {e}", r.name)),
    }
}

/// What a request to a VMM that ended meanwhile failed for, in place of
/// its bare "connection refused".
pub(crate) const VMM_EXITED: &str = "its VMM exited while the daemon was setting it up or \
    talking to it (the guest reset, or the VMM failed: the daemon's log has the VMM's \
    last lines)";

/// Whether domain `r`'s VMM has exited, or does within half a second: a
/// failed exchange with it is then the VMM's end (a guest that reset
/// during a create, a crash), which is what the caller needs to hear.
pub(crate) fn vmm_exited(r: &db::Row) -> bool {
    let Some(pid) = r.pid else {
        return false;
    };
    for _ in 0..10 {
        if !host::alive(pid, r.start_time) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::start_time;
    use domus_api::daemon::State;

    fn row(pid: Option<i64>, start_time: Option<i64>) -> db::Row {
        db::Row {
            id: 1,
            name: "d".into(),
            config: db::test_config("d"),
            pid,
            start_time,
            state: State::Running,
            restarts: 0,
            memory_mib: 64,
        }
    }

    fn refused() -> ClientError {
        ClientError::Transport {
            at: "/x/api.sock".into(),
            source: domus_http::HttpError::Io(std::io::Error::from(
                std::io::ErrorKind::ConnectionRefused,
            )),
        }
    }

    #[test]
    fn a_vmm_that_exited_is_named_in_the_error() {
        // A child that has exited and been reaped: its pid is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i64::from(child.id());
        let started = start_time(pid);
        child.wait().unwrap();
        let gone = row(Some(pid), started);
        let msg = vmm_error(&gone)(refused()).to_string();
        assert!(msg.contains(VMM_EXITED), "{msg}");
        // This process is alive: the transport error is told as it is.
        let me = i64::from(std::process::id());
        let alive = row(Some(me), start_time(me));
        let msg = vmm_error(&alive)(refused()).to_string();
        assert!(!msg.contains("exited"), "{msg}");
        // No VMM recorded: nothing is claimed.
        assert!(!vmm_exited(&row(None, None)));
    }
}
