//! The daemon's optional TCP API: a bearer token is made for it, the CLI
//! reaches it through DOMUS_DAEMON_TCP with the token, and a request
//! without the right token is refused. No guest is started, so this runs in
//! the ordinary `cargo test`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn cli(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_domus"));
    c.args(args)
        .env_remove("DOMUS_TOKEN")
        .env_remove("DOMUS_TOKEN_FILE")
        .env("DOMUS_STATE_DIR", "/nonexistent-so-only-tcp-works");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_tcp_api_needs_the_token() {
    let dir = std::env::temp_dir().join(format!("domus-tcp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A free port: bind, note it, let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["daemon", "--state-dir"])
        .arg(dir.join("state"))
        .args(["--listen-tcp", &addr])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let token_file = dir.join("state/token");
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let tf = token_file.to_str().unwrap();
    let (ok, out, err) = cli(
        &[("DOMUS_DAEMON_TCP", &addr), ("DOMUS_TOKEN_FILE", tf)],
        &["list", "--json"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("Domain-0"), "{out}");
    let (ok, _, err) = cli(
        &[
            ("DOMUS_DAEMON_TCP", &addr),
            ("DOMUS_TOKEN", "0123456789abcdef-wrong"),
        ],
        &["list"],
    );
    assert!(!ok && err.contains("Bearer"), "{err}");
    let (ok, _, err) = cli(&[("DOMUS_DAEMON_TCP", &addr)], &["list"]);
    assert!(!ok && err.contains("DOMUS_TOKEN"), "{err}");
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
