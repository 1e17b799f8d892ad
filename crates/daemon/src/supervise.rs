//! Supervision: how a domain's VMM ended, what its on_poweroff /
//! on_reboot / on_crash action makes of that (the restart policy), and the
//! monitor that reaps VMMs and restarts domains.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use domus_api::daemon::State;
use domus_xlcfg::Action;

use crate::host::alive;
use crate::watch;
use crate::{db, domain_dir, lock, Daemon, Result};

/// What the daemon knows about a running domain beyond its row.
#[derive(Default)]
pub(crate) struct Live {
    pub(crate) child: Option<domus_jail::Process>,
    pub(crate) restart_at: Option<Instant>,
    /// A shutdown or reboot asked of the guest (the power button pressed)
    /// that has not happened yet.
    pub(crate) requested: Option<Request>,
    /// The VMM's vCPU threads, learned once when it started (or when this
    /// daemon found it), so `list` reads their CPU time from /proc without
    /// asking the VMM.
    pub(crate) vcpu_tids: Vec<i32>,
    /// Paused through this daemon.
    pub(crate) paused: bool,
    /// A pidfd of the running VMM, which turns readable when it ends.
    pub(crate) pidfd: Option<OwnedFd>,
}

/// What `shutdown` and `reboot` ask of a guest. Both press its ACPI power
/// button; a reboot then treats the power-off as a reboot (applies
/// on_reboot), as libvirt does for guests without a reboot button.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    PowerOff,
    Reboot,
}

impl Request {
    pub fn as_str(self) -> &'static str {
        match self {
            Request::PowerOff => "poweroff",
            Request::Reboot => "reboot",
        }
    }
}

/// An exit status in words, for the log.
fn describe_status(status: Option<ExitStatus>) -> String {
    match status {
        None => "killed: it was started by an earlier daemon and left no exit file".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(libc::SIGSYS)) => format!(
                "killed by signal {} (SIGSYS): it made a system call its seccomp filter forbids",
                libc::SIGSYS
            ),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => s.to_string(),
        },
    }
}

/// How a VMM that was not our child ended, from the exit file it writes
/// (`domus run --exit-file`) in the domain's directory `dir`: its exit
/// status as a wait status, or None when it wrote none (it was killed).
pub(crate) fn exit_file_status(dir: &Path) -> Option<ExitStatus> {
    let text = std::fs::read_to_string(dir.join("exit")).ok()?;
    let code: i32 = text.split_whitespace().next()?.parse().ok()?;
    (0..=255)
        .contains(&code)
        .then(|| ExitStatus::from_raw(code << 8))
}

/// The last `n` lines of a text file, or nothing.
fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// How a domain's VMM ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    PoweredOff,
    Rebooted,
    Crashed,
    /// Migrated live: it runs on another host now.
    Migrated,
}

impl End {
    /// From the VMM's exit status (see `domus run --help`; None: unknown)
    /// and what had been asked of the guest.
    pub(crate) fn of(code: Option<i32>, requested: Option<Request>) -> End {
        match (code, requested) {
            (Some(3), _) => End::Rebooted,
            (Some(5), _) => End::Migrated,
            (Some(0) | None, Some(Request::Reboot)) => End::Rebooted,
            (Some(0), _) | (None, Some(Request::PowerOff)) => End::PoweredOff,
            _ => End::Crashed,
        }
    }

    /// Whether the end was none the guest was asked for: a crash, or a
    /// reset while nothing or a power-off was asked (a triple fault resets,
    /// and one can come while the guest powers off: CI of 2026-11-26, a
    /// guest reset 0.8 s after its power button), which the log then
    /// explains with the VMM's last lines.
    pub(crate) fn unexpected(self, requested: Option<Request>) -> bool {
        match self {
            End::Crashed => true,
            End::Rebooted => requested != Some(Request::Reboot),
            End::PoweredOff | End::Migrated => false,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            End::PoweredOff => "powered off",
            End::Rebooted => "rebooted",
            End::Crashed => "crashed",
            End::Migrated => "migrated to another host",
        }
    }
}

/// What the daemon does with a domain whose VMM ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Remove it and everything it had (xl's destroy).
    Remove,
    /// Keep it, stopped, in this state: Shutdown or Crashed (preserve).
    Keep(State),
    /// Start it again once this long has passed (restart).
    Restart(Duration),
    /// Restarted too often of late: keep it, crashed, for its
    /// administrator.
    GiveUp,
}

/// The window [`next`] counts recent restarts in.
pub(crate) const RESTART_WINDOW: Duration = Duration::from_secs(600);
/// Restarts in [`RESTART_WINDOW`] after which a domain is left crashed.
pub(crate) const RESTART_LIMIT: usize = 10;
/// Reboots in the window that restart at once; later ones back off.
const FREE_REBOOTS: usize = 3;

/// The restart policy: what becomes of a domain that ended as `end`, given
/// its configuration's actions (on_poweroff, on_reboot, on_crash) and how
/// often it was restarted in the last [`RESTART_WINDOW`] (`recent`). A
/// crash backs off 1 s more for each recent restart (at most 30 s), so a
/// guest that crashes at once does not spin; the first few reboots and
/// any power-off restart at once, later reboots back off the same way; and
/// a domain restarted [`RESTART_LIMIT`] times in the window is left
/// crashed for its administrator ([`Next::GiveUp`]).
pub(crate) fn next(end: End, actions: [Action; 3], recent: usize) -> (Action, Next) {
    let [on_poweroff, on_reboot, on_crash] = actions;
    let act = match end {
        End::PoweredOff => on_poweroff,
        End::Rebooted => on_reboot,
        End::Crashed => on_crash,
        // Nothing of it is left to keep or restart here.
        End::Migrated => return (Action::Destroy, Next::Remove),
    };
    let back_off = Duration::from_secs((recent as u64 + 1).min(30));
    let next = match act {
        Action::Destroy => Next::Remove,
        Action::Preserve if end == End::Crashed => Next::Keep(State::Crashed),
        Action::Preserve => Next::Keep(State::Shutdown),
        Action::Restart if recent >= RESTART_LIMIT => Next::GiveUp,
        Action::Restart if end == End::Crashed => Next::Restart(back_off),
        Action::Restart if end == End::Rebooted && recent >= FREE_REBOOTS => {
            Next::Restart(back_off)
        }
        Action::Restart => Next::Restart(Duration::ZERO),
    };
    (act, next)
}

impl Daemon {
    /// A domain's VMM ended with `status` (None: unknown, it was not our
    /// child); applies its on_poweroff / on_reboot / on_crash action.
    pub(crate) fn ended(&self, r: &db::Row, status: Option<ExitStatus>) -> Result<()> {
        let c = &r.config;
        let requested = lock(&self.live).get(&r.id).and_then(|l| l.requested);
        let end = End::of(status.and_then(|s| s.code()), requested);
        let actions = [c.on_poweroff, c.on_reboot, c.on_crash];
        let recent = {
            let mut log = lock(&self.restart_log);
            let times = log.entry(r.id).or_default();
            times.retain(|t| t.elapsed() < RESTART_WINDOW);
            times.len()
        };
        let (act, next) = next(end, actions, recent);
        self.log_domain(
            &r.name,
            end == End::Crashed,
            &format!(
                "domain {} {} ({}): {}",
                r.name,
                end.as_str(),
                describe_status(status),
                act.as_str()
            ),
        );
        if end.unexpected(requested) {
            // What is left to tell why, before on_crash may remove it or a
            // restart starts new logs.
            self.log_crash_evidence(r);
        }
        match next {
            Next::Remove => {
                // A migrated domain's disks are its destination's now.
                if end != End::Migrated {
                    self.drop_image_disks(r);
                }
                self.cleanup(r)
            }
            Next::Keep(state) => {
                lock(&self.db).set_state(r.id, state)?;
                lock(&self.live).remove(&r.id);
                Ok(())
            }
            Next::GiveUp => {
                self.log_domain(
                    &r.name,
                    true,
                    &format!(
                        "domain {} was restarted {recent} times in {} minutes: left crashed (destroy it, or fix and create it again)",
                        r.name,
                        RESTART_WINDOW.as_secs() / 60
                    ),
                );
                lock(&self.db).set_state(r.id, State::Crashed)?;
                lock(&self.live).remove(&r.id);
                Ok(())
            }
            Next::Restart(wait) => {
                lock(&self.restart_log)
                    .entry(r.id)
                    .or_default()
                    .push(Instant::now());
                lock(&self.db).set_state(r.id, State::Restarting)?;
                lock(&self.live).insert(
                    r.id,
                    Live {
                        restart_at: Some(Instant::now() + wait),
                        ..Live::default()
                    },
                );
                Ok(())
            }
        }
    }

    /// Logs what may tell why a domain crashed: whether its cgroup's memory
    /// limit killed it, and the last lines of its VMM's log and console.
    fn log_crash_evidence(&self, r: &db::Row) {
        if let Some(groups) = &self.host.groups {
            let kills = groups.oom_kills(&self.cgroup_name(r.id));
            if let Some(k) = kills.filter(|k| *k > 0) {
                self.log_domain(
                    &r.name,
                    true,
                    &format!("domain {}: its memory.max killed {k} process(es)", r.name),
                );
            }
        }
        let dir = domain_dir(&self.state, r.id);
        for (file, what) in [("vmm.log", "VMM log"), ("console.log", "console")] {
            for l in tail(&dir.join(file), 10) {
                self.log_domain(&r.name, true, &format!("domain {} {what}: {l}", r.name));
            }
        }
    }

    /// One pass of the monitor: reaps ended VMMs, restarts domains whose
    /// back-off is over, and removes the cgroups the kernel has let go of.
    /// The lifecycle lock is held while it looks and reaps, not while a
    /// restarted VMM starts (up to 15 s), so creates and destroys go on
    /// meanwhile.
    pub fn monitor_once(&self) {
        let due = {
            let _guard = lock(&self.lifecycle);
            self.sweep_cgroups();
            self.sweep_consoles();
            self.reap()
        };
        for r in due {
            match self.start(&r).and_then(|()| self.still_there(&r)) {
                Ok(Some(_)) => {
                    self.log_domain(&r.name, false, &format!("restarted domain {}", r.name))
                }
                Ok(None) => self.log_domain(
                    &r.name,
                    false,
                    &format!("domain {} was destroyed while it restarted", r.name),
                ),
                Err(e) => {
                    self.log_domain(&r.name, true, &format!("restarting {} failed: {e}", r.name));
                    // Kept as crashed, unless a destroy removed it meanwhile
                    // (then what the start made goes too).
                    if let Ok(Some(_)) = self.still_there(&r) {
                        let _ = lock(&self.db).set_state(r.id, State::Crashed);
                    }
                }
            }
        }
    }

    /// Sleeps until the monitor has something to do: a VMM ended (its
    /// pidfd), the daemon woke it (a VMM started, a cgroup was left to
    /// remove), a restart falls due, or a while passed: 1 s while cgroups
    /// wait to be removed, 250 ms while a VMM has no pidfd (a kernel
    /// without them), else 10 s as a backstop.
    pub fn wait_for_change(&self) {
        let now = Instant::now();
        let mut timeout = Duration::from_secs(10);
        if !lock(&self.stale_cgroups).is_empty() {
            timeout = timeout.min(Duration::from_secs(1));
        }
        let mut fds = Vec::new();
        for l in lock(&self.live).values() {
            match (l.restart_at, &l.pidfd) {
                (Some(at), _) => timeout = timeout.min(at.saturating_duration_since(now)),
                (None, Some(fd)) => match fd.try_clone() {
                    Ok(fd) => fds.push(fd),
                    Err(_) => timeout = timeout.min(Duration::from_millis(250)),
                },
                (None, None) => timeout = timeout.min(Duration::from_millis(250)),
            }
        }
        watch::wait(&self.waker, &fds, Some(timeout));
    }

    /// Removes the cgroups of ended domains that the kernel has let go of.
    fn sweep_cgroups(&self) {
        let Some(groups) = &self.host.groups else {
            return;
        };
        lock(&self.stale_cgroups).retain(|n| {
            groups.kill(n);
            match groups.remove(n, Duration::ZERO) {
                Ok(()) => {
                    self.log(&format!("removed cgroup {n}"));
                    false
                }
                Err(_) => true,
            }
        });
    }

    /// Applies the actions of the domains whose VMMs ended, and returns
    /// those whose restart is due (counted, out of `live`).
    fn reap(&self) -> Vec<db::Row> {
        let Ok(rows) = lock(&self.db).all() else {
            return Vec::new();
        };
        let mut due = Vec::new();
        for r in rows {
            let mut ended = None;
            let mut restart = false;
            {
                let mut live = lock(&self.live);
                match live.get_mut(&r.id) {
                    Some(Live {
                        child: Some(ch), ..
                    }) if r.state == State::Running => {
                        if let Ok(Some(st)) = ch.try_wait() {
                            ended = Some(Some(st));
                        }
                    }
                    Some(Live {
                        restart_at: Some(t),
                        ..
                    }) if r.state == State::Restarting => restart = Instant::now() >= *t,
                    Some(_)
                        if r.state == State::Running
                            && !r.pid.is_some_and(|p| alive(p, r.start_time)) =>
                    {
                        // Not our child (started by an earlier daemon): its
                        // exit file says how it ended.
                        ended = Some(exit_file_status(&domain_dir(&self.state, r.id)));
                    }
                    _ => {}
                }
            }
            if let Some(code) = ended {
                let _ = self.ended(&r, code);
            }
            if restart {
                let _ = lock(&self.db).count_restart(r.id);
                lock(&self.live).remove(&r.id);
                due.push(r);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_a_domain_ended() {
        assert_eq!(End::of(Some(0), None), End::PoweredOff);
        assert_eq!(End::of(Some(3), None), End::Rebooted);
        assert_eq!(End::of(Some(4), None), End::Crashed);
        assert_eq!(End::of(None, None), End::Crashed);
        // A reboot asked for: the guest powers off, the domain reboots.
        assert_eq!(End::of(Some(0), Some(Request::Reboot)), End::Rebooted);
        assert_eq!(End::of(None, Some(Request::Reboot)), End::Rebooted);
        assert_eq!(End::of(None, Some(Request::PowerOff)), End::PoweredOff);
        // A guest that panics on the way down has crashed all the same.
        assert_eq!(End::of(Some(4), Some(Request::PowerOff)), End::Crashed);
        // Migrated away: removed here whatever its actions say.
        assert_eq!(End::of(Some(5), None), End::Migrated);
        // Ends nobody asked for get the VMM's last lines in the log: a
        // reset during a power-off too (a triple fault on the way down).
        let reset = End::of(Some(3), Some(Request::PowerOff));
        assert_eq!(reset, End::Rebooted);
        assert!(reset.unexpected(Some(Request::PowerOff)));
        assert!(End::Rebooted.unexpected(None));
        assert!(End::Crashed.unexpected(Some(Request::Reboot)));
        assert!(!End::Rebooted.unexpected(Some(Request::Reboot)));
        assert!(!End::PoweredOff.unexpected(Some(Request::PowerOff)));
        assert!(!End::Migrated.unexpected(None));
        let keep = [Action::Preserve; 3];
        assert_eq!(
            next(End::Migrated, keep, 0),
            (Action::Destroy, Next::Remove)
        );
    }

    #[test]
    fn each_end_takes_its_own_action() {
        use Action::{Destroy, Preserve, Restart};
        let acts = [Destroy, Restart, Preserve];
        assert_eq!(next(End::PoweredOff, acts, 0), (Destroy, Next::Remove));
        assert_eq!(
            next(End::Rebooted, acts, 0),
            (Restart, Next::Restart(Duration::ZERO))
        );
        assert_eq!(
            next(End::Crashed, acts, 0),
            (Preserve, Next::Keep(State::Crashed))
        );
        let keep = [Preserve, Preserve, Destroy];
        assert_eq!(
            next(End::PoweredOff, keep, 0).1,
            Next::Keep(State::Shutdown)
        );
        assert_eq!(next(End::Rebooted, keep, 0).1, Next::Keep(State::Shutdown));
        assert_eq!(next(End::Crashed, keep, 0).1, Next::Remove);
    }

    #[test]
    fn restarts_back_off_and_a_loop_is_left_crashed() {
        let acts = [Action::Restart; 3];
        let wait = |end, recent| match next(end, acts, recent).1 {
            Next::Restart(d) => d.as_secs(),
            other => panic!("{other:?}"),
        };
        assert_eq!(wait(End::Crashed, 0), 1);
        assert_eq!(wait(End::Crashed, 4), 5);
        // Power-offs do not back off; the first reboots neither.
        assert_eq!(wait(End::PoweredOff, 9), 0);
        assert_eq!(wait(End::Rebooted, 2), 0);
        assert_eq!(wait(End::Rebooted, 3), 4);
        // Restarted RESTART_LIMIT times of late: left crashed, however it
        // ended, unless its action does not restart.
        for end in [End::PoweredOff, End::Rebooted, End::Crashed] {
            assert_eq!(
                wait(end, RESTART_LIMIT - 1),
                if end == End::PoweredOff { 0 } else { 10 }
            );
            assert_eq!(next(end, acts, RESTART_LIMIT).1, Next::GiveUp);
        }
        let destroy = [Action::Destroy; 3];
        assert_eq!(next(End::Crashed, destroy, 99).1, Next::Remove);
    }

    #[test]
    fn end_statuses_in_words() {
        // Wait statuses as waitpid(2) gives them: exit code in the high byte,
        // a signal in the low bits.
        assert_eq!(
            describe_status(Some(ExitStatus::from_raw(4 << 8))),
            "exit status 4"
        );
        assert_eq!(
            describe_status(Some(ExitStatus::from_raw(9))),
            "killed by signal 9"
        );
        assert!(describe_status(None).contains("no exit file"));
        let sys = describe_status(Some(ExitStatus::from_raw(libc::SIGSYS)));
        assert!(sys.contains("seccomp filter forbids"), "{sys}");
    }

    #[test]
    fn an_adopted_vmm_tells_how_it_ended_in_its_exit_file() {
        let d = std::env::temp_dir().join(format!("domus-exit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(exit_file_status(&d), None);
        std::fs::write(
            d.join("exit"),
            "3 the guest reset (a reboot, or a triple fault)\n",
        )
        .unwrap();
        let st = exit_file_status(&d).unwrap();
        assert_eq!(st.code(), Some(3));
        assert_eq!(End::of(st.code(), None), End::Rebooted);
        for bad in ["", "x", "-1 no", "300 no"] {
            std::fs::write(d.join("exit"), bad).unwrap();
            assert_eq!(exit_file_status(&d), None, "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn tail_keeps_the_last_non_blank_lines() {
        let p = std::env::temp_dir().join(format!("domus-tail-{}", std::process::id()));
        std::fs::write(&p, "a\nb\n\nc\nd\n").unwrap();
        assert_eq!(tail(&p, 2), ["c", "d"]);
        assert_eq!(tail(&p, 10), ["a", "b", "c", "d"]);
        let _ = std::fs::remove_file(&p);
        assert!(tail(&p, 3).is_empty());
    }
}
