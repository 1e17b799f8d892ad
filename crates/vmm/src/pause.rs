//! Pausing and resuming a domain's vCPUs (for the API's pause/resume).
//!
//! A paused vCPU thread sleeps on a condition variable outside `KVM_RUN`, so
//! it burns no CPU time and the guest's state is frozen. To get a thread out
//! of `KVM_RUN` the controller sends it [`kick_signal`], whose handler does
//! nothing: the signal alone makes `KVM_RUN` return `EINTR`. A signal that
//! lands just before the thread enters `KVM_RUN` would be missed, so
//! [`Pause::pause`] repeats it until every vCPU has parked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use kvm_ioctls::VcpuFd;

/// Work a parked vCPU thread does on its own vCPU (reading its state for a
/// snapshot), given its index.
pub type Work = Arc<dyn Fn(u32, &VcpuFd) + Send + Sync>;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    paused: bool,
    /// vCPU threads parked in [`Pause::checkpoint`].
    parked: usize,
    /// pthread and kernel thread id of each vCPU that has started.
    threads: Vec<(libc::pthread_t, i32)>,
    /// vCPU threads that have ended (they count as parked).
    gone: usize,
    /// The work parked vCPUs are asked to do, numbered.
    work: Option<(u64, Work)>,
    /// Parked vCPUs that have done the current work.
    work_done: usize,
}

#[derive(Default)]
pub struct Pause {
    state: Mutex<State>,
    cv: Condvar,
    /// Mirrors `state.paused` so the check after every exit takes no lock.
    paused: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("the vCPUs did not stop within {0:?}")]
    Timeout(Duration),
    #[error("the domain is not paused")]
    NotPaused,
}

/// The real-time signal that kicks vCPU threads out of `KVM_RUN`.
pub fn kick_signal() -> i32 {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the (empty) handler for [`kick_signal`]; call once per process.
pub fn install_kick_handler() -> std::io::Result<()> {
    vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}

impl Pause {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by each vCPU thread when it starts.
    pub fn register_current(&self) {
        // SAFETY: pthread_self and gettid have no preconditions.
        let ids = unsafe { (libc::pthread_self(), libc::gettid()) };
        self.lock().threads.push(ids);
        self.cv.notify_all();
    }

    /// Called by a vCPU thread when it ends for good.
    pub fn unregister_current(&self) {
        // SAFETY: as above.
        let me = unsafe { libc::pthread_self() };
        let mut s = self.lock();
        // SAFETY: pthread_equal only compares.
        s.threads
            .retain(|(t, _)| unsafe { libc::pthread_equal(*t, me) } == 0);
        s.gone += 1;
        self.cv.notify_all();
    }

    /// Kernel thread ids of the running vCPU threads, in start order.
    pub fn vcpu_tids(&self) -> Vec<i32> {
        self.lock().threads.iter().map(|(_, tid)| *tid).collect()
    }

    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// A vCPU thread calls this between `KVM_RUN`s; it blocks while the
    /// domain is paused, and meanwhile does the [`Work`] it is given on
    /// `vcpu` (its index and descriptor).
    pub fn checkpoint(&self, vcpu: Option<(u32, &VcpuFd)>) {
        if !self.paused.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.lock();
        if !s.paused {
            return;
        }
        s.parked += 1;
        self.cv.notify_all();
        let mut done = s.work.as_ref().map_or(0, |w| w.0);
        while s.paused {
            if let Some((n, w)) = s.work.clone().filter(|(n, _)| *n != done) {
                drop(s);
                if let Some((id, fd)) = vcpu {
                    w(id, fd);
                }
                s = self.lock();
                done = n;
                s.work_done += 1;
                self.cv.notify_all();
                continue;
            }
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.parked -= 1;
        drop(s);
        // kvmclock went on while the vCPU was parked, so the guest finds
        // the time of the pause gone at once. KVM_KVMCLOCK_CTRL tells it
        // that it was stopped (the pvclock's PVCLOCK_GUEST_STOPPED, at
        // its next entry), so its soft-lockup and RCU stall detectors do
        // not report that time as a hung CPU. EINVAL (a guest without
        // kvmclock) is nothing to act on.
        if let Some((_, fd)) = vcpu {
            let _ = fd.kvmclock_ctrl();
        }
    }

    /// Has every parked vCPU of a paused domain do `work`, and returns once
    /// all have.
    pub fn on_vcpus(&self, work: Work, timeout: Duration) -> Result<(), PauseError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        if !s.paused {
            return Err(PauseError::NotPaused);
        }
        let n = s.work.as_ref().map_or(0, |w| w.0) + 1;
        s.work = Some((n, work));
        s.work_done = 0;
        self.cv.notify_all();
        while s.work_done < s.parked {
            let now = Instant::now();
            if now >= deadline {
                return Err(PauseError::Timeout(timeout));
            }
            s = self
                .cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Stops every vCPU of a domain with `vcpus` vCPUs and returns once all
    /// are parked. Pausing a paused domain does nothing.
    pub fn pause(&self, vcpus: usize, timeout: Duration) -> Result<(), PauseError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        s.paused = true;
        self.paused.store(true, Ordering::Release);
        loop {
            if s.parked + s.gone >= vcpus {
                return Ok(());
            }
            for (t, _) in &s.threads {
                // SAFETY: `t` is a live vCPU thread (threads unregister before
                // they end), and the kick signal has a handler.
                unsafe { libc::pthread_kill(*t, kick_signal()) };
            }
            let now = Instant::now();
            if now >= deadline {
                s.paused = false;
                self.paused.store(false, Ordering::Release);
                self.cv.notify_all();
                return Err(PauseError::Timeout(timeout));
            }
            let wait = (deadline - now).min(Duration::from_millis(5));
            s = self
                .cv
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Marks the domain paused before its vCPUs start (a restore of a
    /// paused domain): each parks before its first instruction.
    pub fn hold(&self) {
        self.lock().paused = true;
        self.paused.store(true, Ordering::Release);
    }

    /// Lets the vCPUs run again. Resuming a running domain does nothing.
    pub fn resume(&self) {
        let mut s = self.lock();
        s.paused = false;
        self.paused.store(false, Ordering::Release);
        drop(s);
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn pause_parks_every_thread_and_resume_releases_them() {
        install_kick_handler().unwrap();
        let p = Arc::new(Pause::default());
        let work = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for _ in 0..3 {
            let (p, work, done) = (p.clone(), work.clone(), done.clone());
            hs.push(std::thread::spawn(move || {
                p.register_current();
                while !done.load(Ordering::Relaxed) {
                    // Stands in for KVM_RUN: sleeps, and a signal ends it.
                    std::thread::sleep(Duration::from_micros(200));
                    work.fetch_add(1, Ordering::Relaxed);
                    p.checkpoint(None);
                }
                p.unregister_current();
            }));
        }
        while p.vcpu_tids().len() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        p.pause(3, Duration::from_secs(5)).unwrap();
        assert!(p.is_paused());
        let before = work.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(work.load(Ordering::Relaxed), before, "a paused thread ran");
        p.pause(3, Duration::from_secs(5)).unwrap();
        p.resume();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            work.load(Ordering::Relaxed) > before,
            "resume did not release"
        );
        done.store(true, Ordering::Relaxed);
        for h in hs {
            h.join().unwrap();
        }
        assert!(p.vcpu_tids().is_empty());
        p.pause(3, Duration::from_secs(1))
            .expect("ended threads count as parked");
    }

    #[test]
    fn pause_times_out_if_a_vcpu_never_parks() {
        let p = Pause::default();
        let e = p.pause(1, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, PauseError::Timeout(_)));
        assert!(!p.is_paused(), "a failed pause leaves the domain running");
    }
}
