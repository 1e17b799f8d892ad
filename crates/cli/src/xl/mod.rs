//! The xl-style verbs: `domus daemon` and the commands that talk to it
//! through its typed client ([`DaemonClient`]), on `STATE_DIR/domusd.sock`
//! or TCP. Domain verbs are here; vCPU and scheduling verbs in [`cpu`],
//! disk and interface verbs in [`devices`], save and restore in
//! [`snapshot`].

mod console;
mod cpu;
mod devices;
mod image;
mod migrate;
mod snapshot;
mod vfr;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use domus_api::client::{ClientError, DaemonClient, Endpoint};
use domus_api::daemon::{CreateRequest, State};
use domus_http::tls::Verify;

pub use console::{console, ConsoleArgs};
pub use cpu::{
    sched_credit, top, vcpu_list, vcpu_pin, SchedArgs, TopArgs, VcpuListArgs, VcpuPinArgs,
};
pub use devices::{
    attach, detach, device_list, ssh, AttachArgs, DetachArgs, DeviceListArgs, SshArgs,
};
pub use image::{image, ImageArgs};
pub use migrate::{migrate, MigrateArgs};
pub use snapshot::{clone, restore, save, CloneArgs, RestoreArgs, SaveArgs};
pub use vfr::{vfr, VfrArgs};

/// Where the daemon lives: `--state-dir`, `$DOMUS_STATE_DIR`, /var/lib/domus.
#[derive(clap::Args, Clone)]
pub struct StateArg {
    /// The daemon's state directory [default: $DOMUS_STATE_DIR, else /var/lib/domus]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl StateArg {
    /// The daemon's typed client: on its Unix socket in the state
    /// directory, or over TLS when DOMUS_DAEMON_TCP (host:port) is set, the
    /// daemon's certificate checked by DOMUS_TLS_FINGERPRINT or DOMUS_TLS_CA,
    /// with the bearer token from DOMUS_TOKEN or the file DOMUS_TOKEN_FILE.
    fn client(&self) -> Result<DaemonClient, String> {
        let at = match std::env::var("DOMUS_DAEMON_TCP") {
            Ok(addr) => {
                let token = match (
                    std::env::var("DOMUS_TOKEN"),
                    std::env::var_os("DOMUS_TOKEN_FILE"),
                ) {
                    (Ok(t), _) => t,
                    (_, Some(f)) => std::fs::read_to_string(&f)
                        .map_err(|e| format!("DOMUS_TOKEN_FILE {}: {e}", Path::new(&f).display()))?
                        .trim()
                        .to_string(),
                    _ => {
                        return Err("DOMUS_DAEMON_TCP needs DOMUS_TOKEN or DOMUS_TOKEN_FILE".into())
                    }
                };
                let verify = match (
                    std::env::var("DOMUS_TLS_FINGERPRINT"),
                    std::env::var_os("DOMUS_TLS_CA"),
                ) {
                    (Ok(fp), _) => Verify::Fingerprint(fp),
                    (_, Some(ca)) => Verify::CaFile(ca.into()),
                    _ => {
                        return Err("DOMUS_DAEMON_TCP needs the daemon's certificate to check: \
                             DOMUS_TLS_FINGERPRINT (`domus info` on the daemon's host shows it) \
                             or DOMUS_TLS_CA (a CA file)"
                            .into())
                    }
                };
                Endpoint::Tcp {
                    addr,
                    token,
                    verify,
                }
            }
            Err(_) => Endpoint::Unix(domus_daemon::socket_path(&domus_daemon::state_dir(
                self.state_dir.clone(),
            ))),
        };
        Ok(DaemonClient::new(at))
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
    /// A directory whose files (kernels, initrds, disk images) domains may
    /// use; repeat for more. Any other file is refused (403). Default:
    /// STATE_DIR/images and the guest kit's directory.
    #[arg(long, value_name = "DIR")]
    pub image_dir: Vec<PathBuf>,
    /// A block device domains may use as a disk; repeat for more. No block
    /// device is served unless listed.
    #[arg(long, value_name = "PATH")]
    pub block_device: Vec<PathBuf>,
    /// Run without cgroups: domains get no CPU weights, caps, CPU lists or
    /// memory limits, and requests that set one are refused. Without this
    /// the daemon refuses to start on a host lacking cgroup v2 with the
    /// cpu, cpuset and memory controllers.
    #[arg(long)]
    pub no_cgroups: bool,
    /// Run without the virtual firewall-router (for debugging and for
    /// measuring what it costs): domains' interfaces get no anti-spoofing,
    /// port or isolation rules and no VFR counters. The daemon's log says
    /// so.
    #[arg(long)]
    pub no_vfr: bool,
    /// Start VMMs without their seccomp filter (for debugging a VMM that
    /// dies of SIGSYS): a guest that takes over its VMM can then make any
    /// system call. The daemon's log says so.
    #[arg(long)]
    pub no_seccomp: bool,
    /// Start VMMs without their jail (for debugging): each then runs as
    /// root with every capability, in the host's namespaces and root
    /// directory, so a guest that takes over its VMM owns the host. The
    /// daemon's log says so.
    #[arg(long)]
    pub no_jail: bool,
    /// The first user and group id of the jails: domain N's VMM runs as
    /// user and group FIRST + N. Keep the range (FIRST up to FIRST plus the
    /// number of domains ever created) free of other users.
    #[arg(long, value_name = "FIRST", default_value_t = domus_daemon::JAIL_ID_BASE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub jail_ids: u32,
    /// Seconds a starting VMM has to answer on its API before its create
    /// fails. Many domains created at once on a busy host can need more.
    #[arg(long, value_name = "SECS", default_value_t = domus_daemon::START_TIMEOUT_S,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub start_timeout: u64,
    /// Also serve the API over TLS on TCP at this host:port (requests need
    /// `Authorization: Bearer TOKEN`; the CLI reaches it through
    /// DOMUS_DAEMON_TCP, DOMUS_TLS_FINGERPRINT or DOMUS_TLS_CA, and
    /// DOMUS_TOKEN_FILE or DOMUS_TOKEN).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen_tcp: Option<String>,
    /// The default network's bridge: vifs without bridge= go on it, with
    /// DHCP, DNS (dnsmasq) and NAT to the host's uplink.
    #[arg(long, value_name = "NAME", default_value = "domus0")]
    pub network_bridge: String,
    /// The host's address on the default network, with its prefix.
    #[arg(long, value_name = "ADDR/PREFIX", default_value = "10.200.0.1/24")]
    pub network: String,
    /// No default network: no bridge, no dnsmasq, no NAT made.
    #[arg(long)]
    pub no_network: bool,
    /// The bearer token's file (made, mode 0600, if missing) [default: STATE_DIR/token]
    #[arg(long, value_name = "PATH", requires = "listen_tcp")]
    pub token_file: Option<PathBuf>,
    /// The TLS certificate (PEM) [default: STATE_DIR/tls/cert.pem; a
    /// self-signed one is made with its key on first start]
    #[arg(long, value_name = "PATH", requires = "listen_tcp")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM, mode 0600) [default:
    /// STATE_DIR/tls/key.pem]
    #[arg(long, value_name = "PATH", requires = "listen_tcp")]
    pub tls_key: Option<PathBuf>,
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
    /// Dry run (xl's -n): print the domain configuration that would be
    /// started, as JSON, and start nothing (an image's kernel and disks are
    /// filled in by the daemon when it creates the domain).
    #[arg(short = 'n', long)]
    pub dry_run: bool,
}

/// The invoking user's SSH public keys (`~/.ssh/*.pub`), one line each;
/// keys with quotes or backslashes (not a public key) are left out.
fn user_ssh_keys() -> Vec<String> {
    let Some(home) = std::env::var_os("HOME") else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(PathBuf::from(home).join(".ssh")) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pub"))
        .collect();
    files.sort();
    files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| {
            t.lines()
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|k| !k.is_empty() && !k.contains(['"', '\\', '\'']))
        .collect()
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
    #[arg(value_parser = domus_api::spec::parse_size)]
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

/// Runs a verb: its exit status, or status 1 after printing why it failed.
fn verb(f: impl FnOnce() -> Result<ExitCode, String>) -> ExitCode {
    f().unwrap_or_else(fail)
}

/// A failed request as the user reads it: an unreachable daemon names
/// where it was looked for.
fn failed(e: ClientError) -> String {
    match e {
        ClientError::Transport { at, source } if at.starts_with("tcp ") => {
            format!("cannot reach the daemon at {at} ({source})")
        }
        ClientError::Transport { at, source } => format!(
            "cannot reach the daemon at {at} ({source}); is `domus daemon` running with the same state directory?"
        ),
        e => e.to_string(),
    }
}

/// Prints `v` as pretty JSON (the `--json` of the listings).
fn print_json<T: serde::Serialize>(v: &T) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

pub fn daemon(a: DaemonArgs) -> ExitCode {
    let state = domus_daemon::state_dir(a.state.state_dir);
    let tcp = a.listen_tcp.map(|addr| domus_daemon::TcpApi {
        addr,
        token_file: a.token_file.unwrap_or_else(|| state.join("token")),
        cert: a.tls_cert.unwrap_or_else(|| state.join("tls/cert.pem")),
        key: a.tls_key.unwrap_or_else(|| state.join("tls/key.pem")),
    });
    let mut image_dirs = if a.image_dir.is_empty() {
        vec![state.join("images"), domus_kit::default_dir()]
    } else {
        a.image_dir
    };
    // The disks the daemon makes for image domains (overlays, seeds).
    image_dirs.push(domus_daemon::overlay_dir(&state));
    let network = if a.no_network {
        None
    } else {
        match domus_daemon::NetSettings::parse(&a.network_bridge, &a.network) {
            Ok(n) => Some(n),
            Err(e) => return fail(format!("--network: {e}")),
        }
    };
    let settings = domus_daemon::Settings {
        network,
        policy: domus_daemon::Policy {
            reserve_mib: a.host_reserve,
            files: domus_daemon::paths::Files::new(image_dirs, a.block_device),
            seccomp: !a.no_seccomp,
            jail: (!a.no_jail).then_some(a.jail_ids),
            start_timeout_s: a.start_timeout,
        },
        tcp,
        no_cgroups: a.no_cgroups,
        no_vfr: a.no_vfr,
    };
    match domus_daemon::run(state, settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

pub fn create(a: CreateArgs) -> ExitCode {
    verb(|| {
        let text = std::fs::read_to_string(&a.config)
            .map_err(|e| format!("{}: {e}", a.config.display()))?;
        let dir = std::fs::canonicalize(&a.config)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        let file = a.config.display().to_string();
        let mut overrides = a.overrides;
        // An image domain without ssh_keys gets the user's own public keys.
        if let Ok(l) = domus_xlcfg::load(&file, &text, &overrides) {
            if l.config
                .image
                .as_ref()
                .is_some_and(|u| u.ssh_keys.is_empty())
            {
                let keys = user_ssh_keys();
                if keys.is_empty() {
                    eprintln!(
                        "domus: warning: no public key in ~/.ssh/*.pub: the domain's default user \
                         gets none (give ssh_keys = [...] or make one with ssh-keygen)"
                    );
                } else {
                    let list: Vec<String> = keys.iter().map(|k| format!("\"{k}\"")).collect();
                    overrides.push(format!("ssh_keys=[{}]", list.join(",")));
                }
            }
        }
        if a.dry_run {
            // xl's -n: the configuration as it would be started, nothing started.
            let mut l = domus_xlcfg::load(&file, &text, &overrides).map_err(|e| e.to_string())?;
            l.config.make_absolute(&dir);
            for w in &l.warnings {
                eprintln!("domus: warning: {w}");
            }
            print_json(&l.config);
            return Ok(ExitCode::SUCCESS);
        }
        let created = a
            .state
            .client()?
            .create(&CreateRequest {
                config: text,
                file: Some(file),
                dir: Some(dir.display().to_string()),
                overrides: Some(overrides),
            })
            .map_err(failed)?;
        for w in &created.warnings {
            eprintln!("domus: warning: {w}");
        }
        let d = &created.domain;
        println!("domain {} (id {}) is {}", d.name, d.id, d.state);
        if a.console {
            return Ok(console(ConsoleArgs {
                state: a.state,
                read_only: false,
                domain: d.id.to_string(),
            }));
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// A number the daemon may not know, as a listing prints it.
fn or_null<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "null".into(), |v| v.to_string())
}

pub fn list(a: ListArgs) -> ExitCode {
    verb(|| {
        let doms = a.state.client()?.list().map_err(failed)?;
        if a.json || a.long {
            print_json(&doms);
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<24} {:>4} {:>7} {:>5} {:>11} {:>9}",
            "Name", "ID", "Mem", "VCPUs", "State", "Time(s)"
        );
        for d in doms {
            println!(
                "{:<24} {:>4} {:>7} {:>5} {:>11} {:>9.1}",
                d.name,
                d.id,
                d.memory_mib,
                or_null(d.vcpus),
                d.state.as_str(),
                d.cpu_time_s
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// destroy, pause, unpause.
pub fn simple(name: &str, a: DomArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        match name {
            "destroy" => c.destroy(&a.domain),
            "pause" => c.pause(&a.domain).map(drop),
            _ => c.unpause(&a.domain).map(drop),
        }
        .map_err(failed)?;
        Ok(ExitCode::SUCCESS)
    })
}

pub fn mem_set(a: MemSetArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        c.set_memory(&a.domain, a.size >> 20).map_err(failed)?;
        Ok(ExitCode::SUCCESS)
    })
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
    /// With -w: destroy the domain if it has not stopped when the wait ends
    /// (xl's fallback for a guest that ignores the power button).
    #[arg(short = 'F', long, requires = "wait")]
    pub force: bool,
}

/// How long a guest may take to show it heard the power button before
/// `-w` says that it may not be listening.
const BUTTON_HINT_S: u64 = 10;

/// shutdown and reboot: press the guest's power button through the daemon,
/// and with -w wait for the outcome.
pub fn shutdown(name: &str, a: ShutdownArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        let before = if name == "reboot" {
            c.reboot(&a.domain)
        } else {
            c.shutdown(&a.domain)
        }
        .map_err(failed)?;
        let dom = before.name.clone();
        if !a.wait {
            println!("asked domain {dom} to {name} (ACPI power button)");
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!(
            "domus: waiting for domain {dom} to {name} (at most {} s)",
            a.timeout
        );
        let id = before.id.to_string();
        let pressed = std::time::Instant::now();
        let end = pressed + std::time::Duration::from_secs(a.timeout);
        let mut hinted = false;
        while std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if !hinted && pressed.elapsed().as_secs() >= BUTTON_HINT_S.min(a.timeout / 2) {
                hinted = true;
                eprintln!(
                    "domus: domain {dom} still runs {} s after its power button was pressed; \
                     a guest without systemd-logind (and dbus) or acpid ignores the button{}",
                    pressed.elapsed().as_secs(),
                    if a.force {
                        format!(
                            ": it is destroyed if it has not stopped in {} s (-F)",
                            a.timeout
                        )
                    } else {
                        " (-F destroys it when the wait ends; `domus destroy` stops it now)".into()
                    }
                );
            }
            let now = match c.domain(&id) {
                Ok(d) => d,
                // Gone: destroyed by on_poweroff (or on_reboot) = destroy.
                Err(e) if e.status() == Some(404) && name == "shutdown" => {
                    println!("domain {dom} has shut down");
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) if e.status() == Some(404) => {
                    return Err(format!("domain {dom} went away instead of rebooting"))
                }
                Err(e) => return Err(failed(e)),
            };
            // A new VMM counts once its own API answers (the daemon records
            // it as running as soon as it has started it).
            let restarted =
                now.pid != before.pid && now.state == State::Running && c.devices(&id).is_ok();
            match now.state {
                State::Shutdown | State::Crashed => {
                    println!("domain {dom} is {}", now.state);
                    let ok = name == "shutdown" && now.state == State::Shutdown;
                    return Ok(if ok {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    });
                }
                // Running again although a power-off does not restart it:
                // the guest reset (or crashed) on the way down.
                _ if restarted
                    && name == "shutdown"
                    && before.on_poweroff.as_deref()
                        != Some(domus_api::domain::Action::Restart.as_str()) =>
                {
                    return Err(format!(
                        "domain {dom} reset instead of shutting down and runs again \
                         (pid {}; `domus dmesg` has why)",
                        or_null(now.pid)
                    ));
                }
                _ if restarted => {
                    let done = if name == "reboot" {
                        "rebooted"
                    } else {
                        "shut down"
                    };
                    println!(
                        "domain {dom} has {done} and runs again (pid {})",
                        or_null(now.pid)
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                _ => {}
            }
        }
        if a.force {
            c.destroy(&id).map_err(failed)?;
            println!(
                "domain {dom} did not {name} within {} s: destroyed (-F)",
                a.timeout
            );
            return Ok(ExitCode::SUCCESS);
        }
        Err(format!(
            "domain {dom} did not {name} within {} s (does its guest handle the ACPI power button? \
             -F destroys it when the wait ends; `domus destroy` stops it at once)",
            a.timeout
        ))
    })
}

#[derive(clap::Args)]
pub struct MemMaxArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id.
    pub domain: String,
    /// The most memory the domain may have: 512M, 1G, or plain MiB.
    #[arg(value_parser = domus_api::spec::parse_size)]
    pub size: u64,
}

pub fn mem_max(a: MemMaxArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        let m = c.set_maxmem(&a.domain, a.size >> 20).map_err(failed)?;
        if m.at_next_start {
            println!(
                "domain {}: maximum {} MiB; its guest has {} MiB of RAM until its next start",
                m.name,
                m.maxmem_mib,
                or_null(m.ram_mib)
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn info(a: InfoArgs) -> ExitCode {
    verb(|| {
        let info = a.state.client()?.info().map_err(failed)?;
        if a.json {
            print_json(&info);
            return Ok(ExitCode::SUCCESS);
        }
        // Field by field, by name, as the JSON has them.
        let v = serde_json::to_value(&info).map_err(|e| e.to_string())?;
        for (k, v) in v.as_object().into_iter().flatten() {
            println!(
                "{k:<20}: {}",
                v.as_str().map_or_else(|| v.to_string(), str::to_string)
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn dmesg(a: StateArg) -> ExitCode {
    verb(|| {
        for l in a.client()?.dmesg().map_err(failed)? {
            println!("[{:.3}] {}", l.at, l.msg);
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(clap::Args)]
pub struct RenameArgs {
    #[command(flatten)]
    pub state: StateArg,
    pub domain: String,
    pub new_name: String,
}

pub fn rename(a: RenameArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        c.rename(&a.domain, &a.new_name).map_err(failed)?;
        Ok(ExitCode::SUCCESS)
    })
}
