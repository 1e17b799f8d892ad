//! Disk and interface verbs: block-list, network-list, block-attach,
//! network-attach, block-detach and network-detach.

use std::path::PathBuf;
use std::process::ExitCode;

use domus_api::client::Attach;
use domus_api::daemon::NameOrNumber;
use domus_api::vmm::DeviceInfo;

use super::{failed, print_json, verb, StateArg};

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

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// block-list and network-list: a running domain's disks or interfaces with
/// their counters.
pub fn device_list(kind: &str, a: DeviceListArgs) -> ExitCode {
    verb(|| {
        let all = a.state.client()?.devices(&a.domain).map_err(failed)?;
        let devs: Vec<DeviceInfo> = all.into_iter().filter(|d| d.kind == kind).collect();
        if a.json {
            print_json(&devs);
            return Ok(ExitCode::SUCCESS);
        }
        if kind == "block" {
            println!(
                "{:<6} {:<4} {:>9} {:>9} {:>9} {:>9} {:>6}  Path",
                "Vdev", "Mode", "ReadOps", "Read(MiB)", "WriteOps", "Write(MiB)", "Errors"
            );
            for d in devs {
                println!(
                    "{:<6} {:<4} {:>9} {:>9.1} {:>9} {:>9.1} {:>6}  {}",
                    d.id,
                    if d.flag("read_only") { "ro" } else { "rw" },
                    d.counter("read_ops"),
                    mib(d.counter("read_bytes")),
                    d.counter("write_ops"),
                    mib(d.counter("write_bytes")),
                    d.counter("errors"),
                    d.fact("path")
                );
            }
        } else {
            // VfrPass and VfrDrop: what the virtual firewall-router passed
            // and dropped of what the domain sent ("-": a daemon without it).
            println!(
                "{:<5} {:<16} {:<17} {:<15} {:>9} {:>8} {:>9} {:>8} {:>7} {:>8} {:>8}",
                "Idx",
                "Tap",
                "MAC",
                "IP",
                "RxPkts",
                "Rx(MiB)",
                "TxPkts",
                "Tx(MiB)",
                "Dropped",
                "VfrPass",
                "VfrDrop"
            );
            let vfr = |d: &DeviceInfo, k: &str| {
                d.counters
                    .get(k)
                    .map_or_else(|| "-".to_string(), u64::to_string)
            };
            for d in devs {
                println!(
                    "{:<5} {:<16} {:<17} {:<15} {:>9} {:>8.1} {:>9} {:>8.1} {:>7} {:>8} {:>8}",
                    d.id.trim_start_matches("net"),
                    d.fact("tap"),
                    d.fact("mac"),
                    if d.fact("ip").is_empty() {
                        "-"
                    } else {
                        d.fact("ip")
                    },
                    d.counter("rx_packets"),
                    mib(d.counter("rx_bytes")),
                    d.counter("tx_packets"),
                    mib(d.counter("tx_bytes")),
                    d.counter("rx_dropped") + d.counter("tx_dropped"),
                    vfr(&d, "vfr_passed"),
                    vfr(&d, "vfr_dropped")
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
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
pub fn attach(name: &str, a: AttachArgs) -> ExitCode {
    verb(|| {
        let kind = if name == "block-attach" {
            Attach::Block
        } else {
            Attach::Network
        };
        if kind == Attach::Block && a.spec.is_empty() {
            return Err("block-attach needs a disk spec, like /srv/d.img,raw,xvdb,rw".into());
        }
        let spec = a.spec.join(",");
        let c = a.state.client()?;
        let d = c.attach(&a.domain, kind, Some(&spec)).map_err(failed)?;
        println!("attached {} to domain {}", d.id, a.domain);
        Ok(ExitCode::SUCCESS)
    })
}

/// block-detach and network-detach: ask, then wait for the guest to let go.
pub fn detach(name: &str, a: DetachArgs) -> ExitCode {
    verb(|| {
        let kind = if name == "block-detach" {
            Attach::Block
        } else {
            Attach::Network
        };
        let c = a.state.client()?;
        let asked = c
            .detach(&a.domain, kind, NameOrNumber::Name(a.device.clone()))
            .map_err(failed)?;
        let id = asked.unplugging;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(a.timeout);
        while std::time::Instant::now() < end {
            let now = c.devices(&a.domain).map_err(failed)?;
            if now.iter().all(|d| d.id != id) {
                println!("detached {id} from domain {}", a.domain);
                return Ok(ExitCode::SUCCESS);
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Err(format!(
            "domain {}: the guest did not let go of {id} within {} s (the request stands; its ACPI hot-plug driver decides)",
            a.domain, a.timeout
        ))
    })
}

#[derive(clap::Args)]
pub struct SshArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The user to log in as (cloud-init's default user on Debian's images).
    #[arg(short = 'l', long, default_value = "debian")]
    pub user: String,
    /// An ssh option (`-o UserKnownHostsFile=/tmp/kh`), repeatable.
    #[arg(short = 'o', value_name = "OPTION")]
    pub options: Vec<String>,
    /// An identity file (ssh's -i).
    #[arg(short = 'i', value_name = "FILE")]
    pub identity: Option<PathBuf>,
    pub domain: String,
    /// A command to run instead of a shell (after `--`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `domus ssh DOM [-- ARGS]`: ssh to the domain's address on the default
/// network (its first interface with a DHCP lease).
pub fn ssh(a: SshArgs) -> ExitCode {
    verb(|| {
        let devs = a.state.client()?.devices(&a.domain).map_err(failed)?;
        let ip = devs
            .iter()
            .filter(|d| d.kind == "net")
            .map(|d| d.fact("ip"))
            .find(|ip| !ip.is_empty())
            .ok_or_else(|| {
                format!(
                    "domain {} has no address on the default network yet (no DHCP lease: \
                     is it still booting? `domus network-list {}` shows its interfaces)",
                    a.domain, a.domain
                )
            })?
            .to_string();
        use std::os::unix::process::CommandExt;
        let mut c = std::process::Command::new("ssh");
        c.args(["-o", "StrictHostKeyChecking=accept-new"]);
        for o in &a.options {
            c.args(["-o", o]);
        }
        if let Some(i) = &a.identity {
            c.arg("-i").arg(i);
        }
        let e = c.arg(format!("{}@{ip}", a.user)).args(&a.command).exec();
        Err(format!("ssh: {e}"))
    })
}
