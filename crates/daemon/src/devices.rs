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
        let chain = self
            .files
            .check_disk(&format!("disk {}", disk.vdev), &disk)?;
        if let Some(d) = r.config.disks.iter().find(|d| d.vdev == disk.vdev) {
            return Err(Error::Invalid(format!(
                "domain {} already has a disk {} ({})",
                r.name,
                d.vdev,
                d.path.display()
            )));
        }
        let mut spec = crate::lifecycle::disk_spec(&disk);
        let api = self.vmm(&r)?;
        // A jailed VMM cannot open the file: it is handed the descriptor.
        if let Some(jail) = self.running_jail(&r) {
            let (tag, backing) = self.pass_disk(&r, &jail, &disk, &chain)?;
            spec.passed = Some(tag);
            spec.passed_backing = backing;
        }
        let dev = api
            .plug(&PlugRequest {
                disk: Some(spec),
                net: None,
            })
            .map_err(vmm_error(&r))?;
        self.update_config(r.id, |c| {
            c.disks.push(disk.clone());
            Ok(())
        })?;
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
        self.update_config(r.id, |c| {
            if let Some(i) = c
                .disks
                .iter()
                .position(|x| x.path.display().to_string() == path)
            {
                c.disks.remove(i);
            }
            Ok(())
        })?;
        self.log_domain(
            &r.name,
            false,
            &format!("detaching {id} ({path}) from domain {}", r.name),
        );
        Ok(v)
    }
}
