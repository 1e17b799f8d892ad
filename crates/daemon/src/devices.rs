//! Disk hot-plug (block-attach, block-detach).

use domus_api::client::VmmClient;
use domus_api::vmm::{DeviceInfo, PlugRequest, Unplugging};

use crate::{db, vmm_error, Daemon, Error, Result};

impl Daemon {
    /// block-attach: hot-plugs a disk (an xl disk spec) into the running
    /// domain and adds it to the domain's configuration, so that it is
    /// there after a reboot too.
    pub fn block_attach(&self, dom: &str, spec: &str) -> Result<DeviceInfo> {
        let r = self.find(dom)?;
        let disk = domus_xlcfg::parse_disk(spec).map_err(Error::Invalid)?;
        if !disk.path.is_absolute() {
            return Err(Error::Invalid(format!(
                "give the disk's absolute path, not {}",
                disk.path.display()
            )));
        }
        let c = self.load(&r)?;
        let mut specs: Vec<String> = c.disks.iter().map(|d| d.spec()).collect();
        specs.push(disk.spec());
        let list = domus_xlcfg::list_value(&specs)
            .ok_or_else(|| Error::Invalid("a disk path cannot hold quotes".into()))?;
        let dev = self
            .vmm(&r)?
            .plug(&PlugRequest {
                disk: Some(crate::lifecycle::disk_spec(&disk)),
                net: None,
            })
            .map_err(vmm_error(&r))?;
        self.remember(&r, "disk", &list)?;
        self.log_domain(
            &r.name,
            false,
            &format!(
                "attached {} to domain {} as {}",
                disk.path.display(),
                r.name,
                dev.id
            ),
        );
        Ok(dev)
    }

    /// A device of domain `r`, by its API id (vda, net0, ...), which must
    /// be of `kind`.
    pub(crate) fn device(r: &db::Row, api: &VmmClient, id: &str, kind: &str) -> Result<DeviceInfo> {
        let d = api.device(id).map_err(vmm_error(r))?;
        if d.kind != kind {
            return Err(Error::Invalid(format!(
                "device {id} is not a {kind} device"
            )));
        }
        Ok(d)
    }

    /// block-detach: asks the guest to let go of a disk (by its name,
    /// vda, vdb, ...) and drops it from the domain's configuration. The
    /// disk leaves when the guest has released it.
    pub fn block_detach(&self, dom: &str, id: &str) -> Result<Unplugging> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let d = Self::device(&r, &api, id, "block")?;
        let path = d.fact("path").to_string();
        let v = api.unplug(id).map_err(vmm_error(&r))?;
        let c = self.load(&r)?;
        let mut disks = c.disks.clone();
        if let Some(i) = disks
            .iter()
            .position(|x| x.path.display().to_string() == path)
        {
            disks.remove(i);
        }
        let specs: Vec<String> = disks.iter().map(|d| d.spec()).collect();
        if let Some(list) = domus_xlcfg::list_value(&specs) {
            self.remember(&r, "disk", &list)?;
        }
        self.log_domain(
            &r.name,
            false,
            &format!("detaching {id} ({path}) from domain {}", r.name),
        );
        Ok(v)
    }
}
