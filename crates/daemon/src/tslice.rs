//! The host-wide vCPU time slice: `sched-credit -s -t MS`, Xen's credit
//! scheduler's `tslice`. Linux's EEVDF scheduler gives each thread a slice
//! of its own (`sched_attr.sched_runtime` for the fair policies, Linux
//! 6.12 and later; the kernel's base slice, about 1 to 3 ms, where none is
//! asked). Domains that share CPUs switch less, and lose less guest state
//! (caches, TLB) to each switch, with longer slices; the daemon asks for
//! one on every vCPU thread of every domain, when the setting changes and
//! as each VMM starts or is found. The setting is kept in the state
//! database, so it outlives the daemon.
//!
//! The daemon sets the threads (it runs as root; a jailed VMM could not
//! set its own without a wider seccomp filter), keeping each thread's
//! policy and nice value.

use std::io;

use domus_api::daemon::{HostSched, HostSchedRequest};
use serde::{Deserialize, Serialize};

use crate::{lock, Daemon, Error, Result};

/// The longest slice a fair thread may ask for (the kernel clamps
/// `sched_runtime` to 0.1 to 100 ms).
pub const MAX_TSLICE_MS: u32 = 100;

/// The settings row's key in the state database.
const KEY: &str = "sched";

/// The stored host-wide scheduler settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub tslice_ms: u32,
}

/// The fair (EEVDF) policies, whose threads may ask for a slice:
/// SCHED_OTHER, SCHED_BATCH and SCHED_IDLE.
fn fair(policy: u32) -> bool {
    matches!(
        policy as i32,
        libc::SCHED_OTHER | libc::SCHED_BATCH | libc::SCHED_IDLE
    )
}

fn get_attr(tid: i32) -> io::Result<libc::sched_attr> {
    // SAFETY: sched_attr is plain integers; all zeroes is a valid value.
    let mut a: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: the kernel writes at most `size` bytes into `a`, a live local
    // of that size.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut a, size, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(a)
}

/// Thread `tid`'s slice in ns: its own, or else the kernel's base slice
/// (0 on a kernel before 6.12, which shows none).
pub fn thread_slice_ns(tid: i32) -> io::Result<u64> {
    get_attr(tid).map(|a| a.sched_runtime)
}

/// Makes thread `tid` ask for a slice of `ns` (0: the base slice again),
/// keeping its policy, nice value and flags. A thread under a real-time
/// policy has no slice to ask for and is left as it is (false).
pub fn set_thread_slice_ns(tid: i32, ns: u64) -> io::Result<bool> {
    let mut a = get_attr(tid)?;
    if !fair(a.sched_policy) {
        return Ok(false);
    }
    a.size = std::mem::size_of::<libc::sched_attr>() as u32;
    a.sched_runtime = ns;
    a.sched_deadline = 0;
    a.sched_period = 0;
    // Only SCHED_FLAG_RESET_ON_FORK of what sched_getattr reports may be
    // given back (the others ask for deadline or clamping changes).
    a.sched_flags &= libc::SCHED_FLAG_RESET_ON_FORK as u64;
    // SAFETY: the kernel reads `a.size` bytes from `a`, a live local of
    // that size.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &a, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// `probe` run on a scratch thread of this process (given its id), which
/// asked for no slice and ends with it; an error if it panicked.
fn on_scratch_thread<T: Send + 'static>(
    probe: impl FnOnce(i32) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    std::thread::spawn(|| {
        // SAFETY: gettid has no preconditions.
        probe(unsafe { libc::gettid() })
    })
    .join()
    .unwrap_or_else(|_| Err(io::Error::other("the probing thread panicked")))
}

/// Whether this kernel keeps a fair thread's own slice: a scratch thread
/// asks for 10 ms and reads it back (a kernel before 6.12 takes the
/// request and forgets it, or refuses it as invalid).
pub fn supported() -> io::Result<bool> {
    on_scratch_thread(|tid| {
        let ns = 10_000_000;
        match set_thread_slice_ns(tid, ns) {
            Ok(set) => Ok(set && thread_slice_ns(tid)? == ns),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    })
}

/// The kernel's base slice: what a new thread, which asked for none, has
/// (none before Linux 6.12).
pub fn base_slice_ns() -> Option<u64> {
    on_scratch_thread(thread_slice_ns)
        .ok()
        .filter(|ns| *ns != 0)
}

/// `ms` as the slice a thread asks for (0: none).
fn ns(ms: u32) -> u64 {
    u64::from(ms) * 1_000_000
}

impl Daemon {
    fn sched_settings(&self) -> Result<Settings> {
        let text = lock(&self.db).setting(KEY)?;
        match text {
            None => Ok(Settings::default()),
            Some(t) => serde_json::from_str(&t)
                .map_err(|e| Error::Invalid(format!("the stored scheduler settings ({t}): {e}"))),
        }
    }

    /// `sched-credit -s`: the host-wide scheduler settings.
    pub fn host_sched(&self) -> Result<HostSched> {
        Ok(HostSched {
            tslice_ms: self.sched_settings()?.tslice_ms,
            base_slice_ns: base_slice_ns(),
        })
    }

    /// `sched-credit -s -t MS`: sets the host-wide time slice, kept once
    /// this kernel is known to honour it, then asked for on every running
    /// domain's vCPU threads.
    pub fn set_host_sched(&self, req: &HostSchedRequest) -> Result<HostSched> {
        let Some(ms) = req.tslice_ms else {
            return self.host_sched();
        };
        if ms > MAX_TSLICE_MS {
            return Err(Error::Invalid(format!(
                "tslice {ms} ms is more than the kernel gives a thread ({MAX_TSLICE_MS} ms)"
            )));
        }
        if ms != 0 && !supported()? {
            return Err(Error::Invalid(format!(
                "this kernel ({}) keeps no time slice of a thread's own (Linux 6.12 and later \
                 do); nothing was changed",
                kernel_release()
            )));
        }
        let _one = lock(&self.slicing);
        let text = serde_json::to_string(&Settings { tslice_ms: ms })
            .map_err(|e| Error::Invalid(e.to_string()))?;
        lock(&self.db).set_setting(KEY, &text)?;
        let running: Vec<(i64, Vec<i32>)> = lock(&self.live)
            .iter()
            .map(|(id, l)| (*id, l.vcpu_tids.clone()))
            .collect();
        for (id, tids) in running {
            self.slice_threads(id, &tids, ms);
        }
        self.log(&if ms == 0 {
            "host-wide vCPU time slice: the kernel's base slice again".to_string()
        } else {
            format!("host-wide vCPU time slice set to {ms} ms")
        });
        self.host_sched()
    }

    /// Asks domain `id`'s vCPU threads `tids` for the host-wide slice: as
    /// its VMM starts or is found. A failure is logged; the domain runs on
    /// with the kernel's slice.
    pub(crate) fn slice_vcpus(&self, id: i64, tids: &[i32]) {
        let _one = lock(&self.slicing);
        match self.sched_settings() {
            Ok(s) => self.slice_threads(id, tids, s.tslice_ms),
            Err(e) => self.log(&format!("domain {id}'s vCPU time slice: {e}")),
        }
    }

    fn slice_threads(&self, id: i64, tids: &[i32], ms: u32) {
        // Only threads of the domain's VMM: a thread id the model kept of a
        // VMM that has just ended may be another process's by now.
        let pid = lock(&self.db).get(id).ok().flatten().and_then(|r| r.pid);
        let Some(pid) = pid else { return };
        for &tid in tids {
            if !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() {
                continue;
            }
            match set_thread_slice_ns(tid, ns(ms)) {
                Ok(_) => {}
                // The thread (or its domain) ended meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => self.log(&format!(
                    "domain {id}: asking vCPU thread {tid} for a {ms} ms slice: {e}"
                )),
            }
        }
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_the_slice_it_is_given_where_the_kernel_can() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let base = base_slice_ns().unwrap_or(0);
        assert_eq!(
            thread_slice_ns(tid).unwrap(),
            base,
            "a new thread asks for none"
        );
        assert!(set_thread_slice_ns(tid, 30_000_000).unwrap());
        let kept = thread_slice_ns(tid).unwrap();
        assert_eq!(kept == 30_000_000, supported().unwrap(), "{kept}");
        assert!(set_thread_slice_ns(tid, 0).unwrap());
        assert_eq!(thread_slice_ns(tid).unwrap(), base, "the base slice again");
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        // join returns once the kernel has cleared the thread's tid
        // (CLONE_CHILD_CLEARTID), a moment before it releases the task,
        // which until then still takes a slice (a clean clone's unit tests
        // once saw Ok here): the ended thread answers ESRCH soon after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let gone = loop {
            match set_thread_slice_ns(tid, 0) {
                Err(e) => break e,
                Ok(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                Ok(_) => panic!("thread {tid} still takes a slice 5 s after it ended"),
            }
        };
        assert_eq!(gone.raw_os_error(), Some(libc::ESRCH));
    }

    /// The slice each running domain's (stand-in) vCPU threads ask for.
    fn slices(d: &Daemon) -> Vec<u64> {
        let doms = d.list().unwrap();
        let tids = doms.iter().flat_map(|x| x.vcpu_tids.iter());
        tids.map(|t| thread_slice_ns(*t).unwrap()).collect()
    }

    #[test]
    fn the_host_wide_slice_reaches_every_vcpu_thread_and_outlives_the_daemon() {
        use crate::fakes::{config, daemon, host, StandIn};
        use std::time::Duration;
        let stand_in = StandIn::new(Duration::from_millis(5), None);
        let (d, state) = daemon("tslice", host(stand_in));
        d.create("a.cfg", "/", &config("a", "vcpus = 2"), &[])
            .unwrap();
        assert_eq!(d.host_sched().unwrap().tslice_ms, 0);
        let base = base_slice_ns().unwrap_or(0);
        assert_eq!(slices(&d), [base; 2]);
        let set = |ms| {
            d.set_host_sched(&HostSchedRequest {
                tslice_ms: Some(ms),
            })
        };
        let e = set(MAX_TSLICE_MS + 1).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        if !supported().unwrap() {
            // A kernel before 6.12: refused, nothing kept.
            let e = set(30).unwrap_err();
            assert!(e.to_string().contains("nothing was changed"), "{e}");
            assert_eq!(d.host_sched().unwrap().tslice_ms, 0);
            d.destroy("a").unwrap();
            let _ = std::fs::remove_dir_all(state);
            return;
        }
        assert_eq!(set(30).unwrap().tslice_ms, 30);
        assert_eq!(slices(&d), [30_000_000; 2], "the running domain's threads");
        d.create("b.cfg", "/", &config("b", ""), &[]).unwrap();
        assert_eq!(slices(&d), [30_000_000; 3], "a domain started after");
        // A leaving field keeps the setting.
        let same = d.set_host_sched(&HostSchedRequest::default()).unwrap();
        assert_eq!(same.tslice_ms, 30);

        // The next daemon keeps the setting and gives it to the domains it
        // finds (here after someone reset their threads).
        for t in d.list().unwrap().iter().flat_map(|x| x.vcpu_tids.clone()) {
            set_thread_slice_ns(t, 0).unwrap();
        }
        assert_eq!(slices(&d), [base; 3]);
        let stand_in = StandIn::new(Duration::ZERO, None);
        let d2 = Daemon::open(
            state.clone(),
            "/bin/false".into(),
            crate::Policy::any(),
            host(stand_in),
        )
        .unwrap();
        assert_eq!(d2.host_sched().unwrap().tslice_ms, 30);
        assert_eq!(slices(&d2), [30_000_000; 3], "the domains it found");
        assert_eq!(
            d2.set_host_sched(&HostSchedRequest { tslice_ms: Some(0) })
                .unwrap()
                .tslice_ms,
            0
        );
        assert_eq!(slices(&d2), [base; 3], "back to the kernel's");
        for n in ["a", "b"] {
            d2.destroy(n).unwrap();
        }
        let _ = std::fs::remove_dir_all(state);
    }

    #[test]
    fn settings_are_stored_strictly() {
        assert_eq!(ns(30), 30_000_000);
        assert!(serde_json::from_str::<Settings>(r#"{"tslice_ms": 30, "x": 1}"#).is_err());
        assert!(fair(libc::SCHED_OTHER as u32) && !fair(libc::SCHED_FIFO as u32));
    }
}
