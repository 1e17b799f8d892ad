//! What `domus-guest` shares with the host's tests: the guest agent's
//! protocol, server and client ([`agent`]), `AF_VSOCK` sockets
//! ([`vsock`]), and the streams' checksum ([`hash`]).

pub mod agent;
pub mod hash;
pub mod vsock;
