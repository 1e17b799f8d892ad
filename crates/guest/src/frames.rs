//! Raw Ethernet frames over `AF_PACKET`: the frames a hostile domain would
//! send (a spoofed MAC, a spoofed source address, a forged ARP reply, IPv6
//! from a domain given no IPv6 address) beside a legitimate one, each
//! carrying a marker in its payload, and a sniffer that counts the markers
//! it sees on an interface. The virtual firewall-router's tests send from
//! one domain and sniff in another and on the host's bridge.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// What each test frame is, by its marker.
pub const KINDS: [&str; 6] = ["legit", "mac", "ip", "arp", "ip6", "dhcp"];

/// The marker a frame of `kind` carries.
fn marker(kind: &str) -> Vec<u8> {
    format!("DOMUS-VFR-{kind}.").into_bytes()
}

/// A MAC address from `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

const BROADCAST: [u8; 6] = [0xff; 6];

fn ether(dst: [u8; 6], src: [u8; 6], kind: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(128);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&kind.to_be_bytes());
    f
}

/// The ones' complement sum of RFC 791's header checksum.
fn checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A broadcast UDP datagram (port 9, discard) from `mac`/`ip`.
fn udp(mac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    udp_ports(mac, src, dst, (9, 9), payload)
}

/// A DHCPDISCOVER from `mac` on behalf of `client` (its `chaddr`), from
/// 0.0.0.0 port 68 to the broadcast address port 67, with the marker of
/// `kind` in the BOOTP header's file name.
fn dhcp_discover(mac: [u8; 6], client: [u8; 6], kind: &str) -> Vec<u8> {
    // op, htype, hlen, hops, xid, secs, flags; ciaddr, yiaddr, siaddr,
    // giaddr; chaddr (16 bytes); sname (64); file (128).
    let mut b = vec![1, 1, 6, 0, 0xd0, 0x0a, 0x05, 0x01, 0, 0, 0x80, 0];
    b.extend_from_slice(&[0; 16]);
    b.extend_from_slice(&client);
    b.extend_from_slice(&[0; 10 + 64]);
    let mut file = marker(kind);
    file.resize(128, 0);
    b.extend_from_slice(&file);
    // The magic cookie, DHCP message type 1 (discover), end.
    b.extend_from_slice(&[99, 130, 83, 99, 53, 1, 1, 255]);
    udp_ports(
        mac,
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        (68, 67),
        &b,
    )
}

/// A broadcast UDP datagram from `mac`/`src`, ports (source, destination).
fn udp_ports(
    mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ports: (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut f = ether(BROADCAST, mac, 0x0800);
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&ports.0.to_be_bytes());
    f.extend_from_slice(&ports.1.to_be_bytes());
    f.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// The test frames, by kind, from an interface whose MAC is `mac` and
/// address `ip`: `legit` as it should be; `mac` from another MAC; `ip`
/// from `victim`'s address; `arp` a reply claiming `victim`'s address for
/// this MAC; `ip6` an IPv6 packet; `dhcp` a DHCPDISCOVER for another MAC
/// (what would take another domain's lease, or drain the pool). All
/// broadcast, so every port of a bridge and the host get what passes.
pub fn test_frames(mac: [u8; 6], ip: Ipv4Addr, victim: Ipv4Addr) -> Vec<(&'static str, Vec<u8>)> {
    let dst = Ipv4Addr::BROADCAST;
    let other_mac = [0x52, 0x54, 0x00, 0xde, 0xad, 0x01];
    let mut arp = ether(BROADCAST, mac, 0x0806);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    arp.extend_from_slice(&mac);
    arp.extend_from_slice(&victim.octets());
    arp.extend_from_slice(&BROADCAST);
    arp.extend_from_slice(&victim.octets());
    arp.extend_from_slice(&marker("arp"));
    let mut ip6 = ether([0x33, 0x33, 0, 0, 0, 1], mac, 0x86dd);
    let payload = marker("ip6");
    ip6.extend_from_slice(&[0x60, 0, 0, 0]);
    ip6.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    ip6.extend_from_slice(&[59, 64]);
    ip6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x99]);
    ip6.extend_from_slice(&[0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    ip6.extend_from_slice(&payload);
    vec![
        ("legit", udp(mac, ip, dst, &marker("legit"))),
        ("mac", udp(other_mac, ip, dst, &marker("mac"))),
        ("ip", udp(mac, victim, dst, &marker("ip"))),
        ("arp", arp),
        ("ip6", ip6),
        ("dhcp", dhcp_discover(mac, other_mac, "dhcp")),
    ]
}

/// A raw socket on interface `iface`.
struct Raw(i32, libc::sockaddr_ll);

impl Raw {
    fn open(iface: &str) -> std::io::Result<Raw> {
        let name = std::ffi::CString::new(iface).map_err(std::io::Error::other)?;
        // SAFETY: a NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(std::io::Error::other(format!("no interface {iface}")));
        }
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2).
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        let raw = Raw(fd, addr);
        // SAFETY: binds the socket we own to an address that lives on the
        // stack for the call, with its size.
        let r = unsafe {
            libc::bind(
                fd,
                (&raw.1 as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(raw)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: closes the socket this owns.
        unsafe { libc::close(self.0) };
    }
}

/// Sends each frame once on `iface`.
pub fn send(iface: &str, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let s = Raw::open(iface)?;
    for f in frames {
        // SAFETY: sends f's bytes, which live for the call.
        let n = unsafe { libc::send(s.0, f.as_ptr().cast(), f.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Counts, for `secs` seconds, the frames seen on `iface` that carry each
/// kind's marker.
pub fn sniff(iface: &str, secs: f64) -> std::io::Result<Vec<(&'static str, usize)>> {
    let s = Raw::open(iface)?;
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: sets a receive timeout from a timeval that lives for the call.
    unsafe {
        libc::setsockopt(
            s.0,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let markers: Vec<Vec<u8>> = KINDS.iter().map(|k| marker(k)).collect();
    let mut counts = vec![0usize; KINDS.len()];
    let mut buf = vec![0u8; 65536];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        // SAFETY: receives into buf, whose length is given.
        let n = unsafe { libc::recv(s.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            continue;
        }
        let frame = &buf[..n as usize];
        for (i, m) in markers.iter().enumerate() {
            if frame.windows(m.len()).any(|w| w == m.as_slice()) {
                counts[i] += 1;
            }
        }
    }
    Ok(KINDS.iter().copied().zip(counts).collect())
}

/// `kind=N ...`, as `domus-guest sniff` prints it.
pub fn report(counts: &[(&str, usize)]) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_markers_and_valid_headers() {
        let mac = parse_mac("52:54:00:00:00:0a").unwrap();
        let fs = test_frames(mac, Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 3));
        assert_eq!(fs.len(), KINDS.len());
        for (k, f) in &fs {
            let m = marker(k);
            assert!(f.windows(m.len()).any(|w| w == m.as_slice()), "{k}");
        }
        let legit = &fs[0].1;
        assert_eq!(&legit[6..12], &mac);
        assert_eq!(checksum(&legit[14..34]), 0, "the IPv4 header sums to zero");
        assert_eq!(&fs[2].1[26..30], &[10, 0, 0, 3], "the spoofed source");
        assert_eq!(
            &fs[3].1[28..32],
            &[10, 0, 0, 3],
            "the ARP reply claims the victim"
        );
        assert_ne!(&fs[1].1[6..12], &mac);
        assert_eq!(parse_mac("52:54:00:00:00"), None);
        assert_eq!(parse_mac("52:54:00:00:00:0g"), None);
    }
}
