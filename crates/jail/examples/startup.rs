//! What the jail costs a VMM's start, piece by piece (bench/jail runs it;
//! needs root): starting a process with `domus_jail::spawn` in new
//! namespaces and without, of a small program and of this (larger, like
//! `domus`) binary, and `domus_jail::enter` in a process so started. One
//! JSON object per measurement on stdout.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A job running `program args` with its stdout to `stdout` (else thrown
/// away) and its stderr ours.
fn job(
    program: &Path,
    args: &[&str],
    namespaces: bool,
    stdout: Option<OwnedFd>,
) -> std::io::Result<domus_jail::Job> {
    let stdout = match stdout {
        Some(fd) => fd,
        None => std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")?
            .into(),
    };
    Ok(domus_jail::Job {
        program: program.to_path_buf(),
        args: args.iter().map(Into::into).collect(),
        stdin: None,
        stdout,
        stderr: std::io::stderr().as_fd().try_clone_to_owned()?,
        cgroup_procs: None,
        namespaces,
        max_files: 256,
        dies_with_parent: true,
    })
}

/// Runs a job to its end; the microseconds from spawn to its exit.
fn run(j: domus_jail::Job) -> std::io::Result<f64> {
    let t = Instant::now();
    let st = domus_jail::spawn(j)?.wait()?;
    if !st.success() {
        return Err(std::io::Error::other(format!("the child ended with {st}")));
    }
    Ok(t.elapsed().as_secs_f64() * 1e6)
}

/// In the child: enters a jail rooted at `root`, prints how long it took.
fn child(root: &str) -> std::io::Result<()> {
    let spec = domus_api::spec::JailSpec {
        root: PathBuf::from(root),
        uid: 4_000_123,
        gid: 4_000_123,
        devices: vec![],
        max_file_bytes: 1 << 30,
        max_threads: 64,
        fd_socket: None,
    };
    let t = Instant::now();
    domus_jail::enter(&spec).map_err(std::io::Error::other)?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    println!("{{\"what\": \"enter\", \"us\": {us:.1}}}");
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("exit") => return Ok(()),
        Some("child") => return child(args.get(1).map_or("", String::as_str)),
        _ => {}
    }
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(30);
    let me = std::env::current_exe()?;
    let small = Path::new("/bin/true");
    for _ in 0..rounds {
        for namespaces in [false, true] {
            for (name, program, argv) in [("true", small, &[][..]), ("self", &me, &["exit"][..])] {
                let us = run(job(program, argv, namespaces, None)?)?;
                println!(
                    "{{\"what\": \"spawn\", \"program\": \"{name}\", \"namespaces\": {namespaces}, \"us\": {us:.1}}}"
                );
            }
        }
        // The child prints enter's own time on our stdout.
        let root = std::env::temp_dir().join(format!("domus-jail-bench-{}", std::process::id()));
        std::fs::create_dir_all(&root)?;
        let out = std::io::stdout().as_fd().try_clone_to_owned()?;
        let us = run(job(
            &me,
            &["child", &root.display().to_string()],
            true,
            Some(out),
        )?)?;
        let _ = std::fs::remove_dir(&root);
        println!("{{\"what\": \"spawn+enter\", \"program\": \"self\", \"namespaces\": true, \"us\": {us:.1}}}");
    }
    Ok(())
}
