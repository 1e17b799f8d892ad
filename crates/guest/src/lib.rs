//! What `domus-guest` shares with the host's tests: the guest agent's
//! protocol, server and client ([`agent`]), and `AF_VSOCK` sockets
//! ([`vsock`]).

pub mod agent;
pub mod vsock;
