//! The daemon's TCP API: TLS with a certificate made on first start (its
//! fingerprint shown by `domus info`), a bearer token, and limits that keep
//! unauthenticated clients from holding the daemon. The CLI reaches it
//! through DOMUS_DAEMON_TCP with the certificate's fingerprint and the
//! token. No guest is started, so this runs in the ordinary `cargo test`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn cli(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_domus"));
    c.args(args)
        .env_remove("DOMUS_TOKEN")
        .env_remove("DOMUS_TOKEN_FILE")
        .env_remove("DOMUS_TLS_FINGERPRINT")
        .env_remove("DOMUS_TLS_CA")
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

/// `a`'s variables and `b`'s.
fn both<'a>(a: &[(&'a str, &'a str)], b: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    a.iter().chain(b).copied().collect()
}

#[test]
fn the_tcp_api_is_tls_with_a_token_and_holds_against_idle_clients() {
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
    let state = dir.join("state");
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_domus"))
        .args(["daemon", "--state-dir"])
        .arg(&state)
        .args(["--listen-tcp", &addr, "--no-cgroups", "--no-network"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&addr).is_err() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The fingerprint, from `domus info` on the daemon's own host.
    let sd = state.to_str().unwrap();
    let (ok, out, err) = cli(&[("DOMUS_STATE_DIR", sd)], &["info", "--json"]);
    assert!(ok, "{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fp = info["tls_fingerprint"].as_str().unwrap().to_string();
    assert!(fp.starts_with("SHA256:"), "{out}");
    let key = std::fs::metadata(state.join("tls/key.pem")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&key.permissions()) & 0o777,
        0o600
    );

    let tf = state.join("token");
    let tf = tf.to_str().unwrap();
    let tcp = [
        ("DOMUS_DAEMON_TCP", addr.as_str()),
        ("DOMUS_TLS_FINGERPRINT", fp.as_str()),
    ];
    let (ok, out, err) = cli(
        &both(&tcp, &[("DOMUS_TOKEN_FILE", tf)]),
        &["list", "--json"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("Domain-0"), "{out}");
    let (ok, _, err) = cli(
        &both(&tcp, &[("DOMUS_TOKEN", "0123456789abcdef-wrong")]),
        &["list"],
    );
    assert!(!ok && err.contains("Bearer"), "{err}");
    let (ok, _, err) = cli(&tcp, &["list"]);
    assert!(!ok && err.contains("DOMUS_TOKEN"), "{err}");
    // The server is checked: another fingerprint, or none, is refused.
    let wrong = format!("SHA256:{}", ["AB"; 32].join(":"));
    let env = [
        ("DOMUS_DAEMON_TCP", addr.as_str()),
        ("DOMUS_TLS_FINGERPRINT", wrong.as_str()),
        ("DOMUS_TOKEN_FILE", tf),
    ];
    let (ok, _, err) = cli(&env, &["list"]);
    assert!(!ok && err.contains("not the expected"), "{err}");
    let env = [
        ("DOMUS_DAEMON_TCP", addr.as_str()),
        ("DOMUS_TOKEN_FILE", tf),
    ];
    let (ok, _, err) = cli(&env, &["list"]);
    assert!(!ok && err.contains("DOMUS_TLS_FINGERPRINT"), "{err}");
    // Plain HTTP gets no HTTP answer.
    let mut plain = TcpStream::connect(&addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"GET /v1/info HTTP/1.1\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(
        !got.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // 100 clients that connect and say nothing: past the cap they are
    // turned away, the daemon's thread count stays bounded, the local
    // socket still answers, and the deadline ends them all.
    let threads = || {
        std::fs::read_dir(format!("/proc/{}/task", daemon.id()))
            .unwrap()
            .count()
    };
    let before = threads();
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = threads();
    assert!(during <= before + 64 + 2, "{before} -> {during} threads");
    let (ok, _, err) = cli(&[("DOMUS_STATE_DIR", sd)], &["list"]);
    assert!(ok, "a local request while TCP is full: {err}");
    let at = Instant::now();
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    assert!(
        at.elapsed() < Duration::from_secs(10),
        "idle clients held for {:?}",
        at.elapsed()
    );
    let (ok, _, err) = cli(&both(&tcp, &[("DOMUS_TOKEN_FILE", tf)]), &["list"]);
    assert!(ok, "after the idle clients: {err}");
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
