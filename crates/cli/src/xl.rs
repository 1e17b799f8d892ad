//! The xl-style verbs: `domus daemon` and the commands that talk to it over
//! `STATE_DIR/domusd.sock`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

/// Where the daemon lives: `--state-dir`, `$DOMUS_STATE_DIR`, /var/lib/domus.
#[derive(clap::Args, Clone)]
pub struct StateArg {
    /// The daemon's state directory [default: $DOMUS_STATE_DIR, else /var/lib/domus]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl StateArg {
    fn socket(&self) -> PathBuf {
        domus_daemon::socket_path(&domus_daemon::state_dir(self.state_dir.clone()))
    }
}

#[derive(clap::Args)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Memory kept for the host: domains together get at most the host's
    /// memory minus this (MiB).
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    pub host_reserve: u64,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The domain's configuration file (xl.cfg syntax).
    pub config: PathBuf,
    /// key=value settings that override the file's, as with xl create.
    pub overrides: Vec<String>,
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Long listing: everything the daemon knows, as JSON.
    #[arg(short = 'l', long)]
    pub long: bool,
}

#[derive(clap::Args)]
pub struct DomArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
}

#[derive(clap::Args)]
pub struct MemSetArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// The memory the guest keeps: 512M, 1G, or plain MiB.
    #[arg(value_parser = domus_vmm::config::parse_size)]
    pub size: u64,
}

#[derive(clap::Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("domus: {msg}");
    ExitCode::from(1)
}

/// One request to the daemon; Err is the message to print.
fn call(sock: &Path, method: &str, path: &str, body: Option<&str>) -> Result<Value, String> {
    let (status, text) = domus_http::request(sock, method, path, body).map_err(|e| {
        format!(
            "cannot reach the daemon at {} ({e}); is `domus daemon` running with the same state directory?",
            sock.display()
        )
    })?;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if status >= 400 {
        return Err(v["error"].as_str().unwrap_or(&text).to_string());
    }
    Ok(v)
}

pub fn daemon(a: DaemonArgs) -> ExitCode {
    let state = domus_daemon::state_dir(a.state.state_dir);
    match domus_daemon::run(state, a.host_reserve) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

pub fn create(a: CreateArgs) -> ExitCode {
    let text = match std::fs::read_to_string(&a.config) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", a.config.display())),
    };
    let dir = std::fs::canonicalize(&a.config)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let body = json!({
        "config": text,
        "file": a.config.display().to_string(),
        "dir": dir.display().to_string(),
        "overrides": a.overrides,
    });
    match call(
        &a.state.socket(),
        "POST",
        "/v1/domains",
        Some(&body.to_string()),
    ) {
        Ok(v) => {
            for w in v["warnings"].as_array().into_iter().flatten() {
                eprintln!("domus: warning: {}", w.as_str().unwrap_or_default());
            }
            let d = &v["domain"];
            println!(
                "domain {} (id {}) is {}",
                d["name"].as_str().unwrap_or("?"),
                d["id"],
                d["state"].as_str().unwrap_or("?")
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn list(a: ListArgs) -> ExitCode {
    let v = match call(&a.state.socket(), "GET", "/v1/domains", None) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    if a.json || a.long {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<24} {:>4} {:>7} {:>5} {:>11} {:>9}",
        "Name", "ID", "Mem", "VCPUs", "State", "Time(s)"
    );
    for d in v.as_array().into_iter().flatten() {
        println!(
            "{:<24} {:>4} {:>7} {:>5} {:>11} {:>9.1}",
            d["name"].as_str().unwrap_or("?"),
            d["id"],
            d["memory_mib"],
            d["vcpus"],
            d["state"].as_str().unwrap_or("?"),
            d["cpu_time_s"].as_f64().unwrap_or(0.0)
        );
    }
    ExitCode::SUCCESS
}

/// destroy, pause, unpause.
pub fn simple(verb: &str, a: DomArgs) -> ExitCode {
    let path = format!("/v1/domains/{}", a.domain);
    let (method, path) = match verb {
        "destroy" => ("DELETE", path),
        _ => ("PUT", format!("{path}/{verb}")),
    };
    match call(&a.state.socket(), method, &path, None) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

pub fn mem_set(a: MemSetArgs) -> ExitCode {
    let body = json!({ "target_mib": a.size >> 20 }).to_string();
    let path = format!("/v1/domains/{}/memory", a.domain);
    match call(&a.state.socket(), "PUT", &path, Some(&body)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

pub fn info(a: InfoArgs) -> ExitCode {
    match call(&a.state.socket(), "GET", "/v1/info", None) {
        Ok(v) if a.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(Value::Object(m)) => {
            for (k, v) in m {
                println!(
                    "{k:<20}: {}",
                    v.as_str().map_or_else(|| v.to_string(), str::to_string)
                );
            }
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

pub fn dmesg(a: StateArg) -> ExitCode {
    match call(&a.socket(), "GET", "/v1/dmesg", None) {
        Ok(v) => {
            for l in v.as_array().into_iter().flatten() {
                println!(
                    "[{:.3}] {}",
                    l["at"].as_f64().unwrap_or(0.0),
                    l["msg"].as_str().unwrap_or("")
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
