//! What `domus-guest` shares with the host's tests: the guest agent's
//! protocol, server and client ([`agent`]), `AF_VSOCK` sockets
//! ([`vsock`]), the streams' checksum ([`hash`]), and raw Ethernet test
//! frames for the virtual firewall-router ([`frames`]).

pub mod agent;
pub mod frames;
pub mod hash;
pub mod vsock;
