//! Entering the jail, in the VMM, once everything it needs is open (KVM,
//! guest memory, the kernel read in, disks, taps, vhost, its API socket,
//! its console file) and before the guest's first instruction. From then
//! on it holds descriptors, not names: its root is a small read-only tmpfs
//! with only the device nodes it may still open, it is an unprivileged user
//! with no capabilities, and Landlock (where the kernel has it) limits what
//! it may open to those nodes.
//!
//! This is privilege separation in one process, as OpenSSH does it, rather
//! than Firecracker's jailer, which drops privileges before the VMM runs
//! and so needs every file the VMM opens to be readable by the jail's
//! user: the user's disk images would have to change owner. Here they keep
//! their owner and mode, and are never reachable by name from the jail.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use domus_api::spec::{Checked, JailSpec};
use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

/// What entering the jail can fail on: each step says what it did.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("jail: {0}")]
    Spec(String),
    #[error("jail: {what}: {source}")]
    Step {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("jail: Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
}

/// How the jail came out, for the VMM's log.
#[derive(Debug, PartialEq, Eq)]
pub struct Entered {
    /// "fully enforced", "partially enforced" (an older kernel) or "not
    /// available on this kernel".
    pub landlock: &'static str,
}

fn step(what: impl Into<String>) -> impl FnOnce(io::Error) -> JailError {
    let what = what.into();
    move |source| JailError::Step { what, source }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::other("a NUL byte in a path"))
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cpath).transpose()?;
    let target = cpath(target)?;
    let fstype = fstype.map(|f| CString::new(f).unwrap_or_default());
    let data = data.map(|d| CString::new(d).unwrap_or_default());
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: mount(2) with NUL-terminated strings that live until it
    // returns (or null where the call allows it).
    check(unsafe {
        libc::mount(
            ptr(&src),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
}

/// Enters the jail `spec` describes. Must be called as root while this
/// process has one thread (a new mount namespace needs it; Landlock and the
/// bounding set are per thread, and the threads made later inherit them).
/// Started by [`crate::spawn`], the process is in new namespaces already;
/// new mount, UTS and IPC ones are made here in any case, so nothing done
/// below is seen by the host (only the PID namespace needs the spawn).
pub fn enter(spec: &JailSpec) -> Result<Entered, JailError> {
    spec.check().map_err(JailError::Spec)?;
    // SAFETY: unshare(2) with flags; it changes only this process.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC) })
        .map_err(step(
            "new mount, UTS and IPC namespaces (is this process single-threaded?)",
        ))?;
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(step("making mounts private"))?;
    let root = &spec.root;
    mount(
        None,
        root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("size=64k,nr_inodes=64,mode=0755"),
    )
    .map_err(step(format!("mounting a tmpfs on {}", root.display())))?;
    for dev in &spec.devices {
        let rel = dev.strip_prefix("/").unwrap_or(dev);
        let at = root.join(rel);
        let made = at
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::File::create(&at).map(drop));
        made.and_then(|()| mount(Some(dev), &at, None, libc::MS_BIND, None))
            .map_err(step(format!("binding {}", dev.display())))?;
    }
    let old = root.join("old");
    std::fs::create_dir(&old).map_err(step("making the old root's mount point"))?;
    let (new_c, old_c) = (
        cpath(root).map_err(step("pivot_root"))?,
        cpath(&old).map_err(step("pivot_root"))?,
    );
    // SAFETY: pivot_root(2) with two NUL-terminated paths.
    check(unsafe { libc::syscall(libc::SYS_pivot_root, new_c.as_ptr(), old_c.as_ptr()) } as i32)
        .map_err(step(format!("pivot_root into {}", root.display())))?;
    std::env::set_current_dir("/").map_err(step("chdir /"))?;
    let old = cpath(Path::new("/old")).map_err(step("umount"))?;
    // SAFETY: umount2(2) with a NUL-terminated path.
    check(unsafe { libc::umount2(old.as_ptr(), libc::MNT_DETACH) })
        .map_err(step("detaching the host's root"))?;
    std::fs::remove_dir("/old").map_err(step("removing /old"))?;
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_RDONLY
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC,
        None,
    )
    .map_err(step("making the new root read-only"))?;
    let name = b"domus-jail";
    // SAFETY: sethostname(2) reads `name.len()` bytes of `name`; the UTS
    // namespace is this process's own.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
        .map_err(step("sethostname"))?;
    // SAFETY: umask(2) only sets this process's file mode mask.
    unsafe { libc::umask(0o077) };

    // Changing ids clears the parent-death signal: armed again after.
    let mut pdeath: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes an int through the pointer.
    check(unsafe { libc::prctl(libc::PR_GET_PDEATHSIG, &mut pdeath) })
        .map_err(step("PR_GET_PDEATHSIG"))?;
    drop_privileges(spec)?;
    if pdeath != 0 {
        // SAFETY: prctl(2) with integer arguments.
        check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, pdeath, 0, 0, 0) })
            .map_err(step("PR_SET_PDEATHSIG"))?;
    }
    limit(libc::RLIMIT_FSIZE, spec.max_file_bytes).map_err(step("RLIMIT_FSIZE"))?;
    limit(libc::RLIMIT_NPROC, spec.max_threads).map_err(step("RLIMIT_NPROC"))?;
    // SAFETY: prctl(2) with integer arguments, on this process only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
        .map_err(step("no_new_privs"))?;
    let landlock = landlock(spec)?;
    Ok(Entered { landlock })
}

/// Drops the capability bounding set, the supplementary groups, then
/// becomes `spec.uid`/`spec.gid`: with every uid non-zero, the kernel
/// clears the permitted and effective capabilities. Checked afterwards.
fn drop_privileges(spec: &JailSpec) -> Result<(), JailError> {
    for cap in 0..64 {
        // SAFETY: prctl(2) with integer arguments; EINVAL past the last
        // capability this kernel knows.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(step("dropping the capability bounding set")(e));
        }
    }
    // SAFETY: prctl(2) with integer arguments.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    })
    .map_err(step("clearing ambient capabilities"))?;
    let (u, g) = (spec.uid, spec.gid);
    // SAFETY: glibc's wrappers change the ids of every thread of the
    // process (setgroups with no list, then the group and user ids).
    unsafe {
        check(libc::setgroups(0, std::ptr::null())).map_err(step("setgroups"))?;
        check(libc::setresgid(g, g, g)).map_err(step(format!("setresgid {g}")))?;
        check(libc::setresuid(u, u, u)).map_err(step(format!("setresuid {u}")))?;
    }
    let (mut ru, mut eu, mut su) = (0, 0, 0);
    // SAFETY: getresuid(2) writes the three ids.
    check(unsafe { libc::getresuid(&mut ru, &mut eu, &mut su) }).map_err(step("getresuid"))?;
    if [ru, eu, su] != [u, u, u] || effective_caps().map_err(step("capget"))? != 0 {
        return Err(JailError::Spec(
            "the user id or capabilities did not change".into(),
        ));
    }
    Ok(())
}

/// This thread's effective capabilities.
fn effective_caps() -> io::Result<u64> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        // _LINUX_CAPABILITY_VERSION_3: two Data, for capabilities 0-63.
        version: 0x2008_0522,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget(2) reads `h` and writes two Data into `d`.
    check(unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) } as i32)?;
    Ok(u64::from(d[0].effective) | u64::from(d[1].effective) << 32)
}

fn limit(resource: libc::__rlimit_resource_t, n: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit(2) reads `lim`.
    check(unsafe { libc::setrlimit(resource, &lim) })
}

/// Landlock: of the whole file system, only the jail's device nodes may be
/// opened, read and written, on kernels that have it (5.13 on); the
/// mount namespace and the user already hide the rest.
fn landlock(spec: &JailSpec) -> Result<&'static str, JailError> {
    let abi = ABI::V3;
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules(
            &spec.devices,
            AccessFs::ReadFile | AccessFs::WriteFile,
        ))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced",
        RulesetStatus::NotEnforced => "not available on this kernel",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Set in the child the test below starts: it enters the jail and
    /// reports what it sees.
    const CHILD: &str = "DOMUS_JAIL_TEST_CHILD";

    fn spec(root: PathBuf) -> JailSpec {
        JailSpec {
            root,
            uid: 4_000_123,
            gid: 4_000_124,
            devices: vec!["/dev/null".into()],
            max_file_bytes: 1 << 20,
            max_threads: 64,
            fd_socket: None,
        }
    }

    /// The jail's child half: runs only in the process the parent test
    /// starts (in new namespaces, with CHILD set), where it enters the jail
    /// and prints what it finds; the parent checks the report.
    #[test]
    fn jail_child() {
        let Some(root) = std::env::var_os(CHILD) else {
            return;
        };
        // The parent-death signal is per thread (spawn armed it in the
        // main thread; the test harness runs this on another): armed here,
        // for enter() to keep it across the change of ids.
        // SAFETY: prctl(2) with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
        match enter(&spec(root.into())) {
            Ok(e) => println!("entered landlock={}", e.landlock),
            Err(e) => println!("failed {e}"),
        }
        // SAFETY: plain id queries.
        let ids = unsafe { (libc::getuid(), libc::getgid(), libc::getpid()) };
        println!("ids {} {} pid {}", ids.0, ids.1, ids.2);
        println!("caps {}", effective_caps().unwrap_or(u64::MAX));
        let mut pdeath: libc::c_int = 0;
        // SAFETY: PR_GET_PDEATHSIG writes an int through the pointer.
        unsafe { libc::prctl(libc::PR_GET_PDEATHSIG, &mut pdeath) };
        println!("pdeath {pdeath}");
        // Landlock, where the kernel has it, forbids listing "/": ask by name.
        let here = |p: &str| std::path::Path::new(p).exists();
        println!(
            "seen {} {} {} {}",
            here("/dev/null"),
            here("/etc"),
            here("/proc"),
            here("/old")
        );
        println!(
            "null {}",
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .is_ok()
        );
        println!("write {}", std::fs::write("/x", b"x").is_ok());
    }

    #[test]
    fn a_jailed_process_sees_only_its_devices_as_an_unprivileged_user() {
        // SAFETY: geteuid(2) has no arguments.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (mount namespaces, pivot_root, setuid)");
        }
        let dir = std::env::temp_dir().join(format!("domus-jail-enter-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        let out = dir.join("out");
        let f = std::fs::File::create(&out).unwrap();
        std::env::set_var(CHILD, &root);
        let job = crate::Job {
            program: std::env::current_exe().unwrap(),
            args: [
                "--exact",
                "enter::tests::jail_child",
                "--nocapture",
                "--test-threads=1",
            ]
            .map(Into::into)
            .to_vec(),
            stdin: None,
            stdout: f.try_clone().unwrap().into(),
            stderr: f.into(),
            cgroup_procs: None,
            namespaces: true,
            max_files: 256,
            dies_with_parent: true,
        };
        let st = crate::spawn(job).unwrap().wait().unwrap();
        std::env::remove_var(CHILD);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(st.success(), "{text}");
        assert!(text.contains("entered landlock="), "{text}");
        assert!(text.contains("ids 4000123 4000124 pid 1\n"), "{text}");
        assert!(text.contains("caps 0\n"), "{text}");
        assert!(
            text.contains("pdeath 9\n"),
            "the parent-death signal holds: {text}"
        );
        assert!(text.contains("seen true false false false\n"), "{text}");
        assert!(text.contains("null true\n"), "{text}");
        assert!(text.contains("write false\n"), "{text}");
        // The host's view did not change: the root is an empty directory.
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_spec_is_refused_before_anything_is_done() {
        let mut s = spec("relative".into());
        assert!(matches!(enter(&s), Err(JailError::Spec(_))));
        s.root = "/x".into();
        s.uid = 0;
        assert!(matches!(enter(&s), Err(JailError::Spec(_))));
    }
}
