//! Network: the domains' taps (made through rtnetlink, [`crate::rtnl`])
//! and interface hot-plug (network-attach, network-detach).

use std::time::{Duration, Instant};

use domus_api::daemon::State;
use domus_api::vmm::{DeviceInfo, PlugRequest, Unplugging};

use crate::{lock, vmm_error, Daemon, Error, Result};

/// The host's side of the domains' interfaces, so the daemon's tests can
/// stand in for the host's network ([`HostTaps`] is the real one).
pub trait Taps: Send + Sync {
    /// Makes tap `name`, on `bridge` when one is given, owned by `owner`
    /// (user and group) when one is given, and sets it up; a failure
    /// leaves no tap. A bridge that does not exist is an error of
    /// kind `InvalidInput` (the user's, see [`tap_error`]).
    fn add(
        &self,
        name: &str,
        bridge: Option<&str>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<()>;
    /// Removes tap `name`.
    fn remove(&self, name: &str) -> std::io::Result<()>;
    /// The taps whose names are `prefix` and then digits, sorted.
    fn list(&self, prefix: &str) -> Vec<String>;
}

/// Taps made through rtnetlink and the tun driver, found in
/// /sys/class/net.
pub struct HostTaps;

impl Taps for HostTaps {
    fn add(
        &self,
        name: &str,
        bridge: Option<&str>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<()> {
        if let Some(br) = bridge {
            let sys = std::path::Path::new("/sys/class/net").join(br);
            if br.contains('/') || !sys.join("bridge").is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("there is no bridge '{br}' on this host"),
                ));
            }
        }
        crate::rtnl::add_tap(name, owner)?;
        crate::rtnl::set_link(name, true, bridge).inspect_err(|_| {
            let _ = crate::rtnl::del_link(name);
        })
    }

    fn remove(&self, name: &str) -> std::io::Result<()> {
        crate::rtnl::del_link(name)
    }

    fn list(&self, prefix: &str) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir("/sys/class/net")
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| {
                        n.strip_prefix(prefix)
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
}

/// A failure to make a tap as the API reports it: the user's (400) when it
/// names a bridge that does not exist, the host's (500) otherwise.
pub(crate) fn tap_error(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        Error::Invalid(e.to_string())
    } else {
        Error::Io(e)
    }
}

impl Daemon {
    /// The domain's taps that exist now.
    pub(crate) fn taps(&self, id: i64) -> Vec<String> {
        self.host.taps.list(&format!("dm{}{id}n", self.tag))
    }

    /// network-attach: a new tap (on the vif's bridge) and a hot-plugged
    /// interface on it; the vif (with its MAC, made up if not given) joins
    /// the domain's configuration.
    pub fn network_attach(&self, dom: &str, spec: &str) -> Result<DeviceInfo> {
        let mut warnings = Vec::new();
        let vif = domus_xlcfg::parse_vif(spec, &mut warnings).map_err(Error::Invalid)?;
        self.attach_vif(dom, vif)
    }

    /// [`Daemon::network_attach`] of a parsed vif.
    pub(crate) fn attach_vif(&self, dom: &str, mut vif: domus_xlcfg::Vif) -> Result<DeviceInfo> {
        let r = self.find(dom)?;
        let mac = vif.mac.clone().unwrap_or_else(crate::vifs::random_mac);
        vif.mac = Some(mac.clone());
        if r.state != State::Running {
            return Err(Error::WrongState {
                name: r.name,
                state: r.state,
            });
        }
        let mut own = r.config.clone();
        own.vifs.push(vif.clone());
        self.check_vifs(&lock(&self.db).all()?, &mut own)?;
        // A jailed VMM, no longer root, may open only a tap that is its
        // user's.
        let owner = self.running_jail(&r).map(|j| (j.uid, j.gid));
        // The first index with no tap and none being removed, named and
        // made while a detach's thread cannot remove a tap.
        let tap = {
            let pending = lock(&self.unplugging);
            let taps = self.taps(r.id);
            let tap = (0..)
                .map(|i| self.tap_name(r.id, i))
                .find(|t| !taps.contains(t) && !pending.contains(t))
                .unwrap_or_else(|| self.tap_name(r.id, 0));
            self.plug_tap(&tap, &vif, owner)?;
            tap
        };
        let made = (|| -> Result<DeviceInfo> {
            let mut net = crate::lifecycle::net_spec(tap.clone(), &vif, Some(mac.clone()));
            // A jailed VMM cannot open /dev/net/tun: it is handed one.
            if let Some(jail) = self.running_jail(&r) {
                net.passed = Some(self.pass_tun(&r, &jail)?);
            }
            self.vmm(&r)?
                .plug(&PlugRequest {
                    disk: None,
                    net: Some(net),
                })
                .map_err(vmm_error(&r))
        })();
        let dev = match made {
            Ok(d) => d,
            Err(e) => {
                self.unplug_tap(&tap);
                return Err(e);
            }
        };
        self.update_config(r.id, |c| {
            c.vifs.push(vif);
            Ok(())
        })?;
        self.log_domain(
            &r.name,
            false,
            &format!(
                "attached interface {} ({mac}, tap {tap}) to domain {}",
                dev.id, r.name
            ),
        );
        Ok(dev)
    }

    /// network-detach: by index (0 for net0) or MAC. The guest lets go of
    /// the interface, which leaves with its tap; the vif leaves the
    /// domain's configuration.
    pub fn network_detach(&self, dom: &str, which: &str) -> Result<Unplugging> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let id = if which.contains(':') {
            api.devices()
                .map_err(vmm_error(&r))?
                .into_iter()
                .find(|d| d.kind == "net" && d.fact("mac") == which.to_lowercase())
                .map(|d| d.id)
                .ok_or_else(|| Error::Invalid(format!("no interface with MAC {which}")))?
        } else {
            format!("net{which}")
        };
        let d = Self::device(&r, &api, &id, "net")?;
        let mac = d.fact("mac").to_string();
        let tap = d.fact("tap").to_string();
        let v = api.unplug(&id).map_err(vmm_error(&r))?;
        self.update_config(r.id, |c| {
            let pos = c
                .vifs
                .iter()
                .position(|x| x.mac.as_deref() == Some(mac.as_str()))
                .or_else(|| {
                    // A vif without a MAC: its place is its tap's index.
                    tap.rsplit('n').next().and_then(|i| i.parse::<usize>().ok())
                });
            if let Some(i) = pos.filter(|i| *i < c.vifs.len()) {
                c.vifs.remove(i);
            }
            Ok(())
        })?;
        // The tap goes once the guest has let go and the VMM closed it (at
        // most 60 s later; if the guest never does, destroy removes it),
        // unless a restart or destroy removed it first (`unplug_tap`).
        let (api, dev) = (api.with_timeout(Duration::from_secs(2)), id.clone());
        let (taps, fw) = (self.host.taps.clone(), self.host.firewall.clone());
        let pending = self.unplugging.clone();
        lock(&pending).insert(tap.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                if api.device(&dev).is_ok() {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                let mut p = lock(&pending);
                if p.remove(&tap) {
                    crate::vifs::unplug(&*taps, fw.as_deref(), &tap);
                }
                return;
            }
            lock(&pending).remove(&tap);
        });
        self.log_domain(
            &r.name,
            false,
            &format!("detaching {id} ({mac}) from domain {}", r.name),
        );
        Ok(v)
    }
}
