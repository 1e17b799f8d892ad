//! xl's device and resource specs: disks (`PATH,FORMAT,VDEV,ACCESS` or
//! `key=value`), interfaces (`mac=,bridge=,ip=,rate=`), rates and CPU lists.

use std::path::PathBuf;

use crate::{Disk, Vif};
use domus_api::domain::PortRange;
use domus_api::spec::parse_switch;

/// A host CPU list: "3", "0-3", "0-3,6,^2" is not supported; "all".
pub fn parse_cpulist(s: &str) -> Result<Vec<u32>, String> {
    if s == "all" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) if a <= b && b < 4096 => (a, b),
            _ => {
                return Err(format!(
                    "'{part}' is not a CPU or a range of CPUs (like 0-3)"
                ))
            }
        };
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// xl's disk spec: positional `target,format,vdev,access` or
/// `key=value` pairs (`target=` last, as it may hold commas).
pub fn parse_disk(spec: &str) -> Result<Disk, String> {
    let (mut target, mut format, mut vdev, mut access) = (None, None, None, None);
    if spec.contains('=') {
        let mut rest = spec;
        while !rest.is_empty() {
            let (item, next) = if rest.trim_start().starts_with("target=") {
                (rest, "")
            } else {
                rest.split_once(',').unwrap_or((rest, ""))
            };
            rest = next;
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not key=value"))?;
            match k.trim() {
                "target" => target = Some(v.to_string()),
                "format" => format = Some(v.trim().to_string()),
                "vdev" => vdev = Some(v.trim().to_string()),
                "access" => access = Some(v.trim().to_string()),
                "devtype" | "backendtype" | "script" => {}
                k => return Err(format!("unknown disk key '{k}'")),
            }
        }
    } else {
        let p: Vec<&str> = spec.split(',').map(str::trim).collect();
        if p.len() != 4 {
            return Err(format!(
                "'{spec}' is not PATH,FORMAT,VDEV,ACCESS (or key=value pairs)"
            ));
        }
        target = Some(p[0].to_string());
        format = Some(p[1].to_string());
        vdev = Some(p[2].to_string());
        access = Some(p[3].to_string());
    }
    let target = target
        .filter(|t| !t.is_empty())
        .ok_or("the disk has no target path")?;
    let format = format.as_deref().unwrap_or("raw").parse()?;
    let vdev = vdev.ok_or("the disk has no vdev (like xvda)")?;
    let ok = vdev.len() >= 3
        && ["xvd", "hd", "sd", "vd"].iter().any(|p| {
            vdev.strip_prefix(p)
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase()))
        });
    if !ok {
        return Err(format!("vdev '{vdev}' is not like xvda, hda, sda or vda"));
    }
    let read_only = match access.as_deref().unwrap_or("rw") {
        "rw" | "w" | "" => false,
        "ro" | "r" => true,
        a => return Err(format!("access '{a}' is not rw or ro")),
    };
    Ok(Disk {
        path: PathBuf::from(target),
        format,
        vdev,
        read_only,
    })
}

/// xl's rate: `10MB/s`, `100Mb/s` (bits), `1GB/s`, with an optional
/// `@INTERVAL` that is ignored; K, M, G are powers of 1000. Bytes/s.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let r = s.split('@').next().unwrap_or("").trim();
    let r = r
        .strip_suffix("/s")
        .ok_or_else(|| format!("rate '{s}' does not end in /s (like 10MB/s)"))?;
    let (num, unit) = r.split_at(r.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(r.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("rate '{s}' does not start with a whole number"))?;
    let (mult, bits) = match unit {
        "B" => (1, false),
        "KB" => (1_000, false),
        "MB" => (1_000_000, false),
        "GB" => (1_000_000_000, false),
        "b" => (1, true),
        "Kb" => (1_000, true),
        "Mb" => (1_000_000, true),
        "Gb" => (1_000_000_000, true),
        u => {
            return Err(format!(
                "rate unit '{u}' is not B, KB, MB, GB, b, Kb, Mb or Gb"
            ))
        }
    };
    let v = n.checked_mul(mult).ok_or("rate too large")?;
    Ok(if bits { v / 8 } else { v })
}

/// xl's vif spec: `key=value` pairs (mac, bridge, ip, rate; others are
/// ignored with a warning), and the virtual firewall-router's own: `tcp=`
/// and `udp=` (the inbound ports allowed, separated by spaces, ranges as
/// `8000-8080`; an empty list allows none) and `isolated=1`; and the
/// device's `mrg_rxbuf=0` (no mergeable receive buffers) and
/// `indirect_desc=0` (no indirect descriptors).
pub fn parse_vif(spec: &str, warnings: &mut Vec<String>) -> Result<Vif, String> {
    let mut v = Vif::default();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, val) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not key=value"))?;
        let val = val.trim();
        match k.trim() {
            "mac" => {
                let ok = val.split(':').count() == 6
                    && val
                        .split(':')
                        .all(|p| p.len() == 2 && u8::from_str_radix(p, 16).is_ok());
                if !ok {
                    return Err(format!("mac '{val}' is not six hex pairs"));
                }
                v.mac = Some(val.to_lowercase());
            }
            "bridge" => {
                if val.is_empty() || val.len() > 15 {
                    return Err(format!("bridge '{val}' is not a network interface name"));
                }
                v.bridge = Some(val.to_string());
            }
            "ip" => {
                let words: Vec<&str> = val.split_whitespace().collect();
                if words.is_empty() {
                    return Err("ip= names no address".into());
                }
                v.ip = Some(words.join(" "));
                v.addresses()?;
            }
            "rate" => v.rate = Some(parse_rate(val)?),
            "tcp" | "udp" => {
                let ports = val
                    .split_whitespace()
                    .map(PortRange::parse)
                    .collect::<Result<Vec<_>, _>>()?;
                if k.trim() == "tcp" {
                    v.tcp = Some(ports);
                } else {
                    v.udp = Some(ports);
                }
            }
            "isolated" => {
                v.isolated =
                    parse_switch(val).ok_or_else(|| format!("isolated '{val}' is not 0 or 1"))?
            }
            "mrg_rxbuf" => {
                v.mrg_rxbuf = Some(
                    parse_switch(val).ok_or_else(|| format!("mrg_rxbuf '{val}' is not 0 or 1"))?,
                )
            }
            "indirect_desc" => {
                v.indirect_desc = Some(
                    parse_switch(val)
                        .ok_or_else(|| format!("indirect_desc '{val}' is not 0 or 1"))?,
                )
            }
            k => warnings.push(format!("vif key '{k}' is ignored")),
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_cpulists() {
        assert_eq!(parse_rate("10MB/s"), Ok(10_000_000));
        assert_eq!(parse_rate("100Mb/s@20ms"), Ok(12_500_000));
        assert_eq!(parse_rate("5B/s"), Ok(5));
        assert!(parse_rate("10MB").is_err());
        assert!(parse_rate("10XB/s").is_err());
        assert!(parse_rate("99999999999999999999GB/s").is_err());
        assert_eq!(parse_cpulist("0-2,5,1"), Ok(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpulist("all"), Ok(vec![]));
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("").is_err());
    }

    #[test]
    fn disk_and_vif_specs_become_records() {
        let d = parse_disk("vdev=xvdb,access=ro,target=/srv/a,b.img").unwrap();
        assert_eq!(
            d,
            Disk {
                path: PathBuf::from("/srv/a,b.img"),
                format: Default::default(),
                vdev: "xvdb".into(),
                read_only: true,
            }
        );
        // xl's two ways to say qcow2.
        for spec in [
            "/srv/o.qcow2,qcow2,xvda,rw",
            "format=qcow2,vdev=xvda,target=/srv/o.qcow2",
        ] {
            let d = parse_disk(spec).unwrap();
            assert_eq!(d.format, domus_api::spec::DiskFormat::Qcow2, "{spec}");
            assert_eq!(d.path, PathBuf::from("/srv/o.qcow2"));
        }
        let mut w = Vec::new();
        let v = parse_vif(
            "mac=52:54:00:AA:bb:01,bridge=br0,ip=10.0.0.2,rate=10Mb/s",
            &mut w,
        )
        .unwrap();
        assert_eq!(
            v,
            Vif {
                mac: Some("52:54:00:aa:bb:01".into()),
                bridge: Some("br0".into()),
                ip: Some("10.0.0.2".into()),
                rate: Some(1_250_000),
                ..Vif::default()
            }
        );
        assert!(w.is_empty());
        let v = parse_vif(
            "ip=10.0.0.3  fd00::3,tcp=22 8000-8080,udp=,isolated=1",
            &mut w,
        )
        .unwrap();
        assert_eq!(v.ip.as_deref(), Some("10.0.0.3 fd00::3"));
        assert_eq!(v.addresses().unwrap().len(), 2);
        assert_eq!(
            v.tcp,
            Some(vec![
                PortRange {
                    first: 22,
                    last: 22
                },
                PortRange {
                    first: 8000,
                    last: 8080
                }
            ])
        );
        assert_eq!(v.udp, Some(vec![]));
        assert!(v.isolated && v.filters_ports());
        assert_eq!(v.mrg_rxbuf, None, "the VMM's default unless asked");
        let v = parse_vif("mrg_rxbuf=0", &mut w).unwrap();
        assert_eq!(v.mrg_rxbuf, Some(false));
        assert_eq!(v.indirect_desc, None, "the VMM's default unless asked");
        let v = parse_vif("indirect_desc=0", &mut w).unwrap();
        assert_eq!(v.indirect_desc, Some(false));
        for bad in [
            "ip=10.0.0.300",
            "ip=",
            "tcp=0",
            "tcp=90-80",
            "udp=65536",
            "tcp=ssh",
            "isolated=maybe",
            "mrg_rxbuf=big",
            "indirect_desc=",
        ] {
            assert!(parse_vif(bad, &mut w).is_err(), "{bad}");
        }
    }
}
