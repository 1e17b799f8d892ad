//! The default network: a bridge (`domus0`) with a private IPv4 subnet, the
//! host as its gateway, NAT to whatever the host routes through
//! (nftables masquerade), and DHCP and DNS for the domains from dnsmasq
//! (Debian's dnsmasq-base), which the daemon starts and restarts if it
//! ends. A vif without `bridge=` goes on it.
//!
//! Names resolve under `.domus`: each domain by the name its DHCP request
//! gave (its domain name, set by cloud-init), and the host as `host.domus`.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rtnl;
use crate::vfr::nft;

/// `domus daemon --network`: what the default network is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetSettings {
    pub bridge: String,
    /// The gateway's (the host's) address; the subnet is its /prefix.
    pub gateway: Ipv4Addr,
    pub prefix: u8,
}

impl NetSettings {
    /// `10.200.0.1/24` style: the host's address on the bridge.
    pub fn parse(bridge: &str, cidr: &str) -> Result<Self, String> {
        let (a, p) = cidr
            .split_once('/')
            .ok_or_else(|| format!("'{cidr}' is not ADDRESS/PREFIX (like 10.200.0.1/24)"))?;
        let gateway: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("'{a}' is not an IPv4 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| (8..=29).contains(p))
            .ok_or_else(|| format!("prefix '/{p}' is not 8 to 29"))?;
        let s = NetSettings {
            bridge: bridge.to_string(),
            gateway,
            prefix,
        };
        if s.gateway == s.network() || s.gateway == s.broadcast() {
            return Err(format!("{a} is the subnet's own address, not a host's"));
        }
        // It goes into nft's and dnsmasq's arguments: a plain name only.
        let plain = bridge
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if bridge.is_empty() || bridge.len() > 15 || !plain {
            return Err(format!("'{bridge}' is not a network interface name"));
        }
        Ok(s)
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - self.prefix)
    }

    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.gateway) & self.mask())
    }

    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.gateway) | !self.mask())
    }

    /// Whether `a` is a domain's address on this subnet (not the network,
    /// the broadcast or the gateway's).
    pub fn holds(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & self.mask() == u32::from(self.network())
            && a != self.network()
            && a != self.broadcast()
            && a != self.gateway
    }

    /// The DHCP pool: the subnet but for the gateway and its ends.
    fn pool(&self) -> (Ipv4Addr, Ipv4Addr) {
        let first = u32::from(self.network()) + 1;
        let last = u32::from(self.broadcast()) - 1;
        let start = if u32::from(self.gateway) == first {
            first + 1
        } else {
            first
        };
        let end = if u32::from(self.gateway) == last {
            last - 1
        } else {
            last
        };
        (Ipv4Addr::from(start), Ipv4Addr::from(end))
    }

    /// The nftables table that NATs the subnet (one per bridge).
    fn nat_table(&self) -> String {
        format!("domus_nat_{}", self.bridge.replace(['-', '.'], "_"))
    }
}

/// One DHCP lease, as dnsmasq's lease file has it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Lease {
    pub mac: String,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    /// Seconds since the epoch.
    pub expires: u64,
}

/// The running default network (a clone shares its dnsmasq).
#[derive(Clone)]
pub struct DefaultNet {
    pub settings: NetSettings,
    leases: PathBuf,
    /// The running dnsmasq's pid (written by the daemon: dnsmasq in the
    /// foreground writes none), for the next daemon to stop a stale one.
    pid_file: PathBuf,
    /// The running dnsmasq's pid (0: none).
    pid: Arc<AtomicU32>,
    /// The addresses `ip=` reserves, each for its MAC, which dnsmasq is
    /// given as `--dhcp-host` (it reads a hosts file only after it has
    /// dropped its privileges, and the state directory is the daemon's
    /// alone): a change restarts it.
    reserved: Arc<Mutex<Vec<(String, Ipv4Addr)>>>,
    /// Set before a restart for new reservations (no back-off).
    restarting: Arc<AtomicBool>,
}

impl DefaultNet {
    /// Makes (or takes over) the bridge, its address, the NAT and
    /// forwarding rules, and starts dnsmasq; `log` tells the daemon's log
    /// what dnsmasq did.
    pub fn start(
        state: &Path,
        s: &NetSettings,
        log: Arc<dyn Fn(String) + Send + Sync>,
    ) -> std::io::Result<Self> {
        let br = &s.bridge;
        if !Path::new("/sys/class/net").join(br).exists() {
            rtnl::add_bridge(br)?;
        }
        rtnl::replace_addr(br, s.gateway, s.prefix)?;
        rtnl::set_link(br, true, None)?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
        let t = s.nat_table();
        let subnet = format!("{}/{}", s.network(), s.prefix);
        // Replaced whole, atomically: a restarted daemon leaves no stale rule.
        nft(&format!(
            "table ip {t}\ndelete table ip {t}\ntable ip {t} {{\n\
             \tchain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n\
             \t\tip saddr {subnet} oifname != \"{br}\" masquerade\n\t}}\n\
             \tchain forward {{ type filter hook forward priority filter; policy accept;\n\
             \t\tiifname \"{br}\" accept\n\
             \t\toifname \"{br}\" ct state established,related accept\n\t}}\n}}\n"
        ))?;
        let dir = state.join("network");
        std::fs::create_dir_all(&dir)?;
        let net = DefaultNet {
            settings: s.clone(),
            leases: dir.join(format!("{br}.leases")),
            pid_file: dir.join(format!("{br}.pid")),
            pid: Arc::new(AtomicU32::new(0)),
            reserved: Arc::new(Mutex::new(Vec::new())),
            restarting: Arc::new(AtomicBool::new(false)),
        };
        // A dnsmasq left by a daemon that was killed holds the bridge's
        // ports: it goes first.
        net.stop_stale();
        let first = spawn_recorded(&mut net.command(&[]), &net.pid_file)?;
        net.pid.store(first.id(), Ordering::SeqCst);
        net.watch(first, log);
        Ok(net)
    }

    /// The default network as the daemon's tests see it: its settings,
    /// and no bridge, rules or dnsmasq made.
    #[cfg(test)]
    pub fn stand_in(settings: NetSettings) -> Self {
        let dir = std::env::temp_dir().join(format!("domus-defnet-{}", std::process::id()));
        DefaultNet {
            settings,
            leases: dir.join("leases"),
            pid_file: dir.join("pid"),
            pid: Arc::new(AtomicU32::new(0)),
            reserved: Arc::new(Mutex::new(Vec::new())),
            restarting: Arc::new(AtomicBool::new(false)),
        }
    }

    /// dnsmasq for this network, with these reservations.
    fn command(&self, reserved: &[(String, Ipv4Addr)]) -> Command {
        let s = &self.settings;
        let (start, end) = s.pool();
        let mut c = Command::new("dnsmasq");
        c.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--bind-interfaces",
        ])
        .arg(format!("--interface={}", s.bridge))
        .arg("--except-interface=lo")
        .arg(format!("--listen-address={}", s.gateway))
        .arg(format!(
            "--dhcp-range={start},{end},{},1h",
            Ipv4Addr::from(s.mask())
        ))
        .arg(format!("--dhcp-leasefile={}", self.leases.display()))
        .args(reserved.iter().map(|(m, a)| format!("--dhcp-host={m},{a}")))
        .args([
            "--dhcp-authoritative",
            "--domain=domus",
            "--local=/domus/",
            "--expand-hosts",
        ])
        .arg(format!("--host-record=host.domus,{}", s.gateway))
        .args(["--pid-file", "--log-facility=-", "--log-dhcp"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        c
    }

    /// A thread that passes on what dnsmasq says and starts it again when
    /// it ends: at once for new reservations, else after 5 s.
    fn watch(&self, first: Child, log: Arc<dyn Fn(String) + Send + Sync>) {
        let this = self.clone();
        let _ = std::thread::Builder::new()
            .name("dnsmasq".into())
            .spawn(move || {
                let mut child = first;
                loop {
                    if let Some(err) = child.stderr.take() {
                        use std::io::BufRead;
                        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                            log(format!("dnsmasq: {line}"));
                        }
                    }
                    let status = child.wait();
                    this.pid.store(0, Ordering::SeqCst);
                    if this.restarting.swap(false, Ordering::SeqCst) {
                        log("dnsmasq: starting it again with the new reserved addresses".into());
                    } else {
                        log(format!(
                            "dnsmasq ended ({status:?}): starting it again in 5 s"
                        ));
                        std::thread::sleep(Duration::from_secs(5));
                    }
                    let reserved = this
                        .reserved
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    match spawn_recorded(&mut this.command(&reserved), &this.pid_file) {
                        Ok(c) => {
                            this.pid.store(c.id(), Ordering::SeqCst);
                            child = c;
                        }
                        Err(e) => {
                            log(format!("dnsmasq could not start again: {e}"));
                            return;
                        }
                    }
                }
            });
    }

    /// Reserves each address for its MAC (and no other), restarting
    /// dnsmasq when that changed.
    pub fn reserve(&self, entries: &[(String, Ipv4Addr)]) -> std::io::Result<()> {
        let mut r = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        if r.as_slice() == entries {
            return Ok(());
        }
        *r = entries.to_vec();
        let pid = self.pid.load(Ordering::SeqCst);
        if pid != 0 {
            self.restarting.store(true, Ordering::SeqCst);
            // SAFETY: kill(2) on the dnsmasq this daemon started (the
            // watcher clears the pid once it has ended).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        Ok(())
    }

    /// Kills the dnsmasq the pid file names, if that process is a dnsmasq.
    fn stop_stale(&self) {
        let Some(pid) = std::fs::read_to_string(&self.pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .filter(|p| *p > 1)
        else {
            return;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "dnsmasq" {
            // SAFETY: kill(2) on a dnsmasq this daemon's state directory
            // started (its pid file says so); no memory is involved.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            for _ in 0..50 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// The leases dnsmasq has given.
    pub fn leases(&self) -> Vec<Lease> {
        parse_leases(&std::fs::read_to_string(&self.leases).unwrap_or_default())
    }
}

/// Starts dnsmasq and records its pid in `pid_file`.
fn spawn_recorded(cmd: &mut Command, pid_file: &Path) -> std::io::Result<Child> {
    let child = cmd
        .spawn()
        .map_err(|e| std::io::Error::other(format!("dnsmasq (Debian's dnsmasq-base): {e}")))?;
    std::fs::write(pid_file, child.id().to_string())?;
    Ok(child)
}

/// dnsmasq's lease file: `EXPIRY MAC IP HOSTNAME CLIENT-ID` per line
/// (`*` for no hostname); lines that do not parse are left out.
pub fn parse_leases(text: &str) -> Vec<Lease> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 {
                return None;
            }
            Some(Lease {
                expires: f[0].parse().ok()?,
                mac: f[1].to_ascii_lowercase(),
                ip: f[2].parse().ok()?,
                hostname: (f[3] != "*").then(|| f[3].to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_is_read_checked_and_pooled_around_its_gateway() {
        let s = NetSettings::parse("domus0", "10.200.0.1/24").unwrap();
        assert_eq!(s.network(), Ipv4Addr::new(10, 200, 0, 0));
        assert_eq!(s.broadcast(), Ipv4Addr::new(10, 200, 0, 255));
        assert_eq!(
            s.pool(),
            (Ipv4Addr::new(10, 200, 0, 2), Ipv4Addr::new(10, 200, 0, 254))
        );
        assert!(s.holds(Ipv4Addr::new(10, 200, 0, 9)));
        assert!(!s.holds(Ipv4Addr::new(10, 200, 0, 1)));
        assert!(!s.holds(Ipv4Addr::new(10, 200, 1, 9)));
        let t = NetSettings::parse("br-x", "192.168.7.254/24").unwrap();
        assert_eq!(t.pool().1, Ipv4Addr::new(192, 168, 7, 253));
        assert_eq!(t.nat_table(), "domus_nat_br_x");
        for bad in [
            "10.0.0.1",
            "10.0.0.0/24",
            "10.0.0.255/24",
            "10.0.0.1/31",
            "x/24",
            "10.0.0.1/8x",
        ] {
            assert!(NetSettings::parse("domus0", bad).is_err(), "{bad}");
        }
        for bad in ["a/b", "a\"b", "a b", "", "sixteen-letters!"] {
            assert!(NetSettings::parse(bad, "10.0.0.1/24").is_err(), "{bad}");
        }
    }

    #[test]
    fn leases_are_read_as_dnsmasq_writes_them() {
        let l = parse_leases(
            "1764072000 52:54:00:AA:bb:01 10.200.0.57 web 01:52:54:00:aa:bb:01\n\
             1764072001 52:54:00:aa:bb:02 10.200.0.58 * *\n\
             garbage\n",
        );
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].mac, "52:54:00:aa:bb:01");
        assert_eq!(l[0].hostname.as_deref(), Some("web"));
        assert_eq!(l[1].hostname, None);
    }
}
