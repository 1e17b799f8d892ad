//! Domain configuration files in Xen's xl.cfg syntax, for `domus create`.
//!
//! [`syntax`] reads the file; [`load`] turns the settings into a checked
//! [`DomainConfig`]. An unknown key is a warning (xl.cfg files from Xen
//! carry keys Domus has no use for); an invalid value is an error that
//! names the file, the line and the key. `key=value` overrides from the
//! command line are applied on top, as `xl create` does.

mod specs;
pub mod syntax;

pub use specs::{parse_cpulist, parse_disk, parse_rate, parse_vif};

use std::path::PathBuf;

use syntax::{Setting, Value};

pub use domus_api::domain::{check_name, Action, Disk, DomainConfig, Vif};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}:{line}: {msg}")]
    Syntax {
        file: String,
        line: usize,
        msg: String,
    },
    #[error("{file}:{line}: {key}: {msg}")]
    Invalid {
        file: String,
        line: usize,
        key: String,
        msg: String,
    },
    #[error("{file}: '{key}' is required")]
    Missing { file: String, key: &'static str },
}

/// A loaded configuration and the warnings (unknown keys) met on the way.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub config: DomainConfig,
    pub warnings: Vec<String>,
}

/// Xen's credit scheduler weight when none is given.
pub const DEFAULT_CPU_WEIGHT: u32 = 256;

const KNOWN: &[&str] = &[
    "name",
    "memory",
    "maxmem",
    "vcpus",
    "maxvcpus",
    "cpus",
    "cpu_weight",
    "cap",
    "kernel",
    "ramdisk",
    "cmdline",
    "extra",
    "root",
    "disk",
    "vif",
    "vsock",
    "mergeable",
    "cpuid",
    "on_poweroff",
    "on_reboot",
    "on_crash",
    "type",
    "image",
    "image_keep",
    "ssh_keys",
    "builder",
];

/// Parses `n` in `[lo, hi]` from a number setting.
fn int(s: &Setting, lo: u64, hi: u64) -> Result<u64, String> {
    match &s.value {
        Value::Num(n) if n.fract() == 0.0 && *n >= lo as f64 && *n <= hi as f64 => Ok(*n as u64),
        Value::Num(n) => Err(format!("{n} is not a whole number from {lo} to {hi}")),
        Value::Str(t) => t
            .parse::<u64>()
            .ok()
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(|| format!("'{t}' is not a whole number from {lo} to {hi}")),
        v => Err(format!("expected a number, found {v}")),
    }
}

fn string(s: &Setting) -> Result<String, String> {
    match &s.value {
        Value::Str(t) => Ok(t.clone()),
        v => Err(format!("expected a string, found {v}")),
    }
}

fn strings(s: &Setting) -> Result<Vec<String>, String> {
    match &s.value {
        Value::List(l) => l
            .iter()
            .map(|v| match v {
                Value::Str(t) => Ok(t.clone()),
                v => Err(format!("list items must be strings, found {v}")),
            })
            .collect(),
        Value::Str(t) => Ok(vec![t.clone()]),
        v => Err(format!("expected a list of strings, found {v}")),
    }
}

fn action(s: &Setting) -> Result<Action, String> {
    match string(s)?.as_str() {
        "destroy" => Ok(Action::Destroy),
        "restart" => Ok(Action::Restart),
        "preserve" => Ok(Action::Preserve),
        "rename-restart" | "coredump-destroy" | "coredump-restart" | "soft-reset" => {
            Err("not supported (use destroy, restart or preserve)".into())
        }
        o => Err(format!("'{o}' is not destroy, restart or preserve")),
    }
}

/// The settings of `text` (from `file`) with `overrides` (`KEY=VALUE`,
/// from the command line) applied.
fn settings(file: &str, text: &str, overrides: &[String]) -> Result<Vec<Setting>, ConfigError> {
    let mut settings = syntax::parse(text).map_err(|e| ConfigError::Syntax {
        file: file.into(),
        line: e.line,
        msg: e.msg,
    })?;
    for o in overrides {
        let parsed = syntax::parse(o).or_else(|e| match o.split_once('=') {
            Some((k, v)) => syntax::parse(&format!("{k}='{}'", v.trim())).map_err(|_| e),
            None => Err(e),
        });
        let mut s = parsed.map_err(|e| ConfigError::Syntax {
            file: "command line".into(),
            line: 0,
            msg: format!("'{o}': {}", e.msg),
        })?;
        for x in &mut s {
            x.line = 0;
        }
        for x in s {
            settings.retain(|y| y.key != x.key);
            settings.push(x);
        }
    }
    Ok(settings)
}

/// A configuration that makes a clone of a snapshot (`clone = "FILE"`,
/// as `domus clone FILE 1` does, under the configuration's `name`): its
/// name and the snapshot's path, or None for any other configuration.
/// Such a configuration holds nothing else: the domain is the snapshot's.
pub fn clone_source(
    file: &str,
    text: &str,
    overrides: &[String],
) -> Result<Option<(String, String)>, ConfigError> {
    let settings = settings(file, text, overrides)?;
    let Some(from) = settings.iter().find(|s| s.key == "clone") else {
        return Ok(None);
    };
    let invalid = |s: &Setting, msg: String| ConfigError::Invalid {
        file: file.into(),
        line: s.line,
        key: s.key.clone(),
        msg,
    };
    if let Some(other) = settings
        .iter()
        .find(|s| s.key != "clone" && s.key != "name")
    {
        return Err(invalid(
            other,
            "a clone's configuration has only its name and clone: the rest is the snapshot's"
                .into(),
        ));
    }
    let path = string(from).map_err(|m| invalid(from, m))?;
    let name = match settings.iter().find(|s| s.key == "name") {
        Some(s) => {
            let n = string(s).map_err(|m| invalid(s, m))?;
            check_name(&n).map_err(|m| invalid(s, m))?;
            n
        }
        None => {
            return Err(ConfigError::Missing {
                file: file.into(),
                key: "name",
            })
        }
    };
    Ok(Some((name, path)))
}

/// The command line as a Domus guest needs it: Xen's disk names in
/// `root=` (`/dev/xvda1`, `/dev/hda`, `/dev/sdb2`) become the virtio names
/// the guest has (`/dev/vda1`, ...), each change a warning; the serial
/// console is always wired (as xl's PV console is): `console=ttyS0` is
/// added when no `console=` is given.
pub fn guest_cmdline(cmdline: &str, warnings: &mut Vec<String>) -> String {
    // What follows `--` is init's, untouched.
    let (kernel, init) = match cmdline.split_once(" -- ") {
        Some((k, i)) => (k, Some(i)),
        None => (cmdline, None),
    };
    let mut words: Vec<String> = Vec::new();
    for w in kernel.split_whitespace() {
        let renamed = w.strip_prefix("root=/dev/").and_then(|dev| {
            let rest = ["xvd", "hd", "sd"]
                .iter()
                .find_map(|p| dev.strip_prefix(p))?;
            let letter = rest.chars().next().filter(char::is_ascii_lowercase)?;
            let part = &rest[1..];
            part.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| format!("root=/dev/vd{letter}{part}"))
        });
        match renamed {
            Some(r) => {
                warnings.push(format!(
                    "{w}: Domus's disks are virtio disks, so the guest calls it {}; using that",
                    &r[5..]
                ));
                words.push(r);
            }
            None => words.push(w.to_string()),
        }
    }
    if !words.iter().any(|w| w.starts_with("console=")) {
        words.push("console=ttyS0".into());
    }
    if let Some(i) = init {
        words.push("--".into());
        words.push(i.to_string());
    }
    words.join(" ")
}

/// Loads a configuration: `file` names it in messages, `overrides` are
/// `key=value` settings from the command line (a bare value is taken as a
/// string).
pub fn load(file: &str, text: &str, overrides: &[String]) -> Result<Loaded, ConfigError> {
    let settings = settings(file, text, overrides)?;
    let mut warnings = Vec::new();
    let get = |key: &str| settings.iter().find(|s| s.key == key).cloned();
    let invalid = |s: &Setting, msg: String| ConfigError::Invalid {
        file: if s.line == 0 {
            "command line".into()
        } else {
            file.into()
        },
        line: s.line,
        key: s.key.clone(),
        msg,
    };
    for s in &settings {
        if !KNOWN.contains(&s.key.as_str()) {
            warnings.push(format!(
                "{file}:{}: unknown key '{}' ignored",
                s.line, s.key
            ));
        }
    }
    // xl's domain types: a PV or PVH guest is what Domus boots (a kernel,
    // directly); HVM (firmware, emulated devices) it does not do.
    if let Some(t) = get("type") {
        let ty = string(&t).map_err(|m| invalid(&t, m))?;
        match ty.as_str() {
            "pv" | "pvh" => {}
            "hvm" => {
                return Err(invalid(
                    &t,
                    "not supported: HVM domains (firmware and emulated devices); Domus boots a \
                     kernel directly, as xl's PVH: set kernel (and ramdisk) or image = \"NAME\" \
                     and drop type"
                        .into(),
                ))
            }
            o => return Err(invalid(&t, format!("'{o}' is not pv, pvh or hvm"))),
        }
    }
    let name = match get("name") {
        Some(s) => {
            let n = string(&s).map_err(|m| invalid(&s, m))?;
            check_name(&n).map_err(|m| invalid(&s, m))?;
            n
        }
        None => {
            return Err(ConfigError::Missing {
                file: file.into(),
                key: "name",
            })
        }
    };
    let memory_mib = match get("memory") {
        Some(s) => int(&s, 64, 1 << 22).map_err(|m| invalid(&s, m))?,
        None => 256,
    };
    let maxmem_mib = match get("maxmem") {
        Some(s) => {
            let m = int(&s, 64, 1 << 22).map_err(|m| invalid(&s, m))?;
            if m < memory_mib {
                return Err(invalid(
                    &s,
                    format!("{m} MiB is less than memory ({memory_mib} MiB)"),
                ));
            }
            m
        }
        None => memory_mib,
    };
    let vcpus = match get("vcpus") {
        Some(s) => int(&s, 1, 255).map_err(|m| invalid(&s, m))? as u32,
        None => 1,
    };
    let cpus = match get("cpus") {
        Some(s) => {
            let c = string(&s).map_err(|m| invalid(&s, m))?;
            parse_cpulist(&c).map_err(|m| invalid(&s, m))?;
            Some(c)
        }
        None => None,
    };
    let cpu_weight = match get("cpu_weight") {
        Some(s) => int(&s, 1, 65535).map_err(|m| invalid(&s, m))? as u32,
        None => DEFAULT_CPU_WEIGHT,
    };
    let cap = match get("cap") {
        Some(s) => int(&s, 0, 100 * 255).map_err(|m| invalid(&s, m))? as u32,
        None => 0,
    };
    // `image = "NAME"`: the daemon takes the kernel, the initrd and the
    // root disk (an overlay it makes) from the image.
    let image = match get("image") {
        Some(s) => {
            let name = string(&s).map_err(|m| invalid(&s, m))?;
            let keep = match get("image_keep") {
                Some(k) => int(&k, 0, 1).map_err(|m| invalid(&k, m))? == 1,
                None => false,
            };
            let ssh_keys = match get("ssh_keys") {
                Some(k) => strings(&k).map_err(|m| invalid(&k, m))?,
                None => Vec::new(),
            };
            Some(domus_api::image::ImageUse {
                name,
                keep,
                ssh_keys,
                ..Default::default()
            })
        }
        None => {
            for k in ["image_keep", "ssh_keys"] {
                if let Some(s) = get(k) {
                    return Err(invalid(
                        &s,
                        "only for a domain booted from an image (image = \"NAME\")".into(),
                    ));
                }
            }
            None
        }
    };
    let kernel = match get("kernel") {
        Some(s) => PathBuf::from(string(&s).map_err(|m| invalid(&s, m))?),
        // Filled in from the image when the daemon creates the domain.
        None if image.is_some() => PathBuf::new(),
        None => {
            return Err(ConfigError::Missing {
                file: file.into(),
                key: "kernel' (or 'image",
            })
        }
    };
    let ramdisk = match get("ramdisk") {
        Some(s) => Some(PathBuf::from(string(&s).map_err(|m| invalid(&s, m))?)),
        None => None,
    };
    let cmdline = match get("cmdline") {
        Some(s) => string(&s).map_err(|m| invalid(&s, m))?,
        None => {
            let mut parts = Vec::new();
            match get("root") {
                Some(s) => parts.push(format!("root={}", string(&s).map_err(|m| invalid(&s, m))?)),
                // The daemon puts the image's own root= before it (the
                // whole first disk, or the UUID an imported image names).
                None if image.is_some() => parts.push("rw".into()),
                None => {}
            }
            if let Some(s) = get("extra") {
                parts.push(string(&s).map_err(|m| invalid(&s, m))?);
            }
            if parts.is_empty() {
                "console=ttyS0 panic=-1".to_string()
            } else {
                parts.join(" ")
            }
        }
    };
    let cmdline = guest_cmdline(&cmdline, &mut warnings);
    let mut disks = Vec::new();
    if let Some(s) = get("disk") {
        for d in strings(&s).map_err(|m| invalid(&s, m))? {
            let disk = parse_disk(&d).map_err(|m| invalid(&s, m))?;
            if disks.iter().any(|x: &Disk| x.vdev == disk.vdev) {
                return Err(invalid(&s, format!("vdev '{}' is used twice", disk.vdev)));
            }
            disks.push(disk);
        }
    }
    let mut vifs = Vec::new();
    if let Some(s) = get("vif") {
        for v in strings(&s).map_err(|m| invalid(&s, m))? {
            vifs.push(parse_vif(&v, &mut warnings).map_err(|m| invalid(&s, m))?);
        }
    }
    let vsock_cid = match get("vsock") {
        Some(s) => {
            let v = string(&s).map_err(|m| invalid(&s, m))?;
            Some(domus_api::spec::parse_vsock(&v).map_err(|m| invalid(&s, m))?)
        }
        None => None,
    };
    let mergeable = match get("mergeable") {
        Some(s) => int(&s, 0, 1).map_err(|m| invalid(&s, m))? == 1,
        None => false,
    };
    // xl's xend form, a list; its libxl form ("host,FLAG=0,...") names
    // features by xl's own table, which Domus does not carry.
    let cpuid = match get("cpuid") {
        Some(
            s @ Setting {
                value: Value::Str(_),
                ..
            },
        ) => {
            return Err(invalid(
                &s,
                "not supported: the libxl form (\"host,FLAG=0,...\"); write the xend form, \
                 a list: cpuid = [\"LEAF[,SUBLEAF]:REG=BITS\", ...], BITS being 32 of 0, 1 \
                 or x, the most significant bit first"
                    .into(),
            ))
        }
        Some(s) => {
            let mut rules = Vec::new();
            for entry in strings(&s).map_err(|m| invalid(&s, m))? {
                rules.extend(domus_api::cpuid::parse_xend(&entry).map_err(|m| invalid(&s, m))?);
            }
            rules
        }
        None => Vec::new(),
    };
    let act = |key: &str, default| match get(key) {
        Some(s) => action(&s).map_err(|m| invalid(&s, m)),
        None => Ok(default),
    };
    let on_poweroff = act("on_poweroff", Action::Destroy)?;
    let on_reboot = act("on_reboot", Action::Restart)?;
    let on_crash = act("on_crash", Action::Destroy)?;
    Ok(Loaded {
        config: DomainConfig {
            name,
            memory_mib,
            maxmem_mib,
            vcpus,
            cpus,
            cpu_weight,
            cap,
            kernel,
            ramdisk,
            cmdline,
            disks,
            vifs,
            vsock_cid,
            mergeable,
            cpuid,
            on_poweroff,
            on_reboot,
            on_crash,
            image,
        },
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "web-1"
memory = 512
maxmem = 1024
vcpus = 2
cpus = "0-1"
cpu_weight = 512
cap = 50
kernel = "/k/vmlinuz"
ramdisk = "/k/initrd"
root = "/dev/vda"
extra = "console=ttyS0 quiet"
disk = [ '/img/web.raw,raw,xvda,rw', 'format=raw, vdev=xvdb, access=ro, target=/img/a,b.raw' ]
vif = [ 'mac=00:16:3E:00:00:01,bridge=br0,ip=10.0.0.2,rate=10Mb/s,script=vif-bridge' ]
on_crash = 'restart'
vsock = 'cid=42'
mergeable = 1
cpuid = [ '0x80000006:edx=00000000000000000000000000000000', '1:ecx=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0' ]
pool = "Pool-0"
"#;

    #[test]
    fn a_full_config() {
        let l = load("web.cfg", GOOD, &[]).unwrap();
        let c = l.config;
        assert_eq!(c.name, "web-1");
        assert_eq!((c.memory_mib, c.maxmem_mib, c.vcpus), (512, 1024, 2));
        assert_eq!((c.cpu_weight, c.cap), (512, 50));
        assert_eq!(c.cpus.as_deref(), Some("0-1"));
        assert_eq!(c.cmdline, "root=/dev/vda console=ttyS0 quiet");
        assert_eq!(c.disks.len(), 2);
        assert_eq!(c.disks[1].path, PathBuf::from("/img/a,b.raw"));
        assert!(c.disks[1].read_only && !c.disks[0].read_only);
        assert_eq!(c.vifs[0].mac.as_deref(), Some("00:16:3e:00:00:01"));
        assert_eq!(c.vifs[0].rate, Some(1_250_000));
        assert_eq!(c.on_crash, Action::Restart);
        assert_eq!(c.vsock_cid, Some(42));
        assert!(c.mergeable);
        let cpuid: Vec<String> = c.cpuid.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            cpuid,
            [
                "0x80000006:edx=00000000000000000000000000000000",
                "0x1:ecx=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"
            ]
        );
        assert_eq!(c.on_reboot, Action::Restart);
        assert_eq!(c.on_poweroff, Action::Destroy);
        assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
        assert!(l.warnings.iter().any(|w| w.contains("'pool'")));
    }

    #[test]
    fn a_clone_names_only_itself_and_its_snapshot() {
        let text = "name = 'web-7'\nclone = '/srv/snap/web.snap'\n";
        assert_eq!(
            clone_source("c.cfg", text, &[]).unwrap(),
            Some(("web-7".into(), "/srv/snap/web.snap".into()))
        );
        // The name from the command line, as for any configuration.
        let (name, _) = clone_source("c.cfg", text, &["name=web-8".into()])
            .unwrap()
            .unwrap();
        assert_eq!(name, "web-8");
        // Anything else is the snapshot's.
        let e = clone_source("c.cfg", &format!("{text}memory = 512\n"), &[]).unwrap_err();
        assert!(e.to_string().contains("only its name and clone"), "{e}");
        assert!(
            clone_source("c.cfg", "clone = '/s'\n", &[]).is_err(),
            "no name"
        );
        assert!(clone_source("c.cfg", "name = 'a'\nclone = 3\n", &[]).is_err());
        // Not a clone: a configuration as ever.
        assert_eq!(clone_source("c.cfg", "name = 'a'\n", &[]).unwrap(), None);
    }

    #[test]
    fn xen_disk_names_in_root_become_virtio_names_and_the_console_is_wired() {
        let mut w = Vec::new();
        assert_eq!(
            guest_cmdline("root=/dev/xvda1 ro quiet", &mut w),
            "root=/dev/vda1 ro quiet console=ttyS0"
        );
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("/dev/vda1"), "{w:?}");
        assert_eq!(
            guest_cmdline("root=/dev/sdb console=hvc0", &mut w),
            "root=/dev/vdb console=hvc0"
        );
        // Not a disk name, and init's arguments: left alone.
        assert_eq!(
            guest_cmdline("root=/dev/xvdaa1 -- echo root=/dev/xvda", &mut w),
            "root=/dev/xvdaa1 console=ttyS0 -- echo root=/dev/xvda"
        );
        assert_eq!(
            guest_cmdline("root=LABEL=x", &mut w),
            "root=LABEL=x console=ttyS0"
        );
        // An image domain's root= comes from the image, at create.
        let c = load("i.cfg", "name='i'\nimage='deb12'\nextra='quiet'", &[])
            .unwrap()
            .config;
        assert_eq!(c.cmdline, "rw quiet console=ttyS0");
        assert_eq!(c.image.unwrap().name, "deb12");
        assert!(load("i.cfg", "name='i'\nkernel='/k'\nimage_keep=1", &[]).is_err());
    }

    #[test]
    fn an_hvm_domain_is_refused_saying_what_to_do() {
        let e = load("x.cfg", "name='h'\ntype='hvm'\nbuilder='hvm'", &[]).unwrap_err();
        assert!(e.to_string().contains("not supported: HVM"), "{e}");
        assert!(load("x.cfg", "name='p'\ntype='pvh'\nkernel='/k'", &[]).is_ok());
    }

    #[test]
    fn overrides_win() {
        let o = [
            "memory=768".to_string(),
            "name=web-2".to_string(),
            "cmdline=\"x y\"".to_string(),
        ];
        let c = load("web.cfg", GOOD, &o).unwrap().config;
        assert_eq!(c.memory_mib, 768);
        assert_eq!(c.name, "web-2");
        assert_eq!(
            c.cmdline, "x y console=ttyS0",
            "the serial console is always wired"
        );
        let e = load("web.cfg", GOOD, &["memory=huge".to_string()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "command line:0: memory: 'huge' is not a whole number from 64 to 4194304"
        );
    }

    #[test]
    fn invalid_values_name_file_line_and_key() {
        for (bad, key, line) in [
            ("memory = 'lots'", "memory", 1),
            ("vcpus = 0", "vcpus", 1),
            ("vcpus = 1.5", "vcpus", 1),
            ("cpu_weight = 70000", "cpu_weight", 1),
            ("cpus = 'a-b'", "cpus", 1),
            ("\ndisk = ['/x,vmdk,xvda,rw']", "disk", 2),
            ("disk = ['/x,raw,xvda']", "disk", 1),
            ("disk = ['/x,raw,zz0,rw']", "disk", 1),
            ("disk = ['/x,raw,xvda,rw', '/y,raw,xvda,rw']", "disk", 1),
            ("disk = ['/x,raw,xvda,rx']", "disk", 1),
            ("vif = ['mac=zz']", "vif", 1),
            ("vif = ['rate=10']", "vif", 1),
            ("vif = ['ip=300.1.1.1']", "vif", 1),
            ("on_crash = 'explode'", "on_crash", 1),
            ("vsock = 'cid=2'", "vsock", 1),
            ("vsock = 5", "vsock", 1),
            ("mergeable = 2", "mergeable", 1),
            ("cpuid = 'host,topoext=0'", "cpuid", 1),
            ("cpuid = ['1:ecx=0']", "cpuid", 1),
            ("cpuid = [1]", "cpuid", 1),
            ("maxmem = 100", "maxmem", 1),
            ("name = '123'", "name", 1),
            ("name = 'a b'", "name", 1),
        ] {
            let text = format!("name='n'\nkernel='/k'\nmemory=256\n{bad}");
            let e = load("t.cfg", &text, &[]).unwrap_err();
            match &e {
                ConfigError::Invalid {
                    file,
                    line: l,
                    key: k,
                    ..
                } => {
                    assert_eq!(
                        (file.as_str(), k.as_str(), *l),
                        ("t.cfg", key, line + 3),
                        "{bad}: {e}"
                    )
                }
                e => panic!("{bad}: {e}"),
            }
        }
        assert!(matches!(
            load("t.cfg", "kernel='/k'", &[]),
            Err(ConfigError::Missing { key: "name", .. })
        ));
        assert!(matches!(
            load("t.cfg", "name='x'", &[]),
            Err(ConfigError::Missing {
                key: "kernel' (or 'image",
                ..
            })
        ));
        assert!(matches!(
            load("t.cfg", "name='x' x", &[]),
            Err(ConfigError::Syntax { line: 1, .. })
        ));
    }
}
