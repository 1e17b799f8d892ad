//! The host's links through rtnetlink (and the tun driver's ioctls for
//! taps), instead of shelling out to `ip`: taps made persistent for a
//! domain's user, put on a bridge and up; bridges; their addresses. Over
//! `netlink-packet-route` and a plain `netlink-sys` socket, synchronously
//! (the daemon has no async runtime).

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// The index of link `name`, if there is one.
pub fn index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: a NUL-terminated string that lives for the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

fn no_link(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no network interface '{name}'"),
    )
}

/// Sends one request and waits for the kernel's answer (an error or ack).
fn request(msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf[..]);
    socket.send(&buf, 0)?;
    let mut answer = vec![0u8; 8192];
    loop {
        let n = socket.recv(&mut &mut answer[..], 0)?;
        let got = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[..n])
            .map_err(|e| io::Error::other(format!("netlink answer: {e}")))?;
        match got.payload {
            NetlinkPayload::Error(e) => {
                return match e.code {
                    None => Ok(()),
                    Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                };
            }
            NetlinkPayload::Done(_) => return Ok(()),
            _ => continue,
        }
    }
}

/// Sets link `name` up (or down), on bridge `master` when one is given.
pub fn set_link(name: &str, up: bool, master: Option<&str>) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.header.index = index(name).ok_or_else(|| no_link(name))?;
    m.header.flags = if up {
        LinkFlags::Up
    } else {
        LinkFlags::empty()
    };
    m.header.change_mask = LinkFlags::Up;
    if let Some(br) = master {
        let i = index(br).ok_or_else(|| no_link(br))?;
        m.attributes.push(LinkAttribute::Controller(i));
    }
    request(RouteNetlinkMessage::SetLink(m), 0)
}

/// Makes bridge `name` (an existing one is an error of kind AlreadyExists).
pub fn add_bridge(name: &str) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.attributes.push(LinkAttribute::IfName(name.to_string()));
    m.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Bridge,
        )]));
    request(RouteNetlinkMessage::NewLink(m), NLM_F_CREATE | NLM_F_EXCL)
}

/// Removes link `name`.
pub fn del_link(name: &str) -> io::Result<()> {
    let mut m = LinkMessage::default();
    m.header.index = index(name).ok_or_else(|| no_link(name))?;
    request(RouteNetlinkMessage::DelLink(m), 0)
}

/// Gives link `name` address `a`/`prefix` (replacing it if it has it).
pub fn replace_addr(name: &str, a: Ipv4Addr, prefix: u8) -> io::Result<()> {
    let mut m = AddressMessage::default();
    m.header.family = AddressFamily::Inet;
    m.header.prefix_len = prefix;
    m.header.index = index(name).ok_or_else(|| no_link(name))?;
    m.attributes.push(AddressAttribute::Local(a.into()));
    m.attributes.push(AddressAttribute::Address(a.into()));
    request(
        RouteNetlinkMessage::NewAddress(m),
        NLM_F_CREATE | NLM_F_REPLACE,
    )
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNSETOWNER: libc::c_ulong = 0x4004_54cc;
const TUNSETGROUP: libc::c_ulong = 0x4004_54ce;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The part of `struct ifreq` TUNSETIFF reads and writes.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Makes a persistent tap `name` (as `ip tuntap add mode tap`), owned by
/// `owner` (user, group) when given, so that that user's VMM may open it.
pub fn add_tap(name: &str, owner: Option<(u32, u32)>) -> io::Result<()> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{name}' is not a network interface name"),
        ));
    }
    if index(name).is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("network interface {name} exists"),
        ));
    }
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let fd = tun.as_raw_fd();
    let ioctl = |what: &str, op: libc::c_ulong, arg: libc::c_ulong| -> io::Result<()> {
        // SAFETY: a tun ioctl that takes an integer argument, on our fd.
        if unsafe { libc::ioctl(fd, op as _, arg) } < 0 {
            return Err(io::Error::other(format!(
                "{what} on tap {name}: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(())
    };
    // SAFETY: TUNSETIFF reads and writes an ifreq; `req` is laid out as the
    // part of one it uses, with room to spare, and lives for the call.
    if unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req) } < 0 {
        return Err(io::Error::other(format!(
            "TUNSETIFF for tap {name}: {}",
            io::Error::last_os_error()
        )));
    }
    if let Some((uid, gid)) = owner {
        ioctl("TUNSETOWNER", TUNSETOWNER, libc::c_ulong::from(uid))?;
        ioctl("TUNSETGROUP", TUNSETGROUP, libc::c_ulong::from(gid))?;
    }
    ioctl("TUNSETPERSIST", TUNSETPERSIST, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a network namespace of its own (needs root, as the daemon does).
    #[test]
    fn taps_bridges_and_addresses_are_made_and_removed() {
        std::thread::spawn(|| {
            assert_eq!(
                // SAFETY: unshare(2) of this thread's network namespace only.
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "run as root"
            );
            add_bridge("tbr0").unwrap();
            let e = add_bridge("tbr0").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
            set_link("tbr0", true, None).unwrap();
            replace_addr("tbr0", Ipv4Addr::new(10, 9, 9, 1), 24).unwrap();
            replace_addr("tbr0", Ipv4Addr::new(10, 9, 9, 1), 24).unwrap();
            add_tap("ttap0", Some((4242, 4243))).unwrap();
            assert_eq!(
                add_tap("ttap0", None).unwrap_err().kind(),
                io::ErrorKind::AlreadyExists
            );
            set_link("ttap0", true, Some("tbr0")).unwrap();
            let ip = |args: &str| {
                let out = std::process::Command::new("ip")
                    .args(args.split_whitespace())
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).into_owned()
            };
            assert!(
                ip("-d link show ttap0").contains("master tbr0"),
                "{}",
                ip("-d link show ttap0")
            );
            assert!(ip("-d link show ttap0").contains("tun type tap"));
            assert!(ip("-d link show ttap0").contains("user 4242 group 4243"));
            assert!(ip("addr show tbr0").contains("10.9.9.1/24"));
            assert!(set_link("nothere", true, Some("tbr0")).is_err());
            assert!(set_link("ttap0", true, Some("nothere")).is_err());
            del_link("ttap0").unwrap();
            assert_eq!(index("ttap0"), None);
            del_link("tbr0").unwrap();
            assert!(del_link("tbr0").is_err());
        })
        .join()
        .unwrap();
    }
}
