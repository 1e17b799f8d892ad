//! A domain's interfaces on the host: the MACs and addresses the daemon
//! gives and checks, each tap made with its virtual firewall-router rules
//! ([`crate::vfr`]) and removed with them, the rules reconciled with the
//! domains that run after a daemon restart, and the DHCP leases of the
//! default network learnt as dnsmasq gives them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use domus_api::domain::{DomainConfig, Vif};

use crate::network::{tap_error, Taps};
use crate::vfr::{Firewall, Policy, V4};
use crate::{db, lock, Daemon, Error, Result};

/// A MAC of QEMU's and KVM's locally administered prefix, 52:54:00.
pub(crate) fn random_mac() -> String {
    let mut b = [0u8; 3];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    format!("52:54:00:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2])
}

/// [`Daemon::unplug_tap`] with the host's taps and firewall in hand (for a
/// thread that outlives the call that started it).
pub(crate) fn unplug(taps: &dyn Taps, fw: Option<&dyn Firewall>, tap: &str) {
    let _ = taps.remove(tap);
    if let Some(fw) = fw {
        let _ = fw.remove(tap);
    }
}

impl Daemon {
    /// Whether `v` is on the default network (which gives addresses).
    pub(crate) fn on_default(&self, v: &Vif) -> bool {
        v.bridge.is_none() && self.network.get().is_some()
    }

    /// Makes tap `tap` for `v` (whose MAC is set) with its VFR rules; a
    /// failure leaves neither.
    pub(crate) fn plug_tap(&self, tap: &str, v: &Vif, owner: Option<(u32, u32)>) -> Result<()> {
        self.host
            .taps
            .add(tap, self.bridge_of(v), owner)
            .map_err(tap_error)?;
        let Some(fw) = &self.host.firewall else {
            return Ok(());
        };
        let applied = Policy::of(tap, v, self.on_default(v))
            .map_err(Error::Invalid)
            .and_then(|p| {
                fw.apply(&p).map_err(|e| {
                    Error::Io(std::io::Error::other(format!(
                        "the virtual firewall-router's rules for {tap}: {e}"
                    )))
                })
            });
        if let Err(e) = applied {
            let _ = self.host.taps.remove(tap);
            return Err(e);
        }
        Ok(())
    }

    /// Removes tap `tap` and then its rules (so it is never up unfiltered).
    /// A detach's thread waiting to remove it no longer will: the name may
    /// be given to a new tap after this.
    pub(crate) fn unplug_tap(&self, tap: &str) {
        let mut pending = lock(&self.unplugging);
        pending.remove(tap);
        unplug(&*self.host.taps, self.host.firewall.as_deref(), tap);
    }

    /// Gives `c`'s interfaces a MAC where they have none (the VFR lets
    /// through only the interface's own), and refuses addresses that are
    /// not on the default network or that another domain (of `rows`) or
    /// another of its interfaces has on the same bridge.
    pub(crate) fn check_vifs(&self, rows: &[db::Row], c: &mut DomainConfig) -> Result<()> {
        for v in c.vifs.iter_mut().filter(|v| v.mac.is_none()) {
            v.mac = Some(random_mac());
        }
        let mut mine = Vec::new();
        for v in &c.vifs {
            self.check_vif(rows, &c.name, v)?;
            for a in v.addresses().map_err(Error::Invalid)? {
                if mine.contains(&(self.bridge_of(v), a)) {
                    return Err(Error::Invalid(format!(
                        "address {a} is given to two of domain {}'s interfaces",
                        c.name
                    )));
                }
                mine.push((self.bridge_of(v), a));
            }
        }
        Ok(())
    }

    /// [`Daemon::check_vifs`] of one interface of domain `name`.
    pub(crate) fn check_vif(&self, rows: &[db::Row], name: &str, v: &Vif) -> Result<()> {
        let addrs = v.addresses().map_err(Error::Invalid)?;
        if let (Some(net), true) = (self.network.get(), self.on_default(v)) {
            let s = &net.settings;
            for a in &addrs {
                if let IpAddr::V4(a4) = a {
                    if !s.holds(*a4) {
                        return Err(Error::Invalid(format!(
                            "ip {a} is not a domain's address on the default network {}/{} \
                             (bridge {}, the host is {}): pick one in it, or leave ip= out \
                             and DHCP gives one",
                            s.network(),
                            s.prefix,
                            s.bridge,
                            s.gateway
                        )));
                    }
                }
            }
        }
        for r in rows.iter().filter(|r| r.name != name) {
            for w in r
                .config
                .vifs
                .iter()
                .filter(|w| self.bridge_of(w) == self.bridge_of(v))
            {
                let theirs = w.addresses().unwrap_or_default();
                if let Some(a) = addrs.iter().find(|a| theirs.contains(a)) {
                    return Err(Error::Invalid(format!(
                        "address {a} is domain {}'s (on the same bridge, {})",
                        r.name,
                        self.bridge_of(v).unwrap_or("none")
                    )));
                }
            }
        }
        Ok(())
    }

    /// Puts the VFR's table in line with the domains that run: their
    /// interfaces (as their VMMs show them, hot-plugged ones included)
    /// get their rules, any other's go.
    pub(crate) fn reconcile_vfr(&self) -> Result<()> {
        let Some(fw) = &self.host.firewall else {
            return Ok(());
        };
        let running: Vec<i64> = lock(&self.live).keys().copied().collect();
        let rows = lock(&self.db).all()?;
        let mut ps = Vec::new();
        for r in rows.iter().filter(|r| running.contains(&r.id)) {
            let taps = self.taps(r.id);
            let shown: Vec<(String, String)> = self
                .vmm(r)
                .and_then(|api| api.devices().map_err(crate::vmm_error(r)))
                .map(|ds| {
                    ds.into_iter()
                        .filter(|d| d.kind == "net")
                        .map(|d| (d.fact("tap").to_string(), d.fact("mac").to_string()))
                        .collect()
                })
                // A VMM that does not answer: its configuration's order.
                .unwrap_or_else(|_| {
                    r.config
                        .vifs
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (self.tap_name(r.id, i), v.mac.clone().unwrap_or_default()))
                        .collect()
                });
            for (tap, mac) in shown.into_iter().filter(|(t, _)| taps.contains(t)) {
                let vif = r
                    .config
                    .vifs
                    .iter()
                    .find(|v| v.mac.as_deref() == Some(mac.as_str()))
                    .cloned()
                    .unwrap_or(Vif {
                        mac: Some(mac),
                        ..Vif::default()
                    });
                match Policy::of(&tap, &vif, self.on_default(&vif)) {
                    Ok(p) => ps.push(p),
                    Err(e) => self.log(&format!("domain {}: {e}", r.name)),
                }
            }
        }
        fw.reconcile(&ps).map_err(|e| {
            Error::Io(std::io::Error::other(format!(
                "the virtual firewall-router's table: {e} (it needs Debian's nftables and the \
                 kernel's nf_tables with its bridge family; domus daemon --no-vfr runs without it)"
            )))
        })?;
        self.log(&format!(
            "virtual firewall-router: rules for {} interface(s) of running domains",
            ps.len()
        ));
        Ok(())
    }

    /// A thread that, every second, gives each interface on the default
    /// network the addresses its DHCP lease holds (the VFR lets it send
    /// from them) and tells dnsmasq the addresses reserved by `ip=`.
    pub(crate) fn watch_leases(self: &std::sync::Arc<Self>) {
        let (Some(fw), Some(_)) = (self.host.firewall.clone(), self.network.get()) else {
            return;
        };
        let d = std::sync::Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("leases".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let Some(d) = d.upgrade() else { return };
                let Some(net) = d.network.get() else { return };
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |t| t.as_secs());
                let mut by_mac: HashMap<String, Vec<Ipv4Addr>> = HashMap::new();
                for l in net.leases().into_iter().filter(|l| l.expires > now) {
                    by_mac.entry(l.mac).or_default().push(l.ip);
                }
                let policies = fw.policies();
                for p in policies.iter().filter(|p| p.v4 == V4::Leased) {
                    let ips = by_mac.get(&p.mac).cloned().unwrap_or_default();
                    if let Err(e) = fw.learn(&p.tap, &ips) {
                        d.log(&format!("virtual firewall-router: {}'s lease: {e}", p.tap));
                    }
                }
                let reserved: Vec<(String, Ipv4Addr)> = policies
                    .iter()
                    .filter(|p| p.dhcp)
                    .flat_map(|p| match &p.v4 {
                        V4::Only(a) => a.iter().map(|a| (p.mac.clone(), *a)).collect(),
                        _ => Vec::new(),
                    })
                    .collect();
                if let Err(e) = net.reserve(&reserved) {
                    d.log(&format!("dnsmasq's reserved addresses: {e}"));
                }
            });
    }

    /// Each interface's VFR counts by verdict ([`crate::vfr::KINDS`]).
    pub(crate) fn vfr_counters(&self) -> crate::vfr::Counts {
        self.host
            .firewall
            .as_ref()
            .map(|fw| fw.counters())
            .unwrap_or_default()
    }
}
