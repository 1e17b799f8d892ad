//! What the guest-booting test binaries share: telling a guest that stalled
//! because of the nested test host from one that stalled because of Domus.

use std::path::Path;
use std::process::Command;

/// Captures the stalled VMM `pid` with `tools/soak.py capture` (each thread's
/// state and kernel stack, and the nested kernel's kvm_exit tracepoint) into
/// `dir/stall`, with `console` beside it, and returns a report whose first
/// line is `domus-test: platform stall: VERDICT` when a vCPU was looping
/// inside KVM_RUN with no exit reaching Domus (the nested host's known bug,
/// tools/NOTES.md), and `domus-test: stall: VERDICT` otherwise. `tools/test`
/// runs a test again in a fresh nested host only on the first kind.
pub fn stall_report(pid: u32, dir: &Path, console: &str) -> String {
    let log = dir.join("console.log");
    let _ = std::fs::write(&log, console);
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/soak.py");
    let out = Command::new("python3")
        .arg(tool)
        .args(["capture", &pid.to_string()])
        .arg(dir.join("stall"))
        .arg("--console")
        .arg(&log)
        .output();
    let text = match out {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        }
        Err(e) => format!("tools/soak.py capture: {e}"),
    };
    let verdict = text
        .lines()
        .find_map(|l| l.strip_prefix("verdict: "))
        .unwrap_or("no verdict")
        .to_string();
    let kind = if verdict.starts_with("platform:") {
        "platform stall"
    } else {
        "stall"
    };
    format!("domus-test: {kind}: {verdict}\n{text}")
}
