//! The xl-style verbs: `domus daemon` and the commands that talk to it over
//! `STATE_DIR/domusd.sock`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use domus_api::daemon::{
    AttachRequest, CreateRequest, DetachRequest, MaxmemRequest, MemoryRequest, NameOrNumber,
    PinRequest, RenameRequest, SchedRequest,
};
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
    /// Also serve the API on TCP at this host:port (requests need
    /// `Authorization: Bearer TOKEN`; the CLI reaches it through
    /// DOMUS_DAEMON_TCP and DOMUS_TOKEN_FILE or DOMUS_TOKEN).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen_tcp: Option<String>,
    /// The bearer token's file (made, mode 0600, if missing) [default: STATE_DIR/token]
    #[arg(long, value_name = "PATH", requires = "listen_tcp")]
    pub token_file: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The domain's configuration file (xl.cfg syntax).
    pub config: PathBuf,
    /// key=value settings that override the file's, as with xl create.
    pub overrides: Vec<String>,
    /// Follow the new domain's console (as `domus console`) until it goes away.
    #[arg(short = 'c')]
    pub console: bool,
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

/// One request to the daemon: on its Unix socket, or on TCP when
/// DOMUS_DAEMON_TCP (host:port) is set, with the bearer token from
/// DOMUS_TOKEN or the file DOMUS_TOKEN_FILE. Err is the message to print.
fn raw(sock: &Path, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
    let timeout = std::time::Duration::from_secs(30);
    match std::env::var("DOMUS_DAEMON_TCP") {
        Ok(addr) => {
            let token = match (std::env::var("DOMUS_TOKEN"), std::env::var_os("DOMUS_TOKEN_FILE")) {
                (Ok(t), _) => t,
                (_, Some(f)) => std::fs::read_to_string(&f)
                    .map_err(|e| format!("DOMUS_TOKEN_FILE {}: {e}", Path::new(&f).display()))?
                    .trim()
                    .to_string(),
                _ => return Err("DOMUS_DAEMON_TCP needs DOMUS_TOKEN or DOMUS_TOKEN_FILE".into()),
            };
            domus_http::tcp_request(&addr, &token, method, path, body, timeout)
                .map_err(|e| format!("cannot reach the daemon at tcp {addr} ({e})"))
        }
        Err(_) => domus_http::request_within(sock, method, path, body, timeout).map_err(|e| {
            format!(
                "cannot reach the daemon at {} ({e}); is `domus daemon` running with the same state directory?",
                sock.display()
            )
        }),
    }
}

/// A request body, as the daemon's API types define it.
fn to_body<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// One request to the daemon; Err is the message to print.
fn call(sock: &Path, method: &str, path: &str, body: Option<&str>) -> Result<Value, String> {
    let (status, text) = raw(sock, method, path, body)?;
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    if status >= 400 {
        return Err(v["error"].as_str().unwrap_or(&text).to_string());
    }
    Ok(v)
}

pub fn daemon(a: DaemonArgs) -> ExitCode {
    let state = domus_daemon::state_dir(a.state.state_dir);
    let tcp = a.listen_tcp.map(|addr| domus_daemon::TcpApi {
        addr,
        token_file: a.token_file.unwrap_or_else(|| state.join("token")),
    });
    match domus_daemon::run(state, a.host_reserve, tcp) {
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
    let body = to_body(&CreateRequest {
        config: text,
        file: Some(a.config.display().to_string()),
        dir: Some(dir.display().to_string()),
        overrides: Some(a.overrides),
    });
    match call(&a.state.socket(), "POST", "/v1/domains", Some(&body)) {
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
            if a.console {
                return console(ConsoleArgs {
                    state: a.state,
                    domain: d["id"].to_string(),
                });
            }
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
    let body = to_body(&MemoryRequest {
        target_mib: a.size >> 20,
    });
    let path = format!("/v1/domains/{}/memory", a.domain);
    match call(&a.state.socket(), "PUT", &path, Some(&body)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

#[derive(clap::Args)]
pub struct ShutdownArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// Wait until the guest has stopped (shutdown) or is running again
    /// (reboot).
    #[arg(short = 'w', long)]
    pub wait: bool,
    /// With -w: give up after this many seconds (exit status 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub timeout: u64,
}

/// shutdown and reboot: press the guest's power button through the daemon,
/// and with -w wait for the outcome.
pub fn shutdown(verb: &str, a: ShutdownArgs) -> ExitCode {
    let sock = a.state.socket();
    let before = match call(
        &sock,
        "PUT",
        &format!("/v1/domains/{}/{verb}", a.domain),
        None,
    ) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let name = before["name"].as_str().unwrap_or("?").to_string();
    if !a.wait {
        println!("asked domain {name} to {verb} (ACPI power button)");
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "domus: waiting for domain {name} to {verb} (at most {} s)",
        a.timeout
    );
    let (id, pid) = (before["id"].clone(), before["pid"].clone());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(a.timeout);
    while std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = match raw(&sock, "GET", &format!("/v1/domains/{id}"), None) {
            Ok((200, text)) => serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            // Gone: destroyed by on_poweroff (or on_reboot) = destroy.
            Ok((404, _)) if verb == "shutdown" => {
                println!("domain {name} has shut down");
                return ExitCode::SUCCESS;
            }
            Ok((404, _)) => return fail(format!("domain {name} went away instead of rebooting")),
            Ok((status, text)) => return fail(format!("the daemon answered {status}: {text}")),
            Err(e) => return fail(e),
        };
        let state = now["state"].as_str().unwrap_or("?");
        // A new VMM counts once its own API answers (the daemon records it
        // as running as soon as it has started it).
        let restarted = now["pid"] != pid
            && state == "running"
            && matches!(
                raw(&sock, "GET", &format!("/v1/domains/{id}/devices"), None),
                Ok((200, _))
            );
        match (verb, state) {
            (_, "shutdown" | "crashed") => {
                println!("domain {name} is {state}");
                return if verb == "shutdown" && state == "shutdown" {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                };
            }
            _ if restarted => {
                let done = if verb == "reboot" {
                    "rebooted"
                } else {
                    "shut down"
                };
                println!(
                    "domain {name} has {done} and runs again (pid {})",
                    now["pid"]
                );
                return ExitCode::SUCCESS;
            }
            _ => {}
        }
    }
    fail(format!(
        "domain {name} did not {verb} within {} s (does its guest handle the ACPI power button? `domus destroy` stops it at once)",
        a.timeout
    ))
}

#[derive(clap::Args)]
pub struct MemMaxArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// The most memory the domain may have: 512M, 1G, or plain MiB.
    #[arg(value_parser = domus_vmm::config::parse_size)]
    pub size: u64,
}

pub fn mem_max(a: MemMaxArgs) -> ExitCode {
    let body = to_body(&MaxmemRequest {
        maxmem_mib: a.size >> 20,
    });
    let path = format!("/v1/domains/{}/maxmem", a.domain);
    match call(&a.state.socket(), "PUT", &path, Some(&body)) {
        Ok(v) => {
            if v["at_next_start"] == true {
                println!(
                    "domain {}: maximum {} MiB; its guest has {} MiB of RAM until its next start",
                    v["name"].as_str().unwrap_or("?"),
                    v["maxmem_mib"],
                    v["ram_mib"]
                );
            }
            ExitCode::SUCCESS
        }
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

#[derive(clap::Args)]
pub struct RenameArgs {
    #[command(flatten)]
    pub state: StateArg,
    pub domain: String,
    pub new_name: String,
}

pub fn rename(a: RenameArgs) -> ExitCode {
    let body = to_body(&RenameRequest { name: a.new_name });
    match call(
        &a.state.socket(),
        "PUT",
        &format!("/v1/domains/{}/name", a.domain),
        Some(&body),
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

#[derive(clap::Args)]
pub struct VcpuListArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id (default: all domains).
    pub domain: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn vcpu_list(a: VcpuListArgs) -> ExitCode {
    let sock = a.state.socket();
    let doms: Vec<String> = match &a.domain {
        Some(d) => vec![d.clone()],
        None => match call(&sock, "GET", "/v1/domains", None) {
            Ok(v) => v
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["id"] != 0)
                .filter_map(|d| d["name"].as_str().map(str::to_string))
                .collect(),
            Err(e) => return fail(e),
        },
    };
    let mut all = Vec::new();
    for d in doms {
        match call(&sock, "GET", &format!("/v1/domains/{d}/vcpus"), None) {
            Ok(Value::Array(v)) => all.extend(v),
            Ok(_) => {}
            Err(e) => return fail(e),
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<24} {:>4} {:>5} {:>7} {:>4} {:>9}  Affinity",
        "Name", "ID", "VCPU", "TID", "CPU", "Time(s)"
    );
    for v in all {
        println!(
            "{:<24} {:>4} {:>5} {:>7} {:>4} {:>9.1}  {}",
            v["name"].as_str().unwrap_or("?"),
            v["id"],
            v["vcpu"],
            v["tid"],
            v["cpu"],
            v["cpu_time_s"].as_f64().unwrap_or(0.0),
            v["affinity"].as_str().unwrap_or("?")
        );
    }
    ExitCode::SUCCESS
}

#[derive(clap::Args)]
pub struct VcpuPinArgs {
    #[command(flatten)]
    pub state: StateArg,
    pub domain: String,
    /// vCPU number, or all.
    pub vcpu: String,
    /// Host CPUs: a list like 0-3,6, or all.
    pub cpus: String,
}

pub fn vcpu_pin(a: VcpuPinArgs) -> ExitCode {
    let vcpu = match a.vcpu.as_str() {
        "all" => None,
        v => match v.parse::<u64>() {
            Ok(n) => Some(NameOrNumber::Number(n)),
            Err(_) => return fail(format!("'{v}' is not a vCPU number or all")),
        },
    };
    let body = to_body(&PinRequest { vcpu, cpus: a.cpus });
    match call(
        &a.state.socket(),
        "PUT",
        &format!("/v1/domains/{}/vcpu-pin", a.domain),
        Some(&body),
    ) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

#[derive(clap::Args)]
pub struct SchedArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The domain (default: list every domain's weight and cap).
    #[arg(short = 'd', long = "domain")]
    pub domain: Option<String>,
    /// Weight, 1 to 65535 (default 256): CPU shares under contention.
    #[arg(short = 'w', long)]
    pub weight: Option<u32>,
    /// Cap in percent of one CPU (0: none).
    #[arg(short = 'c', long)]
    pub cap: Option<u32>,
}

pub fn sched_credit(a: SchedArgs) -> ExitCode {
    let sock = a.state.socket();
    let show = |v: &Value| {
        println!(
            "{:<24} {:>4} {:>6} {:>4}",
            v["name"].as_str().unwrap_or("?"),
            v["id"],
            v["weight"],
            v["cap"]
        )
    };
    match (&a.domain, a.weight, a.cap) {
        (None, None, None) => {
            let doms = match call(&sock, "GET", "/v1/domains", None) {
                Ok(v) => v,
                Err(e) => return fail(e),
            };
            println!("{:<24} {:>4} {:>6} {:>4}", "Name", "ID", "Weight", "Cap");
            for d in doms
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["id"] != 0)
            {
                match call(
                    &sock,
                    "GET",
                    &format!("/v1/domains/{}/sched", d["id"]),
                    None,
                ) {
                    Ok(v) => show(&v),
                    Err(e) => return fail(e),
                }
            }
            ExitCode::SUCCESS
        }
        (None, _, _) => fail("-w and -c need -d DOMAIN"),
        (Some(d), w, c) => {
            let (method, body) = if w.is_none() && c.is_none() {
                ("GET", None)
            } else {
                ("PUT", Some(to_body(&SchedRequest { weight: w, cap: c })))
            };
            match call(
                &sock,
                method,
                &format!("/v1/domains/{d}/sched"),
                body.as_deref(),
            ) {
                Ok(v) => {
                    println!("{:<24} {:>4} {:>6} {:>4}", "Name", "ID", "Weight", "Cap");
                    show(&v);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}

#[derive(clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// One sample (over --delay seconds), then exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON (with --once).
    #[arg(long)]
    pub json: bool,
    /// Seconds between samples.
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub delay: f64,
}

/// One sample: each domain with CPU percentages over `delay`.
fn top_sample(sock: &Path, delay: f64) -> Result<Vec<Value>, String> {
    let a = call(sock, "GET", "/v1/domains", None)?;
    let t0 = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(delay.max(0.1)));
    let b = call(sock, "GET", "/v1/domains", None)?;
    let dt = t0.elapsed().as_secs_f64();
    let before = |id: &Value, k: &str| {
        a.as_array()
            .into_iter()
            .flatten()
            .find(|d| &d["id"] == id)
            .and_then(|d| d[k].as_f64())
    };
    Ok(b.as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["id"] != 0)
        .map(|d| {
            let pct = |k: &str| match (before(&d["id"], k), d[k].as_f64()) {
                (Some(x), Some(y)) => ((y - x) / dt * 100.0).max(0.0),
                _ => 0.0,
            };
            json!({
                "name": d["name"], "id": d["id"], "state": d["state"],
                "cpu_s": d["cpu_time_s"], "cpu_pct": pct("cpu_time_s"),
                "vcpu_pct": pct("vcpu_time_s"), "io_cpu_pct": pct("io_time_s"),
                "memory_mib": d["memory_mib"], "maxmem_mib": d["maxmem_mib"], "vcpus": d["vcpus"],
            })
        })
        .collect())
}

pub fn top(a: TopArgs) -> ExitCode {
    let sock = a.state.socket();
    loop {
        let s = match top_sample(&sock, a.delay) {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        if a.once && a.json {
            println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            return ExitCode::SUCCESS;
        }
        if !a.once {
            print!("\x1b[H\x1b[2J");
        }
        println!(
            "{:<24} {:>10} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>5}",
            "NAME",
            "STATE",
            "CPU(sec)",
            "CPU(%)",
            "VCPU(%)",
            "IOCPU(%)",
            "MEM(MiB)",
            "MAXMEM",
            "VCPUS"
        );
        for d in &s {
            println!(
                "{:<24} {:>10} {:>9.1} {:>7.1} {:>8.1} {:>8.1} {:>8} {:>8} {:>5}",
                d["name"].as_str().unwrap_or("?"),
                d["state"].as_str().unwrap_or("?"),
                d["cpu_s"].as_f64().unwrap_or(0.0),
                d["cpu_pct"].as_f64().unwrap_or(0.0),
                d["vcpu_pct"].as_f64().unwrap_or(0.0),
                d["io_cpu_pct"].as_f64().unwrap_or(0.0),
                d["memory_mib"],
                d["maxmem_mib"],
                d["vcpus"]
            );
        }
        if a.once {
            return ExitCode::SUCCESS;
        }
    }
}

#[derive(clap::Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub state: StateArg,
    pub domain: String,
}

/// Follows a domain's console log until the domain goes away (read-only:
/// the console of a daemon-managed domain goes to a file).
pub fn console(a: ConsoleArgs) -> ExitCode {
    let sock = a.state.socket();
    let d = match call(&sock, "GET", &format!("/v1/domains/{}", a.domain), None) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let state = domus_daemon::state_dir(a.state.state_dir.clone());
    let path = state
        .join("domains")
        .join(d["id"].to_string())
        .join("console.log");
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", path.display())),
    };
    let mut buf = [0u8; 4096];
    loop {
        use std::io::{Read, Write};
        match f.read(&mut buf) {
            Ok(0) => {
                if call(&sock, "GET", &format!("/v1/domains/{}", d["id"]), None).is_err() {
                    return ExitCode::SUCCESS;
                }
                // A restart moves the log to console.log.1 and starts a new
                // one: follow the new one, as `tail -F` does.
                use std::os::unix::fs::MetadataExt;
                let ino = |m: std::io::Result<std::fs::Metadata>| m.ok().map(|m| m.ino());
                if ino(std::fs::metadata(&path)).is_some_and(|i| Some(i) != ino(f.metadata())) {
                    if let Ok(new) = std::fs::File::open(&path) {
                        f = new;
                        continue;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Ok(n) => {
                let _ = std::io::stdout().write_all(&buf[..n]);
                let _ = std::io::stdout().flush();
            }
            Err(e) => return fail(e),
        }
    }
}

#[derive(clap::Args)]
pub struct DeviceListArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn mib(v: &Value) -> f64 {
    v.as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64
}

/// block-list and network-list: a running domain's disks or interfaces with
/// their counters.
pub fn device_list(kind: &str, a: DeviceListArgs) -> ExitCode {
    let path = format!("/v1/domains/{}/devices", a.domain);
    let all = match call(&a.state.socket(), "GET", &path, None) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let devs: Vec<&Value> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["type"] == kind)
        .collect();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&devs).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    if kind == "block" {
        println!(
            "{:<6} {:<4} {:>9} {:>9} {:>9} {:>9} {:>6}  Path",
            "Vdev", "Mode", "ReadOps", "Read(MiB)", "WriteOps", "Write(MiB)", "Errors"
        );
        for d in devs {
            let c = &d["counters"];
            println!(
                "{:<6} {:<4} {:>9} {:>9.1} {:>9} {:>9.1} {:>6}  {}",
                d["id"].as_str().unwrap_or("?"),
                if d["info"]["read_only"] == true {
                    "ro"
                } else {
                    "rw"
                },
                c["read_ops"],
                mib(&c["read_bytes"]),
                c["write_ops"],
                mib(&c["write_bytes"]),
                c["errors"],
                d["info"]["path"].as_str().unwrap_or("?")
            );
        }
    } else {
        println!(
            "{:<5} {:<16} {:<17} {:>9} {:>8} {:>9} {:>8} {:>7}",
            "Idx", "Tap", "MAC", "RxPkts", "Rx(MiB)", "TxPkts", "Tx(MiB)", "Dropped"
        );
        for d in devs {
            let c = &d["counters"];
            println!(
                "{:<5} {:<16} {:<17} {:>9} {:>8.1} {:>9} {:>8.1} {:>7}",
                d["id"].as_str().unwrap_or("?").trim_start_matches("net"),
                d["info"]["tap"].as_str().unwrap_or("?"),
                d["info"]["mac"].as_str().unwrap_or("?"),
                c["rx_packets"],
                mib(&c["rx_bytes"]),
                c["tx_packets"],
                mib(&c["tx_bytes"]),
                c["rx_dropped"].as_u64().unwrap_or(0) + c["tx_dropped"].as_u64().unwrap_or(0)
            );
        }
    }
    ExitCode::SUCCESS
}

#[derive(clap::Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// block-attach: an xl disk spec ('/srv/d.img,raw,xvdb,rw' or
    /// 'vdev=xvdb,access=ro,target=/srv/d.img'); network-attach: vif
    /// settings (mac=, bridge=, ip=, rate=), as separate words or one spec.
    pub spec: Vec<String>,
}

#[derive(clap::Args)]
pub struct DetachArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// block-detach: the disk's name as block-list shows it (vdb);
    /// network-detach: the interface's index (0) or MAC.
    pub device: String,
    /// Give up waiting for the guest to let go after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub timeout: u64,
}

/// block-attach and network-attach.
pub fn attach(verb: &str, a: AttachArgs) -> ExitCode {
    if verb == "block-attach" && a.spec.is_empty() {
        return fail("block-attach needs a disk spec, like /srv/d.img,raw,xvdb,rw");
    }
    let body = to_body(&AttachRequest {
        spec: Some(a.spec.join(",")),
    });
    let path = format!("/v1/domains/{}/{verb}", a.domain);
    match call(&a.state.socket(), "PUT", &path, Some(&body)) {
        Ok(d) => {
            println!(
                "attached {} to domain {}",
                d["id"].as_str().unwrap_or("?"),
                a.domain
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// block-detach and network-detach: ask, then wait for the guest to let go.
pub fn detach(verb: &str, a: DetachArgs) -> ExitCode {
    let sock = a.state.socket();
    let body = to_body(&DetachRequest {
        id: NameOrNumber::Name(a.device.clone()),
    });
    let path = format!("/v1/domains/{}/{verb}", a.domain);
    let v = match call(&sock, "PUT", &path, Some(&body)) {
        Ok(v) => v,
        Err(e) => return fail(e),
    };
    let id = v["unplugging"].as_str().unwrap_or_default().to_string();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(a.timeout);
    let devices = format!("/v1/domains/{}/devices", a.domain);
    while std::time::Instant::now() < end {
        match call(&sock, "GET", &devices, None) {
            Ok(l)
                if l.as_array()
                    .is_some_and(|l| l.iter().all(|d| d["id"] != id)) =>
            {
                println!("detached {id} from domain {}", a.domain);
                return ExitCode::SUCCESS;
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(200)),
            Err(e) => return fail(e),
        }
    }
    fail(format!(
        "domain {}: the guest did not let go of {id} within {} s (the request stands; its ACPI hot-plug driver decides)",
        a.domain, a.timeout
    ))
}
