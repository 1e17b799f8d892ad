//! What the guest-booting test binaries share: telling a guest that stalled
//! because of the nested test host from one that stalled because of Domus.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Captures the stalled VMM `pid` with `tools/soak.py capture` (each thread's
/// state and kernel stack, and the nested kernel's kvm_exit tracepoint) into
/// `dir/stall`, with `console` beside it, and returns a report whose first
/// line is `domus-test: platform stall: VERDICT` when a vCPU was looping
/// inside KVM_RUN with no exit reaching Domus (the nested host's known bug,
/// tools/NOTES.md), and `domus-test: stall: VERDICT` otherwise. `tools/test`
/// runs a test again in a fresh nested host only on the first kind.
///
/// With the VMM's API socket `api`, the virtio rings go into the verdict
/// too (see [`rings`]): an interrupt the device owes the guest is Domus's
/// fault, one it sent that the guest never handled is the platform's.
pub fn stall_report(pid: u32, dir: &Path, console: &str, api: Option<&Path>) -> String {
    let log = dir.join("console.log");
    let _ = std::fs::write(&log, console);
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/soak.py");
    let mut capture = Command::new("python3");
    capture
        .arg(tool)
        .args(["capture", &pid.to_string()])
        .arg(dir.join("stall"))
        .arg("--console")
        .arg(&log);
    let mut text = String::new();
    if let Some(sock) = api {
        match rings(sock, dir) {
            Ok(file) => {
                capture.arg("--rings").arg(file);
            }
            Err(e) => text = format!("rings: not read: {e}\n"),
        }
    }
    text += &match capture.output() {
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

/// Reads the stalled VMM's virtio rings twice, a second apart, through its
/// API socket `sock` (`GET /v1/domain/rings`), and writes both readings and
/// the findings they agree on (`domus_api::rings::stable_findings`) to
/// `dir/rings.json`, which `tools/soak.py capture --rings` weighs.
fn rings(sock: &Path, dir: &Path) -> Result<std::path::PathBuf, String> {
    let api = domus_api::client::VmmClient::new(sock).with_timeout(Duration::from_secs(5));
    let first = api.rings().map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_secs(1));
    let second = api.rings().map_err(|e| e.to_string())?;
    let findings = domus_api::rings::stable_findings(&first, &second);
    let doc = serde_json::json!({"first": first, "second": second, "findings": findings});
    let file = dir.join("rings.json");
    std::fs::write(&file, doc.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(file)
}
