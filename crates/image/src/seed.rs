//! cloud-init's NoCloud seed disk: a small FAT file system labelled
//! `cidata` with `meta-data`, `user-data` and (when the daemon gives one)
//! `network-config`, made with dosfstools' mkfs.vfat and mtools' mcopy (no
//! mounts).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{run, Error, Result};

/// What a domain's first boot is told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seed {
    /// Unique per domain: cloud-init runs its first-boot modules again
    /// when it changes.
    pub instance_id: String,
    pub hostname: String,
    /// Public keys for the default user (`debian` on Debian's images).
    pub ssh_keys: Vec<String>,
    /// A cloud-init network configuration (version 2), if not DHCP on the
    /// first interface.
    pub network_config: Option<String>,
}

/// A YAML string (double-quoted, escaped): keys and names go into the
/// seed as data, never as YAML.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Seed {
    pub fn meta_data(&self) -> String {
        format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            quoted(&self.instance_id),
            quoted(&self.hostname)
        )
    }

    pub fn user_data(&self) -> String {
        let mut s = String::from("#cloud-config\n");
        s.push_str(&format!("hostname: {}\n", quoted(&self.hostname)));
        // No ssh_pwauth: setting it makes cloud-init restart sshd late in
        // the boot (the default user has no password anyway).
        if !self.ssh_keys.is_empty() {
            s.push_str("ssh_authorized_keys:\n");
            for k in &self.ssh_keys {
                s.push_str(&format!("  - {}\n", quoted(k.trim())));
            }
        }
        s
    }
}

/// Writes `seed`'s disk to `path` (which must not exist).
pub fn make_seed(path: &Path, seed: &Seed) -> Result<()> {
    if path.exists() {
        return Err(Error::io(
            path.display(),
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    let work = path.with_extension("seed-files");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| Error::io(work.display(), e))?;
    let r = (|| {
        let mut files = vec![
            ("meta-data", seed.meta_data()),
            ("user-data", seed.user_data()),
        ];
        if let Some(n) = &seed.network_config {
            files.push(("network-config", n.clone()));
        }
        run(
            Command::new("mkfs.vfat")
                .args(["-C", "-n", "CIDATA"])
                .arg(path)
                .arg("1024"),
            None,
        )?;
        for (name, text) in files {
            let f = work.join(name);
            fs::write(&f, text).map_err(|e| Error::io(f.display(), e))?;
            run(
                Command::new("mcopy")
                    .arg("-i")
                    .arg(path)
                    .arg(&f)
                    .arg(format!("::{name}")),
                None,
            )?;
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&work);
    if r.is_err() {
        let _ = fs::remove_file(path);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_names_are_data_not_yaml() {
        let s = Seed {
            instance_id: "domus-7".into(),
            hostname: "web".into(),
            ssh_keys: vec!["ssh-ed25519 AAAA me@host\n".into(), "x\"\n- evil: 1".into()],
            network_config: None,
        };
        let u = s.user_data();
        assert!(u.starts_with("#cloud-config\n"));
        assert!(u.contains("  - \"ssh-ed25519 AAAA me@host\"\n"), "{u}");
        assert!(u.contains("  - \"x\\\"\\u000a- evil: 1\"\n"), "{u}");
        assert_eq!(
            s.meta_data(),
            "instance-id: \"domus-7\"\nlocal-hostname: \"web\"\n"
        );
    }

    #[test]
    fn the_seed_is_a_fat_disk_labelled_cidata_holding_the_files() {
        let d = std::env::temp_dir().join(format!("domus-seed-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let p = d.join("seed.img");
        let s = Seed {
            instance_id: "i-1".into(),
            hostname: "h".into(),
            ssh_keys: vec!["ssh-ed25519 AAAA k".into()],
            network_config: Some("version: 2\n".into()),
        };
        make_seed(&p, &s).unwrap();
        let out = Command::new("mdir")
            .args(["-b", "-i"])
            .arg(&p)
            .arg("::")
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        for f in ["meta-data", "user-data", "network-config"] {
            assert!(listing.contains(f), "{listing}");
        }
        let label = Command::new("mlabel")
            .args(["-s", "-i"])
            .arg(&p)
            .arg("::")
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&label.stdout).contains("CIDATA"));
        let ud = Command::new("mtype")
            .arg("-i")
            .arg(&p)
            .arg("::user-data")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&ud.stdout), s.user_data());
        assert!(
            make_seed(&p, &s).is_err(),
            "an existing seed is not overwritten"
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
