//! The virtual firewall-router (the Xen paper's VFR, section 3.3.5): rules
//! on every domain interface, in nftables, in one bridge-family table of the
//! daemon's own (`domus_TAG`, TAG naming its state directory).
//!
//! - Frames a domain sends (`from_domains`, the bridge's prerouting hook,
//!   which sees them whether they go to another domain, to the host or
//!   out) must carry the interface's MAC; ARP must be Ethernet/IPv4 and
//!   claim only the interface's MAC and address (or 0.0.0.0, a probe);
//!   IPv4 must come from the interface's address (its `ip=`, or on the
//!   default network the address its DHCP lease gave it; until then only a
//!   DHCP request from 0.0.0.0); IPv6 only from the `ip=` IPv6 addresses
//!   and link-local ones, and none at all when `ip=` names none; any other
//!   kind of frame (VLAN tags, other protocols) is dropped. As libvirt's
//!   `clean-traffic` filter does.
//! - Frames to a domain (`to_domains`, postrouting) may be limited to new
//!   connections on listed ports (`tcp=`, `udp=`), over conntrack.
//! - An `isolated=1` interface exchanges nothing with other domains
//!   (`between`, the forward hook); the host and the outside are reached.
//!
//! Each interface has its own chains, address set and named counters (one
//! per verdict, [`KINDS`]), hooked in through verdict maps keyed by the tap's
//! name, so that adding or removing one is one atomic `nft -f` transaction
//! that touches no other interface's rules.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use domus_api::domain::{PortRange, Vif};

/// The verdicts each interface counts (packets), in the order shown.
pub const KINDS: [&str; 9] = [
    "passed", "mac", "ip", "arp", "ip6", "dhcp", "other", "port", "isolated",
];

/// Packets by tap and verdict ([`KINDS`]), as [`Firewall::counters`]
/// reads them.
pub type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// One interface's packets passed, and dropped for any reason.
pub fn passed_dropped(c: &BTreeMap<String, u64>) -> (u64, u64) {
    c.iter().fold((0, 0), |(p, d), (k, n)| {
        if k == "passed" {
            (p + n, d)
        } else {
            (p, d + n)
        }
    })
}

/// Which IPv4 source addresses an interface may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum V4 {
    /// Any (an interface on the user's own bridge with no `ip=`).
    Any,
    /// These (its `ip=`).
    Only(Vec<Ipv4Addr>),
    /// The address its DHCP lease on the default network gives it, learnt
    /// when dnsmasq gives it ([`Firewall::learn`]); none before.
    Leased,
}

/// What one interface may send and receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub tap: String,
    /// Lower case, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    pub v4: V4,
    /// The IPv6 addresses it may use besides link-local ones; none: no
    /// IPv6 at all.
    pub v6: Vec<Ipv6Addr>,
    pub tcp: Option<Vec<PortRange>>,
    pub udp: Option<Vec<PortRange>>,
    pub isolated: bool,
    /// On the default network, whose DHCP server gives it its address (or
    /// holds its `ip=` for it).
    pub dhcp: bool,
}

impl Policy {
    /// The policy of `vif` (whose MAC is known) on `tap`; `dhcp`: the
    /// interface is on the default network, where DHCP gives addresses.
    pub fn of(tap: &str, vif: &Vif, dhcp: bool) -> Result<Policy, String> {
        let mac = vif
            .mac
            .as_deref()
            .ok_or_else(|| format!("interface on {tap} has no MAC"))?
            .to_ascii_lowercase();
        let ok = mac.split(':').count() == 6
            && mac
                .split(':')
                .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
        if !ok || !plain(tap) {
            return Err(format!("interface {tap} ({mac}): not a MAC or a tap name"));
        }
        let addrs = vif.addresses()?;
        let v4: Vec<Ipv4Addr> = addrs
            .iter()
            .filter_map(|a| match a {
                IpAddr::V4(a) => Some(*a),
                IpAddr::V6(_) => None,
            })
            .collect();
        let v6 = addrs
            .iter()
            .filter_map(|a| match a {
                IpAddr::V6(a) => Some(*a),
                IpAddr::V4(_) => None,
            })
            .collect();
        Ok(Policy {
            tap: tap.to_string(),
            mac,
            v4: if !v4.is_empty() {
                V4::Only(v4)
            } else if dhcp {
                V4::Leased
            } else {
                V4::Any
            },
            v6,
            tcp: vif.tcp.clone(),
            udp: vif.udp.clone(),
            isolated: vif.isolated,
            dhcp,
        })
    }
}

/// A name that goes into nft's scripts unquoted: letters, digits, `_`.
fn plain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && s.as_bytes()[0].is_ascii_alphabetic()
}

/// The host's side of the VFR, so the daemon's tests can stand in for it
/// ([`Nft`] is the real one).
pub trait Firewall: Send + Sync {
    /// Puts (or replaces) the rules of `p`'s interface; its counters keep
    /// their counts.
    fn apply(&self, p: &Policy) -> std::io::Result<()>;
    /// Removes the rules of interface `tap` (none there is no error).
    fn remove(&self, tap: &str) -> std::io::Result<()>;
    /// Makes the table hold exactly the rules of `ps`, removing any other
    /// interface's (after a daemon restart).
    fn reconcile(&self, ps: &[Policy]) -> std::io::Result<()>;
    /// A [`V4::Leased`] interface's addresses now (its DHCP lease).
    fn learn(&self, tap: &str, v4: &[Ipv4Addr]) -> std::io::Result<()>;
    /// Each interface's packets by verdict ([`KINDS`]).
    fn counters(&self) -> Counts;
    /// The interfaces that have rules now, as applied.
    fn policies(&self) -> Vec<Policy>;
}

/// The VFR in nftables, through Debian's `nft`.
pub struct Nft {
    table: String,
    applied: Mutex<HashMap<String, Policy>>,
    learnt: Mutex<HashMap<String, Vec<Ipv4Addr>>>,
}

impl Nft {
    /// The VFR of the daemon whose instance tag is `tag`.
    pub fn new(tag: &str) -> Self {
        Nft {
            table: table_name(tag),
            applied: Mutex::new(HashMap::new()),
            learnt: Mutex::new(HashMap::new()),
        }
    }

    /// The interfaces whose chains the table holds now.
    fn present(&self) -> std::io::Result<Vec<String>> {
        let out = nft_json(&["list", "table", "bridge", &self.table]);
        let v = match out {
            Ok(v) => v,
            // No table yet.
            Err(e) if e.to_string().contains("No such file") => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(items(&v, "chain")
            .filter_map(|c| c.get("name")?.as_str()?.strip_suffix("_out"))
            // Not TAP_fwd_out: taps' names have no '_'.
            .filter(|t| !t.contains('_'))
            .map(str::to_string)
            .collect())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Firewall for Nft {
    fn apply(&self, p: &Policy) -> std::io::Result<()> {
        nft(&(base_script(&self.table) + &apply_script(&self.table, p))).map_err(|e| {
            if e.to_string().contains("ct state") {
                std::io::Error::other(format!(
                    "{e}\n(tcp= and udp= follow bridged connections through the kernel's \
                     nf_conntrack_bridge module: modprobe nf_conntrack_bridge)"
                ))
            } else {
                e
            }
        })?;
        lock(&self.learnt).remove(&p.tap);
        lock(&self.applied).insert(p.tap.clone(), p.clone());
        Ok(())
    }

    fn remove(&self, tap: &str) -> std::io::Result<()> {
        if !plain(tap) {
            return Ok(());
        }
        nft(&(base_script(&self.table) + &remove_script(&self.table, tap)))?;
        lock(&self.applied).remove(tap);
        lock(&self.learnt).remove(tap);
        Ok(())
    }

    fn reconcile(&self, ps: &[Policy]) -> std::io::Result<()> {
        let mut script = base_script(&self.table);
        for stale in self
            .present()?
            .iter()
            .filter(|t| plain(t) && !ps.iter().any(|p| &&p.tap == t))
        {
            script += &remove_script(&self.table, stale);
        }
        for p in ps {
            script += &apply_script(&self.table, p);
        }
        if nft(&script).is_err() {
            // A table this daemon cannot read as its own: made again.
            let t = &self.table;
            nft(&format!(
                "add table bridge {t}\ndelete table bridge {t}\n{script}"
            ))?;
        }
        *lock(&self.applied) = ps.iter().map(|p| (p.tap.clone(), p.clone())).collect();
        lock(&self.learnt).clear();
        Ok(())
    }

    fn learn(&self, tap: &str, v4: &[Ipv4Addr]) -> std::io::Result<()> {
        let leased = lock(&self.applied)
            .get(tap)
            .is_some_and(|p| p.v4 == V4::Leased);
        if !leased || lock(&self.learnt).get(tap).map(Vec::as_slice) == Some(v4) {
            return Ok(());
        }
        nft(&learn_script(&self.table, tap, v4))?;
        lock(&self.learnt).insert(tap.to_string(), v4.to_vec());
        Ok(())
    }

    fn counters(&self) -> Counts {
        let Ok(v) = nft_json(&["list", "counters", "table", "bridge", &self.table]) else {
            return BTreeMap::new();
        };
        parse_counters(&v)
    }

    fn policies(&self) -> Vec<Policy> {
        let mut ps: Vec<Policy> = lock(&self.applied).values().cloned().collect();
        ps.sort_by(|a, b| a.tap.cmp(&b.tap));
        ps
    }
}

/// The table of the daemon with instance tag `tag`.
pub fn table_name(tag: &str) -> String {
    format!("domus_{tag}")
}

/// The table, its verdict maps and its three hooked chains, made if
/// missing (every line is idempotent) and their dispatch rules put back.
/// A tap of this daemon's (`dm` and its tag, as the table's name has the
/// tag) that the maps do not name has no rules, for a moment (made and
/// not yet given its rules, or being removed) or by a bug: nothing it
/// sends or would be sent passes. (A tap the maps name ends in its own
/// chain's verdict, before these rules.)
fn base_script(t: &str) -> String {
    let mut s = format!("add table bridge {t}\n");
    for map in ["out_of", "into", "fwd_out", "fwd_in"] {
        s += &format!("add map bridge {t} {map} {{ type ifname : verdict; }}\n");
    }
    for (chain, hook) in [
        ("from_domains", "prerouting"),
        ("between", "forward"),
        ("to_domains", "postrouting"),
    ] {
        s += &format!(
            "add chain bridge {t} {chain} {{ type filter hook {hook} priority -300; policy accept; }}\n\
             flush chain bridge {t} {chain}\n"
        );
    }
    s += &format!(
        "add rule bridge {t} from_domains iifname vmap @out_of\n\
         add rule bridge {t} between iifname vmap @fwd_out\n\
         add rule bridge {t} between oifname vmap @fwd_in\n\
         add rule bridge {t} to_domains oifname vmap @into\n"
    );
    if let Some(tag) = t.strip_prefix("domus_") {
        s += &format!(
            "add rule bridge {t} from_domains iifname \"dm{tag}*\" drop\n\
             add rule bridge {t} to_domains oifname \"dm{tag}*\" drop\n"
        );
    }
    s
}

/// `{ a, b }`, or the one element.
fn set_of<T: std::fmt::Display>(xs: &[T]) -> String {
    let v: Vec<String> = xs.iter().map(ToString::to_string).collect();
    format!("{{ {} }}", v.join(", "))
}

/// The rules of one interface, replacing any it had (its counters and
/// maps' elements stay).
fn apply_script(t: &str, p: &Policy) -> String {
    let (tap, mac) = (&p.tap, &p.mac);
    let mut s = String::new();
    for k in KINDS {
        s += &format!("add counter bridge {t} {tap}_{k}\n");
    }
    s += &format!(
        "add set bridge {t} {tap}_v4 {{ type ipv4_addr; }}\nflush set bridge {t} {tap}_v4\n"
    );
    if let V4::Only(a) = &p.v4 {
        s += &format!("add element bridge {t} {tap}_v4 {}\n", set_of(a));
    }
    let count = |k: &str| format!("counter name {tap}_{k}");
    let rule = |chain: &str, r: String| format!("add rule bridge {t} {tap}_{chain} {r}\n");
    for c in ["out", "in", "fwd_out", "fwd_in"] {
        s += &format!("add chain bridge {t} {tap}_{c}\nflush chain bridge {t} {tap}_{c}\n");
    }
    // What the domain sends.
    let drop = |k: &str| format!("{} drop", count(k));
    let pass = format!("{} accept", count("passed"));
    let mut out = vec![format!("ether saddr != {mac} {}", drop("mac"))];
    for (field, want) in [
        ("htype", "1"),
        ("ptype", "ip"),
        ("hlen", "6"),
        ("plen", "4"),
    ] {
        out.push(format!(
            "ether type arp arp {field} != {want} {}",
            drop("arp")
        ));
    }
    out.push(format!(
        "ether type arp arp saddr ether != {mac} {}",
        drop("arp")
    ));
    if p.v4 != V4::Any {
        out.push(format!(
            "ether type arp arp saddr ip != 0.0.0.0 arp saddr ip != @{tap}_v4 {}",
            drop("arp")
        ));
    }
    out.push(format!("ether type arp {pass}"));
    if p.v4 != V4::Any {
        // A DHCP request names its client by MAC in the BOOTP header
        // (chaddr, 28 bytes into the UDP payload): one for another MAC
        // would take that domain's lease, or drain the pool. (A domain
        // that relays DHCP for others needs an interface with no IPv4
        // policy, on a bridge of the user's.)
        let chaddr = mac.replace(':', "");
        out.push(format!(
            "ether type ip udp dport 67 @th,288,48 != 0x{chaddr} {}",
            drop("dhcp")
        ));
        // A DHCP client before it has an address.
        out.push(format!(
            "ether type ip ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 {pass}"
        ));
        out.push(format!(
            "ether type ip ip saddr != @{tap}_v4 {}",
            drop("ip")
        ));
    }
    out.push(format!("ether type ip {pass}"));
    if !p.v6.is_empty() {
        let mut allowed: Vec<String> = p.v6.iter().map(ToString::to_string).collect();
        allowed.extend(["fe80::/10".to_string(), "::".to_string()]);
        out.push(format!(
            "ether type ip6 ip6 saddr != {} {}",
            set_of(&allowed),
            drop("ip6")
        ));
        out.push(format!("ether type ip6 {pass}"));
    } else {
        out.push(format!("ether type ip6 {}", drop("ip6")));
    }
    out.push(drop("other"));
    for r in out {
        s += &rule("out", r);
    }
    // What reaches the domain: new connections only to listed ports.
    if p.tcp.is_some() || p.udp.is_some() {
        let mut inb = vec![
            format!("ct state established,related {pass}"),
            format!("ether type ip udp sport 67 udp dport 68 {pass}"),
        ];
        for (proto, ports) in [("tcp", &p.tcp), ("udp", &p.udp)] {
            if let Some(ports) = ports.as_ref().filter(|p| !p.is_empty()) {
                inb.push(format!(
                    "meta l4proto {proto} {proto} dport {} {pass}",
                    set_of(ports)
                ));
            }
            inb.push(format!("meta l4proto {proto} {}", drop("port")));
        }
        for r in inb {
            s += &rule("in", r);
        }
    }
    s += &rule("in", pass.clone());
    // Domain to domain, for an isolated interface: domains' taps are dm...
    if p.isolated {
        s += &rule("fwd_out", format!("oifname \"dm*\" {}", drop("isolated")));
        s += &rule("fwd_in", format!("iifname \"dm*\" {}", drop("isolated")));
    }
    for (map, c) in [("out_of", "out"), ("into", "in")] {
        s += &format!("add element bridge {t} {map} {{ \"{tap}\" : jump {tap}_{c} }}\n");
    }
    // The forward maps hold only isolated interfaces: put in, then taken
    // out where it is not one (both are idempotent that way).
    for (map, c) in [("fwd_out", "fwd_out"), ("fwd_in", "fwd_in")] {
        s += &format!("add element bridge {t} {map} {{ \"{tap}\" : jump {tap}_{c} }}\n");
        if !p.isolated {
            s += &format!("delete element bridge {t} {map} {{ \"{tap}\" }}\n");
        }
    }
    s
}

/// Removes one interface's rules, whether or not it has any: each object
/// is made first, so the deletes cannot fail on a missing one.
fn remove_script(t: &str, tap: &str) -> String {
    let chains = ["out", "in", "fwd_out", "fwd_in"];
    let mut s = String::new();
    for c in chains {
        s += &format!("add chain bridge {t} {tap}_{c}\nflush chain bridge {t} {tap}_{c}\n");
    }
    for (map, c) in [
        ("out_of", "out"),
        ("into", "in"),
        ("fwd_out", "fwd_out"),
        ("fwd_in", "fwd_in"),
    ] {
        s += &format!(
            "add element bridge {t} {map} {{ \"{tap}\" : jump {tap}_{c} }}\n\
             delete element bridge {t} {map} {{ \"{tap}\" }}\n"
        );
    }
    for c in chains {
        s += &format!("delete chain bridge {t} {tap}_{c}\n");
    }
    for k in KINDS {
        s += &format!("add counter bridge {t} {tap}_{k}\ndelete counter bridge {t} {tap}_{k}\n");
    }
    s += &format!(
        "add set bridge {t} {tap}_v4 {{ type ipv4_addr; }}\ndelete set bridge {t} {tap}_v4\n"
    );
    s
}

/// A leased interface's addresses, replaced.
fn learn_script(t: &str, tap: &str, v4: &[Ipv4Addr]) -> String {
    let mut s = format!("flush set bridge {t} {tap}_v4\n");
    if !v4.is_empty() {
        s += &format!("add element bridge {t} {tap}_v4 {}\n", set_of(v4));
    }
    s
}

/// Runs an nft script as one transaction.
pub(crate) fn nft(script: &str) -> std::io::Result<()> {
    let mut c = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| std::io::Error::other(format!("nft (Debian's nftables): {e}")))?;
    if let Some(mut stdin) = c.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = c.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// `nft -j ARGS`, parsed.
fn nft_json(args: &[&str]) -> std::io::Result<serde_json::Value> {
    let out = Command::new("nft")
        .arg("-j")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| std::io::Error::other(format!("nft (Debian's nftables): {e}")))?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout).map_err(std::io::Error::other)
}

/// The objects of one kind (`chain`, `counter`, ...) in nft's JSON.
fn items<'a>(
    v: &'a serde_json::Value,
    kind: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> {
    v.get("nftables")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(move |i| i.get(kind))
}

/// `nft -j list counters`: TAP_KIND counters by tap and kind.
fn parse_counters(v: &serde_json::Value) -> Counts {
    let mut out = Counts::new();
    for c in items(v, "counter") {
        let (Some(name), Some(packets)) = (
            c.get("name").and_then(serde_json::Value::as_str),
            c.get("packets").and_then(serde_json::Value::as_u64),
        ) else {
            continue;
        };
        if let Some((tap, kind)) = name.rsplit_once('_').filter(|(_, k)| KINDS.contains(k)) {
            out.entry(tap.to_string())
                .or_default()
                .insert(kind.to_string(), packets);
        }
    }
    out
}

#[cfg(test)]
mod tests;
