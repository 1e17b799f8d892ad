//! `domus console` on a terminal: what is typed goes to the guest's serial
//! console (here the kit's shell), its answer comes back, and `Ctrl-]`
//! leaves; the daemon's console-input route refuses what it must.

use super::*;

/// A pseudo-terminal pair: (master, slave).
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors into the ints given; the
    // name, termios and winsize pointers may be null.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both are descriptors openpty just made, owned from here on.
    unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::fs::File::from_raw_fd(slave),
        )
    }
}

#[test]
fn the_console_takes_what_is_typed_and_ctrl_bracket_leaves() {
    use std::io::{Read, Write};
    let dir = scratch("console");
    let state = dir.join("state");
    let _daemon = start_daemon(&state);
    // The kit with no command: a shell on the console.
    let cfg = domain_config(&dir, "sh", 128, "", "");
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    expect_console(&state, "sh", "starting a shell", 1, 180);
    let (mut master, slave) = pty();
    let mut console = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["console", "sh"])
        .env("DOMUS_STATE_DIR", &state)
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave)
        .spawn()
        .unwrap();
    // What the terminal shows, read on a thread (the master blocks).
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut reader, shown) = (master.try_clone().unwrap(), seen.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            shown
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let wait_shown = |needle: &str| {
        let end = Instant::now() + Duration::from_secs(60);
        while !seen.lock().unwrap().contains(needle) {
            assert!(
                Instant::now() < end,
                "'{needle}' never shown; the terminal:\n{}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_shown("Ctrl-] leaves");
    // Typed as a terminal sends it: the guest's shell runs it.
    master.write_all(b"echo typed-$((6*7))\r").unwrap();
    wait_shown("typed-42");
    // Ctrl-] leaves the console; the domain runs on.
    master.write_all(&[0x1d]).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = console.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "Ctrl-] did not end domus console");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert_eq!(find(&state, "sh").unwrap().state, State::Running);
    // The route refuses what it must, and a domain that is not there.
    let sock = state.join("domusd.sock");
    let post =
        |path: &str, body: &str| domus_http::request(&sock, "POST", path, Some(body)).unwrap();
    let (s, _) = post("/v1/domains/sh/console", r#"{"txt": "x"}"#);
    assert_eq!(s, 400);
    let big = format!(r#"{{"text": "{}"}}"#, "x".repeat(5000));
    let (s, m) = post("/v1/domains/sh/console", &big);
    assert_eq!(s, 400, "{m}");
    let (s, _) = post("/v1/domains/ghost/console", r#"{"text": "x"}"#);
    assert_eq!(s, 404);
    let (ok, out, err) = domus_cli(&state, &["destroy", "sh"]);
    assert!(ok, "{out}{err}");
    let _ = std::fs::remove_dir_all(dir);
}
